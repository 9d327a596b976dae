"""What happened after one injected fault, read from the controller database: the recovery timeline.

Every milestone is a timestamp the platform itself recorded (incident opened, action journaled as done,
KPI line written by the trainer, lifecycle transition), so latencies are measured, not guessed.
"""

from __future__ import annotations

import json
import sqlite3
from dataclasses import dataclass, field


@dataclass
class Timeline:
    fault_ts: float
    node: str
    job_id: int | None
    detected_ts: float | None = None
    detected_by: str = ""  # rule id (or watchdog / isolation detector)
    incident_id: int | None = None
    incident_node: str | None = None  # the node the platform blamed
    drained_ts: float | None = None
    drain_reason: str = ""  # as SLURM keeps it; `sinfo -R` shows its first 20 characters
    requeued_ts: float | None = None
    resumed_ts: float | None = None  # first training step after the requeue
    last_step_before: int | None = None
    first_step_after: int | None = None
    rebooted_ts: float | None = None
    node_back_ts: float | None = None
    extra: dict = field(default_factory=dict)

    @property
    def steps_lost(self) -> int | None:
        """Steps computed before the fault that had to be computed again (work since the last checkpoint)."""
        if self.last_step_before is None or self.first_step_after is None:
            return None
        return max(0, self.last_step_before - (self.first_step_after - 1))

    def since_fault(self, ts: float | None) -> float | None:
        return None if ts is None else ts - self.fault_ts

    def rows(self) -> list[tuple[str, float | None, str]]:
        """(milestone, seconds after the fault, detail) in story order."""
        return [
            ("fault injected", 0.0, f"on {self.node}"),
            ("detected", self.since_fault(self.detected_ts),
             f"{self.detected_by} (incident {self.incident_id}, node {self.incident_node})" if self.detected_by else ""),
            ("node drained", self.since_fault(self.drained_ts), f"sinfo -R: {self.drain_reason[:20]}"
             if self.drained_ts else ""),
            ("job requeued", self.since_fault(self.requeued_ts), f"job {self.job_id}" if self.requeued_ts else ""),
            ("first step after resume", self.since_fault(self.resumed_ts),
             f"step {self.first_step_after} (the old run reached {self.last_step_before}; "
             f"{self.steps_lost} steps redone)"
             if self.resumed_ts else ""),
            ("node rebooted", self.since_fault(self.rebooted_ts), "scontrol reboot ASAP nextstate=DOWN"
             if self.rebooted_ts else ""),
            ("node back in service", self.since_fault(self.node_back_ts), "validated in a maintenance reservation"
             if self.node_back_ts else ""),
        ]


def observe(conn: sqlite3.Connection, node: str, job_id: int | None, fault_ts: float) -> Timeline:
    """Fill what the controller database shows so far for a fault on node (affecting job_id)."""
    t = Timeline(fault_ts, node, job_id)
    since = fault_ts - 1.0  # timestamps of different processes on one host; allow clock rounding
    row = conn.execute(
        "SELECT id, opened_at, rule_id, node FROM incidents WHERE opened_at >= ? AND (node = ? OR job_id = ?) "
        "ORDER BY opened_at LIMIT 1", (since, node, job_id)).fetchone()
    if row:
        t.incident_id, t.detected_ts, t.detected_by, t.incident_node = row[0], row[1], row[2], row[3]
    t.drained_ts = _action_done(conn, "drain", node, since)
    if t.drained_ts is not None:
        params = conn.execute("SELECT params FROM actions WHERE kind = 'drain' AND target = ? AND state = 'done' "
                              "AND created_at >= ? ORDER BY done_at LIMIT 1", (node, since)).fetchone()
        reason = json.loads(params[0]).get("reason", "") if params else ""
        t.drain_reason = reason if reason.startswith("sigma:") else f"sigma: {reason}"
    if job_id is not None:
        t.requeued_ts = _action_done(conn, "requeue", str(job_id), since)
        if t.requeued_ts is not None:
            # The requeued run announces itself with a `resume` (or, without a checkpoint, `start`) KPI event;
            # the old run may still report steps until SLURM has killed it, and those count as lost work.
            restart = conn.execute(
                "SELECT min(events.ts) FROM events, json_each(events.job_ids) AS j WHERE events.source = 'kpi' "
                "AND events.kind IN ('resume', 'start') AND events.ts > ? AND j.value = ?",
                (t.requeued_ts, job_id)).fetchone()[0]
            if restart is not None:
                before = conn.execute("SELECT max(step) FROM kpis WHERE job_id = ? AND ts < ?",
                                      (job_id, restart)).fetchone()
                t.last_step_before = before[0] if before else None
                after = conn.execute("SELECT ts, step FROM kpis WHERE job_id = ? AND ts > ? AND step IS NOT NULL "
                                     "ORDER BY ts LIMIT 1", (job_id, restart)).fetchone()
                if after:
                    t.resumed_ts, t.first_step_after = after
        if t.last_step_before is None:
            before = conn.execute("SELECT max(step) FROM kpis WHERE job_id = ? AND ts <= ?",
                                  (job_id, fault_ts)).fetchone()
            t.last_step_before = before[0] if before else None
    for state, attr in (("validating", "rebooted_ts"), ("resumed", "node_back_ts")):
        got = conn.execute("SELECT min(ts) FROM lifecycle_transitions WHERE node = ? AND to_state = ? AND ts >= ?",
                           (node, state, since)).fetchone()
        setattr(t, attr, got[0] if got else None)
    return t


def _action_done(conn: sqlite3.Connection, kind: str, target: str, since: float) -> float | None:
    row = conn.execute("SELECT min(done_at) FROM actions WHERE kind = ? AND target = ? AND state = 'done' "
                       "AND created_at >= ?", (kind, target, since)).fetchone()
    return row[0] if row else None
