"""Read a job's KPIs and its nodes' telemetry from the controller database and attribute its noise
(sigma.controller.detect.noise); render it for `sigma noise` and `sigma explain`."""

from __future__ import annotations

import sqlite3

from sigma.controller.detect.noise import FIXES, NODE_METRICS, JobNoise, NoiseConfig, attribute
from sigma.train.kpi import throughput_stability


class NoJobData(LookupError):
    """The job has no step lines in the window asked about (unknown job, or none since --since)."""


def job_noise(conn: sqlite3.Connection, job_id: int, since: float | None = None, until: float | None = None,
              cfg: NoiseConfig | None = None) -> JobNoise:
    """The job's metric rows in [since, until] and its nodes' NODE_METRICS samples over the same time."""
    kpis = [dict(r) for r in conn.execute(
        "SELECT node, ts, rank, step, step_time_s, tokens_per_s, payload FROM kpis WHERE job_id = ? AND ts >= ? "
        "AND ts <= ? AND step IS NOT NULL ORDER BY ts", (job_id, since or 0.0, until or float("inf")))]
    if not kpis:
        known = conn.execute("SELECT 1 FROM kpis WHERE job_id = ? LIMIT 1", (job_id,)).fetchone()
        raise NoJobData(f"no step KPIs of job {job_id} in the controller database"
                        + (" in that window" if known else " (does the job write KPI lines? see docs/train.md)"))
    start = min(k["ts"] - (k["step_time_s"] or 0.0) for k in kpis) - 5.0
    end = max(k["ts"] for k in kpis) + 5.0
    samples = []
    marks = ",".join("?" * len(NODE_METRICS))
    for node in sorted({k["node"] for k in kpis}):  # one range of the (node, ts) index per node
        samples += [dict(r) for r in conn.execute(
            f"SELECT node, ts, metric, value, labels FROM samples WHERE node = ? AND ts >= ? AND ts <= ? AND metric "
            f"IN ({marks})", (node, start, end, *NODE_METRICS))]
    return attribute(job_id, kpis, samples, cfg)


def stability_line(s: dict | None) -> str:
    if not s:
        return "throughput stability: fewer than 2 steps"
    return (f"throughput stability over {s['steps']} steps: min/peak {s['min_over_peak']:.3f}, mean/peak "
            f"{s['mean_over_peak']:.3f}, std {s['std']:.4g} (cv {s['cv']:.3f}), peak {s['peak']:.4g}")


def render(noise: JobNoise, console, indent: str = "") -> None:
    """Print the attribution: the job's stability, then one line per rank with its likely cause and evidence."""
    console.print(f"{indent}job {noise.job_id}: {stability_line(noise.stability)}", highlight=False)
    for r in noise.ranks:
        share = f"{100 * r.jitter:.1f}% of its step time lost to {r.slow_steps} slow step(s)"
        console.print(f"{indent}  rank {r.rank} on {r.node}: [bold]{r.cause}[/bold] ({share}; median step "
                      f"{r.median_step_s:.3f}s)", highlight=False)
        for line in r.evidence:
            console.print(f"{indent}    {line}", highlight=False)
        if r.cause in FIXES:
            console.print(f"{indent}    fix: {FIXES[r.cause]}", highlight=False)


def stability_table(conn: sqlite3.Connection, since: float, until: float) -> list[dict]:
    """Per job with steps in the window, the stability of its step throughput (each step at its slowest rank's
    pace), newest job first: the `sigma report` table."""
    steps: dict[int, list[float]] = {}
    for job_id, tps in conn.execute(
            "SELECT job_id, MIN(tokens_per_s) FROM kpis WHERE ts >= ? AND ts <= ? AND step IS NOT NULL AND "
            "tokens_per_s > 0 GROUP BY job_id, step ORDER BY job_id DESC", (since, until)):
        steps.setdefault(job_id, []).append(tps)
    rows = []
    for job_id, values in steps.items():
        s = throughput_stability(values)
        if s:
            rows.append({"job_id": job_id, **{k: round(v, 4) if isinstance(v, float) else v for k, v in s.items()}})
    return rows
