"""The figures of "Sigma: An AI-Empowered Training Stack on Early-Life Hardware" (Lei Qu, Lianhai Ren, Peng Cheng
et al., Microsoft, 2025, https://arxiv.org/abs/2512.13488), computed from the controller database.

- utilisation (Table 6): available = node-time in service / total; allocated = node-time running jobs / total;
  effective = allocated minus node-time of jobs between a fault and their first training step after resuming;
- job time-to-failure (fault - start of that run) and MTBF (job run time observed / interruptions);
- job recovery time: interruption (fault) -> first training step after the resume (KPIs), and the part after
  the requeue decision;
- node recycling time (Table 5) split into detect (fault -> incident), triage (incident -> remediation starts:
  drain + jobs leave), repair (time in remediating), validate (time in validating); a failed validation sends the
  node back to remediating, so a cycle's second repair counts as repair, not as validation;
- automation ratio (Table 7): incidents handled end to end without a person / all that needed handling.
"""

from __future__ import annotations

import json
import sqlite3
import statistics
import time
from collections import defaultdict

from sigma.controller.report.losses import losses

IN_SERVICE = ("idle", "allocated", "mixed", "completing")


def _stats(values: list[float]) -> dict:
    if not values:
        return {"count": 0}
    return {"count": len(values), "mean": round(statistics.fmean(values), 2),
            "median": round(statistics.median(values), 2), "max": round(max(values), 2)}


def utilisation(conn: sqlite3.Connection, since: float, until: float, lost: dict[int, list[tuple[float, float]]]
                ) -> dict:
    rows = conn.execute("SELECT ts, node, state, flags, alloc_cpus, cpus, jobs FROM node_snapshots WHERE ts <= ?"
                        " ORDER BY node, ts", (until,)).fetchall()
    per_node: dict[str, list] = defaultdict(list)
    for r in rows:
        per_node[r["node"]].append(r)
    total = avail = alloc = effective = 0.0
    for node, snaps in per_node.items():
        for i, s in enumerate(snaps):
            t0 = max(s["ts"], since)
            t1 = min(snaps[i + 1]["ts"] if i + 1 < len(snaps) else until, until)
            if t1 <= t0:
                continue
            dt = t1 - t0
            total += dt
            flags = set(filter(None, s["flags"].split(",")))
            in_service = s["state"] in IN_SERVICE and not flags & {"DRAIN", "NOT_RESPONDING", "MAINTENANCE",
                                                                   "RESERVED", "REBOOT_REQUESTED"}
            avail += dt if in_service else 0.0
            jobs = json.loads(s["jobs"])
            if s["alloc_cpus"] > 0 or jobs:
                alloc += dt
                lost_here = sum(_overlap(t0, t1, w) for j in jobs for w in lost.get(j, ()))
                effective += max(0.0, dt - min(dt, lost_here))
    if total == 0:
        return {"node_seconds": 0}
    return {"node_seconds": round(total, 1), "available": round(avail / total, 4),
            "allocated": round(alloc / total, 4), "effective": round(effective / total, 4)}


def _overlap(t0: float, t1: float, window: tuple[float, float]) -> float:
    return max(0.0, min(t1, window[1]) - max(t0, window[0]))


def job_recovery(conn: sqlite3.Connection, since: float, now: float) -> tuple[list[dict], dict]:
    """Per interruption we acted on: fault time, requeue time, first step after the resume."""
    out = []
    rows = conn.execute(
        "SELECT a.target AS job_id, a.created_at AS requeued_at, i.fault_ts, i.id AS incident, i.rule_id, i.evidence"
        " FROM actions a JOIN incidents i ON i.id = a.incident_id WHERE a.kind = 'requeue' AND a.state = 'done'"
        " AND a.created_at >= ? ORDER BY a.created_at", (since,)).fetchall()
    for r in rows:
        job_id = int(r["job_id"])
        # the new run: after its start/resume KPI event when the trainer sends one (the old run's ranks may
        # log a last step while SLURM is still killing them), else after the requeue
        resumed = conn.execute("SELECT MIN(ts) FROM events WHERE source = 'kpi' AND kind IN ('start', 'resume')"
                               " AND ts > ? AND EXISTS (SELECT 1 FROM json_each(events.job_ids) WHERE value = ?)",
                               (r["requeued_at"], job_id)).fetchone()[0]
        first = conn.execute("SELECT MIN(ts) FROM kpis WHERE job_id = ? AND ts > ? AND step IS NOT NULL",
                             (job_id, resumed or r["requeued_at"])).fetchone()[0]
        starts = [j.get("start_time") for j in json.loads(r["evidence"]).get("jobs", []) if j.get("job_id") == job_id]
        out.append({"job_id": job_id, "incident": r["incident"], "rule": r["rule_id"], "fault_ts": r["fault_ts"],
                    "requeued_at": r["requeued_at"], "first_step_after": first,
                    "recovery_s": round(first - r["fault_ts"], 2) if first else None,
                    "after_decision_s": round(first - r["requeued_at"], 2) if first else None,
                    "time_to_failure_s": round(r["fault_ts"] - starts[0], 1) if starts and starts[0] else None})
    lost = defaultdict(list)
    for x in out:
        lost[x["job_id"]].append((x["fault_ts"], x["first_step_after"] or now))
    return out, lost


def recycling(conn: sqlite3.Connection, since: float) -> list[dict]:
    cycles = defaultdict(dict)
    for r in conn.execute("SELECT node, cycle, ts, to_state, incident_id FROM lifecycle_transitions WHERE ts >= ?"
                          " ORDER BY id", (since,)):
        c = cycles[(r["node"], r["cycle"])]
        c.setdefault(r["to_state"], r["ts"])
        c["incident"] = c.get("incident") or r["incident_id"]
        if c.get("last") in ("remediating", "validating"):  # time in each state, added up over the cycle
            c[f"in_{c['last']}"] = c.get(f"in_{c['last']}", 0.0) + r["ts"] - c["since"]
        c["last"], c["since"] = r["to_state"], r["ts"]
    out = []
    for (node, cycle), c in cycles.items():
        inc = conn.execute("SELECT fault_ts, opened_at, rule_id FROM incidents WHERE id = ?",
                           (c.get("incident"),)).fetchone()
        row = {"node": node, "cycle": cycle, "state": c["last"], "rule": inc["rule_id"] if inc else None}
        if inc:
            row["detect_s"] = round(inc["opened_at"] - inc["fault_ts"], 2)
            if "remediating" in c:
                row["triage_s"] = round(c["remediating"] - inc["opened_at"], 2)
        if "remediating" in c and "validating" in c:
            row["repair_s"] = round(c["in_remediating"], 2)
        if "validating" in c and "resumed" in c:
            row["validate_s"] = round(c["in_validating"], 2)
        if inc and "resumed" in c:
            row["total_s"] = round(c["resumed"] - inc["fault_ts"], 2)
        out.append(row)
    return out


def automation(conn: sqlite3.Connection, since: float) -> dict:
    """Incidents the controller acted on (an action journaled or a node remediation started). An incident folded
    into a remediation already under way (e.g. the epilog failing on the node an Xid just drained) is the same
    fault seen twice, and is not counted again."""
    handled = manual = 0
    for inc in conn.execute("SELECT id, node, status, action FROM incidents WHERE opened_at >= ? AND status NOT IN"
                            " ('recorded','notified','shadow') AND (EXISTS (SELECT 1 FROM actions a WHERE"
                            " a.incident_id = incidents.id) OR EXISTS (SELECT 1 FROM lifecycle_transitions t"
                            " WHERE t.incident_id = incidents.id))", (since,)):
        if inc["status"] == "escalated":
            manual += 1
            continue
        lc = conn.execute("SELECT state, playbook, data FROM node_lifecycle WHERE incident_id = ?",
                          (inc["id"],)).fetchone()
        if lc and (lc["state"] in ("escalated", "admin") or "repaired_by" in json.loads(lc["data"] or "{}")
                   or lc["playbook"] in ("manual",)):
            manual += 1
        else:
            handled += 1
    total = handled + manual
    return {"automatic": handled, "manual": manual, "ratio": round(handled / total, 4) if total else None}


def report(conn: sqlite3.Connection, since: float | None = None, now: float | None = None) -> dict:
    now = now or time.time()
    if since is None:
        first = conn.execute("SELECT MIN(ts) FROM node_snapshots").fetchone()[0]
        since = first if first is not None else now
    recoveries, lost = job_recovery(conn, since, now)
    ttf = [r["time_to_failure_s"] for r in recoveries if r["time_to_failure_s"] is not None]
    util = utilisation(conn, since, now, lost)
    job_seconds = _job_seconds(conn, since, now)
    cycles = recycling(conn, since)
    incidents = conn.execute("SELECT rule_id, status, COUNT(*) AS n, AVG(opened_at - fault_ts) AS latency FROM"
                             " incidents WHERE opened_at >= ? GROUP BY rule_id, status ORDER BY rule_id",
                             (since,)).fetchall()
    return {
        "since": since, "until": now,
        "utilisation": util,
        "jobs": {"interruptions": len(recoveries), "job_seconds": round(job_seconds, 1),
                 "mtbf_s": round(job_seconds / len(recoveries), 1) if recoveries else None,
                 "time_to_failure_s": _stats(ttf),
                 "recovery_s": _stats([r["recovery_s"] for r in recoveries if r["recovery_s"] is not None]),
                 "recovery_after_decision_s": _stats([r["after_decision_s"] for r in recoveries
                                                      if r["after_decision_s"] is not None]),
                 "recoveries": recoveries},
        "recycling": {"cycles": cycles,
                      **{k: _stats([c[k] for c in cycles if k in c])
                         for k in ("detect_s", "triage_s", "repair_s", "validate_s", "total_s")}},
        "automation": automation(conn, since),
        "losses": losses(conn, since),
        "shadow_hits": shadow_hits(conn, since),
        "stability": stability_table(conn, since, now),
        "incidents": [{"rule": r["rule_id"], "status": r["status"], "count": r["n"],
                       "detect_latency_s": round(r["latency"], 2) if r["latency"] is not None else None}
                      for r in incidents],
    }


def stability_table(conn: sqlite3.Connection, since: float, now: float) -> list[dict]:
    from sigma.controller.report.noise import stability_table as table

    return table(conn, since, now)


def shadow_hits(conn: sqlite3.Connection, since: float) -> list[dict]:
    """Per rule in shadow mode (a newly promoted learned rule, say): what it would have acted on."""
    per_rule: dict[str, dict] = {}  # grouped here: GROUP_CONCAT is SQLite's (PostgreSQL has string_agg)
    for r in conn.execute("SELECT rule_id, node, job_id, opened_at FROM incidents WHERE status = 'shadow'"
                          " AND opened_at >= ? ORDER BY rule_id", (since,)):
        hit = per_rule.setdefault(r["rule_id"], {"rule": r["rule_id"], "hits": 0, "targets": set(), "last": None})
        hit["hits"] += 1
        target = r["node"] if r["node"] is not None else r["job_id"]
        if target is not None:
            hit["targets"].add(str(target))
        hit["last"] = r["opened_at"] if hit["last"] is None else max(hit["last"], r["opened_at"])
    return [{**h, "targets": sorted(h["targets"]) or [""]} for h in per_rule.values()]


def _job_seconds(conn: sqlite3.Connection, since: float, until: float, max_gap_s: float = 60.0) -> float:
    """Wall time during which each job was seen running (node snapshots are written at least every
    snapshot_every_s), summed over jobs; a longer gap means the job was not running in between."""
    seen: dict[int, set[float]] = defaultdict(set)
    for r in conn.execute("SELECT ts, jobs FROM node_snapshots WHERE ts >= ? AND ts <= ?", (since, until)):
        for j in json.loads(r["jobs"]):
            seen[j].add(r["ts"])
    total = 0.0
    for ts in seen.values():
        ordered = sorted(ts)
        total += sum(b - a for a, b in zip(ordered, ordered[1:]) if b - a <= max_gap_s)
    return total
