"""A hang seen from the nodes, for a job that writes no KPI lines (pure: samples in, finding out).

The sidecars report what each job's processes do (telemetry collector `jobprocs`: cores used, processes stopped by a
signal, stopped by a debugger). Over the last hang_timeout_s, on every node of the job:
- stopped: the job's processes there were stopped by a signal (state T, SIGSTOP) in every sample and used no CPU.
  Nothing trains while stopped, so one such node is a hang whatever the others do (they may spin in a collective);
- idle: the job's processes used at most IDLE_CORES in every sample. Every node idle, after the job had been busy,
  is a hang: all ranks wait (for a peer, the disk, a service) and none of them for longer than a job may.
What is no hang: a job SLURM suspended (its state is SUSPENDED, not RUNNING: the caller judges RUNNING jobs only), a
process stopped by a debugger (state t: somebody is looking), any node busy while none is stopped, a job that was
never busy (a shell waiting for its user, `sleep`), a job that wrote any KPI line within the window (the KPI
watchdog judges it), a node whose samples do not cover the window (its sidecar is down: no verdict without it).
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence

from sigma.findings import Finding

METRICS = ("job.procs.count", "job.procs.cpu", "job.procs.stopped", "job.procs.traced")
IDLE_CORES = 0.02  # a node's job processes using at most this many cores make no progress (a blocked rank: ~0)
COVER_GAP_S = 15.0  # a node's samples must reach this close to both ends of the window (3 runs of the collector)


def proc_labels(job_id: int) -> str:
    """The label set the sidecars give a job's samples (as stored: canonical JSON)."""
    return json.dumps({"job": str(int(job_id))}, separators=(",", ":"))


def judge_processes(job_id: int, nodes: Sequence[str], rows: Iterable[Mapping], now: float, timeout_s: float,
                    busy_before: bool) -> Finding | None:
    """rows: the job's samples of METRICS (node, ts, metric, value) since now - timeout_s; busy_before: some node's
    job processes used more than IDLE_CORES earlier in this run."""
    lo = now - timeout_s
    by_node: dict[str, dict[str, list[tuple[float, float]]]] = defaultdict(lambda: defaultdict(list))
    for r in rows:
        if r["ts"] >= lo and r["node"] in nodes and r["value"] is not None:
            by_node[r["node"]][r["metric"]].append((r["ts"], float(r["value"])))
    seen: dict[str, dict] = {}
    for node in nodes:
        series = by_node.get(node, {})
        cpu, stopped, traced = (series.get(m, []) for m in ("job.procs.cpu", "job.procs.stopped", "job.procs.traced"))
        times = [t for t, _ in cpu]
        if not times or min(times) > lo + COVER_GAP_S or max(times) < now - COVER_GAP_S:
            return None  # this node's sidecar says too little: no verdict
        if any(v > 0 for _, v in traced):
            return None  # a debugger holds the job: somebody is looking
        most = max(v for _, v in cpu)
        seen[node] = {"max_cores": round(most, 3), "samples": len(cpu),
                      "processes": int(max((v for _, v in series.get("job.procs.count", [])), default=0)),
                      "stopped": bool(stopped) and all(v > 0 for _, v in stopped) and most <= IDLE_CORES,
                      "idle": most <= IDLE_CORES}
    held = [n for n, s in seen.items() if s["stopped"]]
    base = dict(rule_id="watchdog-proc-hang", source="watchdog", scope="job", severity="error", action="requeue",
                job_id=job_id, first_ts=lo, last_ts=now, category="hang",
                evidence={"basis": "processes", "nodes": seen, "timeout_s": timeout_s})
    if held:
        return Finding(summary=f"processes stopped (SIGSTOP) on {', '.join(held)} for {timeout_s:.0f}s; no KPI line",
                       **base)
    if busy_before and all(s["idle"] for s in seen.values()):
        return Finding(summary=f"no CPU progress on any node ({', '.join(nodes)}) for {timeout_s:.0f}s after being "
                               f"busy; no KPI line", **base)
    return None
