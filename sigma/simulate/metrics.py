"""The paper's figures for one simulated arm: utilisation (Table 6), job MTBF and time to failure, job recovery
time, node recycle time by stage (Table 5), automation ratio (Table 7), effective training time."""

from __future__ import annotations

import statistics

from sigma.simulate.engine import Result


def _stats(values: list[float]) -> dict:
    values = sorted(v for v in values if v is not None)
    if not values:
        return {"n": 0}
    pick = lambda q: values[min(len(values) - 1, int(q * len(values)))]  # noqa: E731
    return {"n": len(values), "mean": round(statistics.fmean(values), 1), "median": round(statistics.median(values), 1),
            "p90": round(pick(0.9), 1), "p99": round(pick(0.99), 1), "max": round(values[-1], 1)}


def figures(r: Result) -> dict:
    span = r.end - r.start
    total = r.nodes * span
    runs = [run for j in r.jobs for run in j.runs if "end" in run]
    interrupted = [run for run in runs if run.get("fault") is not None]
    run_time = sum(run["end"] - run["start"] for run in runs)
    kept = sum(run["kept"] * run["nodes"] for run in runs)
    # recovery: fault -> first training step of the next run of the same job
    recovery = []
    for j in r.jobs:
        for a, b in zip(j.runs, j.runs[1:]):
            if a.get("fault") is not None:
                recovery.append(b["first_step"] - a["fault"])
    job_time = sum(((j.end_time or r.end) - max(j.submit_time, r.start)) for j in r.jobs)
    job_kept = sum(run["kept"] for j in r.jobs for run in j.runs if "end" in run)
    stages = {}
    for key in ("detect_s", "triage_s", "repair_s", "validate_s", "total_s"):
        stages[key.removesuffix("_s")] = _stats([c.get(key) for c in r.recycle])
    if r.arm == "policy":
        # the incident's fault time is what the controller could know (for a dead node: SLURM's flag); the
        # simulation knows when the fault really happened
        stages["detect"] = _stats(r.detect_s)
    return {
        "arm": r.arm,
        "days": round(span / 86400.0, 2),
        "nodes": r.nodes,
        "faults": r.faults,
        "faults_on_nodes_already_out": len(r.absorbed),
        "faults_latent_at_end": r.latent,
        "utilisation": {"available": round(r.node_s["available"] / total, 4),
                        "allocated": round(r.node_s["allocated"] / total, 4),
                        "effective": round(kept / total, 4)},
        "job_interruptions": len(interrupted),
        "job_mtbf_h": round(run_time / len(interrupted) / 3600.0, 2) if interrupted else None,
        "job_time_to_failure_s": _stats([run["fault"] - run["start"] for run in interrupted]),
        "job_recovery_s": _stats(recovery),
        "node_recycle_s": stages,
        # the same measure in both arms, from each fault's timeline: every fault that took its node out of service
        "fault_out_of_service_s": _stats([e.out_s(r.end) for e in r.episodes if e.out_at is not None]),
        # ... less the repair by hand the fault needed (its recorded time): what detection, triage, reboots,
        # tickets and validation added, the part automation can change
        "fault_overhead_s": _stats([e.overhead_s(r.end) for e in r.episodes if e.back_at is not None]),
        "fault_detect_s": _stats([e.detect_s for e in r.episodes]),
        "fault_latent_s": _stats([e.shown_at - e.start for e in r.episodes if e.shown_at is not None]),
        "automation": r.automation or {"automatic": 0, "manual": len(r.recycle), "ratio": 0.0 if r.recycle else None},
        "escalations": r.escalations,
        "effective_training_time": round(job_kept / job_time, 4) if job_time else None,
        "jobs_completed": sum(1 for j in r.jobs if j.state == "COMPLETED"),
        "incidents": r.incidents,
        "controller_ticks": r.ticks,
        "events": r.events,
    }
