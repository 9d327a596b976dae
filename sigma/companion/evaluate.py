"""Execution-match scoring of the companion against a question set with ground-truth SQL.

An answer is right when its table holds every column of the ground truth's result: for each ground-truth column
some answer column has the same values (floats to one decimal, in any row order) and both have the same number of
rows. Extra columns are allowed (an answer may say more); a missing or different column is wrong.
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
class Scored:
    question: str
    tier: str              # the set's tier (simple/hard)
    answered_by: str       # fast / llm / none
    right: bool
    latency_s: float
    detail: str = ""


def _norm(v) -> str:
    if v is None:
        return ""
    if isinstance(v, float):
        return f"{v:.1f}"
    if isinstance(v, int):
        return f"{float(v):.1f}"
    try:
        return f"{float(v):.1f}"
    except (TypeError, ValueError):
        return str(v).strip().lower()


def columns_of(columns_rows: tuple[list[str], list[tuple]]) -> list[Counter]:
    _, rows = columns_rows
    width = len(rows[0]) if rows else 0
    return [Counter(_norm(r[i]) for r in rows) for i in range(width)]


def matches(gold_rows: list[tuple], answer: Answer) -> tuple[bool, str]:
    if answer.clarify:
        return False, "asked back"
    if len(gold_rows) != len(answer.rows):
        return False, f"{len(answer.rows)} rows, expected {len(gold_rows)}"
    if not gold_rows:
        return True, "both empty"
    got = columns_of((answer.columns, answer.rows))
    for i, want in enumerate(columns_of(([], gold_rows))):
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
    return conn.execute("SELECT MAX(ts) FROM (SELECT MAX(ts) AS ts FROM kpis UNION SELECT MAX(ts) FROM events "
                        "UNION SELECT MAX(ts) FROM node_snapshots)").fetchone()[0]


def load_questions(path: Path) -> list[tuple[str, str, str]]:
    """[(tier, question, sql)] from the YAML set."""
    data = yaml.safe_load(path.read_text())
    return [(tier, item["q"], item["sql"]) for tier in ("simple", "hard") for item in data.get(tier, [])]


def evaluate(conn: sqlite3.Connection, questions: list[tuple[str, str, str]], *, llm=None) -> list[Scored]:
    from sigma.companion.ask import ask

    now = reference_time(conn)
    out = []
    for tier, question, sql in questions:
        try:
            gold = conn.execute(sql).fetchall()
        except sqlite3.Error as exc:
            raise ValueError(f"ground truth of {question!r} does not run: {exc}") from None
        started = time.monotonic()
        answer = ask(conn, question, llm=llm, now=now)
        latency = time.monotonic() - started
        right, detail = matches([tuple(r) for r in gold], answer)
        out.append(Scored(question, tier, answer.tier, right, latency, detail))
    return out


def summary(scored: list[Scored], tier: str) -> dict:
    rows = [s for s in scored if s.tier == tier]
    lat = sorted(s.latency_s for s in rows)
    return {"questions": len(rows), "right": sum(s.right for s in rows),
            "accuracy": sum(s.right for s in rows) / len(rows) if rows else 0.0,
            "median_s": statistics.median(lat) if lat else 0.0, "max_s": lat[-1] if lat else 0.0,
            "by": dict(Counter(s.answered_by for s in rows))}
