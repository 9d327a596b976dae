"""A question parsed into a structured query, without a language model: the entity asked about, its filters (nodes,
jobs, rules, values, comparisons), the time range, the measure and how to aggregate it, grouping, ordering, a limit,
and a hypothetical action. Every word of the question must be consumed by one of those slots (or be a function word,
sigma.companion.lexicon.STOPWORDS); the words that are not, and the parts that do not fit the chosen entity, are
kept in `unknown`, and a question with any of them is never answered as fact (sigma.companion.fast).
"""

from __future__ import annotations

import re
import threading
from dataclasses import dataclass, field
from datetime import tzinfo

from sigma.companion import timerange
from sigma.companion.lexicon import NUMBER_WORDS, STOPWORDS, normalise, phrase_stems, stem, tokenize
from sigma.companion.model import UNITS, Column, Cond, Entity, Model, link, table_of, unit_of

# Words of the question's shape, whatever the entity. (kind, value)
GRAMMAR: dict[str, tuple[str, str]] = {
    "how many": ("q", "count"), "number of": ("q", "count"), "count": ("q", "count"), "how often": ("q", "count"),
    "how many times": ("q", "count"), "how frequently": ("q", "count"), "total number of": ("q", "count"),
    "times": ("times", ""), "so often": ("emphasis", ""), "often": ("emphasis", ""), "at all": ("emphasis", ""),
    "no": ("zero", ""),   # before a measure's word ("lost no steps"): that measure is 0
    "how long": ("q", "duration"), "how fast": ("q", "duration"), "how quickly": ("q", "duration"),
    "how much time": ("q", "duration"), "duration": ("q", "duration"),
    "when": ("q", "when"), "what time": ("q", "when"), "at what time": ("q", "when"),
    "first time": ("q", "when-first"), "last time": ("q", "when-last"),
    "why": ("q", "why"), "reason": ("q", "why"), "cause": ("q", "why"), "caused": ("q", "why"),
    "because of": ("q", "why-filter"), "due to": ("q", "why-filter"), "for": ("for", ""),
    "average": ("agg", "avg"), "mean": ("agg", "avg"), "avg": ("agg", "avg"), "on average": ("agg", "avg"),
    "typical": ("agg", "median"), "median": ("agg", "median"),
    "total": ("agg", "sum"), "in total": ("agg", "sum"), "sum": ("agg", "sum"), "altogether": ("agg", "sum"),
    "in all": ("agg", "sum"), "all told": ("agg", "sum"), "overall": ("agg", "sum"), "added up": ("agg", "sum"),
    "add up": ("agg", "sum"),
    "summed": ("agg", "sum"), "summed up": ("agg", "sum"),
    "maximum": ("rank", "max"), "max": ("rank", "max"), "highest": ("rank", "max"), "peak": ("rank", "max"),
    "longest": ("rank", "longest"), "worst": ("rank", "max"), "largest": ("rank", "max"), "biggest": ("rank", "max"),
    "slowest": ("rank", "max"), "most": ("rank", "most"), "the most": ("rank", "most"), "top": ("rank", "max"),
    "minimum": ("rank", "min"), "min": ("rank", "min"), "lowest": ("rank", "min"), "shortest": ("rank", "shortest"),
    "smallest": ("rank", "min"), "fewest": ("rank", "min"), "least": ("rank", "min"), "the least": ("rank", "min"),
    "quickest": ("rank", "min"), "fastest": ("rank", "min"), "busiest": ("rank", "most"), "quietest": ("rank", "min"),
    "last": ("order", "latest"), "latest": ("order", "latest"), "most recent": ("order", "latest"),
    "recent": ("order", "latest"), "current": ("order", "latest"), "currently": ("now", ""),
    "first": ("order", "earliest"), "earliest": ("order", "earliest"), "oldest": ("order", "earliest"),
    "share of": ("agg", "share"), "fraction of": ("agg", "share"), "percentage of": ("agg", "share"),
    "what share": ("agg", "share"), "what fraction": ("agg", "share"), "ratio": ("agg", "share"),
    "proportion of": ("agg", "share"), "rate": ("agg", "share"),
    "per": ("group", ""), "by": ("group", ""), "for each": ("group", ""), "each": ("group", ""),
    "for every": ("group", ""), "broken down by": ("group", ""), "breakdown": ("group", ""),
    "over time": ("bucket", "auto"), "trend": ("bucket", "auto"), "hourly": ("bucket", "3600"),
    "daily": ("bucket", "86400"), "per minute": ("bucket", "60"), "per hour": ("bucket", "3600"),
    "per day": ("bucket", "86400"), "by minute": ("bucket", "60"), "by hour": ("bucket", "3600"),
    "by day": ("bucket", "86400"), "each minute": ("bucket", "60"), "each hour": ("bucket", "3600"),
    "each day": ("bucket", "86400"), "every hour": ("bucket", "3600"),
    "rank": ("sort", ""), "sort": ("sort", ""),
    "minute": ("period", "60"), "hour": ("period", "3600"), "day": ("period", "86400"),
    "now": ("now", ""), "right now": ("now", ""), "at the moment": ("now", ""), "currently": ("now", ""),
    "at present": ("now", ""), "still": ("still", ""),
    "were": ("past", ""), "was": ("past", ""), "did": ("past", ""), "had": ("past", ""), "got": ("past", ""),
    "been": ("past", ""), "ended": ("past", ""), "ended up": ("past", ""), "end up": ("past", ""),
    "is": ("present", ""), "are": ("present", ""),
    "not": ("neg", ""), "excluding": ("neg", ""), "except": ("neg", ""), "except for": ("neg", ""),
    "other than": ("neg", ""), "apart from": ("neg", ""), "never": ("neg", "never"), "but not": ("neg", ""),
    "but never": ("neg", "never"), "nobody": ("neg", "never"), "no one": ("neg", "never"),
    "rather than": ("neg", ""), "instead of": ("neg", ""),
    "in gib": ("unit", "GiB"), "in gb": ("unit", "GB"), "in mib": ("unit", "MiB"), "in mb": ("unit", "MB"),
    "in minutes": ("unit", "min"), "in hours": ("unit", "h"), "in seconds": ("unit", "s"),
    "in percent": ("unit", "%"), "as a percentage": ("unit", "%"),
    "mention": ("search", ""), "contain": ("search", ""), "say": ("search", ""), "match": ("search", ""),
    "compare": ("compare", ""), "versus": ("compare", ""), "vs": ("compare", ""),
    "ago": ("ago", ""),   # "how long ago was the last reboot": the time from a row's time to now
    "only": ("only", ""),   # before or after a value a row has one of ("notified only"), it says nothing more
    "wait": ("wait", ""), "waited": ("wait", ""),   # a duration's verb: with a duration only ("waited to be acked")
    "distinct": ("distinct", ""), "different": ("distinct", ""), "unique": ("distinct", ""),
    "happen": ("filler", ""), "see": ("filler", ""), "have": ("filler", ""), "get": ("filler", ""),
    "seconds": ("unit", "s"), "bytes": ("unit", "bytes"),   # a unit named bare ("total seconds lost"): in it
    "take": ("filler", ""), "it": ("filler", ""),
    "controller": ("filler", ""), "the controller": ("filler", ""), "sigma": ("filler", ""), "go": ("filler", ""),
    "there": ("filler", ""), "have we": ("filler", ""), "we have": ("filler", ""), "been": ("past", ""),
    "until": ("filler", ""), "till": ("filler", ""), "across": ("filler", ""), "reach": ("filler", ""),
    "report": ("filler", ""), "send": ("filler", ""), "sent": ("filler", ""), "use": ("filler", ""),
    "hit": ("filler", ""), "affect": ("filler", ""), "experience": ("filler", ""), "record": ("filler", ""),
    "spend": ("filler", ""), "run": ("filler", ""), "managed": ("filler", ""), "issue": ("filler", ""),
    "handle": ("filler", ""), "catch": ("filler", ""), "caught": ("filler", ""), "notice": ("filler", ""),
    "keep": ("filler", ""), "kept": ("filler", ""), "stay": ("filler", ""), "remain": ("filler", ""),
    "related": ("filler", ""), "related to": ("filler", ""), "how much": ("filler", ""),
    "go through": ("filler", ""), "been through": ("filler", ""), "come from": ("filler", ""),
    "everything": ("filler", ""), "anything": ("filler", ""), "single": ("single", ""),
    "in terms of": ("filler", ""),   # "affect in terms of jobs": which jobs
    "sit": ("filler", ""), "rack up": ("filler", ""), "clock up": ("filler", ""),
    "cluster": ("filler", ""), "whole cluster": ("filler", ""),   # "across the cluster": all of its rows
    "cluster wide": ("filler", ""),   # "cluster-wide": all of its rows
    "reading": ("reading", ""),   # after an order or a measure ("at last reading", "the load reading"): its row
    # a row's own start: understood only with a time range that says since when ("new incidents in the past hour")
    "new": ("new", ""), "newly": ("new", ""),
    # a copula before a category's value ("marked resolved"): understood only when a value follows
    "marked": ("copula", ""), "marked as": ("copula", ""), "flagged": ("copula", ""), "flagged as": ("copula", ""),
    "labelled": ("copula", ""), "labeled": ("copula", ""), "tagged": ("copula", ""), "tagged as": ("copula", ""),
    "set to": ("copula", ""), "turn out": ("copula", ""), "turn out to be": ("copula", ""),
    "come back": ("copula", ""), "come back as": ("copula", ""),   # "came back failed": a result (else a return)
    "after": ("after", ""), "because": ("after", ""), "caused by": ("after", ""), "due": ("after", ""),
    # a relation to rows of another entity ("incidents not followed by any action", "closed without a drain")
    "followed by": ("rel", ""), "led to": ("rel", ""), "lead to": ("rel", ""), "leading to": ("rel", ""),
    "resulted in": ("rel", ""), "result in": ("rel", ""), "ended in": ("rel", ""), "ended with": ("rel", ""),
    "ended up with": ("rel", ""), "ended up in": ("rel", ""), "end up with": ("rel", ""), "end up in": ("rel", ""),
    "triggered": ("rel", ""), "without": ("rel", "not"), "with no": ("rel", "not"), "had no": ("rel", "not"),
}
YESNO_START = ("is", "are", "was", "were", "did", "does", "do", "has", "have", "had", "any", "can")
CMP = re.compile(
    r"\b(more than|greater than|longer than|higher than|larger than|over|above|exceeding|at least|fewer than|"
    r"less than|shorter than|lower than|under|below|at most|no more than|not more than)\s+"
    r"(\d+(?:\.\d+)?|once|twice|thrice|one|two|three|four|five|six|seven|eight|nine|ten|a|an)\b\s*"
    r"(times?|seconds?|secs?|minutes?|mins?|hours?|hrs?|steps?|percent|s|h|%)?\b")
# "two or more times", "5 or fewer steps", "30 s or longer": the number first, the bound after it
CMP_UNIT = r"(times?|seconds?|secs?|minutes?|mins?|hours?|hrs?|steps?|percent|s|h|%)"
CMP_OR = re.compile(
    r"\b(\d+(?:\.\d+)?|once|twice|thrice|one|two|three|four|five|six|seven|eight|nine|ten)\s*" + CMP_UNIT + r"?\s+or\s+"
    r"(more|greater|longer|higher|larger|over|above|fewer|less|shorter|lower|under|below)\b(?:\s*" + CMP_UNIT
    + r"\b)?")
CMP_OPS = {"more than": ">", "greater than": ">", "longer than": ">", "higher than": ">", "larger than": ">",
           "over": ">", "above": ">", "exceeding": ">", "at least": ">=", "fewer than": "<", "less than": "<",
           "shorter than": "<", "lower than": "<", "under": "<", "below": "<", "at most": "<=",
           "no more than": "<=", "not more than": "<="}
CMP_UNITS = {"second": 1, "sec": 1, "s": 1, "minute": 60, "min": 60, "hour": 3600, "hr": 3600, "h": 3600}
HYPO = re.compile(r"\b(if|suppose|supposing|what happens|what would happen|would happen|would be affected|"
                  r"would it affect|what if|would \w+ing)\b")
HYPO_VERBS = {"drain": "drain", "reboot": "reboot", "restart": "reboot", "take down": "down", "take out": "drain",
              "take out of service": "drain", "take offline": "down",
              "took out": "drain", "remove": "drain", "lose": "down", "go down": "down", "went down": "down",
              "goes down": "down", "fail": "down", "die": "down", "crash": "down", "power off": "down",
              "shut down": "down", "kill": "down", "went offline": "down", "go offline": "down", "down": "down",
              "offline": "down"}
HYPO_WORDS = ("affect", "affected", "hit", "impact", "impacted", "happen", "if", "suppose", "supposing", "would",
              "what if", "running", "run", "interrupted", "at risk", "risk")
PAST_FORMS = {"ran", "went", "came", "took", "saw", "fell", "wrote", "happened", "occurred"}
COMMANDS = re.compile(r"^\s*(please )?(drain|undrain|resume|reboot|requeue|cancel|scancel|kill|delete|drop|restart|stop|"
                      r"start|set|update|remove|suspend|release|hold|power|shut|run|insert|truncate|alter|create|"
                      r"ignore|forget)\b")
# after a rule word they only repeat it ("xid errors", "prolog failures", "a GPU fell off the bus")
COUNTS = {w: i for i, w in enumerate("two three four five six seven eight nine ten".split(), 2)}   # as words
WEAK_NOUNS = {stem(w) for w in ("error", "failure", "fault", "problem", "issue", "gpu")}
# A second question in one: ", and how many of them ...", "and the first time one opened", "and at which step"
CLAUSE = re.compile(r",?\s+and\s+(?=(?:how|what|which|when|why|(?:at|in|for|on|to|from|with) (?:what|which)|"
                    r"the (?:first|last|latest|earliest))\b)")
REFERENTS = {"each", "one", "ones"}   # in a second part: the first part's rows (like "them", a function word)
FILTERS = ("node", "job", "rule", "cond", "json")
RANK = ("neg", "weak", "entity", "measure", "metric", "cond", "time", "dim", "column", "json")   # senses, first first
HOMES = {"node": "nodes", "job": "kpis", "rule": "incidents"}   # the entity a node, job or fault is, by itself
CONTENT = ("entity", "cond", "measure", "metric", "column", "time", "json", "rule")   # what a word can mean
WHILE_JOB = re.compile(r"\b(?:while|when) job #?(\d+) (?:ran|was running|was active|trained|run)"
                       r"(?: on (?:it|there|that node))?\b")
SPAN_OF = re.compile(r"\b(?:(?:time|delay|gap|duration|latency|how long|how much time)(?: it took| did it take)? "
                     r"(?:between|from)|between)\b")
# "break the actions down by state": the verb's two halves around its object are one grouping word, "by"
BREAK_DOWN = re.compile(r"\b(?:break|breaking|broke|split|splitting)\b(?: [\w-]+){1,4}? (down|up)(?= by\b)")
# "break down the reboots by node", "split by where it resumed": the verb before its object, "by" the grouping word
BREAK_DOWN_BY = re.compile(r"\b(?:(?:break|breaking|broke) (?:down|up)|split|splitting)\b(?=(?: [\w'-]+){0,5}? by\b)")
# "how long did it last", "which stay lasted longest": the verb (how long something was), never the latest one
LASTED = re.compile(r"\blast(?:ed|s|ing)\b|\bhow long\b.*\b(last)\b(?=\s*(?:$|[?.,!;]|for|on|in|at|during)\b)")
# buckets of a stated size: "in 10-minute buckets", "5 minute intervals", "every 15 minutes"
BUCKETS = re.compile(r"\b(?:in |into |by |per )?(\d+)[- ]?(second|sec|minute|min|hour)s? (?:buckets?|bins?|intervals?|"
                     r"slots?)\b|\bevery (\d+) (second|sec|minute|min|hour)s?\b")
# a percentile, as the nearest rank: "p90", "the 95th percentile"
PERCENTILE = re.compile(r"\bp([1-9]\d?)\b|\b(?:the )?([1-9]\d?)(?:st|nd|rd|th)? percentile(?: of)?\b")
SPEED = {"slowest", "fastest", "quickest"}   # superlatives of how long a row took, where no measure is named
NOW = re.compile(r"\b(?:right now|at (?:the|this) moment|at present|at this point|currently|as of now|by now|atm|"
                 r"now)\b")
# A time with no bound: the whole history, as a question without a time range reads ("so far", "to date")
UNBOUNDED = re.compile(r"\b(?:so far|to date|up to now|until now|till now|up till now|(?:of |over )?all time|"
                       r"(?:over|across) all(?= \w)(?! time)|"   # "over all incidents": every one, as with no word
                       r"(?:over|across|for|during|in|throughout) (?:its|their|the) (?:whole|entire|full) "
                       r"(?:run|runs|life|lifetime|history))\b")   # "over its whole run": the job's every row
# The site as the subject of a light verb ("have we done", "we've had", "did we see"): who saw it is no condition
SUBJECT = re.compile(r"\b(?:have we|did we|do we|we have|we had|we|have i|did i|i have|i)(?: ever)? (?:done|do|did|"
                     r"had|have|seen|see|saw|got|get|gotten|experienced|observed)\b")
# Verbs of a thing becoming faulty ("the loss went NaN", "node3 turned bad"): when it did is the fault's own time
BECAME = {stem(w) for w in ("go", "went", "gone", "turn", "turned", "become", "became")}
# Verbs of a fault's report being had ("seen", "logged", "reported", "hit"): the reports, not the incident opened
SEEN = {stem(w) for w in ("see", "seen", "saw", "log", "logged", "report", "reported", "hit")}
# Verbs that say a row was made (filed, submitted, raised): every row was, so they constrain nothing
MADE = {stem(w) for w in ("file", "filed", "submit", "submitted", "create", "created", "generate", "generated",
                          "produce", "produced", "emit", "emitted", "raise", "raised", "issue", "issued", "make",
                          "made", "write", "wrote", "written", "throw", "threw", "thrown")}
# Verbs of appearing ("showed up", "came up", "popped up", "appeared"): every row that is there did, so they
# constrain nothing
APPEARED = re.compile(r"\b(?:(?:show|shows|showed|shown|showing|come|comes|came|coming|turn|turns|turned|turning|pop|"
                      r"pops|popped|popping|crop|crops|cropped|cropping) up|appear|appears|appeared|appearing|"
                      r"(?:come|comes|came|arrive|arrives|arrived)(?= (?:after|before|past|in time)\b))\b")
#   and of arriving before when ("acks came after their deadline"): the row's own time, which the words after say
UN = re.compile(r"\bun([a-z]{4,})\b")   # a negative prefix: "unclosed", "unacknowledged"
HYPHENATED = re.compile(r"(?<![\w'-])[a-z]+(?:-[a-z]+)+(?![\w-])")   # words joined by hyphens, no digits
QUOTED = re.compile(r"'([^']+)'|\"([^\"]+)\"")
PREPOSITIONS = {"in", "on", "at", "for", "from", "with", "into", "to", "during", "under"}
TIME_ORDER = {"by": "<=", "before": "<", "after": ">"}   # between two times of a row: "acked by the deadline"
DETERMINERS = {stem(w) for w in ("the", "a", "an", "its", "their", "his", "her", "our", "your")}
# inside a phrase ("steps were lost"; "to get acknowledged": to acknowledge)
AUX = {stem(w) for w in ("was", "were", "been", "be", "did", "has", "have", "had", "is", "are", "get", "got", "gets",
                         "getting")}
UNKNOWN_NODE = re.compile(r"node\d+|[a-z]+\d*(?:-[a-z0-9]+)*-\d+|gpu\d+-\w+")


def percentile(agg: str) -> int | None:
    """The percentile an aggregate names ("p90": 90), or None."""
    return int(agg[1:]) if re.fullmatch(r"p\d+", agg or "") else None


@dataclass(frozen=True)
class Meaning:
    kind: str                 # entity cond measure time column ref dim rule json q agg rank order group bucket ...
    entity: str | None = None
    value: object = None
    learnt: bool = False      # from a name or value in the data, not from the schema document (vocabulary.yaml)
    weak: bool = False        # a value the schema lists that no row has: it fits, but weighs less in the choice
    noun: bool = False        # a value spelled as the noun of an entity that is those rows: fits, weighs nothing
    modifier: bool = False    # a value that modifies the entity's own noun ("remediation stage"): name or value


@dataclass
class Span:
    start: int                # token indexes [start, end)
    end: int
    text: str
    meanings: list[Meaning]


@dataclass
class Query:
    """What the question asks, in slots."""
    entity: Entity
    conds: list[Cond] = field(default_factory=list)
    judged: str = ""   # a fault's words that are the question's only noun ("the slow nodes"): a judgement of the
    #                    thing with several readings (its fault's incidents, or a measure of it), asked back
    cmp: tuple[str, float, str] | None = None   # a comparison on the measure: (op, value, unit)
    since: float | None = None
    until: float | None = None
    period: str = ""
    qkind: str = "list"                   # list count duration when why yesno
    agg: str = ""                         # avg median sum share count
    rank: str = ""                        # max min (superlatives)
    order: str = ""                       # latest earliest
    measure: Column | None = None
    time_col: str | None = None
    timed: str = ""                       # the time the verb names ("closed": closed_at), where it is not the
    #                                     entity's own: the time range and the buckets are of it
    group: list[str] = field(default_factory=list)
    bucket: int | None = None
    project: str | None = None            # "which nodes ..." -> one row per node
    show: list[str] = field(default_factory=list)   # columns asked for ("what state", "what action")
    count_distinct: bool = False          # "how many nodes ...": count them, do not list them
    per_item: bool = False                # "how long did each validation take": no aggregate over them
    plural: bool = False                  # the entity named in the plural ("when were the drains"): every row
    assumed: str = ""                     # a default taken for one value of several rows (latest, sum, avg): said
    which: bool = False                   # "which <entity> ...": the rows (one per label), not a number
    compare: bool = False                 # "compare ... on node1 and node2": one row each
    exclude: dict[str, list] = field(default_factory=dict)   # negated filters: node/job/rule -> values
    anti: bool = False                    # "which nodes were never drained": the projection's others
    without: Entity | None = None         # "drained but never rebooted": the projection less that entity's
    having: tuple[str, float] | None = None
    having_of: str = ""                   # the having counts different values of this column ("on more than one node")
    distinct_of: str = ""                 # each projected row counts different values of this ("different kinds")
    latest_each: bool = False             # only each projected node's or job's latest reading ("... now")
    top: int | None = None
    hypo: str = ""
    versus: object = None                 # a second time range the same value is asked of (timerange.TimeRange)
    ago: bool = False                     # "how long ago": the measure is the time from the row's time to now
    unit: str = ""                        # "in GiB", "in minutes": the measure in that unit
    search: list[str] = field(default_factory=list)   # quoted text the rows mention
    noun_of_name: str = ""                # a value word read as the noun of the name before it ("AER errors")
    sort: bool = False                    # "rank the nodes by ...": every group, the largest value first
    nodes: list[str] = field(default_factory=list)
    jobs: list[int] = field(default_factory=list)
    rules: list[str] = field(default_factory=list)
    understood: list[str] = field(default_factory=list)
    extras: list[Query | None] = field(default_factory=list)   # "..., and how many of them led to a drain": a
    #                                     second part asked of the same rows (None: one this entity cannot answer)

    def one_value(self) -> bool:
        """'what stage is node2 in': one value of the entity's category label (singular), of one node or job, with
        nothing that says which of its rows."""
        ent = self.entity
        return (self.which and not self.plural and self.project == ent.label and len(self.nodes) + len(self.jobs) == 1
                and getattr(ent.columns.get(ent.label), "role", "") == "category" and self.qkind == "list"
                and not (self.agg or self.rank or self.order or self.group or self.bucket is not None or self.having
                         or self.measure or self.since is not None or self.until is not None or self.extras))


@dataclass
class Parse:
    query: Query | None
    unknown: list[str]                    # words or parts not understood (for this entity)
    unknown_nodes: list[str] = field(default_factory=list)
    understood: list[str] = field(default_factory=list)
    command: str = ""                     # the question is an order ("drain node3"): the companion only reads
    # other readings of the same words, each understood in full (sigma.companion.fast asks back when their answers
    # differ from the query's)
    alternatives: list[Query] = field(default_factory=list)


class Lexicon:
    """Phrases (tuples of stems) -> meanings, for one model."""

    def __init__(self, model: Model):
        self.phrases: dict[tuple[str, ...], list[Meaning]] = {}
        add = self._add
        for words, (kind, value) in GRAMMAR.items():
            add(phrase_stems(words), Meaning(kind, None, value))
        for ref, phrases in model.refs.items():
            for p in phrases:
                add(p, Meaning("dim", None, ref))
        for p, likes in model.rule_words.items():
            add(p, Meaning("rule", None, tuple(likes)))
        for rid in model.rule_ids:
            add((rid,), Meaning("rule", None, (rid,)))
        reserved = {p for ps in model.refs.values() for p in ps}
        nouns = {p for ent in model.entities.values() for p in ent.words}
        reserved |= nouns
        reserved |= {phrase_stems(w) for w in GRAMMAR}
        for ent in model.entities.values():
            for p in ent.words:
                add(p, Meaning("entity", ent.name, learnt=not ent.explicit))
            for p, cond in ent.conds.items():
                add(p, Meaning("cond", ent.name, cond))
            for p in ent.row_words:
                add(p, Meaning("row", ent.name))
            for p in ent.by_words:
                add(p, Meaning("by", ent.name))
            for p, device in ent.devices.items():
                add(p, Meaning("device", ent.name, device))
            for col in ent.columns.values():
                kind = {"measure": "measure", "time": "time", "category": "column", "text": "column"}.get(col.role)
                if kind:
                    for p in col.words:
                        add(p, Meaning(kind, ent.name, col.name, learnt=col.learnt))
                explicit = {c: {w for v in vals.values() for w in v} for c, vals in ent.explicit_values.items()}
                for value, phrases in col.values.items():
                    learnt = value not in ent.explicit_values.get(col.name, {})
                    if ent.measure_names and col.name == ent.measure_names["column"]:
                        for p in phrases:
                            add(p, Meaning("metric", ent.name, value, learnt))
                        continue
                    # set membership: equality for one value, and right for SLURM's comma-separated flags too
                    cond = Cond(ent.name, f"instr(',' || {col.name} || ',', ?) > 0", f"{col.name} {value}",
                                col.name, (f",{value},",))
                    for p in phrases:   # a value spelled by the noun of an entity that is those rows of this
                        #   one ("requeue" actions: restarts): a reading only where that entity does not fit
                        noun = p in nouns and p not in explicit.get(col.name, ()) and any(
                            p in other.words and _subset(other, ent, col.name, value)
                            for other in model.entities.values())
                        if p in reserved and p not in explicit.get(col.name, ()) and not noun:
                            continue
                        add(p, Meaning("cond", ent.name, cond, learnt, value in col.unseen, noun))
                for key in col.keys:
                    add(phrase_stems(key) + ("#",), Meaning("json", ent.name, (col.name, key), True))
        for w in MADE:   # a verb that says a row was made fits every entity (a column's word of some, too)
            add((w,), Meaning("filler"))
        for p, likes in _rule_id_words(model.rule_ids).items():   # every other word's meaning comes first, and a
            #   noun that names an entity stays its own ("nan loss events": events, not the kpi-nan-loss-event rule)
            if _determined(p) not in self.phrases and not any(
                    m.kind == "entity" for w in p for m in self.phrases.get((w,), [])):
                add(p, Meaning("rule", None, likes))
        for ent in model.entities.values():   # a compound's head noun alone ("xid lines": log lines), where it
            for p in ent.words:                #  means nothing else; it weighs less than the whole compound
                if len(p) > 1 and (p[-1],) not in self.phrases and p[-1] not in STOPWORDS:
                    self._add((p[-1],), Meaning("entity", ent.name, learnt=not ent.explicit, weak=True))
        # a name whose modifier is a value of its own rows ("remediation stage": stages, and the stage remediating)
        # means that value too, as "validation stage" does; the name alone where the question asks that column
        for ent in model.entities.values():
            for p in (p for p in ent.words if len(p) > 1):
                for m in self.phrases.get(_determined(p[:-1]), []):
                    if m.kind == "cond" and m.entity == ent.name:
                        self._add(p, Meaning("cond", ent.name, m.value, m.learnt, m.weak, modifier=True))
        self.longest = max(len(p) for p in self.phrases)
        # phrases by their words, in any order: a compound written the other way round ("ambiguous isolation"), and
        # a phrase whose words are apart in the question ("how much training time did job 1 lose")
        self.by_words: dict[frozenset, list[tuple[str, ...]]] = {}
        self.containing: dict[str, list[tuple[str, ...]]] = {}
        for p, meanings in self.phrases.items():
            if len(p) > 1 and "#" not in p and "<det>" not in p and any(m.kind in CONTENT for m in meanings):
                self.by_words.setdefault(frozenset(p), []).append(p)
                for w in set(p):
                    self.containing.setdefault(w, []).append(p)

    def _add(self, phrase: tuple[str, ...], meaning: Meaning) -> None:
        if phrase:
            bucket = self.phrases.setdefault(_determined(phrase), [])
            if meaning not in bucket:
                bucket.append(meaning)

    def match(self, stems: list[str], i: int, free: list[bool]) -> tuple[int, list[Meaning], list[float]]:
        """The longest phrase starting at token i over free tokens: (length, meanings, numbers in it). Auxiliaries
        inside it do not count ("steps were lost" is "steps lost") unless the phrase has them ("had no"); one
        determiner stands for another ("miss its deadline" is "missed the deadline")."""
        stems = [*stems[:i], *_determined(tuple(stems[i:]))]
        for n in range(min(self.longest + 2, len(stems) - i), 0, -1):
            if not all(free[i:i + n]):
                continue
            if n > 1 and tuple(stems[i:i + n]) in self.phrases and not self._learnt_only(tuple(stems[i:i + n])):
                #                                                   a phrase with its auxiliary ("had no")
                return n, self._led(tuple(stems[i:i + n])), []
            if n > 1 and (stems[i] in AUX or stems[i + n - 1] in AUX):
                continue
            window = [w for k, w in enumerate(stems[i:i + n]) if k == 0 or w not in AUX]
            if len(window) > self.longest:
                continue
            if len(window) < n:   # across an auxiliary only a measure's words ("steps were lost", "memory is free")
                found = [m for m in self.phrases.get(tuple(window), []) if m.kind in ("measure", "metric")]
                if found:
                    return n, found, []
                continue
            nums = [_number(w) for w in window]
            key = tuple("#" if x is not None and not w.isalpha() else w for w, x in zip(window, nums))
            for k in (tuple(window), key):
                if k in self.phrases and not self._learnt_only(k):
                    return n, self._led(k), [x for x, w in zip(nums, k) if w == "#"]
            others = self.by_words.get(frozenset(window), [])   # one phrase, its words in another order, where
            if n > 1 and len(others) == 1 and len(others[0]) == n and not all(   # a word means nothing alone
                    (w,) in self.phrases or w in STOPWORDS for w in window):
                return n, self.phrases[others[0]], []
        return 0, [], []

    def _learnt_only(self, phrase: tuple[str, ...]) -> bool:
        """A phrase of several words that only names a value learnt from the data and starts with the name of what
        rows refer to ("nodes down": the incident category node-down), each of whose words the schema document gives
        a meaning of its own ("nodes", "down": a node's state): the document's words are read."""
        return len(phrase) > 1 and all(m.learnt for m in self.phrases[phrase]) and any(
            m.kind == "dim" for m in self.phrases.get(phrase[:1], [])) and all(
            any(not m.learnt for m in self.phrases.get((w,), [])) for w in phrase)

    def agree(self, span: tuple[str, ...], meanings: list[Meaning], free: dict[str, int],
              names: dict[int, set[str]]) -> tuple[list[int], list]:
        """Words apart from a span that complete one of its phrases (free: stem -> token index): "training time"
        with "lose" is "training time lost"; "submit" with "validation job" is the action. The span keeps only the
        meanings that phrase shares with it: (the tokens it takes, those meanings), or ([], []). A word that names
        the entity of those meanings (names: token index -> entities) stays its own ("incidents per severity")."""
        best: tuple[list[int], list] = ([], [])
        for p in {p for w in set(span) for p in self.containing.get(w, [])}:
            extra = set(p) - set(span)
            shared = [m for m in meanings if m in self.phrases[p] and m.kind in CONTENT]
            if extra and extra <= set(free) and shared and len(extra) > len(best[0]) and not any(
                    names.get(free[w], set()) & {m.entity for m in shared} for w in extra):
                best = ([free[w] for w in extra], shared)
        return best

    def _led(self, phrase: tuple[str, ...]) -> list[Meaning]:
        """A phrase's meanings; one led by a preposition also means the rest ("in validation": "validation")."""
        found = self.phrases[phrase]
        if len(phrase) > 1 and phrase[0] in PREPOSITIONS and not any(f.kind == "measure" for f in found):
            found = found + [m for m in self.phrases.get(phrase[1:], []) if m not in found]   # ("to ack", a
            #                                                    duration, is not the time acked nor "acked")
        return found

    def split_measure(self, stems: list[str], i: int, free: list[bool]) -> tuple[int, int, list[Meaning]]:
        """A measure's verb and its object on either side of a superlative ("lost the most time" is "lost time",
        ranked): (the superlative's length, the object's length, the measure meanings), or (0, 0, []). Only a
        phrase that names a measure joins across it, so the object's word is never read apart from its verb."""
        stems = [*stems[:i], *_determined(tuple(stems[i:]))]
        for r in (2, 1):
            if not (i + 1 + r < len(stems) and all(free[i:i + 1 + r]) and any(
                    m.kind == "rank" for m in self.phrases.get(tuple(stems[i + 1:i + 1 + r]), []))):
                continue
            start = i + 1 + r
            for k in range(min(self.longest - 1, len(stems) - start), 0, -1):
                found = [m for m in self.phrases.get((stems[i], *stems[start:start + k]), []) if m.kind == "measure"]
                if found and all(free[start:start + k]):
                    return r, k, found
            return 0, 0, []
        return 0, 0, []


def _subset(part: Entity, whole: Entity, column: str, value: str) -> bool:
    """`part` is the rows of `whole`'s table with that value ("restarts": actions WHERE kind = 'requeue')."""
    return part is not whole and table_of(part) == table_of(whole) and bool(
        re.search(rf"\b{column}\s*=\s*'{re.escape(value)}'", part.source))


def _rule_id_words(rule_ids) -> dict[tuple[str, ...], tuple[str, ...]]:
    """Rule ids in the words they are made of: "kernel hard lockup" and "hard lockup" (kernel-hard-lockup); a phrase
    several ids end in is each of them, a last word too where several ids share it ("lockups": hard and soft). Not
    with numbers: "xid 79" is the schema document's (a rule or an event's field)."""
    out: dict[tuple[str, ...], list[str]] = {}
    for rid in sorted(rule_ids):
        parts = rid.split("-")
        if len(parts) < 2 or not all(re.fullmatch(r"[a-z]+", p) for p in parts):
            continue
        for i in range(len(parts)):
            out.setdefault(phrase_stems(" ".join(parts[i:])), []).append(rid)
    return {p: tuple(dict.fromkeys(v)) for p, v in out.items()
            if not all(w in STOPWORDS for w in p) and (len(p) > 1 or len(v) > 1)}


def _determined(phrase: tuple[str, ...]) -> tuple[str, ...]:
    """The phrase with each determiner as one word: "the deadline", "its deadline" and "their deadline" are one."""
    return tuple("<det>" if w in DETERMINERS else w for w in phrase)


def _number(word: str) -> float | None:
    try:
        return float(word.lstrip("#").rstrip("%"))
    except ValueError:
        return None


def _cmp(word: str, raw: str, unit: str) -> tuple[str, float, str]:
    """(operator, value, unit) of "more than 3 times", "over 30 s", "at least 2 minutes" (durations in seconds)."""
    op = CMP_OPS[word]
    value = float(NUMBER_WORDS.get(raw, raw))
    base = unit.rstrip("s") or unit
    if raw in ("once", "twice", "thrice") or base == "time":
        return op, value, "times"
    if base in CMP_UNITS:
        return op, value * CMP_UNITS[base], "s"
    if base == "step":
        return op, value, "steps"
    return op, value, "%" if unit in ("%", "percent") else ""


def _kind_of(unit: str) -> str:
    """A measure's unit as a comparison names it: a duration in seconds whatever its unit."""
    return "s" if unit in ("s", "min", "h") else unit


def _likes(value) -> list[str]:
    """LIKE patterns of a rule meaning, a number from the question put in for '#' ("xid 79")."""
    likes, nums = value if isinstance(value[0], tuple) else (value, [])
    return [like.replace("#", str(int(nums[0]))) if nums else like for like in likes]


def _bare_count(q: Query) -> bool:
    """'how often', 'how many times': a count with nothing of its own."""
    return q.qkind == "count" and not (q.conds or q.measure or q.agg or q.rules or q.nodes or q.jobs or q.exclude
                                       or q.since is not None or q.until is not None)


def _bare_duration(q: Query) -> bool:
    """'how long was it': a duration with nothing of its own."""
    return q.qkind == "duration" and q.measure is None and q.time_col is None and not (
        q.conds or q.agg or q.rank or q.order or q.rules or q.nodes or q.jobs or q.exclude or q.show
        or q.since is not None or q.until is not None)


def _from(ent: Entity) -> str:
    return f"({ent.source})" if ent.source.upper().startswith("SELECT") else ent.source


def _json_cond(ent: Entity, value) -> Cond:
    (column, key), nums = value
    return Cond(ent.name, f"json_extract({column}, '$.{key}') = ?", f"{key} {nums[0]:g}", "", (nums[0],))


class Parser:
    def __init__(self, model: Model):
        self.model = model
        # the stems of the question's second part while it is parsed; per thread (one parser serves every request)
        self._local = threading.local()
        self.lexicon = Lexicon(model)

    def parse(self, question: str, now: float, tz: tzinfo | None) -> Parse:
        q = re.sub(r"\b([a-z]+)-wise\b", r"\1", normalise(question))   # "step-wise, where is job 1": its step
        q = HYPHENATED.sub(lambda m: m.group(0) if self._known(m.group(0)) else m.group(0).replace("-", " "),
                           q)   # "shadow-mode" is "shadow mode"; a rule id stays one word
        q = UN.sub(lambda m: m.group(0) if self._means(m.group(0)) or not self._means(m.group(1), ("time", "cond"))
                   else "not " + m.group(1), q)   # "unclosed" is "not closed" where only "closed" means something
        command = COMMANDS.match(q)
        if command:   # an order, not a question: nothing here acts
            return Parse(None, [command.group(2)], [], command=command.group(2))
        first, *rest = CLAUSE.split(q, maxsplit=1)
        # the names its first part's rows may have
        self._local.second = [t.stem for t in tokenize(rest[0])] if rest else []
        parsed = self._parse(first, now, tz)
        if rest and parsed.query is not None:   # a second part, asked of the same rows as the first
            follow = self._parse(rest[0], now, tz, parsed.query.entity)
            parsed.unknown += follow.unknown
            parsed.understood += ["and"] + follow.understood
            for query in [parsed.query] + parsed.alternatives:
                other = follow if query is parsed.query else self._parse(rest[0], now, tz, query.entity)
                if other.unknown and query is not parsed.query:   # not every word fits it: not a reading
                    parsed.alternatives = [a for a in parsed.alternatives if a is not query]
                elif other.unknown:
                    query.extras.append(None)
                elif _bare_duration(other.query) and query.measure is not None and _kind_of(
                        query.measure.unit) == "s":   # "the longest stay ..., and how long was it": its measure,
                    continue                          # which the first part's answer already shows
                elif _bare_count(other.query) and query.qkind == "list":   # "which playbooks ..., and how often"
                    query.qkind = "count"
                    if query.show and not query.project:
                        query.project = query.show.pop(0)
                else:
                    query.extras.append(other.query)
        elif rest:
            parsed.unknown.append(rest[0])
        return parsed

    def _means(self, word: str, kinds=CONTENT) -> bool:
        return any(m.kind in kinds for m in self.lexicon.phrases.get((stem(word),), []))

    def _known(self, word: str) -> bool:
        """A hyphenated word that is a name of its own: a rule id, a node, a phrase or a word of one ("resumed from a
        just-in-time checkpoint"), a number ("twenty-four")."""
        return (word in self.model.rule_ids or word in self.model.nodes or (stem(word),) in self.lexicon.phrases
                or stem(word) in self.lexicon.containing or any(part in timerange.COUNTS for part in word.split("-")))

    def _time_order(self, tokens, stems: list[str], free: list[bool]) -> list[Span]:
        """Two times of one row compared: "acked by their deadline", "delivered after the deadline" is a condition
        on the row (negated as any condition is: "not acked by the deadline" includes those never acked)."""
        out = []
        for i in range(1, len(tokens) - 1):
            op = TIME_ORDER.get(tokens[i].text)
            k = i + 1
            while k < len(tokens) - 1 and stems[k] in DETERMINERS:
                k += 1
            if not op or not all(free[i - 1:k + 1]):
                continue
            a, b = (self._times(stems[x]) for x in (i - 1, k))
            text = " ".join(t.text for t in tokens[i - 1:k + 1])
            meanings = [Meaning("cond", e, Cond(e, f"{a[e]} {op} {b[e]}", text, a[e])) for e in a
                        if e in b and a[e] != b[e]]
            if meanings:
                for x in range(i - 1, k + 1):
                    free[x] = False
                out.append(Span(i - 1, k + 1, text, meanings))
        return out

    def _times(self, word: str) -> dict[str, str]:
        """The time column one word names, per entity: as a time ("deadline") or as that time being there
        ("acknowledged": acked_at is set)."""
        out = {}
        for m in self.lexicon.phrases.get((word,), []):
            col = m.value if m.kind == "time" else m.value.column if m.kind == "cond" else ""
            if col and getattr(self.model.entities[m.entity].columns.get(col), "role", "") == "time":
                out.setdefault(m.entity, col)
        return out

    def _overlapping(self, stems: list[str], i: int, n: int, meanings: list[Meaning],
                     free: list[bool]) -> tuple[int, list[Meaning]]:
        """A phrase that overlaps the one matched at i and names the same thing takes its further words too: in
        "1-minute load average" both "1-minute load" and "load average" name the metric, so "average" is part of
        the name and never an aggregate of its own. (The span keeps the meanings both phrases share.)"""
        for j in range(i + 1, i + n):
            trial = [*free[:j], *([True] * (i + n - j)), *free[i + n:]]
            n2, more, _ = self.lexicon.match(stems, j, trial)
            shared = [m for m in meanings if m in more and m.kind in CONTENT]
            if j + n2 > i + n and shared:
                return j + n2 - i, shared
        return n, meanings

    def _parse(self, q: str, now: float, tz: tzinfo | None, only: Entity | None = None) -> Parse:
        """One clause; `only`: the entity a second part is asked of (its referents, "of them", "each", are it)."""
        tokens = tokenize(q)
        if only is not None:
            tokens = [t for t in tokens if t.text not in REFERENTS]
        # "did any node run out of memory? which ones?": the rows' subject named first is what is listed
        self._local.ones = bool(re.search(r"[?.]\s*(?:and )?which ones\b", q))
        if self._local.ones:
            tokens = [t for t in tokens if t.text != "ones"]
        spans: list[Span] = []
        free = [True] * len(tokens)

        def claim(start: int, end: int, meaning: Meaning) -> None:
            idx = [i for i, t in enumerate(tokens) if free[i] and t.start < end and t.end > start]
            if idx:
                for i in idx:
                    free[i] = False
                spans.append(Span(idx[0], idx[-1] + 1, q[start:end].strip(), [meaning]))

        for m in QUOTED.finditer(q):   # 'culprit': text searched for, whatever its words
            claim(m.start(), m.end(), Meaning("text", None, m.group(1) or m.group(2)))
        for m in UNBOUNDED.finditer(q):   # before "now": "until now" is no bound, not the current state
            claim(m.start(), m.end(), Meaning("filler"))
        for m in SUBJECT.finditer(q):
            claim(m.start(), m.end(), Meaning("filler"))
        for m in APPEARED.finditer(q):   # "showed up", "comes up": a row that is there appeared; no condition
            claim(m.start(), m.end(), Meaning("filler"))
        for m in BREAK_DOWN.finditer(q):
            claim(m.start(), m.start() + len(m.group(0).split(" ")[0]), Meaning("filler"))
            claim(m.start(1), m.end(1), Meaning("filler"))
        for m in BREAK_DOWN_BY.finditer(q):
            claim(m.start(), m.end(), Meaning("filler"))
        for m in re.finditer(r"\bout of (?:all|every)(?: the| of the)?\b", q):   # "out of all requests, how many
            claim(m.start(), m.end(), Meaning("agg", None, "of_all"))            # were acked": those, and all
        for m in LASTED.finditer(q):
            a, b = m.span(1) if m.group(1) else m.span()
            claim(a, b, Meaning("filler"))
        for m in NOW.finditer(q):   # a time word, claimed before phrases ("drained at the moment")
            claim(m.start(), m.end(), Meaning("now"))
        for m in PERCENTILE.finditer(q):
            claim(m.start(), m.end(), Meaning("agg", None, f"p{m.group(1) or m.group(2)}"))
        for m in BUCKETS.finditer(q):
            size = int(m.group(1) or m.group(3)) * timerange.UNITS[m.group(2) or m.group(4)]
            if size:
                claim(m.start(), m.end(), Meaning("bucket", None, str(size)))
        tr = timerange.find(q, now, tz)
        if tr:
            for a, b in tr.spans:
                claim(a, b, Meaning("range", None, tr))
            other = timerange.versus(q, tr)   # "vs the hour before that": the same question of a second period
            if other:
                claim(*other.spans[0], Meaning("versus", None, other))
        hypo = HYPO.search(q)
        if hypo:   # the action: its words, with the node it acts on between them ("take node3 out of service")
            for words, verb in sorted(HYPO_VERBS.items(), key=lambda kv: -len(kv[0])):
                head, _, rest = words.partition(" ")
                tail = rest.replace(" ", r"\w* ")
                pattern = rf"\b{head}\w*" + (rf"(?: [\w-]+)? (?P<rest>{tail})" if rest else "")
                for m in re.finditer(pattern + r"\w*\b", q):
                    if m.start() > hypo.start():
                        claim(m.start(), m.start() + len(m.group(0).split(" ")[0]), Meaning("hypo", None, verb))
                        if rest:
                            claim(m.start("rest"), m.end(), Meaning("hypo", None, verb))
            for w in HYPO_WORDS:
                for m in re.finditer(r"\b" + w + r"\b", q):
                    claim(m.start(), m.end(), Meaning("hypo-word", None, w))
        for m in SPAN_OF.finditer(q):   # "the time between the fault and the requeue": two times of one row
            if all(free[i] for i, t in enumerate(tokens) if m.start() <= t.start < m.end()):   # not a time range's
                claim(m.start(), m.end(), Meaning("between"))
        for m in CMP.finditer(q):
            claim(m.start(), m.end(), Meaning("cmp", None, _cmp(m.group(1), m.group(2), m.group(3) or "")))
        for m in CMP_OR.finditer(q):
            word = m.group(3) + " than" if m.group(3) + " than" in CMP_OPS else m.group(3)   # "or more", "or over"
            op, value, unit = _cmp(word, m.group(1), m.group(2) or m.group(4) or "")
            claim(m.start(), m.end(), Meaning("cmp", None, (op + "=", value, unit)))
        n = rf"(\d+|{'|'.join(COUNTS)})"   # "top 3", "top three"
        for m in re.finditer(rf"\btop {n}\b|\b{n} (?=(?:most|worst|busiest|least|slowest|longest)\b)"   # and
                             rf"|\bthe {n} (?=[a-z]+(?: [a-z]+)? (?:that|which|with|who)\b.*\b(?:most|least|fewest|"
                             r"highest|lowest|longest|shortest|worst|largest)\b)", q):   # "the 3 rules that ... most"
            word = m.group(1) or m.group(2) or m.group(3)
            claim(m.start(), m.end(), Meaning("top", None, COUNTS.get(word) or int(word)))
        for m in WHILE_JOB.finditer(q):   # "while job 21 ran on it": the rows of that job
            claim(m.start(), m.end(), Meaning("job", None, [int(m.group(1))]))
        for m in re.finditer(r"\bjobs? (?:id |number |no\.? )?#?(\d+)((?:(?:,| and| or|, and) #?\d+)*)|#(\d+)\b", q):
            ids = [int(x) for x in re.findall(r"\d+", m.group(0))]
            claim(m.start(), m.end(), Meaning("job", None, ids))
        unknown_nodes = []
        for i, t in enumerate(tokens):
            if not free[i]:
                continue
            if t.text in self.model.nodes:
                claim(t.start, t.end, Meaning("node", None, t.text))
            elif t.text in self.model.rule_ids:
                claim(t.start, t.end, Meaning("rule", None, (t.text,)))
            elif UNKNOWN_NODE.fullmatch(t.text) and not any(w for w in self.lexicon.phrases.get((t.stem,), [])):
                unknown_nodes.append(t.text)
                claim(t.start, t.end, Meaning("unknown-node", None, t.text))
        stems = [t.stem for t in tokens]
        spans += self._time_order(tokens, stems, free)
        i = 0
        while i < len(tokens):
            if not free[i]:
                i += 1
                continue
            r, k, meanings = self.lexicon.split_measure(stems, i, free)
            if k:   # the superlative between them stays free: it is read next, as itself
                for x in (i, *range(i + 1 + r, i + 1 + r + k)):
                    free[x] = False
                obj = q[tokens[i + 1 + r].start:tokens[i + r + k].end]
                spans.append(Span(i, i + 1 + r + k, f"{tokens[i].text} … {obj}", meanings))
                i += 1
                continue
            n, meanings, nums = self.lexicon.match(stems, i, free)
            n, meanings = self._overlapping(stems, i, n, meanings, free)
            if n:
                for k in range(i, i + n):
                    free[k] = False
                text = q[tokens[i].start:tokens[i + n - 1].end]
                if nums:
                    meanings = [Meaning(m.kind, m.entity, (m.value, nums), m.learnt) for m in meanings]
                spans.append(Span(i, i + n, text, meanings))
                i += n
            else:
                i += 1
        for s in list(spans):   # words apart that complete a phrase of a span's ("training time ... lose"): free
            #                     words, or one-word spans of content read apart ("training": KPI lines)
            if s not in spans or not any(m.kind in CONTENT for m in s.meanings):
                continue
            apart = {x.start: x for x in spans if x is not s and x.end - x.start == 1
                     and all(m.kind in CONTENT or m.kind == "times" for m in x.meanings)}
            loose = {t.stem: i for i, t in enumerate(tokens) if (free[i] or i in apart) and t.text not in STOPWORDS
                     and t.stem not in STOPWORDS}
            names = {i: {m.entity for m in x.meanings if m.kind == "entity"} for i, x in apart.items()}
            taken, shared = self.lexicon.agree(tuple(stems[s.start:s.end]), s.meanings, loose, names)
            if not taken:
                continue
            for i in taken:
                if i in apart:
                    spans.remove(apart[i])
                free[i] = False
                spans.append(Span(i, i + 1, tokens[i].text, [Meaning("filler")]))
            words = " … ".join(text for _, text in sorted([(s.start, s.text), *((i, tokens[i].text) for i in taken)]))
            head = min([s, *(x for x in spans if x.start in taken)], key=lambda x: x.start)   # read where it begins
            s.meanings, head.meanings, head.text = [Meaning("filler")], shared, words   # ("how many steps ... lose")
        for i, t in enumerate(tokens):   # "how many tickets were filed": every row was made
            if free[i] and t.stem in MADE:
                free[i] = False
                spans.append(Span(i, i + 1, t.text, [Meaning("filler")]))
        if any(m.kind == "rule" for s in spans for m in s.meanings):   # "a GPU fell off the bus": the GPU repeats it
            for i, t in enumerate(tokens):
                if free[i] and t.stem in WEAK_NOUNS:
                    free[i] = False
                    spans.append(Span(i, i + 1, t.text, [Meaning("weak")]))
        leftovers = [t.text for i, t in enumerate(tokens) if free[i] and t.text not in STOPWORDS
                     and t.stem not in STOPWORDS]
        if tokens and tokens[0].text == "whose":   # a question for an owner, a person the data does not record
            leftovers.insert(0, "whose")          # ("incidents whose status ...": a relative, a function word)
        for s in spans:   # "time" is a measure's word; only "times" counts ("how many times", "the most times")
            if s.text == "time":
                s.meanings = [m for m in s.meanings if m.kind != "times"]
        leftovers += [s.text for s in spans if not s.meanings]
        spans = sorted((s for s in spans if s.meanings), key=lambda s: s.start)
        if any(m.kind == "rule" for s in spans for m in s.meanings):  # "xid errors", "prolog failures"
            for s in spans:
                if all(tokens[k].stem in WEAK_NOUNS for k in range(s.start, s.end)):
                    s.meanings = [Meaning("weak")] + s.meanings
        for a, b in zip(spans, spans[1:]):   # the entity after a relation word is the related one, not the subject
            names = tuple(m.entity for m in b.meanings if m.kind == "entity")
            if a.meanings[0].kind == "rel" and names:
                b.meanings = [Meaning("related", None, names)]
            if a.end == b.start and any(m.kind == "copula" for m in a.meanings) and any(
                    m.kind == "cond" for m in b.meanings):   # "came back failed": a copula before a value, no return
                a.meanings = [m for m in a.meanings if m.kind == "copula"]
        self._agree_units(spans)
        yesno = bool(tokens) and tokens[0].text in YESNO_START
        if only is not None:
            return self._fill(only, spans, leftovers, tokens, False, unknown_nodes, False)
        return self._interpret(spans, leftovers, tokens, yesno, unknown_nodes)

    def _agree_units(self, spans: list[Span]) -> None:
        """A unit the question names ("total seconds job 1 lost", "in GiB") agrees with the measure: where a word
        names measures in several units ("lost": steps, or time), it names only those in that unit. (One with no
        measure in it is not understood: sigma.companion.compose._in_unit.)"""
        units = {m.value for s in spans for m in s.meanings if m.kind == "unit"}
        if len(units) != 1:
            return
        fits = {have for have, asked in UNITS if asked in units}
        for s in spans:
            measures = [m for m in s.meanings if m.kind == "measure"]
            agree = [m for m in measures if self.model.entities[m.entity].columns[m.value].unit in fits]
            if agree and len(agree) < len(measures):
                s.meanings = [m for m in s.meanings if m.kind != "measure" or m in agree]

    # ---------- choosing the entity and filling the slots ----------

    def _fits(self, m: Meaning, ent: Entity) -> bool:
        if m.kind in ("entity", "cond", "measure", "time", "column", "json", "metric", "row", "by", "device"):
            return m.entity == ent.name
        if m.kind == "dim":
            return m.value in ent.refs or (ent.name == "nodes" and m.value == "node")
        if m.kind in ("node", "job", "rule"):
            return m.kind in ent.refs
        if m.kind == "now":
            return ent.now or ent.readings
        if m.kind == "weak":
            return "rule" in ent.refs
        if m.kind in ("hypo", "hypo-word"):
            return ent.name == "nodes"
        if m.kind == "related":
            return any(n != ent.name and link(ent, self.model.entities[n]) for n in m.value)
        if m.kind == "between":
            return bool(ent.time)
        if m.kind == "rank" and m.value in ("longest", "shortest"):   # how long something lasted: a duration's
            return bool(self._durations(ent))   # rows (a stay, an outage), never a current state's
        return True

    @staticmethod
    def _plural(token) -> bool:
        """The word is in the plural ("categories", "nodes"; not "loss")."""
        return token.text.endswith("s") and not token.text.endswith("ss") and token.text != token.stem

    @staticmethod
    def _durations(ent: Entity) -> list[Column]:
        return [c for c in ent.measures() if _kind_of(c.unit) == "s"]

    def _interpret(self, spans, leftovers, tokens, yesno, unknown_nodes) -> Parse:
        model = self.model
        past = any(m.kind == "past" for s in spans for m in s.meanings) or any(
            t.text in PAST_FORMS or t.text in ("was", "were", "did", "had") for t in tokens)
        present = any(m.kind in ("present", "now", "still") for s in spans for m in s.meanings) and not past
        weights = {"entity": 3, "cond": 1, "measure": 2, "time": 1, "column": 1, "json": 1, "metric": 2, "by": 1,
                   "hypo": 3, "rule": 1}
        best, best_key, keys = None, None, {}
        # "how many times": occurrences in a history, never a current-state view's one row per node
        times = any(s.text.split()[-1] == "times" and m.kind == "q" for s in spans for m in s.meanings)
        # "on average, how long does a node stay": an average is over a history, never one current row per node
        times = times or any(m.kind == "agg" and (m.value in ("avg", "median") or percentile(m.value))
                             for s in spans for m in s.meanings)
        for order, ent in enumerate(model.entities.values()):
            if (past or times) and ent.now and not any(m.kind == "now" for s in spans for m in s.meanings):
                tense_ok = False
            else:
                tense_ok = True
            fit = [any(self._fits(m, ent) for m in s.meanings) for s in spans]
            score = sum(max((weights.get(m.kind, 0) * (not m.noun) / (2 if m.weak else 1) for m in s.meanings
                             if self._fits(m, ent)), default=0) for s in spans)
            if any(m.kind == "hypo" for s in spans for m in s.meanings) and ent.name == "nodes":
                score += 3
            misfits = sum(not f for f in fit) + (0 if tense_ok else 1)
            first = min((s.start for s in spans for m in s.meanings if m.kind == "entity" and m.entity == ent.name),
                        default=99)
            # present tense or "now": the current state before a history that names the word ("is node3 drained")
            key = (-misfits, int(present and ent.now), score, -first, ent.explicit, -order)
            if score > 0:
                keys[ent.name] = key
            if score > 0 and (best_key is None or key > best_key):
                best, best_key = ent, key
        if best is None:
            dims = [m.value for s in spans for m in s.meanings if m.kind == "dim"]
            if dims and HOMES.get(dims[0]) in model.entities:
                best = model.entities[HOMES[dims[0]]]
        chosen = best
        best = self._reported(best, spans, tokens, keys)
        understood = [s.text for s in spans if s.meanings[0].kind not in ("filler", "past", "present")]
        if best is None:
            return Parse(None, [s.text for s in spans if s.meanings[0].kind == "unknown-node"] + leftovers,
                         unknown_nodes, understood=understood)
        parsed = self._fill(best, spans, leftovers, tokens, yesno, unknown_nodes, past)
        if not parsed.unknown:
            others = [(best, pick) for pick in self._choices(best, spans, tokens)]
            others += [(ent, pick) for ent in self._readings(best, spans, keys, present)
                       if ent is not chosen or best is chosen   # a fault reported: not its incidents too
                       for pick in [None, *self._choices(ent, spans, tokens)]]
            for ent, pick in others:
                other = self._fill(ent, spans, leftovers, tokens, yesno, unknown_nodes, past, pick)
                if not other.unknown:
                    parsed.alternatives.append(other.query)
        return parsed

    def _reported(self, best: Entity | None, spans: list[Span], tokens, keys: dict[str, tuple]) -> Entity | None:
        """A count of a fault that a job or node is the subject of ("how many nan losses did job 1 hit"): the
        reports it sent, where a word of the fault is also a kind of report (its rule's incidents are what the
        controller opened, read where the question names them or another subject: "did the controller catch");
        and a fault seen, logged, reported or hit, counted or asked when, first or last ("when was the first xid seen
        on node4"): those reports and their time."""
        if best is None or any(m.kind == "entity" for s in spans for m in s.meanings):
            return best
        asked = {m.value for s in spans for m in s.meanings if m.kind in ("q", "order")}
        fault = next((s.end for s in spans if any(m.kind == "rule" for m in s.meanings)), None)
        seen = fault is not None and any(t.stem in SEEN for t in tokens[fault:fault + 2])
        subject = any(s.start and tokens[s.start - 1].text in ("did", "has", "have", "had") and any(
            m.kind in ("job", "node") for m in s.meanings) for s in spans)
        if not (("count" in asked and (subject or seen)) or (seen and asked & {"when", "earliest", "latest"})):
            return best
        own = [m.entity for s in spans if any(m.kind == "rule" and self._fits(m, best) for m in s.meanings)
               for m in s.meanings if m.kind == "cond" and m.entity != best.name and keys.get(m.entity, (1,))[0] == 0
               and "source" in self.model.entities[m.entity].columns]   # reports, each naming who sent it (not
        #                                                                   a state: "did node1 go down")
        return self.model.entities[own[0]] if own else best

    def _readings(self, best: Entity, spans: list[Span], keys: dict[str, tuple], present: bool) -> list[Entity]:
        """The other entities every word of the question fits, in order of fit: each is another reading of the
        question. A question that names its subject ("incidents", "drains") is read only as the entities it names;
        one that names none but a measure ("steps lost"), as those the measure belongs to; otherwise each entity a
        word means ("which node went down": SLURM states, a fault's incidents) is a reading. As past tense
        rules out the current-state views, present tense read by one rules out the histories ("which nodes are
        drained")."""
        fitting = [n for n, k in keys.items() if k[0] == 0 and n != best.name
                   and not (present and best.now and not self.model.entities[n].now)
                   and not self._outworded(self.model.entities[n], best, spans)
                   and not self._by_noun(self.model.entities[n], spans)]
        for kind in ("entity", "measure"):   # a measure's words may be a time of another ("back in service"); a
            #     subject's word may be a condition of another history ("failures": incidents, or failed health
            #     checks), not of a current-state view, which only present tense reads ("drains" are not "draining")
            named = {m.entity for s in spans if any(m.kind == kind for m in s.meanings) for m in s.meanings
                     if m.kind == kind or (kind == "measure" and m.kind == "time") or (
                         kind == "entity" and m.kind == "cond" and not self.model.entities[m.entity].now)}
            if named & (set(fitting) | {best.name}):
                fitting = [n for n in fitting if n in named]
                break
        else:   # an entity a word means (a value, a condition of its own; a fault's incidents), not one a fault,
            #     node or job merely filters ("went down": not every drain or reboot of that fault)
            own = {m.entity for s in spans for m in s.meanings if m.kind in CONTENT and m.entity}
            own |= {HOMES[m.kind] for s in spans for m in s.meanings if m.kind in HOMES}
            fitting = [n for n in fitting if n in own]
            # "which rules run in shadow mode": what is listed is a rule, and a rule is its own entity's (what it
            # fires), not another's that merely carries it, unless a word names that other ("and what actions")
            first = next((s for s in spans if any(m.kind in CONTENT or m.kind == "dim" for m in s.meanings)), None)
            noun = first and any(m.kind == "column" and self._fits(m, best) for m in first.meanings) and any(
                set(p) <= set(phrase_stems(first.text)) for p in best.words)   # "incident category": an incident's
            if first and (noun or best.name in {HOMES.get(m.value) for m in first.meanings if m.kind == "dim"}):
                fitting = [n for n in fitting if any(m.kind == "entity" and m.entity == n
                                                     for s in spans for m in s.meanings) or self._names(n)]
        return [self.model.entities[n] for n in sorted(fitting, key=lambda n: keys[n], reverse=True)]

    def _by_noun(self, ent: Entity, spans: list[Span]) -> bool:
        """Some word fits `ent` only as a value spelled by another entity's noun ("requeues": actions of kind
        requeue): the noun names its own entity, and this one is read only where that one does not fit."""
        return any(fit and all(m.noun for m in fit) for fit in (
            [m for m in s.meanings if self._fits(m, ent)] for s in spans))

    def _scope(self, ent: Entity, spans: list[Span], tokens, n: int, value: str) -> Column | None:
        """The category column of `ent` with a value `value` where the dimension's word, in the singular, comes
        right before the entity's own noun in the plural ("node incidents"; not "rules fired"), or None."""
        after = spans[n + 1] if n + 1 < len(spans) and spans[n + 1].start == spans[n].end else None
        if not (after and any(m.kind == "entity" and m.entity == ent.name for m in after.meanings)
                and not self._plural(tokens[spans[n].end - 1]) and self._plural(tokens[after.end - 1])):
            return None
        return next((c for c in ent.columns.values() if c.role == "category" and value in c.values), None)

    def _names(self, name: str) -> bool:
        """One of the entity's own words is in the question's second part ("..., and what actions would ...")."""
        second = getattr(self._local, "second", [])
        return any(tuple(second[i:i + len(p)]) == tuple(p) for p in self.model.entities[name].words
                   for i in range(len(second)))

    def _outworded(self, ent: Entity, best: Entity, spans: list[Span]) -> bool:
        """Some word fits `ent` only by a name or value learnt from the data, where the schema document gives it a
        meaning for `best` ("state": a node's SLURM state, not its remediation state): the document decided. Unless
        another word gives `ent` a meaning of the document's that `best` lacks: "xid errors" are the xid rules'
        incidents, or events of kind xid and severity error; each stays a reading."""
        def fits(e: Entity, s: Span, learnt: bool, kinds=CONTENT) -> bool:
            return any(m.kind in kinds and m.learnt == learnt and self._fits(m, e) for m in s.meanings)
        own = tuple(k for k in CONTENT if k != "rule")   # a fault's name filters any entity with a rule
        return any(fits(best, s, False) and fits(ent, s, True) and not fits(ent, s, False) for s in spans) and not any(
            fits(ent, s, False, own) and not fits(best, s, False, own) for s in spans)

    def _senses(self, ent: Entity, s: Span) -> list[Meaning]:
        """What a word can mean for this entity, most likely first; where the schema document gives it a meaning,
        not the meanings learnt from names and values in the data."""
        fitting = [m for m in s.meanings if self._fits(m, ent)]
        if any(m.kind in CONTENT and not m.learnt for m in fitting):
            fitting = [m for m in fitting if not (m.kind in CONTENT and m.learnt)]
        return sorted(fitting, key=lambda m: RANK.index(m.kind) if m.kind in RANK else len(RANK))

    def _choices(self, ent: Entity, spans: list[Span], tokens) -> list[tuple[int, Meaning]]:
        """Other senses of a word for this entity, each a reading of its own: (span index, sense). A word that names
        the entity is read with all its senses at once ("in remediation": the entity and its state)."""
        out = []
        for n, s in enumerate(spans):
            senses = self._senses(ent, s)
            if senses and senses[0].kind in CONTENT and senses[0].kind != "entity":
                out += [(n, m) for m in senses[1:] if m.kind in CONTENT and m.value != senses[0].value]
            if n and self._names_head(ent, spans[n - 1], s, senses):
                out.append((n, Meaning("filler")))
            last = tokens[s.end - 1]
            if any(m.modifier for m in senses) and last.text != last.stem and last.text.endswith("s"):
                out.append((n, Meaning("entity", ent.name, "name")))   # "remediation stages": the stages of
        return out                                                     # remediation, or those in remediating

    def _names_head(self, ent: Entity, before: Span, s: Span, senses: list[Meaning]) -> bool:
        """A value word right after the name of another value of the rows may be that name's own noun, not a
        condition ("sidecar errors": what the sidecar logged, whatever its severity; after a kind's name it is
        always the kind's noun, sigma.companion.parse.Parser._fill). That reading is weighed only where the
        condition leaves none of the named rows (sigma.companion.fast): then the question is asked back, never
        answered "none"."""
        head = self._senses(ent, before)
        return (before.end == s.start and bool(senses) and senses[0].kind == "cond" and bool(head)
                and head[0].kind == "cond" and head[0].value.column != senses[0].value.column)

    def _fill(self, ent: Entity, spans: list[Span], leftovers, tokens, yesno, unknown_nodes, past,
              pick: tuple[int, Meaning] | None = None) -> Parse:
        """The slots of the question read as `ent`, each word in its first sense (or, `pick`, one word in another)."""
        q = Query(ent)
        unknown = list(leftovers)
        pending_group = False
        negate = neg_column = relation = searched = negate_text = ""
        negated = -1   # the token where a negated filter ended
        single = new = now_word = ago = waited = timed_word = ""
        periods: list[tuple[str, int]] = []   # words naming a period of time ("hour"), each the buckets' or unknown
        each_row = False
        loose: list[int] = []     # spans with no sense for this entity
        measured = False          # a word named the measure (not the entity's own name: "out of service")
        timed: set[int] = set()   # the two spans of "between X and Y", read as times
        most = False
        modified: list[Cond] = []   # values read from a name's modifier ("remediation stage")
        lasting = ""   # "longest", "shortest": a superlative of how long a row lasted
        distinct, distinct_at, distinct_col = "", -1, ""   # "different kinds", "how many ranks": different values
        zero: tuple[str, int] | None = None   # "no" and where it ends
        devices: list[tuple[str, tuple]] = []   # "NVSwitch": understood beside a kind of event about it
        for n, s in enumerate(spans):
            # a copula ("marked resolved") only before a value of a category; a phrase that is also a column's word
            # ("came back") is that column otherwise
            if any(m.kind == "copula" for m in s.meanings):
                if n + 1 < len(spans) and any(m.kind == "cond" and self._fits(m, ent) for m in spans[n + 1].meanings):
                    continue
                if not any(m.kind != "copula" and self._fits(m, ent) for m in s.meanings):
                    unknown.append(s.text)
                    continue
            if s.meanings[0].kind == "wait":   # understood with a duration (below)
                waited = s.text
                continue
            if s.meanings[0].kind == "only":   # "only led to a drain" restricts what else there was: not understood
                near = [spans[k] for k in (n - 2, n - 1, n + 1, n + 2) if 0 <= k < len(spans)]
                if not any(m.kind == "cond" and self._fits(m, ent) and m.value.column in ent.columns
                           and ent.columns[m.value.column].role == "category" for x in near for m in x.meanings):
                    unknown.append(s.text)
                continue
            if s.meanings[0].kind == "new":   # "new incidents": new since the time range's start, or unclear
                new = s.text
                continue
            if s.meanings[0].kind == "after":   # "drained after node death": only before a fault's name, or the
                #   word for the row itself ("out of service after being drained": from the drain on, as it is)
                if not (n + 1 < len(spans) and any(m.kind == "rule" or (m.kind == "row" and m.entity == ent.name)
                                                   for m in spans[n + 1].meanings)):
                    unknown.append(s.text)
                continue
            fitting = self._senses(ent, s)
            if n and all(tokens[k].stem in WEAK_NOUNS for k in range(s.start, s.end)) and self._names_head(
                    ent, spans[n - 1], s, fitting) and self._senses(ent, spans[n - 1])[0].value.column == "kind":
                q.understood.append(s.text)   # "EDAC errors": a kind's name and its class noun, as "xid errors" after
                continue                      # a rule's name, whatever their severity
            other = next((self.model.entities[m.entity] for m in s.meanings if m.kind == "entity"
                          and m.entity != ent.name and negate.endswith("never")), None)
            if other is not None and not fitting and q.without is None:   # "nodes drained but never rebooted": the
                q.without, negate = other, ""   # listed ones less those another entity's rows name (below)
                q.understood.append(s.text)
                continue
            if not fitting:
                if s.meanings[0].kind not in ("unknown-node",):
                    loose.append(n)
                continue
            m = pick[1] if pick and pick[0] == n else fitting[0]
            if pick and pick[0] == n and m.kind == "filler":
                q.noun_of_name = s.text
            kind, value = m.kind, m.value
            q.understood.append(s.text)
            agent = any(m.kind == "cond" and self._fits(m, ent) for x in spans[n + 1:n + 2] for m in x.meanings)
            if negate and (kind in ("past", "present", "filler") or (kind == "time" and value == ent.time and any(
                    m.kind == "group" for x in spans[n + 1:n + 2] for m in x.meanings)) or (
                    kind == "group" and s.text == "by" and agent)):
                continue   # "have not been closed", "not raised by the watchdog": the negation reaches on
            if kind == "between":   # the next two words name two times of the row: the measure is the time apart,
                # never negative whichever is named first ("from incident to fault" is the detection time too);
                # a word naming the row itself stands for its own time ("from fault to incident": to its opening)
                ends = [next((t for t in x.meanings if t.kind == "time" and self._fits(t, ent)), None) or (
                            Meaning("time", ent.name, ent.time) if ent.time and any(
                                t.kind == "entity" and t.entity == ent.name for t in x.meanings) else None)
                        for x in spans[n + 1:n + 3]]
                # the row itself, then a duration from its start named by its end ("from request to ack": ack_s)
                since_start = next((ent.columns[t.value] for x in spans[n + 2:n + 3] for t in x.meanings
                                    if t.kind == "measure" and self._fits(t, ent) and re.fullmatch(
                                        rf"\w+ - {ent.time}", ent.columns[t.value].sql or "")), None)
                if len(ends) == 2 and ends[0] and ends[0].value == ent.time and ends[1] is None and since_start \
                        and q.measure is None:
                    q.measure, measured, timed = since_start, True, {n + 1, n + 2}
                    continue
                if len(ends) < 2 or None in ends or ends[0].value == ends[1].value or q.measure is not None:
                    unknown.append(s.text)
                    continue
                a, b = (ent.columns[t.value] for t in ends)
                words = lambda c: re.sub(r"_(at|ts)$", "", c.name)   # noqa: E731
                q.measure = Column(f"{words(a)}_to_{words(b)}_s", f"ABS({b.sql} - {a.sql})", "measure", "s")
                timed = {n + 1, n + 2}
                continue
            if n in timed:
                continue
            if kind == "rel":   # the next word names the related rows; "not followed by" and "without" negate
                if value == "not" and not negate and n + 1 < len(spans) and all(
                        m.kind in ("time", "cond") for m in spans[n + 1].meanings):
                    negate = s.text   # "without an ack": that time is not there, as "never acked"
                    continue
                relation = "not" if value == "not" or negate else "with"
                negate = ""
                if not (n + 1 < len(spans) and spans[n + 1].meanings[0].kind == "related"):
                    # "ended up in shadow mode": before a value of the rows' own category it says what they became
                    if not (value != "not" and not negate and n + 1 < len(spans) and any(
                            m.kind == "cond" and self._fits(m, ent) for m in spans[n + 1].meanings)):
                        unknown.append(s.text)
                    relation = ""
                continue
            if kind == "related":
                other = next(self.model.entities[x] for x in value
                             if x != ent.name and link(ent, self.model.entities[x]))
                sql = f"EXISTS (SELECT 1 FROM {_from(other)} AS o WHERE {link(ent, other)}"
                # "any action" and "no action" (not any): planned, skipped and shadow ones too
                anything = s.start and tokens[s.start - 1].text in ("any", "no")
                sql += f" AND ({other.default}))" if other.default and not anything else ")"
                label = (f"{'without' if relation == 'not' else 'with'} {'any ' if anything else ''}"
                         f"{other.name.replace('_', ' ')}")
                q.conds.append(Cond(ent.name, f"NOT {sql}" if relation == "not" else sql, label, "rel:" + other.name))
                continue
            if kind == "neg":
                if negate:
                    unknown.append(negate)
                negate = s.text
                continue
            if neg_column and kind == "cond" and value.column == neg_column:   # "not resolved or confirmed": neither
                negate = "not"
            neg_column = ""
            if negated == s.start and kind in FILTERS:   # "except isolation outliers": is the negation's reach
                unknown.append(f"{negate_text} {s.text}")  # one word or both (not A and B, or not both)? unclear
            negated = -1
            if negate:   # "not", "excluding", "never": the next filter is negated, or nothing is understood
                negate_text, negated = f"{negate} {s.text}", s.end
                if kind in ("node", "job", "rule"):
                    values = value if kind != "rule" else _likes(value)
                    q.exclude.setdefault(kind, []).extend(values if isinstance(values, list) else [values])
                    negate = ""
                    continue
                if kind in ("cond", "json"):
                    cond = value if kind == "cond" else _json_cond(ent, value)
                    q.conds.append(Cond(cond.entity, f"NOT COALESCE(({cond.sql}), 0)", "not " + cond.label,
                                        cond.column + "!", cond.params))
                    negate, neg_column = "", cond.column
                    continue
                negated = -1
                if kind == "time" and value == ent.time:   # "not open": every row has its own start; unclear
                    unknown.append(negate_text)
                    negate = ""
                    continue
                if kind == "time":   # that time is not there, or not there as the next word says
                    col = ent.columns[value]
                    sql = col.name if col.sql == f"src.{col.name}" else col.sql
                    after = spans[n + 1] if n + 1 < len(spans) and spans[n + 1].start == s.end else None
                    how = next((x.value for x in (after.meanings if after else []) if x.kind == "cond"
                                and self._fits(x, ent) and x.value.column == col.name), None)
                    if how is not None:   # "not acked in time": not (acked, and in time), so never acked or late
                        q.conds.append(Cond(ent.name, f"NOT COALESCE(({sql} IS NOT NULL AND {how.sql}), 0)",
                                            f"{negate} {s.text} {after.text}", col.name + "!", how.params))
                        q.understood.append(after.text)
                        timed.add(n + 1)
                    else:   # "never got an ack", "not closed": that time is not there
                        q.conds.append(Cond(ent.name, f"{sql} IS NULL", f"{negate} {s.text}", col.name + "!"))
                    negate = ""
                    continue
                if kind == "entity" and q.project:   # "which nodes were never drained"
                    q.anti, negate = True, ""
                else:
                    unknown.append(negate)
                    negate = ""
            if kind == "range":
                if q.period and q.period != value.words:   # a second time range: which one bounds the rows?
                    unknown.append(s.text)
                q.since, q.until, q.period = value.since, value.until, value.words
            elif kind == "node":
                q.nodes.append(value)
            elif kind == "job":
                q.jobs += value
            elif kind == "rule":
                q.rules += _likes(value)
                nouns = {p[-1] for k in ("node", "job") for p in self.model.refs.get(k, [])}   # things, not faults
                if phrase_stems(s.text)[-1] in nouns and not any(   # "show me the slow nodes": the fault's words
                        m.kind in ("entity", "dim", "measure", "metric", "column", "row")   # are its only noun, so
                        for x in spans if x is not s for m in x.meanings):   # the thing judged, not its reports
                    q.judged = s.text
            elif kind == "q":
                if value == "why-filter":
                    continue
                if value in ("when-first", "when-last"):   # "the first time one opened"
                    q.order, value = ("earliest" if value == "when-first" else "latest"), "when"
                if q.qkind in ("list", "yesno") or value == "count":
                    q.qkind = value
                elif value != q.qkind and not (value == "why" and any(   # "how many requeues did xid errors
                        m.kind == "rule" for x in spans for m in x.meanings)):   # cause": the fault's filter
                    unknown.append(s.text)   # "how long ... when": a second question word the first left out
            elif kind == "agg":
                if q.agg and q.agg != value:   # "average total": one aggregate replacing another says neither
                    unknown.append(s.text)
                q.agg = value
                if value == "share" and "percent" in s.text:   # "what percentage of": the share in percent
                    q.unit = q.unit or "%"
            elif kind == "zero":
                zero = (s.text, s.end)
            elif kind == "reading":
                before = spans[n - 1] if n and spans[n - 1].end == s.start else None
                if not (before and any(m.kind in ("measure", "metric") and self._fits(m, ent) or (
                        m.kind == "order" and ent.readings) for m in before.meanings)):
                    unknown.append(s.text)
            elif kind == "rank":
                rank = {"most": "max", "longest": "max", "shortest": "min"}.get(value, value)
                if q.rank and q.rank != rank:   # "the longest, the shortest": one superlative replacing another
                    unknown.append(s.text)
                q.rank = rank
                lasting = lasting or (s.text if value in ("longest", "shortest") or s.text in SPEED else "")
                most = most or value == "most"
            elif kind == "order":
                if value == "earliest" and n and q.rank == "max" and spans[n - 1].end == s.start and any(
                        m.kind == "rank" for m in spans[n - 1].meanings):   # "most first": an order, largest first,
                    q.rank, q.sort = "", True                                 # of every row, not the top one
                    continue
                if q.order and q.order != value:
                    unknown.append(s.text)
                q.order = value
            elif kind == "unit":
                if q.unit and q.unit != value:
                    unknown.append(s.text)
                q.unit = value
            elif kind == "text":
                q.search.append(value)
            elif kind == "search":
                searched = s.text
            elif kind == "top":
                q.top, q.rank = value, q.rank or "max"
            elif kind == "group":
                if s.text == "by" and q.sort and q.project:   # "rank the nodes by ...": what follows is the value
                    continue
                if pending_group:
                    unknown.append(pending_group)
                pending_group = s.text
                continue
            elif kind == "bucket":
                if value != "auto" or q.bucket is None:   # "hourly trend": the stated period, not one chosen
                    q.bucket = 0 if value == "auto" else int(value)
            elif kind == "sort":
                q.sort = True
            elif kind == "period":   # "oldest hour first", "(avg per hour)": understood only as the buckets' own
                periods.append((s.text, int(value)))
            elif kind == "cmp":
                op, number, unit = value
                after = spans[n + 1] if n + 1 < len(spans) and spans[n + 1].start == s.end else None
                dim = next((ent.refs[x.value] for x in (after.meanings if after and not unit else [])
                            if x.kind == "dim" and x.value in ent.refs and not ent.refs[x.value].startswith("list:")),
                           None)
                if dim:   # "fired on more than one node": a count of different nodes
                    q.having, q.having_of = (op, number), dim
                elif unit == "times" or (not unit and after and any(  # "more than 2 incidents": a count of them
                        x.kind == "entity" and x.entity == ent.name for x in after.meanings)):
                    q.having = (op, number)
                else:
                    q.cmp = value
            elif kind == "distinct":   # understood only before what has the values ("different kinds", "distinct
                distinct, distinct_at = s.text, n   # nodes")
            elif kind == "compare":
                q.compare = True
            elif kind == "entity":
                if n + 1 < len(spans) and spans[n + 1].start == s.end and not any(
                        x.kind in ("cond", "measure") for x in fitting) and any(
                        x.kind == "entity" and x.entity == ent.name for x in spans[n + 1].meanings):
                    unknown.append(s.text)   # "log events": a word before the entity's noun that narrows it in a
                    continue                 # way not understood (it names the entity, and nothing of its own)
                q.plural = q.plural or self._plural(tokens[s.end - 1])
                if pending_group in ("each", "every", "for each", "for every"):   # "each validation": one row each
                    q.per_item, pending_group = True, False
                elif s.start and tokens[s.start - 1].text == "every":   # "the state of every drain": each one,
                    q.per_item = q.plural = True                        # never a single row
                elif pending_group and (q.rank or q.top or q.sort):   # "top 2 nodes by incidents": by their count
                    pending_group = False
                elif pending_group == "per" and q.agg:   # "median time lost per job loss": over the rows, as "per
                    pending_group, each_row = False, True   # drain" (a row's word)
                own = [x for x in fitting if x.kind == "measure"]
                if own and q.measure is None:     # "time out of service" names the entity and its measure
                    q.measure = ent.columns[own[0].value]
                if m.value == "name":   # the other reading of "remediation stages": the name, no value
                    fitting = [x for x in fitting if not x.modifier]
                q.conds += [x.value for x in fitting if x.kind == "cond"]   # "in remediation": entity and state
                modified += [x.value for x in fitting if x.kind == "cond" and x.modifier]
                if s.start and tokens[s.start - 1].text in ("which", "what") and ent.label not in ("id", "rowid"):
                    q.which = True
                    if not q.project and ent.label in ent.columns and not ent.now:
                        q.project = ent.label   # "which health checks failed": one row per check
                elif s.start and tokens[s.start - 1].text in ("which", "what"):
                    q.which = True
            elif kind == "cond":
                q.conds.append(value)
                if pending_group in ("each", "every", "for each", "for every") and value.column == ent.label:
                    q.per_item, pending_group = True, False   # "each validation": one row per such stage
            elif kind == "measure" and pending_group and not ent.columns[value].unit:   # "each rank"
                q.group.append(value)
            elif kind == "measure" and not (ent.columns[value].unit or ent.columns[value].agg) and n and (
                    distinct_at == n - 1 or spans[n - 1].meanings[0] == Meaning("q", None, "count")) \
                    and spans[n - 1].end == s.start:   # "how many ranks": a number that names a row's part (no
                distinct_col = value                   # unit, no aggregate) counts its different values, not rows
            elif kind == "measure" or kind == "metric":
                col = ent.columns[value] if kind == "measure" else None
                if kind == "metric":
                    mn = ent.measure_names
                    col = Column(mn["value"], f"src.{mn['value']}", "measure", unit_of(value), [], "")
                    q.conds.append(Cond(ent.name, f"{mn['column']} = ?", value, mn["column"], (value,)))
                if q.measure is not None and q.measure.name != col.name:
                    unknown.append(s.text)
                    continue
                q.measure, measured = col, True
                before = spans[n - 1].meanings[0] if n else None
                if col.agg == "sum" and before and before.kind == "q" and before.value == "count" \
                        and spans[n - 1].end == s.start:   # "how many steps were lost": what is counted is summed;
                    q.qkind, q.agg = "list", q.agg or ("" if q.rank else "sum")   # "the largest number of": ranked
            elif kind == "time":
                if q.time_col and q.time_col != value:   # two times of the row, neither said to be a span
                    unknown.append(s.text)
                q.time_col, timed_word = value, s.text
            elif kind == "column":
                if pending_group:
                    q.group.append(value)
                elif distinct_at == n - 1 and n:
                    distinct_col = value
                elif s.start and tokens[s.start - 1].text in ("which", "what") and not q.project and (
                        self._plural(tokens[s.end - 1])):   # "which categories of incident": the column's
                    q.project = value                       # different values, one row each (as "which nodes")
                else:
                    q.show.append(value)
            elif kind == "json":
                q.conds.append(_json_cond(ent, value))
            elif kind == "dim" and not pending_group and (scope := self._scope(ent, spans, tokens, n, value)):
                # "node incidents": a dimension's word before the entity's noun, where the entity has a category
                # of that name, is that category (incidents of scope node), never a grouping by node
                sql = scope.name if scope.sql == f"src.{scope.name}" else scope.sql
                q.conds.append(Cond(ent.name, f"{sql} = ?", s.text, scope.name, (value,)))
            elif kind == "dim":
                col = ent.refs.get(value) or ("node" if value == "node" else None)
                if pending_group in ("each", "every") and ent.now and ent.label == col and q.qkind == "list" \
                        and not (q.agg or q.rank or q.measure or q.group):
                    # "what remediation state is each node in": a current-state view has one row per node, each
                    # node's own, listed with its values (never a count per node)
                    q.per_item = q.plural = True
                    pending_group = False
                elif pending_group:
                    q.group.append(col)
                elif col:
                    before = tokens[s.start - 1].text if s.start else ""
                    subject = not any(x.meanings[0].kind not in ("past", "present", "filler") for x in spans[:n]) \
                        and any(x.kind in ("rank", "top") for y in spans[n + 1:] for x in y.meanings)
                    if q.project and q.project != col and before == "and" and not col.startswith("list:"):
                        q.show.append(col)   # "which node and job": both, on each row
                    elif ent.now and ent.label == col and not (subject and any(   # a current-state view's rows are
                            x.kind == "measure" and self._fits(x, ent) for y in spans[n + 1:] for x in y.meanings)):
                        # its nodes: listed as such, unless a measure of theirs is ranked ("the most cycles"); "every
                        # node": each one's row, never a single (latest) one
                        q.per_item = q.plural = q.per_item or q.plural or before in ("every", "all")
                    elif before in ("which", "what", "list", "the", "show", "top", "of", "those", "many", "all",
                                    "every", "distinct", "different", "unique", "rank", "sort", "order") \
                            or before.isdigit() or before in COUNTS or (self._local.ones and not q.project) or subject:
                        # "node with the most remediation cycles": the subject of a superlative is who, listed
                        q.project = q.project or col     # "which nodes ...": one row per node
                        q.count_distinct = before in ("many", "distinct", "different", "unique")
                        distinct = "" if distinct_at == n - 1 else distinct
            elif kind == "versus":
                q.versus = value
            elif kind == "ago":
                ago = s.text
            elif kind == "now" and not ent.now:   # a history of readings: its latest row (below)
                now_word = s.text
            elif kind == "hypo":
                q.hypo = value
            elif kind == "row" and pending_group:   # "on average per drain": over the rows, each one drain; with
                pending_group, each_row = False, True   # no aggregate, each row's own ("per drain": each one)
                continue
            elif kind == "single":   # "the most steps lost in a single requeue": one row's, kept if ranked
                single = s.text
            elif kind == "device":
                devices.append((s.text, value))
            if pending_group in ("each", "every") and kind in ("measure", "time"):   # "until each came back"
                pending_group = False
            if pending_group and kind == "q" and value == "count" and (q.rank or q.top or q.sort):
                continue   # "top 3 rules by number of incidents": ranked by their count (the entity comes next)
            if pending_group == "by" and kind == "agg" and (q.rank or q.top or q.sort) and q.project:
                pending_group = False   # "top 3 rules by average time open": ranked by that aggregate (of the
                continue                # measure next)
            if pending_group == "by" and kind == "measure" and (q.rank or q.top or q.sort) and q.project:
                pending_group = False   # "top 3 rules by time open": ranked by it
            if pending_group == "by" and kind in ("node", "job", "rule", "cond"):   # "reported by job 1", "raised by
                #                                                          the watchdog": who, not a grouping
                pending_group = False
            if pending_group == "by" and kind == "single" and n + 1 < len(spans) and any(
                    m.kind == "entity" and m.entity == ent.name for m in spans[n + 1].meanings):
                pending_group = False   # "steps lost by a single job loss": the row that did it, not a grouping
            if pending_group and not (kind in ("dim", "column") or (kind == "measure" and q.group)):
                unknown.append(pending_group)   # "per" or "each" that groups by nothing understood
            pending_group = False
        unended = any(c.sql.endswith(" IS NULL") and not c.sql.startswith("NOT ") for c in q.conds)
        for n in loose:   # a word that repeats the measure ("how many steps did job 1 lose": steps lost), the modifier
            s = spans[n]  # of the entity's own name ("checkpoint ack time": of checkpoint requests), or a related
            #               entity's name qualifying a column of this one ("time lost per recovery source")
            after = spans[n + 1] if n + 1 < len(spans) and spans[n + 1].start == s.end else None
            if s.meanings[0].kind == "now" and unended:   # rows whose end is not there yet ("incidents open right
                q.understood.append(s.text)              # now", "never acked"): they are so now
                continue
            if set(phrase_stems(s.text)) <= {w for p in ent.words for w in p[:-1]} - STOPWORDS or (after and any(
                    m.kind == "entity" and m.entity != ent.name and link(ent, self.model.entities[m.entity])
                    for m in s.meanings) and any(m.kind in ("column", "dim", "measure") and self._fits(m, ent)
                                                 for m in after.meanings)):
                q.understood.append(s.text)
                continue
            if s.text in STOPWORDS and all(m.entity for m in s.meanings) and after and after.meanings[0].kind in (
                    "filler", "range"):   # "requeues done so far", "done this week": a function word before a time
                continue   # where it names only other entities' columns or values (a drain's "done")
            before = spans[n - 1] if n and spans[n - 1].end == s.start else None
            if s.text in ("value", "values", "reading", "readings") and q.measure is not None and before and any(
                    m.kind in ("measure", "metric") and self._fits(m, ent) for m in before.meanings):
                q.understood.append(s.text)   # "the loss value": the measure just named, its own value
                continue
            if set(phrase_stems(s.text)) <= MADE:   # "did the sidecar raise": another entity's time of being made
                q.understood.append(s.text)
                continue
            if not (q.measure and set(phrase_stems(s.text)) <= {w for p in q.measure.words for w in p}):
                unknown.append(s.text)
                continue
            q.understood.append(s.text)
            before = spans[n - 1].meanings[0] if n else None
            if q.measure.agg == "sum" and before and before.kind == "q" and before.value == "count" \
                    and spans[n - 1].end == s.start:
                q.qkind, q.agg = "list", q.agg or ("" if q.rank else "sum")
        if pending_group:
            unknown.append(pending_group)
        if distinct_col:   # "node with the most different kinds of errors": per node, how many kinds; "how many
            #                ranks": how many different ranks; "which different kinds": each kind once
            if q.project and q.project != distinct_col and not q.group:
                q.distinct_of = distinct_col
            else:
                q.project = distinct_col
                q.count_distinct = q.qkind == "count" or bool(q.group)
            distinct = ""
        if distinct:   # "distinct" before nothing that has values: not understood
            unknown.append(distinct)
        if zero and not q.cmp and q.measure is not None and zero[1] < len(tokens) and tokens[zero[1]].stem in {
                w for p in q.measure.words for w in p}:   # "lost no steps": steps lost = 0
            q.cmp = ("=", 0.0, "s" if _kind_of(q.measure.unit) == "s" else q.measure.unit)
        elif zero:
            unknown.append(zero[0])
        if lasting and q.measure is None and not most:   # "the longest stay in remediation": the row's duration
            # what "how long" names, or the one duration a word of the question names part of ("the slowest
            # checkpoint save": its save time; never "which job has run the longest": no duration says "run")
            said = {t.stem for t in tokens} - STOPWORDS - {stem("time")}
            long = [c for c in self._durations(ent) if ("long",) in c.words] or [
                c for c in self._durations(ent) if any(set(w) & said for w in c.words)]
            if len(long) == 1:
                q.measure = long[0]
            elif q.qkind != "duration":   # a "how long" question's own duration, else unclear: never a count of
                unknown.append(lasting)   # rows ("which job has run the longest")
        if q.cmp and q.measure and {q.cmp[2], _kind_of(q.measure.unit)} >= {"steps", "s"}:
            unknown.append(f"{q.cmp[1]:g} {q.cmp[2]}")   # "lose more than 10 steps": not a time lost
        if single and not q.rank:
            unknown.append(single)
        unknown += [text for text, (column, values) in devices if not any(
            c.column == column and any(str(p).strip(",") in values for p in c.params) for c in q.conds)]
        unknown += [text for text, seconds in periods if q.bucket != seconds]
        if q.sort and not (q.project or q.group):   # "rank" with nothing to rank
            unknown.append("rank")
        if new and q.since is None:
            unknown.append(new)
        columns = [c.column for c in q.conds if not c.column.endswith("!")]
        if any(t.text == "both" for t in tokens) and (len(q.nodes) > 1 or len(q.jobs) > 1 or len(q.rules) > 1 or len(
                columns) > len(set(columns))):   # "on both node2 and node3": what each has (an intersection), never
            unknown.append("both")           # the rows of either, which two values of one slot otherwise are
        if q.time_col and q.time_col != ent.time and not q.ago:   # "closed in the last 20 minutes", "when were
            col = ent.columns[q.time_col]   # they closed since 16:00": the window is on the closing, not the opening
            q.timed = col.name if col.sql == f"src.{col.name}" else col.sql
        if q.time_col and not (q.qkind == "when" or q.order and q.time_col == ent.time or q.ago):
            # a time named of rows, not asked when nor ordered by: that time is there ("drains finished", "the
            # node was back"), as a time negated is that time not there ("never acked")
            col = ent.columns[q.time_col]   # (the row's own time, "incidents opened", every row has)
            sql = col.name if col.sql == f"src.{col.name}" else col.sql
            # a time set only in one state, beside another value of that state ("done in shadow mode"): two
            # values of one single-valued column, and no word says which one wins
            only = re.match(r"(\w+)\b", col.only_in)
            if only and any(c.column == only.group(1) and c.sql != col.only_in for c in q.conds):
                unknown.append(timed_word)
            if q.time_col != ent.time:
                q.conds.append(Cond(ent.name, f"{sql} IS NOT NULL", timed_word, col.name))
            q.time_col = None
        if not q.timed and (q.since is not None or q.until is not None or q.bucket is not None
                            or q.qkind == "when"):
            # a condition that the row's other time is there ("closed", "acknowledged") is the verb's time: a
            # window is of it ("closed in the last 20 minutes": closed_at, not opened_at); of two, none is forced
            named = {m.group(1) for c in q.conds if (m := re.fullmatch(r"(\w+) IS NOT NULL", c.sql))
                     and m.group(1) != ent.time and getattr(ent.columns.get(m.group(1)), "role", "") == "time"}
            if len(named) == 1:
                q.timed = named.pop()
            elif named:
                unknown.append(" and ".join(sorted(named)) + " as the time of the window")
        if waited and not (q.qkind == "duration" or (q.measure is not None and q.measure.unit in ("s", "min", "h"))):
            unknown.append(waited)
        if ago:   # "how long ago was the last reboot": the time since it, of a row the question picks
            if q.qkind == "duration" and q.measure is None and ent.time:
                q.ago = True
            else:
                unknown.append(ago)
        if now_word:   # "what step is job 1 on now": one node's or job's latest reading; of several, or an
            if q.measure and q.project == q.measure.name:   # aggregate, "now" says no row alone ("what training
                q.project = None                            # step ... now": the measure asked, no row per value)
            if q.measure and len(q.nodes) + len(q.jobs) == 1 and not (
                    q.agg or q.rank or q.group or q.bucket is not None or q.order or q.project or q.since is not None):
                q.order = "latest"
            elif q.measure and q.project and q.project in (ent.refs.get("node"), ent.refs.get("job")) and not (
                    q.agg or q.group or q.bucket is not None or q.order or q.since is not None or q.extras):
                q.latest_each = True   # "which node is lowest on free memory now": each one's latest reading
            else:
                unknown.append(now_word)
        if each_row and not (q.agg or q.rank):
            q.per_item = True
        if q.per_item and q.order == "latest" and ent.now and not q.nodes:   # "the current state of every node":
            q.order = ""   # a current-state view's rows are each one's current row, so no single latest one
        if negate:
            unknown.append(negate)
        for cond in modified:   # "what remediation stage is node2 in": the column asked is no value given, so the
            if cond.column in (q.project, *q.show) and cond in q.conds:   # modifier is part of the name
                q.conds.remove(cond)
        present = any(m.kind in ("present", "now", "still") for s in spans for m in s.meanings) and not past
        if present and not ent.now and q.one_value():
            # "what stage is node2 in": one value, now, of one node or job; a history's answer is its latest row,
            # never a count of every value it has had (in the past tense it is asked back: sigma.companion.fast)
            q.show, q.project, q.order = [ent.label], None, "latest"
        if yesno and q.qkind == "list" and not self._local.ones:
            q.qkind = "yesno"
        if not q.hypo and any(m.kind == "hypo-word" for s in spans for m in s.meanings):
            unknown.append("what if")   # a hypothetical whose action was not understood: not a filter on today
        q.which = q.which or any(t.text == "which" for t in tokens)
        if measured and q.which and q.measure.agg == "sum" and q.qkind in ("list", "yesno") and not (
                q.cmp or q.agg or q.rank or q.having or q.order or q.group or q.bucket is not None):
            q.cmp = (">", 0.0, "s" if q.measure.unit == "s" else "")   # "which jobs lost steps": more than none
        fault = ent.columns.get("fault_ts")
        if q.qkind == "when" and q.rules and not q.time_col and fault is not None and fault.role == "time" and any(
                t.stem in BECAME for t in tokens):   # "when did the loss last go NaN": when the fault happened,
            q.time_col = fault.name                  # not its detection ("when was the last NaN loss": its incident)
        if q.compare:   # "compare X on node1 and node2": one row per node (or job)
            ref = "node" if len(q.nodes) > 1 else "job" if len(q.jobs) > 1 else None
            values = [c.column for c in q.conds if c.column in ent.columns and ent.columns[c.column].role == "category"]
            if ref and ent.refs.get(ref) and not ent.refs[ref].startswith("list:"):
                q.group.append(ent.refs[ref])
            elif len(values) > 1 and len(set(values)) == 1:   # "compare ... of critical and warning incidents":
                q.group.append(values[0])                       # one row per value of that column
            else:
                unknown.append("compare")
        if q.search:   # text searched in the columns named ("in their summary"), else in every text column
            named = [c for c in q.show if ent.columns[c].role in ("text", "category")]
            cols = named or [c.name for c in ent.columns.values() if c.role == "text"]
            q.show = [c for c in q.show if c not in named]
            for text in q.search:
                like = "%" + re.sub(r"([%_\\])", r"\\\1", text) + "%"
                q.conds.append(Cond(ent.name, "(" + " OR ".join(f"{c} LIKE ? ESCAPE '\\'" for c in cols) + ")",
                                    f"mentions '{text}'", "search:" + text, (like,) * len(cols)))
        elif searched:
            unknown.append(searched)
        if q.without is not None:   # "nodes drained but never rebooted": what is listed is in both entities' rows
            named = [ent.refs.get(m.value) for x in spans for m in x.meanings if m.kind == "dim"]
            q.project = q.project or next((d for d in named if d and not d.startswith("list:")), None)
            ref = next((r for r, c in ent.refs.items() if c == q.project), None)
            if ref is None or not q.without.refs.get(ref) or q.qkind not in ("list", "yesno", "count") or q.group:
                unknown.append(f"never {q.without.name.replace('_', ' ')}")
        if q.having and not q.project and not q.group:
            dims = [ent.refs.get(m.value) for s in spans for m in s.meanings if m.kind == "dim"]
            dims = [d for d in dims if d and not d.startswith("list:")]
            if dims:
                q.project = dims[0]
        if q.show and not q.project and (q.qkind == "count" or q.rank or q.having):  # "which playbooks, how often"
            q.project = q.show.pop(0)
        if most and q.measure and q.measure.agg == "sum" and q.project and not q.agg:   # "spent the most time":
            #                  the total per node (of a time that adds up; "the most cycles" is the highest)
            q.agg = "sum"
        q.understood = [u for u in q.understood if u]
        return Parse(q, unknown, unknown_nodes, q.understood)
