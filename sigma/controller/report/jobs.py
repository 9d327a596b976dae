"""Does the platform watch a job? What reached the controller from its trainer, and what the sidecars refused.

Per job: the ranks whose steps arrive (node, last step, when), the heartbeats per node, the trainer's start event
(which trainer, whether it answers just-in-time checkpoint requests, its fault hooks), the lines refused on the
nodes and why (sidecar events with a reason code: ts-units, file-name, owner, ...), and the checkpoint requests
the controller made with their answers. A job with no step from any rank is not watched by the job watchdog:
the verdict says so and what to check. Plain SQL over the controller database (`sigma jobs`).
"""

from __future__ import annotations

import json
import sqlite3
from collections import Counter

REFUSALS = ("kpi_malformed", "kpi_refused", "kpi_misnamed", "kpi_ranks_mixed", "kpi_out_of_order")
STALE_S = 60.0  # a job whose last step or heartbeat is older than this is no longer heard from


def _events(conn: sqlite3.Connection, job_id: int, since: float, source: str, kinds: tuple[str, ...]) -> list[dict]:
    marks = ",".join("?" * len(kinds))
    rows = conn.execute(
        f"SELECT ts, node, kind, message, fields FROM events WHERE ts >= ? AND source = ? AND kind IN ({marks}) AND"
        " EXISTS (SELECT 1 FROM json_each(events.job_ids) WHERE value = ?) ORDER BY ts", (since, source, *kinds, job_id))
    return [{"ts": r[0], "node": r[1], "kind": r[2], "message": r[3], "fields": json.loads(r[4] or "{}")}
            for r in rows]


def job_ids(conn: sqlite3.Connection, since: float) -> list[int]:
    """Jobs heard from since `since`: a KPI row, or a refused line."""
    ids = {r[0] for r in conn.execute("SELECT DISTINCT job_id FROM kpis WHERE ts >= ?", (since,))}
    marks = ",".join("?" * len(REFUSALS))
    for (job_ids_json,) in conn.execute(f"SELECT DISTINCT job_ids FROM events WHERE ts >= ? AND source = 'sidecar'"
                                        f" AND kind IN ({marks})", (since, *REFUSALS)):
        ids.update(json.loads(job_ids_json or "[]"))
    return sorted(ids)


def watch(conn: sqlite3.Connection, job_id: int, since: float, now: float) -> dict:
    ranks = [{"rank": r[0], "node": r[1], "last_step": r[2], "last_ts": r[3], "steps": r[4]} for r in conn.execute(
        "SELECT rank, node, MAX(step), MAX(ts), COUNT(*) FROM kpis WHERE job_id = ? AND ts >= ? AND step IS NOT NULL"
        " GROUP BY rank, node ORDER BY rank, node", (job_id, since))]
    beats: dict[str, float] = {}
    for e in _events(conn, job_id, since, "kpi", ("heartbeat",)):
        beats[e["node"]] = e["ts"]
    starts = _events(conn, job_id, since, "kpi", ("start",))
    start = starts[-1]["fields"] if starts else None
    refused = _events(conn, job_id, since, "sidecar", REFUSALS)
    reasons = Counter((e["kind"], e["fields"].get("reason") or e["kind"], e["node"]) for e in refused)
    examples = {(e["kind"], e["fields"].get("reason") or e["kind"], e["node"]): e["message"] for e in refused}
    requests = [dict(zip(("id", "node", "requested_at", "deadline", "acked_at", "ack_step"), r)) for r in conn.execute(
        "SELECT id, node, requested_at, deadline, acked_at, ack_step FROM checkpoint_requests WHERE job_id = ? AND"
        " requested_at >= ? ORDER BY id", (job_id, since))]
    last = max([r["last_ts"] for r in ranks] + list(beats.values()), default=None)
    if not ranks:
        verdict = ("NOT watched by the job watchdog: no training step reached the controller"
                   + ("; its KPI lines are refused (below)" if refused else
                      f"; does it write $SIGMA_KPI_DIR/job-{job_id}/rank-<RANK>.<NODE>.jsonl (sigma.kpi does)?")
                   + " Node faults still drain its nodes and requeue it")
    elif last is not None and now - last > STALE_S:
        verdict = f"silent: nothing from its ranks for {now - last:.0f} s (ended, or hung: the watchdog judges it)"
    else:
        verdict = (f"watched: steps from {len(ranks)} rank(s) on {', '.join(sorted({r['node'] for r in ranks}))}"
                   + (", answers just-in-time checkpoint requests" if start and start.get("jit_poll_every") else
                      ", does not answer just-in-time checkpoint requests (requeued without one)"))
    return {"job_id": job_id, "verdict": verdict, "watched": bool(ranks), "ranks": ranks, "heartbeats": beats,
            "trainer": (start or {}).get("trainer"), "answers_requests": bool(start and start.get("jit_poll_every")),
            "fault_hooks": (start or {}).get("fault_hooks") or [],
            "refused": [{"kind": k, "reason": reason, "node": node, "reports": n, "example": examples[(k, reason, node)]}
                        for (k, reason, node), n in sorted(reasons.items())],
            "checkpoint_requests": requests}
