"""The fast tier: no language model. A question is parsed into slots (sigma.companion.parse) over a model of the
database (sigma.companion.model), composed into one SELECT (sigma.companion.compose), run read-only and said in
words (sigma.companion.say). It answers as fact only when every word of the question was understood and the slots
make one query; otherwise it says what it understood and what it did not, or asks back.
"""

from __future__ import annotations

import re
import sqlite3
import time
from collections import Counter
from dataclasses import replace
from datetime import datetime, tzinfo

from sigma.companion.answer import Answer
from sigma.companion.compose import Built, NotUnderstood, compose
from sigma.companion.lexicon import STOPWORDS, phrase_stems
from sigma.companion.model import Cond, Model, build
from sigma.companion.parse import Parser, Query
from sigma.companion.safe_sql import UnsafeQuery, run_select
from sigma.companion.say import noun, reading, say, scope

VAGUE = re.compile(r"\b(my|this|that) (job|node|run|training run|machine)\b(?! ?#?\d)")

_CACHE: dict[tuple, tuple[float, Model, Parser]] = {}
MODEL_TTL_S = 60.0   # values and keys are learnt again after this long (a new node, a new rule)


def parser_for(conn: sqlite3.Connection) -> Parser:
    """The parser for this database, learnt again when its schema changes or after MODEL_TTL_S."""
    path = conn.execute("PRAGMA database_list").fetchone()[2]
    key = (path or id(conn), conn.execute("PRAGMA schema_version").fetchone()[0])
    hit = _CACHE.get(key)
    if hit is None or time.monotonic() - hit[0] > MODEL_TTL_S:
        model = build(conn)
        hit = (time.monotonic(), model, Parser(model))
        _CACHE[key] = hit
    return hit[2]


def describe(parsed) -> str:
    if parsed.query is None:
        return ", ".join(parsed.understood)
    return describe_query(parsed.query)


def describe_query(q) -> str:
    bits = [q.entity.name.replace("_", " ")]
    bits += [f"{k} {', '.join(map(str, v))}" for k, v in (("node", q.nodes), ("job", q.jobs), ("rule", q.rules)) if v]
    bits += [c.label for c in q.conds] + [f"not {k} {', '.join(map(str, v))}" for k, v in q.exclude.items()]
    for name, v in (("time", q.period), ("measure", q.measure.name if q.measure else ""), ("aggregate", q.agg),
                    ("superlative", q.rank), ("order", q.order), ("per", ", ".join(q.group)),
                    ("one row per", q.project), ("question", q.qkind if q.qkind != "list" else ""),
                    ("what if", q.hypo), ("in", q.unit), ("beside", q.versus.words if q.versus else ""),
                    ("time since", "now" if q.ago else ""),
                    ("less those of", q.without.name.replace("_", " ") if q.without else "")):
        if v:
            bits.append(f"{name}: {v}")
    if q.cmp:
        bits.append(f"{q.cmp[0]} {q.cmp[1]:g}{q.cmp[2] and ' ' + q.cmp[2]}")
    if q.having:
        bits.append(f"count {q.having[0]} {q.having[1]:g}")
    if q.bucket is not None:
        bits.append("over time")
    return " · ".join(bits) + "".join(f" · and: {describe_query(x)}" if x else " · and: ?" for x in q.extras)


def _alternatives(conn: sqlite3.Connection, queries: list, now: float, offset: float) -> list[tuple]:
    """(query, built, columns, rows) of each other reading; built and rows None where it makes no query this tier
    can run (a reading all the same: its answer is not known, so it is not the same as another's)."""
    out = []
    for q in queries:
        try:
            built = compose(q, now, offset)
            result = run_select(conn, built.sql, tuple(built.params))
            q, built, result = _settled(conn, q, built, result, now, offset)
        except (NotUnderstood, UnsafeQuery, sqlite3.Error):
            out.append((q, None, [], None))
            continue
        out.append((q, built, result.columns, result.rows))
    return out


def _norm(v) -> str:
    """A value as two readings are compared: numbers to one decimal, text without case."""
    if isinstance(v, (int, float)):
        return f"{float(v):.1f}"
    return "" if v is None else str(v).strip().lower()


def _answer_columns(q, built, columns: list[str]) -> list[str]:
    """The columns that are the answer: the value of a scalar; the keys and value of groups (for "which nodes ..."
    the nodes: a count beside each is extra); the rows' node/job/rule or label, and their measure."""
    if built.shape == "scalar":
        cols = [built.value] if built.value in columns else columns
    elif built.shape in ("groups", "ranking"):
        cols = columns[:-1] if q.which and built.shape == "groups" and len(columns) > 1 else columns
    else:
        label = q.project if q.project in columns else q.entity.label
        cols = [c for c in (label, built.value) if c in columns] or columns
    return [f"{q.entity.name}.id" if c == "id" else c for c in cols]   # ids of two tables are different things


def _same(a: tuple, b: tuple) -> bool:
    """Two readings give the same answer: both nothing, or the same answer columns with the same values."""
    (qa, ba, ca, ra), (qb, bb, cb, rb) = a, b
    if ra is None or rb is None:
        return False
    if not ra and not rb:
        return True
    wanted = _answer_columns(qa, ba, ca)
    if sorted(wanted) != sorted(_answer_columns(qb, bb, cb)):
        return False
    values = lambda q, cols, rows: Counter(tuple(_norm(r[cols.index(c.split(".")[-1])]) for c in wanted)  # noqa: E731
                                          for r in rows)
    return values(qa, ca, ra) == values(qb, cb, rb)


def _found(rows: list) -> bool:
    """Some row answers: not none, and not a count of none."""
    return bool(rows) and rows != [(0,)]


def _one_of_many(q, built, rows: list) -> bool:
    """A question for one time or duration ("when did node1 come back", "how long did detection take") that several
    rows answer, with no word saying which (each, first, last, average, total)."""
    return (q.qkind in ("when", "duration") and built.shape == "rows" and len(rows) > 1
            and not (q.agg or q.rank or q.order or q.per_item or q.group or q.project or q.extras or q.compare
                     or q.bucket is not None))


def _assumed(q: Query) -> Query | None:
    """The reading an admin means by one time or one duration of several rows, said in the answer with how many
    rows there are: the latest time ("when did node1 come back": the last time), the total of a time that adds up
    (a measure whose default aggregate in the schema document is the sum: "how long was node2 out of service"), the
    average of any other duration ("how long did detection take for xid errors"). Rows named in the plural ("when
    were the drains") are each listed instead: None. A total is of what the question names (a node, a job, a rule,
    a window, a condition): "how long was the downtime?" names none, so "the" one of many is not forced: None."""
    if q.plural:
        return None
    count = [Query(q.entity, qkind="count")]
    if q.qkind == "when":
        return replace(q, order="latest", assumed="latest", extras=count)
    m = q.measure or next((c for c in q.entity.measures() if c.unit == "s"), None)
    agg = "sum" if m is not None and m.agg == "sum" else "avg"
    if agg == "sum" and not (q.nodes or q.jobs or q.rules or q.conds or q.exclude or q.since is not None
                             or q.until is not None):
        return None
    return replace(q, agg=agg, assumed=agg, extras=count)


def _settled(conn, q, built, result, now: float, offset: float) -> tuple:
    """(query, built, result) of one reading, with the default an admin means where it asks one value of several
    rows (_assumed); unchanged otherwise."""
    if not _one_of_many(q, built, result.rows):
        return q, built, result
    other = _assumed(q)
    if other is None:
        return q, built, result
    built = compose(other, now, offset)
    return other, built, run_select(conn, built.sql, tuple(built.params))


def _no_values(conn, q, built, columns: list[str], rows: list, now: float, offset: float) -> bool:
    """The measure asked about has no value in any row in scope, though there are rows (a column the data never
    fills, like MFU without a known peak): "none" would read as a fact about the cluster, so it is said as the
    data's gap. No rows at all ("the throughput of job 9", a job with no KPI lines) stays an answer: none."""
    value = built.value or (columns[-1] if built.shape in ("groups", "ranking") and columns else "")
    if q.measure is None or value not in columns or not rows:
        return False
    i = columns.index(value)
    if any(r[i] is not None for r in rows):
        return False
    count = compose(Query(q.entity, conds=q.conds, since=q.since, until=q.until, nodes=q.nodes, jobs=q.jobs,
                          rules=q.rules, exclude=q.exclude, qkind="count"), now, offset)
    return bool(run_select(conn, count.sql, tuple(count.params)).rows[0][0])


def _parts_differ(conn, q, built, rows: list, now: float, offset: float) -> bool:
    """The listed rows merge parts (a checkpoint: its ranks' writes) and there are not as many parts as rows: one
    list cannot be both, so both numbers are said instead (a count or an aggregate over such rows says both)."""
    if not q.entity.parts or built.shape != "rows" or q.per_item or q.project or q.group or q.which:
        return False
    count = compose(replace(q, entity=replace(q.entity, source=q.entity.parts[1], parts=None, default=""),
                            qkind="count", measure=None, cmp=None, order="", show=[], plural=False), now, offset)
    return run_select(conn, count.sql, tuple(count.params)).rows[0][0] != len(rows)


def _senses(q, question: str) -> tuple[Query, Query, list]:
    """The question with the words whose sense their place fixes ("log errors": of the kernel log), then read
    with each word readers take two ways (the entity's `senses`: "logged" by any source or in the kernel log,
    "errors" of severity error or error or critical) in its other reading, and those senses."""
    stems = phrase_stems(question)
    base, conds, said = list(q.conds), list(q.conds), []
    for sense in q.entity.senses:
        at = [i + len(w) for w in sense.words for i in range(len(stems)) if stems[i:i + len(w)] == w]
        own = [c for c in conds if c.column == sense.column]
        if not at or [c.label for c in own] != ([f"{sense.column} {sense.value}"] if sense.value else []):
            continue   # the question says its own value ("kernel log errors": no other reading of "logged")
        cond = Cond(q.entity.name, sense.sql, sense.said, sense.column)
        if sense.modifier and all(i < len(stems) and stems[i] not in STOPWORDS for i in at):   # "log errors"
            base, conds = base + [cond], conds + [cond]
            continue
        conds = [c for c in conds if c not in own] + [cond]
        said.append(sense)
    return replace(q, conds=base), replace(q, conds=conds), said


def _both_senses(q, built: Built, columns: list[str], other: Built, senses: list) -> Built | None:
    """A count read both ways, side by side ("3 events; kernel log only and critical too: 2"), one row per group
    where it is grouped; None for any other answer (a list or a ranking is one reading or the other)."""
    if (built.value or columns[-1]) != "n" or built.extras or built.shape not in ("scalar", "groups") \
            or q.qkind == "yesno":
        return None
    name = "as_" + "_and_".join("_".join(re.findall(r"[a-z0-9]+", x.said)) for x in senses)
    params = list(built.params) + list(other.params)
    if built.shape == "scalar":
        return Built(f"SELECT ({built.sql}) AS n, ({other.sql}) AS {name}", params, dict(built.units), "scalar",
                     "n", extras=[name])
    keys = columns[:-1]   # the groups' keys, then the count
    if not keys or columns[-1] != "n" or not all(re.fullmatch(r"[a-z_]+", k) for k in keys):
        return None
    on = lambda t: " AND ".join(f"{t}.{k} IS k.{k}" for k in keys)  # noqa: E731
    cols = ", ".join(f"k.{k}" for k in keys)
    return Built(f"WITH a AS ({built.sql}), b AS ({other.sql}) SELECT {cols}, COALESCE(a.n, 0) AS n, "
                 f"COALESCE(b.n, 0) AS {name} FROM (SELECT {', '.join(keys)} FROM a UNION SELECT {', '.join(keys)} "
                 f"FROM b) k LEFT JOIN a ON {on('a')} LEFT JOIN b ON {on('b')} ORDER BY {cols}", params,
                 dict(built.units), "groups", "n", extras=[name])


def _which_one(q, rows: list, understood: str) -> Answer:
    """A question back: which of several rows' times or durations."""
    one, options, words = (("time", "each time, the first or the last", "each, first, last") if q.qkind == "when"
                           else ("duration", "each one's, their average or their total", "each, average, total"))
    return Answer(text=f"{len(rows)} {noun(q, len(rows))}{scope(q)} match; you asked for one {one}: do you mean "
                       f"{options}? Ask again with that word ({words}).", tier="fast", intent=q.entity.name,
                  status="clarify", understood=understood)


def answer(conn: sqlite3.Connection, question: str, *, now: float | None = None, tz: tzinfo | None = None) -> Answer:
    now = time.time() if now is None else now
    parser = parser_for(conn)
    parsed = parser.parse(question, now, tz)
    understood = describe(parsed)
    vague = VAGUE.search(question.lower())
    if parsed.unknown_nodes:
        return Answer(text=f"I know no node named {', '.join(parsed.unknown_nodes)}; ask about one the controller "
                           "has seen (see `sigma nodes` or `sinfo`).", tier="fast", status="clarify",
                      understood=understood, not_understood=parsed.unknown_nodes)
    if parsed.command:
        return Answer(text=f"I only read the controller's data; I do not {parsed.command} anything. Use the SLURM or "
                           "sigma commands for that (e.g. `scontrol`, `sigma nodes`).", tier="fast",
                      status="cannot", understood=understood, not_understood=[parsed.command])
    if parsed.query is None:
        return Answer(text="I cannot answer that from the controller's data: I did not recognise what it asks "
                           f"about ({', '.join(parsed.unknown) or 'nothing I know'}).", tier="fast",
                      status="cannot", understood=understood, not_understood=parsed.unknown)
    q = parsed.query
    if vague and not (q.jobs if vague.group(2) in ("job", "run", "training run") else q.nodes):
        thing = "job" if vague.group(2) in ("job", "run", "training run") else "node"
        return Answer(text=f"Which {thing}? Give its {'SLURM job id' if thing == 'job' else 'name'}, e.g. "
                           f"'{'why did job 42 restart?' if thing == 'job' else 'what state is node3 in?'}'",
                      tier="fast", intent=q.entity.name, status="clarify", understood=understood)
    if q.judged and not parsed.unknown:
        thing = q.judged.split()[-1]
        return Answer(text=f"'{q.judged}' has several readings whose answers differ: the {thing} of "
                           f"{' or '.join(q.rules)} incidents, or a measure of each {thing.rstrip('s')} (its step "
                           f"time, load or utilisation) against the others. Which do you mean? Ask with that "
                           f"measure, or 'incidents'.", tier="fast", intent=q.entity.name, status="clarify",
                      understood=understood)
    if parsed.unknown:
        return Answer(text=f"I understood {understood}, but not: {', '.join(repr(w) for w in parsed.unknown)}. "
                           "I will not guess at those, so this is not an answer; rephrase, or configure a language "
                           "model (SIGMA_LLM_BASE_URL, SIGMA_LLM_MODEL) for questions beyond the schema's words.",
                      tier="fast", intent=q.entity.name, status="partial", understood=understood,
                      not_understood=parsed.unknown)
    offset = datetime.fromtimestamp(now, tz).astimezone(tz).utcoffset().total_seconds()
    try:
        built = compose(q, now, offset)
    except NotUnderstood as exc:
        return Answer(text=f"I understood {understood}, but these parts do not make one question I can answer "
                           f"from the data: {exc}.", tier="fast", intent=q.entity.name, status="partial",
                      understood=understood, not_understood=[str(exc)])
    try:
        result = run_select(conn, built.sql, tuple(built.params))
    except (UnsafeQuery, sqlite3.Error) as exc:  # a query this tier wrote that does not run: say so, never guess
        return Answer(text=f"I understood {understood}, but my query for it failed ({exc}).", sql=built.sql,
                      params=list(built.params), tier="fast", intent=q.entity.name, status="cannot",
                      understood=understood, not_understood=[str(exc)])
    try:
        q, built, result = _settled(conn, q, built, result, now, offset)
    except (NotUnderstood, UnsafeQuery, sqlite3.Error) as exc:   # the default does not compose: ask which
        return _which_one(q, result.rows, understood) if _one_of_many(q, built, result.rows) else Answer(
            text=f"I understood {understood}, but my query for it failed ({exc}).", tier="fast",
            intent=q.entity.name, status="cannot", understood=understood, not_understood=[str(exc)])
    if not q.plural and _one_of_many(q, built, result.rows):   # one of many with no default forced: ask which
        return _which_one(q, result.rows, understood)
    if q.one_value() and len(result.rows) > 1:   # "what stage was node2 in": one of several, no word says which
        return Answer(text=f"{', '.join(q.nodes + [f'job {j}' for j in q.jobs])} had {len(result.rows)} "
                           f"{q.project.replace('_', ' ')} values ({', '.join(str(r[0]) for r in result.rows[:8])}); "
                           "you asked for one: the latest, the first, or each? Ask again with that word, or a time.",
                      tier="fast", intent=q.entity.name, status="clarify", understood=understood)
    readings = [(q, built, result.columns, result.rows)] + _alternatives(conn, [
        x for x in parsed.alternatives if not (x.noun_of_name and _found(result.rows))], now, offset)
    distinct = [r for i, r in enumerate(readings) if not any(_same(r, o) for o in readings[:i])]
    if len(distinct) > 1:   # the words fit readings whose answers differ: ask which, never pick one
        names = "; or ".join(reading(r[0]) + (" (not one I can answer from the data)" if r[3] is None else "")
                             for r in distinct)
        return Answer(text=f"Your words fit {len(distinct)} readings with different answers: {names}. Which do you "
                           "mean? Ask again with the words of that one.", tier="fast", intent=q.entity.name,
                      status="clarify", understood=" | ".join(describe_query(r[0]) for r in distinct))
    parted = _parts_differ(conn, q, built, result.rows, now, offset)
    if parted:   # "checkpoints written in the last 30 minutes":
        q = replace(q, qkind="count", plural=False)   # 19 checkpoints or their 28 rank writes: both numbers, as a
        built = compose(q, now, offset)              # list is one or the other
        result = run_select(conn, built.sql, tuple(built.params))
    fixed, other_q, senses = _senses(q, question) if not parted else (q, q, [])
    otherwise = ""
    try:
        if fixed != q:   # "log errors": the kernel log's, the one reading
            q, built = fixed, compose(fixed, now, offset)
            result = run_select(conn, built.sql, tuple(built.params))
        if senses:   # a word readers take two ways: where the answers differ, both are said
            other = compose(other_q, now, offset)
            other_result = run_select(conn, other.sql, tuple(other.params))
            if _same((q, built, result.columns, result.rows),
                     (other_q, other, other_result.columns, other_result.rows)):
                senses = []
            else:
                both = _both_senses(q, built, result.columns, other, senses)
                keys = lambda rows: {r[:-1] for r in rows}  # noqa: E731
                if both is not None and (q.which or q.qkind != "count") and keys(result.rows) != keys(
                        other_result.rows):   # "which kinds ... more than once": the groups are the answer, so
                    both = None               # both readings must have the same ones
                if both is None:   # a list or a ranking is one reading or the other: the first, the other's said
                    otherwise = say(other_q, other, other_result.columns, other_result.rows, tz)
                else:
                    built, result = both, run_select(conn, both.sql, tuple(both.params))
    except (NotUnderstood, UnsafeQuery, sqlite3.Error) as exc:   # a reading that does not compose: no answer
        return Answer(text=f"I understood {understood}, but these parts do not make one question I can answer "
                           f"from the data: {exc}.", tier="fast", intent=q.entity.name, status="partial",
                      understood=understood, not_understood=[str(exc)])
    if _no_values(conn, q, built, result.columns, result.rows, now, offset):   # "what MFU is job 1 getting"
        return Answer(text=f"The data holds no values of {q.measure.name.replace('_', ' ')} for {noun(q, 2)}"
                           f"{scope(q)}: no row in scope has one, so I cannot tell.", sql=built.sql,
                      params=list(built.params), tier="fast", intent=q.entity.name, status="cannot",
                      understood=understood, not_understood=[q.measure.name])
    text = say(q, built, result.columns, result.rows, tz)
    if parted:
        text += f" A list is one or the other: ask with 'each' for the {noun(q)}, one row each."
    if senses:
        text += " Read two ways, as the words allow: " + "; ".join(x.means for x in senses) + (
            f". Read the other way: {otherwise}" if otherwise else ".")
    return Answer(text=text, columns=result.columns, rows=result.rows, sql=built.sql, params=list(built.params),
                  tier="fast", intent=q.entity.name, status="fact", understood=understood,
                  units={c: u for c, u in built.units.items() if c in result.columns}, truncated=result.truncated)
