"""The schema document the companion (and a language model) reads, generated from the controller's migrations so it
never drifts from the database: every allowed table with its columns and types (from SQLite itself after applying
the migrations) and the meaning written beside them in the migration SQL (`-- ...` comments), plus the conventions
that no column type says (units, JSON columns, join keys).
"""

from __future__ import annotations

import re
import sqlite3
from dataclasses import dataclass, field
from functools import lru_cache

from sigma.companion.safe_sql import ALLOWED_TABLES

CONVENTIONS = """\
Conventions:
- Every *_at, ts and fault_ts column is a Unix timestamp in seconds (REAL); durations are differences of them.
  Use datetime(ts, 'unixepoch') to show one; "now" is unixepoch('now') (or the question's reference time).
- node is a SLURM node name (node1, gpu-a-017, ...); job_id is a SLURM job id (INTEGER).
- job_ids in samples and events is a JSON list of the job ids running on that node then: json_each(job_ids).
- incidents.evidence and actions.params are JSON objects; json_extract(evidence, '$.isolation.reason') etc.
- incidents: one row per detected fault (rule_id names the rule or detector: gpu-xid-79, watchdog-hang,
  isolation-outlier, health-prolog-failed, ...). Detection latency = opened_at - fault_ts.
- actions.incident_id -> incidents.id; actions.kind is drain, requeue, start_now, reboot, resume, notify, ...;
  actions.state is planned, done, skipped, failed or shadow; automatic = 0 means a person did it.
- node_lifecycle: one row per node the controller took out of service (its current remediation state);
  lifecycle_transitions: every state change (drained -> waiting_jobs -> remediating -> validating -> resumed),
  so the time a node was out of service is the resumed transition's ts minus the drained transition's ts of the
  same (node, cycle).
- node_snapshots: SLURM's node state each time it changed (state, reason, jobs as a JSON list).
- kpis: one row per rank per reported training step (loss, step_time_s, tokens_per_s, mfu, grad_norm).
"""


@dataclass
class Column:
    name: str
    type: str
    note: str = ""


@dataclass
class Table:
    name: str
    note: str
    columns: list[Column] = field(default_factory=list)


def _comments(sql: str) -> tuple[dict[str, str], dict[tuple[str, str], str]]:
    """Table notes (comment lines just above CREATE TABLE) and column notes (a `-- ...` at the end of a column)."""
    table_notes: dict[str, str] = {}
    column_notes: dict[tuple[str, str], str] = {}
    pending: list[str] = []
    current = None
    for raw in sql.splitlines():
        line = raw.strip()
        if line.startswith("--"):
            pending.append(line[2:].strip())
            continue
        m = re.match(r"CREATE TABLE (?:IF NOT EXISTS )?(\w+)", line, re.I)
        if m:
            current = m.group(1).lower()
            if pending:
                table_notes[current] = " ".join(pending)
        elif current and "--" in line:
            code, note = line.split("--", 1)
            names = re.findall(r"(?:^|,)\s*(\w+)\s+(?:TEXT|REAL|INTEGER)", code)
            for name in names:
                column_notes[(current, name.lower())] = note.strip()
        if line.endswith(");") or line.endswith(") WITHOUT ROWID;"):
            current = None
        pending = []
    return table_notes, column_notes


@lru_cache(maxsize=1)
def tables() -> tuple[Table, ...]:
    from sigma.controller.db import MIGRATIONS
    from sigma.store import migrate

    conn = sqlite3.connect(":memory:")
    migrate(conn, MIGRATIONS)
    table_notes: dict[str, str] = {}
    column_notes: dict[tuple[str, str], str] = {}
    for _, sql in MIGRATIONS:
        t, c = _comments(sql)
        table_notes.update(t)
        column_notes.update(c)
    out = []
    for (name,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name"):
        if name not in ALLOWED_TABLES:
            continue
        cols = [Column(r[1], r[2] or "ANY", column_notes.get((name, r[1].lower()), ""))
                for r in conn.execute(f"PRAGMA table_info({name})")]
        out.append(Table(name, table_notes.get(name, ""), cols))
    return tuple(out)


def column_names() -> dict[str, set[str]]:
    return {t.name: {c.name for c in t.columns} for t in tables()}


def schema_document() -> str:
    """Plain text: one block per table, then the conventions."""
    parts = []
    for t in tables():
        head = f"TABLE {t.name}" + (f"  -- {t.note}" if t.note else "")
        cols = [f"  {c.name} {c.type}" + (f"  -- {c.note}" if c.note else "") for c in t.columns]
        parts.append("\n".join([head, *cols]))
    return "\n\n".join(parts) + "\n\n" + CONVENTIONS
