"""Incidents: one row per (rule, node, job) while open; what was seen, what was decided, how it ended."""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Callable
from dataclasses import dataclass

from sigma.findings import Finding, clean

OPEN_STATUSES = ("open", "acted", "shadow", "escalated", "recorded", "notified")
FINAL_STATUSES = ("resolved", "confirmed", "misdiagnosed", "closed")


@dataclass
class Incident:
    id: int
    key: str
    opened_at: float
    updated_at: float
    rule_id: str
    rule_version: int
    source: str
    scope: str
    node: str | None
    job_id: int | None
    severity: str
    action: str
    category: str
    summary: str
    fault_ts: float
    status: str
    status_note: str
    evidence: dict
    closed_at: float | None

    @classmethod
    def from_row(cls, r: sqlite3.Row) -> "Incident":
        d = {k: r[k] for k in r.keys()}
        d["evidence"] = json.loads(d["evidence"] or "{}")
        return cls(**d)


class Incidents:
    def __init__(self, conn: sqlite3.Connection, clock: Callable[[], float] = time.time):
        self.conn = conn
        self.clock = clock

    def find_open(self, key: str) -> Incident | None:
        row = self.conn.execute("SELECT * FROM incidents WHERE key = ? AND closed_at IS NULL ORDER BY id DESC",
                                (key,)).fetchone()
        return Incident.from_row(row) if row else None

    def open(self, f: Finding, status: str, note: str = "") -> Incident:
        now = self.clock()
        with self.conn:
            cur = self.conn.execute(
                "INSERT INTO incidents (key, opened_at, updated_at, rule_id, rule_version, source, scope, node, job_id,"
                " severity, action, category, summary, fault_ts, status, status_note, evidence)"
                " VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
                (f.key, now, now, f.rule_id, f.rule_version, f.source, f.scope, f.node, f.job_id, f.severity,
                 f.action, f.category, f.summary, f.first_ts, status, note,
                 json.dumps(clean({**f.evidence, "last_ts": f.last_ts}), default=str)))
        return self.get(cur.lastrowid)

    def touch(self, incident: Incident, f: Finding) -> None:
        """New evidence for an open incident: keep the newest evidence, keep the first fault time."""
        evidence = {**incident.evidence, **clean(f.evidence), "last_ts": f.last_ts}
        with self.conn:
            self.conn.execute("UPDATE incidents SET updated_at=?, evidence=? WHERE id=?",
                              (self.clock(), json.dumps(evidence, default=str), incident.id))

    def set_status(self, incident_id: int, status: str, note: str = "", close: bool = False) -> None:
        now = self.clock()
        with self.conn:
            self.conn.execute("UPDATE incidents SET status=?, status_note=?, updated_at=?,"
                              " closed_at=CASE WHEN ? = 1 THEN ? ELSE closed_at END WHERE id=?",
                              (status, note, now, int(close), now, incident_id))

    def add_evidence(self, incident_id: int, **extra) -> None:
        inc = self.get(incident_id)
        with self.conn:
            self.conn.execute("UPDATE incidents SET evidence=?, updated_at=? WHERE id=?",
                              (json.dumps({**inc.evidence, **clean(extra)}, default=str), self.clock(), incident_id))

    def get(self, incident_id: int) -> Incident | None:
        row = self.conn.execute("SELECT * FROM incidents WHERE id = ?", (incident_id,)).fetchone()
        return Incident.from_row(row) if row else None

    def query(self, *, node: str | None = None, job_id: int | None = None, since: float | None = None,
              open_only: bool = False, status: str | tuple[str, ...] | None = None,
              source: str | None = None) -> list[Incident]:
        sql, args = "SELECT * FROM incidents WHERE 1=1", []
        statuses = (status,) if isinstance(status, str) else status
        for clause, value in (("node = ?", node), ("job_id = ?", job_id), ("opened_at >= ?", since),
                              ("source = ?", source)):
            if value is not None:
                sql += f" AND {clause}"
                args.append(value)
        if statuses is not None:
            sql += f" AND status IN ({','.join('?' * len(statuses))})"
            args += statuses
        if open_only:
            sql += " AND closed_at IS NULL"
        return [Incident.from_row(r) for r in self.conn.execute(sql + " ORDER BY id", args)]

    def nodes_with_rule(self, rule_id: str, since: float, statuses: tuple[str, ...]) -> set[str]:
        marks = ",".join("?" * len(statuses))
        rows = self.conn.execute(f"SELECT DISTINCT node FROM incidents WHERE rule_id=? AND opened_at>=? AND node IS NOT"
                                 f" NULL AND status IN ({marks})", (rule_id, since, *statuses))
        return {r[0] for r in rows}

    def nodes_out(self, since: float, statuses: tuple[str, ...]) -> set[str]:
        """Nodes any rule, the watchdog or isolation took out of service since `since` and that have not come back
        since (a node already back in service is no longer part of a wave)."""
        marks = ",".join("?" * len(statuses))
        rows = self.conn.execute(
            f"SELECT DISTINCT node FROM incidents i WHERE opened_at>=? AND node IS NOT NULL AND scope='node' AND "
            f"status IN ({marks}) AND NOT EXISTS (SELECT 1 FROM lifecycle_transitions t WHERE t.node = i.node "
            f"AND t.to_state IN ('resumed', 'returned') AND t.ts > i.opened_at)", (since, *statuses))
        return {r[0] for r in rows}
