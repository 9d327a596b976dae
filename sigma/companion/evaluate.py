"""Execution-match scoring of the companion against question sets with ground truth written apart from it.

Each question has either `sql` (ground truth, run on the same database) or `refuse` (the right answer is "I can't
tell" or a question back; the text says why). An answer given as fact is right when its table holds every column of
the ground truth's result: for each ground-truth column some answer column has the same values (numbers to one
decimal, in any row order) and both have the same number of rows; extra columns are allowed (an answer may say
more). An answer given as fact where the set expects a refusal, or whose table does not match, is a *wrong fact* —
the one outcome the companion must never produce. An honest "I did not understand ..." where a ground truth exists
is a miss, not a wrong fact.
"""

from __future__ import annotations

import sqlite3
import statistics
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import yaml

from sigma.companion.answer import Answer


@dataclass
class Question:
    tier: str              # simple | hard
    text: str
    sql: str = ""          # ground truth; empty when the right answer is a refusal
    refuse: str = ""       # why the right answer is "I can't" or a question back
    where: str = ""        # file:line, for messages


@dataclass
class Scored:
    question: str
    tier: str              # the set's tier (simple/hard)
    answered_by: str       # fast / llm / none
    status: str            # fact / partial / clarify / cannot
    right: bool
    wrong_fact: bool       # given as fact, and wrong
    latency_s: float
    detail: str = ""


def _norm(v) -> str:
    if v is None:
        return ""
    if isinstance(v, bool):
        v = int(v)
    try:
        return f"{float(v):.1f}"
    except (TypeError, ValueError):
        return str(v).strip().lower()


def _columns(rows: list[tuple]) -> list[Counter]:
    width = len(rows[0]) if rows else 0
    return [Counter(_norm(r[i]) for r in rows) for i in range(width)]


def matches(gold_rows: list[tuple], answer: Answer) -> tuple[bool, str]:
    if len(gold_rows) != len(answer.rows):
        return False, f"{len(answer.rows)} rows, expected {len(gold_rows)}"
    if not gold_rows:
        return True, "both empty"
    got = _columns(answer.rows)
    for i, want in enumerate(_columns(gold_rows)):
        if want not in got:
            return False, f"no column matches ground-truth column {i + 1} ({sorted(want)[:3]}...)"
    return True, ""


def load_dump(sql_path: Path, db_path: Path | None = None) -> sqlite3.Connection:
    """A controller database (migrated schema) holding a dump's rows; in memory unless db_path is given."""
    from sigma.controller.db import MIGRATIONS
    from sigma.store import migrate

    conn = sqlite3.connect(str(db_path) if db_path else ":memory:", check_same_thread=False)
    migrate(conn, MIGRATIONS)
    conn.executescript("BEGIN;\n" + sql_path.read_text() + "\nCOMMIT;")  # one transaction, not one per row
    return conn


def reference_time(conn: sqlite3.Connection) -> float:
    """'Now' for a recorded database: its newest timestamp."""
    return conn.execute("SELECT MAX(ts) FROM (SELECT MAX(ts) AS ts FROM kpis UNION SELECT MAX(ts) FROM events "
                        "UNION SELECT MAX(ts) FROM node_snapshots)").fetchone()[0]


def load_questions(path: Path) -> list[Question]:
    """The questions of one YAML set: {simple: [...], hard: [...]}, each item {q, sql} or {q, refuse}."""
    text = path.read_text()
    data = yaml.safe_load(text) or {}
    lines = text.splitlines()
    out = []
    for tier in ("simple", "hard"):
        for item in data.get(tier) or []:
            q = item.get("q") if isinstance(item, dict) else None
            line = next((i + 1 for i, l in enumerate(lines) if q and q in l), 0)
            where = f"{path}:{line}"
            if not q or bool(item.get("sql")) == bool(item.get("refuse")):
                raise ValueError(f"{where}: each question needs q and exactly one of sql or refuse: {item!r}")
            out.append(Question(tier, q, item.get("sql", ""), item.get("refuse", ""), where))
    return out


def score(conn: sqlite3.Connection, q: Question, answer: Answer) -> tuple[bool, bool, str]:
    """(right, wrong_fact, detail)."""
    fact = answer.status in ("fact", "model")   # a model's answer is scored like one given as fact
    if q.refuse:
        return (not fact), fact, ("answered as fact, expected: " + q.refuse) if fact else ""
    try:
        gold = [tuple(r) for r in conn.execute(q.sql).fetchall()]
    except sqlite3.Error as exc:
        raise ValueError(f"{q.where}: ground truth of {q.text!r} does not run: {exc}") from None
    if not fact:
        return False, False, f"not answered ({answer.status}): {answer.text[:160]}"
    right, detail = matches(gold, answer)
    return right, not right, detail


def evaluate(conn: sqlite3.Connection, questions: list[Question], *, llm=None, tz=None) -> list[Scored]:
    from sigma.companion.ask import ask

    now = reference_time(conn)
    out = []
    for q in questions:
        started = time.monotonic()
        answer = ask(conn, q.text, llm=llm, now=now, tz=tz)
        latency = time.monotonic() - started
        right, wrong_fact, detail = score(conn, q, answer)
        out.append(Scored(q.text, q.tier, answer.tier, answer.status, right, wrong_fact, latency, detail))
    return out


def summary(scored: list[Scored], tier: str | None = None) -> dict:
    rows = [s for s in scored if tier is None or s.tier == tier]
    lat = sorted(s.latency_s for s in rows)
    return {"questions": len(rows), "right": sum(s.right for s in rows),
            "accuracy": sum(s.right for s in rows) / len(rows) if rows else 0.0,
            "wrong_facts": sum(s.wrong_fact for s in rows),
            "median_s": statistics.median(lat) if lat else 0.0, "max_s": lat[-1] if lat else 0.0,
            "by": dict(Counter(s.status for s in rows))}
