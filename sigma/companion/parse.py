"""A question parsed into a structured query, without a language model: the entity asked about, its filters (nodes,
jobs, rules, values, comparisons), the time range, the measure and how to aggregate it, grouping, ordering, a limit,
and a hypothetical action. Every word of the question must be consumed by one of those slots (or be a function word,
sigma.companion.lexicon.STOPWORDS); the words that are not, and the parts that do not fit the chosen entity, are
kept in `unknown`, and a question with any of them is never answered as fact (sigma.companion.fast).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import tzinfo

from sigma.companion import timerange
from sigma.companion.lexicon import NUMBER_WORDS, STOPWORDS, normalise, phrase_stems, stem, tokenize
from sigma.companion.model import Column, Cond, Entity, Model, unit_of

# Words of the question's shape, whatever the entity. (kind, value)
GRAMMAR: dict[str, tuple[str, str]] = {
    "how many": ("q", "count"), "number of": ("q", "count"), "count": ("q", "count"), "how often": ("q", "count"),
    "how many times": ("q", "count"), "how frequently": ("q", "count"), "total number of": ("q", "count"),
    "times": ("times", ""), "so often": ("emphasis", ""), "often": ("emphasis", ""),
    "how long": ("q", "duration"), "how fast": ("q", "duration"), "how quickly": ("q", "duration"),
    "how much time": ("q", "duration"), "duration": ("q", "duration"),
    "when": ("q", "when"), "what time": ("q", "when"), "at what time": ("q", "when"),
    "why": ("q", "why"), "reason": ("q", "why"), "cause": ("q", "why"), "caused": ("q", "why"),
    "because of": ("q", "why-filter"), "due to": ("q", "why-filter"), "for": ("for", ""),
    "average": ("agg", "avg"), "mean": ("agg", "avg"), "avg": ("agg", "avg"), "on average": ("agg", "avg"),
    "typical": ("agg", "median"), "median": ("agg", "median"),
    "total": ("agg", "sum"), "in total": ("agg", "sum"), "sum": ("agg", "sum"), "altogether": ("agg", "sum"),
    "in all": ("agg", "sum"), "overall": ("agg", "sum"),
    "maximum": ("rank", "max"), "max": ("rank", "max"), "highest": ("rank", "max"), "peak": ("rank", "max"),
    "longest": ("rank", "max"), "worst": ("rank", "max"), "largest": ("rank", "max"), "biggest": ("rank", "max"),
    "slowest": ("rank", "max"), "most": ("rank", "most"), "the most": ("rank", "most"), "top": ("rank", "max"),
    "minimum": ("rank", "min"), "min": ("rank", "min"), "lowest": ("rank", "min"), "shortest": ("rank", "min"),
    "smallest": ("rank", "min"), "fewest": ("rank", "min"), "least": ("rank", "min"), "the least": ("rank", "min"),
    "quickest": ("rank", "min"), "fastest": ("rank", "min"),
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
    "now": ("now", ""), "right now": ("now", ""), "at the moment": ("now", ""), "currently": ("now", ""),
    "at present": ("now", ""), "still": ("still", ""),
    "were": ("past", ""), "was": ("past", ""), "did": ("past", ""), "had": ("past", ""), "got": ("past", ""),
    "been": ("past", ""),
    "is": ("present", ""), "are": ("present", ""),
    "not": ("neg", ""), "excluding": ("neg", ""), "except": ("neg", ""), "except for": ("neg", ""),
    "other than": ("neg", ""), "apart from": ("neg", ""), "never": ("neg", "never"), "but not": ("neg", ""),
    "compare": ("compare", ""), "versus": ("compare", ""), "vs": ("compare", ""),
    "distinct": ("distinct", ""), "different": ("distinct", ""), "unique": ("distinct", ""),
    "happen": ("filler", ""), "see": ("filler", ""), "have": ("filler", ""), "get": ("filler", ""),
    "in seconds": ("filler", ""), "seconds": ("filler", ""), "take": ("filler", ""), "it": ("filler", ""),
    "controller": ("filler", ""), "the controller": ("filler", ""), "sigma": ("filler", ""), "go": ("filler", ""),
    "there": ("filler", ""), "have we": ("filler", ""), "we have": ("filler", ""), "been": ("past", ""),
    "until": ("filler", ""), "till": ("filler", ""), "across": ("filler", ""), "reach": ("filler", ""),
    "report": ("filler", ""), "send": ("filler", ""), "sent": ("filler", ""), "use": ("filler", ""),
    "hit": ("filler", ""), "affect": ("filler", ""), "experience": ("filler", ""), "record": ("filler", ""),
    "spend": ("filler", ""), "run": ("filler", ""), "managed": ("filler", ""), "issue": ("filler", ""),
    "after": ("after", ""), "because": ("after", ""), "caused by": ("after", ""), "due": ("after", ""),
}
YESNO_START = ("is", "are", "was", "were", "did", "does", "do", "has", "have", "had", "any", "can")
CMP = re.compile(
    r"\b(more than|greater than|longer than|higher than|larger than|over|above|exceeding|at least|fewer than|"
    r"less than|shorter than|lower than|under|below|at most|no more than|not more than)\s+"
    r"(\d+(?:\.\d+)?|once|twice|thrice|one|two|three|four|five|six|seven|eight|nine|ten|a|an)\b\s*"
    r"(times?|seconds?|secs?|minutes?|mins?|hours?|hrs?|steps?|percent|s|h|%)?\b")
CMP_OPS = {"more than": ">", "greater than": ">", "longer than": ">", "higher than": ">", "larger than": ">",
           "over": ">", "above": ">", "exceeding": ">", "at least": ">=", "fewer than": "<", "less than": "<",
           "shorter than": "<", "lower than": "<", "under": "<", "below": "<", "at most": "<=",
           "no more than": "<=", "not more than": "<="}
CMP_UNITS = {"second": 1, "sec": 1, "s": 1, "minute": 60, "min": 60, "hour": 3600, "hr": 3600, "h": 3600}
HYPO = re.compile(r"\b(if|suppose|supposing|what happens|what would happen|would happen|would be affected|"
                  r"would it affect|what if)\b")
HYPO_VERBS = {"drain": "drain", "reboot": "reboot", "restart": "reboot", "take down": "down", "take out": "drain",
              "took out": "drain", "remove": "drain", "lose": "down", "go down": "down", "went down": "down",
              "goes down": "down", "fail": "down", "die": "down", "crash": "down", "power off": "down",
              "shut down": "down", "kill": "down", "went offline": "down", "go offline": "down", "down": "down",
              "offline": "down"}
HYPO_WORDS = ("affect", "affected", "hit", "impact", "impacted", "happen", "if", "suppose", "supposing", "would",
              "what if", "running", "run", "interrupted")
PAST_FORMS = {"ran", "went", "came", "took", "saw", "fell", "wrote", "happened", "occurred"}
COMMANDS = re.compile(r"^\s*(please )?(drain|undrain|resume|reboot|requeue|cancel|scancel|kill|delete|drop|restart|stop|"
                      r"start|set|update|remove|suspend|release|hold|power|shut|run|insert|truncate|alter|create|"
                      r"ignore|forget)\b")
WEAK_NOUNS = {stem(w) for w in ("error", "failure", "fault", "problem", "issue")}  # after a rule word they only repeat it
UNKNOWN_NODE = re.compile(r"node\d+|[a-z]+\d*(?:-[a-z0-9]+)*-\d+|gpu\d+-\w+")


@dataclass(frozen=True)
class Meaning:
    kind: str                 # entity cond measure time column ref dim rule json q agg rank order group bucket ...
    entity: str | None = None
    value: object = None


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
    group: list[str] = field(default_factory=list)
    bucket: int | None = None
    project: str | None = None            # "which nodes ..." -> one row per node
    show: list[str] = field(default_factory=list)   # columns asked for ("what state", "what action")
    count_distinct: bool = False          # "how many nodes ...": count them, do not list them
    per_item: bool = False                # "how long did each validation take": no aggregate over them
    which: bool = False                   # "which <entity> ...": the rows (one per label), not a number
    compare: bool = False                 # "compare ... on node1 and node2": one row each
    exclude: dict[str, list] = field(default_factory=dict)   # negated filters: node/job/rule -> values
    anti: bool = False                    # "which nodes were never drained": the projection's others
    having: tuple[str, float] | None = None
    top: int | None = None
    hypo: str = ""
    nodes: list[str] = field(default_factory=list)
    jobs: list[int] = field(default_factory=list)
    rules: list[str] = field(default_factory=list)
    understood: list[str] = field(default_factory=list)


@dataclass
class Parse:
    query: Query | None
    unknown: list[str]                    # words or parts not understood (for this entity)
    unknown_nodes: list[str] = field(default_factory=list)
    understood: list[str] = field(default_factory=list)
    command: str = ""                     # the question is an order ("drain node3"): the companion only reads
    ambiguous: list[str] = field(default_factory=list)   # entities the words fit equally well


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
        reserved |= {p for ent in model.entities.values() for p in ent.words}
        reserved |= {phrase_stems(w) for w in GRAMMAR}
        for ent in model.entities.values():
            for p in ent.words:
                add(p, Meaning("entity", ent.name))
            for p, cond in ent.conds.items():
                add(p, Meaning("cond", ent.name, cond))
            for col in ent.columns.values():
                kind = {"measure": "measure", "time": "time", "category": "column", "text": "column"}.get(col.role)
                if kind:
                    for p in col.words:
                        add(p, Meaning(kind, ent.name, col.name))
                explicit = {c: {w for v in vals.values() for w in v} for c, vals in ent.explicit_values.items()}
                for value, phrases in col.values.items():
                    if ent.measure_names and col.name == ent.measure_names["column"]:
                        for p in phrases:
                            add(p, Meaning("metric", ent.name, value))
                        continue
                    # set membership: equality for one value, and right for SLURM's comma-separated flags too
                    cond = Cond(ent.name, f"instr(',' || {col.name} || ',', ?) > 0", f"{col.name} {value}",
                                col.name, (f",{value},",))
                    for p in phrases:
                        if p not in reserved or p in explicit.get(col.name, ()):
                            add(p, Meaning("cond", ent.name, cond))
                for key in col.keys:
                    add(phrase_stems(key) + ("#",), Meaning("json", ent.name, (col.name, key)))
        self.longest = max(len(p) for p in self.phrases)

    def _add(self, phrase: tuple[str, ...], meaning: Meaning) -> None:
        if phrase:
            bucket = self.phrases.setdefault(phrase, [])
            if meaning not in bucket:
                bucket.append(meaning)

    def match(self, stems: list[str], i: int, free: list[bool]) -> tuple[int, list[Meaning], list[float]]:
        """The longest phrase starting at token i over free tokens: (length, meanings, numbers in it)."""
        for n in range(min(self.longest, len(stems) - i), 0, -1):
            if not all(free[i:i + n]):
                continue
            window = stems[i:i + n]
            nums = [_number(w) for w in window]
            key = tuple("#" if x is not None and not w.isalpha() else w for w, x in zip(window, nums))
            for k in (tuple(window), key):
                if k in self.phrases:
                    return n, self.phrases[k], [x for x, w in zip(nums, k) if w == "#"]
        return 0, [], []


def _number(word: str) -> float | None:
    try:
        return float(word.lstrip("#").rstrip("%"))
    except ValueError:
        return None


def _cmp(m: re.Match) -> tuple[str, float, str]:
    """(operator, value, unit) of "more than 3 times", "over 30 s", "at least 2 minutes" (durations in seconds)."""
    op, raw, unit = CMP_OPS[m.group(1)], m.group(2), m.group(3) or ""
    value = float(NUMBER_WORDS.get(raw, raw))
    base = unit.rstrip("s") or unit
    if raw in ("once", "twice", "thrice") or base == "time":
        return op, value, "times"
    if base in CMP_UNITS:
        return op, value * CMP_UNITS[base], "s"
    if base == "step":
        return op, value, "steps"
    return op, value, "%" if unit in ("%", "percent") else ""


def _likes(value) -> list[str]:
    """LIKE patterns of a rule meaning, a number from the question put in for '#' ("xid 79")."""
    likes, nums = value if isinstance(value[0], tuple) else (value, [])
    return [like.replace("#", str(int(nums[0]))) if nums else like for like in likes]


def _json_cond(ent: Entity, value) -> Cond:
    (column, key), nums = value
    return Cond(ent.name, f"json_extract({column}, '$.{key}') = ?", f"{key} {nums[0]:g}", "", (nums[0],))


class Parser:
    def __init__(self, model: Model):
        self.model = model
        self.lexicon = Lexicon(model)

    def parse(self, question: str, now: float, tz: tzinfo | None) -> Parse:
        q = normalise(question)
        tokens = tokenize(q)
        command = COMMANDS.match(q)
        if command:   # an order, not a question: nothing here acts
            return Parse(None, [command.group(2)], [], command=command.group(2))
        spans: list[Span] = []
        free = [True] * len(tokens)

        def claim(start: int, end: int, meaning: Meaning) -> None:
            idx = [i for i, t in enumerate(tokens) if free[i] and t.start < end and t.end > start]
            if idx:
                for i in idx:
                    free[i] = False
                spans.append(Span(idx[0], idx[-1] + 1, q[start:end].strip(), [meaning]))

        tr = timerange.find(q, now, tz)
        if tr:
            for a, b in tr.spans:
                claim(a, b, Meaning("range", None, tr))
        hypo = HYPO.search(q)
        if hypo:
            for words, verb in sorted(HYPO_VERBS.items(), key=lambda kv: -len(kv[0])):
                for m in re.finditer(r"\b" + words.replace(" ", r"\w* ") + r"\w*\b", q):
                    if m.start() > hypo.start():
                        claim(m.start(), m.end(), Meaning("hypo", None, verb))
            for w in HYPO_WORDS:
                for m in re.finditer(r"\b" + w + r"\b", q):
                    claim(m.start(), m.end(), Meaning("hypo-word", None, w))
        for m in CMP.finditer(q):
            claim(m.start(), m.end(), Meaning("cmp", None, _cmp(m)))
        for m in re.finditer(r"\btop (\d+)\b|\b(\d+) (?=(?:most|worst|busiest|least|slowest|longest)\b)", q):
            claim(m.start(), m.end(), Meaning("top", None, int(m.group(1) or m.group(2))))
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
        i = 0
        while i < len(tokens):
            if not free[i]:
                i += 1
                continue
            n, meanings, nums = self.lexicon.match(stems, i, free)
            if n:
                for k in range(i, i + n):
                    free[k] = False
                text = q[tokens[i].start:tokens[i + n - 1].end]
                if nums:
                    meanings = [Meaning(m.kind, m.entity, (m.value, nums)) for m in meanings]
                spans.append(Span(i, i + n, text, meanings))
                i += n
            else:
                i += 1
        leftovers = [t.text for i, t in enumerate(tokens) if free[i] and t.text not in STOPWORDS
                     and t.stem not in STOPWORDS]
        spans.sort(key=lambda s: s.start)
        if any(m.kind == "rule" for s in spans for m in s.meanings):  # "xid errors", "prolog failures"
            for s in spans:
                if all(tokens[k].stem in WEAK_NOUNS for k in range(s.start, s.end)):
                    s.meanings = [Meaning("weak")] + s.meanings
        yesno = bool(tokens) and tokens[0].text in YESNO_START
        return self._interpret(spans, leftovers, tokens, yesno, unknown_nodes)

    # ---------- choosing the entity and filling the slots ----------

    def _fits(self, m: Meaning, ent: Entity) -> bool:
        if m.kind in ("entity", "cond", "measure", "time", "column", "json", "metric"):
            return m.entity == ent.name
        if m.kind == "dim":
            return m.value in ent.refs or (ent.name == "nodes" and m.value == "node")
        if m.kind in ("node", "job", "rule"):
            return m.kind in ent.refs
        if m.kind == "now":
            return ent.now
        if m.kind == "weak":
            return "rule" in ent.refs
        if m.kind in ("hypo", "hypo-word"):
            return ent.name == "nodes"
        return True

    def _interpret(self, spans, leftovers, tokens, yesno, unknown_nodes) -> Parse:
        model = self.model
        past = any(m.kind == "past" for s in spans for m in s.meanings) or any(
            t.text in PAST_FORMS for t in tokens)
        present = any(m.kind in ("present", "now", "still") for s in spans for m in s.meanings) and not past
        weights = {"entity": 3, "cond": 1, "measure": 2, "time": 1, "column": 1, "json": 1, "metric": 2,
                   "hypo": 3, "rule": 1}
        best, best_key, keys = None, None, {}
        for order, ent in enumerate(model.entities.values()):
            if past and ent.now and not any(m.kind == "now" for s in spans for m in s.meanings):
                tense_ok = False
            else:
                tense_ok = True
            fit = [any(self._fits(m, ent) for m in s.meanings) for s in spans]
            score = sum(max((weights.get(m.kind, 0) for m in s.meanings if self._fits(m, ent)), default=0)
                        for s in spans)
            if any(m.kind == "hypo" for s in spans for m in s.meanings) and ent.name == "nodes":
                score += 3
            if present and ent.now and score > 0:
                score += 2
            misfits = sum(not f for f in fit) + (0 if tense_ok else 1)
            first = min((s.start for s in spans for m in s.meanings if m.kind == "entity" and m.entity == ent.name),
                        default=99)
            key = (-misfits, score, -first, ent.explicit, -order)
            if score > 0:
                keys[ent.name] = key
            if score > 0 and (best_key is None or key > best_key):
                best, best_key = ent, key
        if best is None:
            dims = [m.value for s in spans for m in s.meanings if m.kind == "dim"]
            fallback = {"node": "nodes", "job": "kpis", "rule": "incidents"}
            if dims and fallback.get(dims[0]) in model.entities:
                best = model.entities[fallback[dims[0]]]
        understood = [s.text for s in spans if s.meanings[0].kind not in ("filler", "past", "present")]
        named = {m.entity for s in spans for m in s.meanings if m.kind == "entity"}
        measured = {m.entity for s in spans for m in s.meanings if m.kind == "measure"}
        tied = [n for n, k in keys.items() if best is not None and n != best.name and k[:2] == best_key[:2]
                and n in measured]
        if tied and best.name in measured and best.name not in named and not named & set(tied):
            # only a measure named it, and another entity has a measure of the same name: ask which
            return Parse(None, [], unknown_nodes, understood=understood,
                         ambiguous=[best.name] + tied)
        if best is None:
            return Parse(None, [s.text for s in spans if s.meanings[0].kind == "unknown-node"] + leftovers,
                         unknown_nodes, understood=understood)
        return self._fill(best, spans, leftovers, tokens, yesno, unknown_nodes, past)

    def _fill(self, ent: Entity, spans: list[Span], leftovers, tokens, yesno, unknown_nodes, past) -> Parse:
        q = Query(ent)
        unknown = list(leftovers)
        pending_group = False
        negate = neg_column = ""
        most = False
        for n, s in enumerate(spans):
            if s.meanings[0].kind == "after":   # "drained after node death": only before a fault's name
                if not (n + 1 < len(spans) and any(m.kind == "rule" for m in spans[n + 1].meanings)):
                    unknown.append(s.text)
                continue
            fitting = [m for m in s.meanings if self._fits(m, ent)]
            if not fitting:
                if s.meanings[0].kind not in ("unknown-node",):
                    unknown.append(s.text)
                continue
            rank = ["neg", "weak", "entity", "measure", "metric", "cond", "time", "dim", "column", "json"]
            m = sorted(fitting, key=lambda m: rank.index(m.kind) if m.kind in rank else 9)[0]
            kind, value = m.kind, m.value
            q.understood.append(s.text)
            if kind == "neg":
                if negate:
                    unknown.append(negate)
                negate = s.text
                continue
            if neg_column and kind == "cond" and value.column == neg_column:   # "not resolved or confirmed": neither
                negate = "not"
            neg_column = ""
            if negate:   # "not", "excluding", "never": the next filter is negated, or nothing is understood
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
                if kind == "entity" and q.project:   # "which nodes were never drained"
                    q.anti, negate = True, ""
                else:
                    unknown.append(negate)
                    negate = ""
            if kind == "range":
                q.since, q.until, q.period = value.since, value.until, value.words
            elif kind == "node":
                q.nodes.append(value)
            elif kind == "job":
                q.jobs += value
            elif kind == "rule":
                q.rules += _likes(value)
            elif kind == "q":
                if value == "why-filter":
                    continue
                if q.qkind in ("list", "yesno") or value == "count":
                    q.qkind = value
            elif kind == "agg":
                q.agg = value
            elif kind == "rank":
                q.rank = "max" if value == "most" else value
                most = most or value == "most"
            elif kind == "order":
                q.order = value
            elif kind == "top":
                q.top, q.rank = value, q.rank or "max"
            elif kind == "group":
                if pending_group:
                    unknown.append(pending_group)
                pending_group = s.text
                continue
            elif kind == "bucket":
                q.bucket = 0 if value == "auto" else int(value)
            elif kind == "cmp":
                op, n, unit = value
                if unit == "times":
                    q.having = (op, n)
                else:
                    q.cmp = value
            elif kind == "compare":
                q.compare = True
            elif kind == "entity":
                if pending_group in ("each", "every", "for each", "for every"):   # "each validation": one row each
                    q.per_item, pending_group = True, False
                elif pending_group and (q.rank or q.top):   # "top 2 nodes by incidents": ranked by their count
                    pending_group = False
                own = [x for x in fitting if x.kind == "measure"]
                if own and q.measure is None:     # "time out of service" names the entity and its measure
                    q.measure = ent.columns[own[0].value]
                q.conds += [x.value for x in fitting if x.kind == "cond"]   # "in remediation": entity and state
                if s.start and tokens[s.start - 1].text in ("which", "what") and ent.label not in ("id", "rowid"):
                    q.which = True
                    if not q.project and ent.label in ent.columns and not ent.now:
                        q.project = ent.label   # "which health checks failed": one row per check
                elif s.start and tokens[s.start - 1].text in ("which", "what"):
                    q.which = True
            elif kind == "cond":
                q.conds.append(value)
            elif kind == "measure" and pending_group and not ent.columns[value].unit:   # "each rank"
                q.group.append(value)
            elif kind == "measure" or kind == "metric":
                col = ent.columns[value] if kind == "measure" else None
                if kind == "metric":
                    mn = ent.measure_names
                    col = Column(mn["value"], f"src.{mn['value']}", "measure", unit_of(value), [], "")
                    q.conds.append(Cond(ent.name, f"{mn['column']} = ?", value, mn["column"], (value,)))
                if q.measure is not None and q.measure.name != col.name:
                    unknown.append(s.text)
                    continue
                q.measure = col
            elif kind == "time":
                q.time_col = value
            elif kind == "column":
                if pending_group:
                    q.group.append(value)
                else:
                    q.show.append(value)
            elif kind == "json":
                q.conds.append(_json_cond(ent, value))
            elif kind == "dim":
                col = ent.refs.get(value) or ("node" if value == "node" else None)
                if pending_group:
                    q.group.append(col)
                elif col and not (ent.now and ent.label == col):
                    before = tokens[s.start - 1].text if s.start else ""
                    if before in ("which", "what", "list", "the", "show", "top", "of", "those", "many", "all",
                                  "every", "distinct", "different") or before.isdigit():
                        q.project = q.project or col     # "which nodes ...": one row per node
                        q.count_distinct = before in ("many", "distinct", "different")
            elif kind == "hypo":
                q.hypo = value
            if pending_group in ("each", "every") and kind in ("measure", "time"):   # "until each came back"
                pending_group = False
            if pending_group and not (kind in ("dim", "column") or (kind == "measure" and q.group)):
                unknown.append(pending_group)   # "per" or "each" that groups by nothing understood
            pending_group = False
        if pending_group:
            unknown.append(pending_group)
        if negate:
            unknown.append(negate)
        if yesno and q.qkind == "list":
            q.qkind = "yesno"
        q.which = q.which or any(t.text == "which" for t in tokens)
        if most and q.measure and q.project and not q.agg:   # "spent the most time": the total per node
            q.agg = "sum"
        if q.compare:   # "compare X on node1 and node2": one row per node (or job)
            ref = "node" if len(q.nodes) > 1 else "job" if len(q.jobs) > 1 else None
            if ref and ent.refs.get(ref) and not ent.refs[ref].startswith("list:"):
                q.group.append(ent.refs[ref])
            else:
                unknown.append("compare")
        if q.having and not q.project and not q.group:
            dims = [ent.refs.get(m.value) for s in spans for m in s.meanings if m.kind == "dim"]
            dims = [d for d in dims if d and not d.startswith("list:")]
            if dims:
                q.project = dims[0]
        if q.show and not q.project and (q.qkind == "count" or q.rank or q.having):  # "which playbooks, how often"
            q.project = q.show.pop(0)
        q.understood = [u for u in q.understood if u]
        return Parse(q, unknown, unknown_nodes, q.understood)
