"""Per-rank KPI JSON lines, the protocol the node sidecar tails (see docs/telemetry.md, "The KPI protocol"): the
writer is sigma.kpi's, the public API any trainer uses; this module adds the trainer's run figures.

Each rank appends to `$SIGMA_KPI_DIR/job-<SLURM_JOB_ID>/rank-<RANK>.<NODE>.jsonl`. Every line has `ts` (unix
float), `job_id` (int) and `rank` (int); a metrics line adds `step` and any of `loss`, `grad_norm`,
`step_time_s`, `tokens_per_s`, `mfu` (other keys become payload); an event line adds `event` and `message`.
A requeued job keeps its job id, so the resumed run appends to the same files.
"""

from __future__ import annotations

import math

from sigma.kpi import (DEFAULT_KPI_DIR, METRIC_FIELDS, REQUIRED_FIELDS, KpiWriter, _clean,  # noqa: F401
                       job_id_from_env, kpi_path, node_name, read_kpis)


def throughput_stability(values) -> dict | None:
    """Throughput stability of one run (the Sigma paper's Table 11): from per-step throughputs, the worst and the
    average step against the best one (min/peak, mean/peak), the standard deviation, and the coefficient of
    variation (std/mean, comparable across models). Non-positive values are ignored; None with fewer than 2."""
    xs = [float(v) for v in values if v is not None and math.isfinite(v) and v > 0]
    if len(xs) < 2:
        return None
    peak, mean = max(xs), sum(xs) / len(xs)
    std = math.sqrt(sum((x - mean) ** 2 for x in xs) / (len(xs) - 1))
    return {"steps": len(xs), "peak": peak, "min": min(xs), "mean": mean, "std": std,
            "min_over_peak": min(xs) / peak, "mean_over_peak": mean / peak, "cv": std / mean}
