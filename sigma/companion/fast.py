"""The fast tier: no language model. A question is parsed into slots (sigma.companion.parse) over a model of the
database (sigma.companion.model), composed into one SELECT (sigma.companion.compose), run read-only and said in
words (sigma.companion.say). It answers as fact only when every word of the question was understood and the slots
make one query; otherwise it says what it understood and what it did not, or asks back.
"""

from __future__ import annotations

import re
import sqlite3
import time
from datetime import datetime, tzinfo

from sigma.companion.answer import Answer
from sigma.companion.compose import NotUnderstood, compose
from sigma.companion.model import Model, build
from sigma.companion.parse import Parser
from sigma.companion.safe_sql import UnsafeQuery, run_select
from sigma.companion.say import say

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
    q = parsed.query
    if q is None:
        return ", ".join(parsed.understood)
    bits = [q.entity.name.replace("_", " ")]
    bits += [f"{k} {', '.join(map(str, v))}" for k, v in (("node", q.nodes), ("job", q.jobs), ("rule", q.rules)) if v]
    bits += [c.label for c in q.conds]
    for name, v in (("time", q.period), ("measure", q.measure.name if q.measure else ""), ("aggregate", q.agg),
                    ("superlative", q.rank), ("order", q.order), ("per", ", ".join(q.group)),
                    ("one row per", q.project), ("question", q.qkind if q.qkind != "list" else ""),
                    ("what if", q.hypo)):
        if v:
            bits.append(f"{name}: {v}")
    if q.cmp:
        bits.append(f"{q.cmp[0]} {q.cmp[1]:g}{q.cmp[2] and ' ' + q.cmp[2]}")
    if q.having:
        bits.append(f"count {q.having[0]} {q.having[1]:g}")
    if q.bucket is not None:
        bits.append("over time")
    return " · ".join(bits)


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
    if parsed.ambiguous:
        names = " or ".join(n.replace("_", " ") for n in parsed.ambiguous)
        return Answer(text=f"Do you mean {names}? The words ({understood}) fit each of them; name the one you mean.",
                      tier="fast", status="clarify", understood=understood)
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
    text = say(q, built, result.columns, result.rows, tz)
    return Answer(text=text, columns=result.columns, rows=result.rows, sql=built.sql, params=list(built.params),
                  tier="fast", intent=q.entity.name, status="fact", understood=understood,
                  units={c: u for c, u in built.units.items() if c in result.columns}, truncated=result.truncated)
