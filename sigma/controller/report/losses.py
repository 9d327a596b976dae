"""What each fault cost a job: steps lost and time lost, recorded once the requeued run is back where it was.

- step reached: the highest step the job reported before its new run started (steps the old run finished after
  the requeue decision, while SLURM was stopping it, count: they were done and are redone);
- resume step: the step the new run started from (its `start` KPI event; 0 for a run from scratch);
- steps lost = step reached - resume step (0 when a just-in-time checkpoint of the last step was saved);
- time lost = fault -> the new run is back at the step reached (detection, the checkpoint wait, the requeue, the
  restart and the redone steps);
- source: the kind of checkpoint the new run resumed from (`jit`, `rollback`, `periodic`, ... ; `none` from
  scratch).

Recorded in `job_losses` by the controller's tick (`record_losses`); `sigma report` shows them per job and in
total (`losses`). Plain SQL, JSON decoded in Python.
"""

from __future__ import annotations

import json
import sqlite3
import statistics
import time

LOOKBACK_S = 86400.0  # requeues older than this that never came back are no longer looked at


def _new_run(conn: sqlite3.Connection, job_id: int, after: float) -> tuple[float, dict] | None:
    """(ts, fields) of the first `start` KPI event of the job after `after`, on whichever nodes the new run got."""
    for ts, fields, job_ids in conn.execute(
            "SELECT ts, fields, job_ids FROM events WHERE ts > ? AND source = 'kpi' AND kind = 'start' ORDER BY ts",
            (after,)):
        if job_id in json.loads(job_ids or "[]"):
            return ts, json.loads(fields or "{}")
    return None


def _resume_kind(conn: sqlite3.Connection, job_id: int, start_ts: float, after: float) -> str:
    for fields, job_ids in conn.execute(
            "SELECT fields, job_ids FROM events WHERE ts > ? AND ts <= ? AND source = 'kpi' AND kind = 'resume'"
            " ORDER BY ts DESC",  # after a disk resume, a newer in-memory replica may follow: the last one counts
            (after, start_ts + 1.0)):
        if job_id in json.loads(job_ids or "[]"):
            return json.loads(fields or "{}").get("checkpoint_kind") or "periodic"
    return "none"


def record_losses(conn: sqlite3.Connection, now: float | None = None) -> int:
    """Record the losses of every done requeue whose new run is back at the step reached; return how many."""
    now = time.time() if now is None else now
    rows = conn.execute(
        "SELECT a.incident_id, a.target, a.done_at, i.fault_ts FROM actions a JOIN incidents i ON i.id ="
        " a.incident_id WHERE a.kind = 'requeue' AND a.state = 'done' AND a.done_at >= ? AND NOT EXISTS"
        " (SELECT 1 FROM job_losses l WHERE l.incident_id = a.incident_id)", (now - LOOKBACK_S,)).fetchall()
    recorded = 0
    for incident_id, target, requeued_at, fault_ts in rows:
        job_id = int(target)
        started = _new_run(conn, job_id, requeued_at)
        if started is None:
            continue
        start_ts, fields = started
        reached = conn.execute("SELECT MAX(step) FROM kpis WHERE job_id = ? AND ts < ? AND step IS NOT NULL",
                               (job_id, start_ts)).fetchone()[0]
        if reached is None:
            continue  # the job never reported a step before the fault: nothing to lose
        resume_step = int(fields.get("step") or 0)
        back = conn.execute("SELECT MIN(ts) FROM kpis WHERE job_id = ? AND ts >= ? AND step >= ?",
                            (job_id, start_ts, max(int(reached), resume_step + 1))).fetchone()[0]
        if back is None:
            continue  # not back yet
        conn.execute("INSERT INTO job_losses (incident_id, job_id, fault_ts, step_reached, resume_step, steps_lost,"
                     " time_lost_s, source, recorded_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                     (incident_id, job_id, fault_ts, int(reached), resume_step, max(0, int(reached) - resume_step),
                      round(back - fault_ts, 2), _resume_kind(conn, job_id, start_ts, requeued_at), now))
        recorded += 1
    if recorded:
        conn.commit()
    return recorded


def losses(conn: sqlite3.Connection, since: float) -> dict:
    """Per fault, per job and in total: steps lost and time lost (for `sigma report`)."""
    faults = [dict(r) for r in conn.execute(
        "SELECT l.incident_id AS incident, l.job_id, i.rule_id AS rule, l.fault_ts, l.step_reached, l.resume_step,"
        " l.steps_lost, l.time_lost_s, l.source FROM job_losses l LEFT JOIN incidents i ON i.id = l.incident_id"
        " WHERE l.fault_ts >= ? ORDER BY l.fault_ts", (since,))]
    per_job: dict[int, dict] = {}
    for f in faults:
        j = per_job.setdefault(f["job_id"], {"job_id": f["job_id"], "faults": 0, "steps_lost": 0, "time_lost_s": 0.0})
        j["faults"] += 1
        j["steps_lost"] += f["steps_lost"]
        j["time_lost_s"] = round(j["time_lost_s"] + (f["time_lost_s"] or 0.0), 2)
    steps = [f["steps_lost"] for f in faults]
    times = [f["time_lost_s"] for f in faults if f["time_lost_s"] is not None]
    total = {"faults": len(faults), "steps_lost": sum(steps), "time_lost_s": round(sum(times), 2),
             "steps_lost_max": max(steps) if steps else None,
             "time_lost_median_s": round(statistics.median(times), 2) if times else None}
    return {"faults": faults, "jobs": sorted(per_job.values(), key=lambda j: j["job_id"]), "total": total}
