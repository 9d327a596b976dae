"""Timing layouts for real on a noisy machine: interleaved rounds on one allocation, until the figures separate.

    MeasureTask(spec)()   # one process per rank (submitit): time spec["layouts"], append a JSON line per layout

Every layout of a group is built once and warmed up; then each round times one step of each layout in turn (the
order rotated every round: A B C, B C A, C A B, ...), so load that comes and goes on a shared machine hits all of
them alike. A step's time is the slowest rank's. Rounds go on until the fastest layout is faster than the runner-up
in a paired comparison with confidence (the confidence interval of the median of the per-round ratios excludes 1),
or `max_rounds`, or the group's time budget. Each layout's record keeps its samples, median, minimum, confidence
interval and spread, and with a `reference` layout timed in every group, its median per-round ratio to it, which
stays comparable across groups timed at different loads (the exhaustive grid of bench/tune.py), and lets the tuner
judge its cost model on ratios, which a machine's load moving between phase 1 and phase 2 does not skew.
A failed or preempted job keeps the groups already written (`sigma tune --resume` times only the rest).
"""

from __future__ import annotations

import gc
import json
import math
import statistics
import time
from pathlib import Path

import torch
import torch.distributed as dist

WARMUP = 1  # untimed steps per layout after it is built (allocations, first-call costs)
Z95 = 1.96


# ---------------------------------------------------------------- statistics (pure)

def median_ci(samples: list[float], z: float = Z95) -> tuple[float, float]:
    """Distribution-free ~95 % confidence interval of the median: the order statistics n/2 -/+ z sqrt(n)/2
    (with 5 samples or fewer it is their whole range)."""
    s = sorted(samples)
    n = len(s)
    half = z * math.sqrt(n) / 2
    lo = max(1, math.floor(n / 2 - half))  # 1-based ranks
    hi = min(n, math.ceil(1 + n / 2 + half))
    return s[lo - 1], s[hi - 1]


def spread(samples: list[float]) -> float:
    """Interquartile range over the median: how much one timed step of this layout varies."""
    if len(samples) < 2:
        return 0.0
    q1, _, q3 = statistics.quantiles(samples, n=4, method="inclusive")
    return (q3 - q1) / statistics.median(samples)


def paired_ratio(a: list[float], b: list[float]) -> dict:
    """Per-round ratios b / a of two layouts timed in the same rounds: median and its confidence interval."""
    ratios = [y / x for x, y in zip(a, b) if x > 0]
    lo, hi = median_ci(ratios)
    return {"median": statistics.median(ratios), "ci": [lo, hi]}


def separated(samples: dict[str, list[float]]) -> bool:
    """Is the fastest (by median) faster than the runner-up in every plausible reading of the rounds?"""
    if len(samples) < 2:
        return True
    best, second = sorted(samples, key=lambda k: statistics.median(samples[k]))[:2]
    return paired_ratio(samples[best], samples[second])["ci"][0] > 1.0


def summarise(samples: list[float], reference: list[float] | None = None) -> dict:
    lo, hi = median_ci(samples)
    out = {"step_s": statistics.median(samples), "min_s": min(samples), "ci_s": [lo, hi],
           "spread": spread(samples), "rounds": len(samples), "samples_s": [round(x, 6) for x in samples]}
    if reference:
        out["vs_reference"] = paired_ratio(reference, samples)  # > 1: slower than the reference
    return out


# ---------------------------------------------------------------- one group of layouts, interleaved

def _ready(model_cfg, layout, world: int, rank: int, global_batch: int, seq_len: int):
    """Build the layout, and the step that trains it once on the same random tokens (returns the slowest rank's
    seconds and its stage figures); a warm-up step runs here."""
    from sigma.train.parallelize import build_optimizer, build_parallel, train_step
    from sigma.train.train_config import OptimConfig
    from sigma.tune.profile import _device

    dims = layout.dims(world, model_cfg, global_batch)
    run = build_parallel(model_cfg, dims, rank, seed=0, device=_device())
    optimizer, named, _ = build_optimizer(run, OptimConfig(fused=False), shard=layout.zero)
    batch = torch.randint(0, model_cfg.vocab_size, (global_batch, seq_len + 1),
                          generator=torch.Generator().manual_seed(7)).to(_device())

    def step() -> tuple[float, float, float, float]:
        if world > 1:
            dist.barrier()
        t0 = time.perf_counter()
        train_step(run, optimizer, named, batch)
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        # [step, busy, pipeline, bubble] of every rank: the slowest rank's step, the pipeline's figures
        mine = torch.zeros(4 * world, dtype=torch.float64)
        mine[4 * rank:4 * rank + 4] = torch.tensor([time.perf_counter() - t0, run.kpi.get("stage_busy_s", 0.0),
                                                    run.kpi.get("pipeline_s", 0.0), run.kpi.get("bubble", 0.0)],
                                                   dtype=torch.float64)
        if world > 1:
            dist.all_reduce(mine)
        per_rank = mine.view(world, 4)
        return (float(per_rank[:, 0].max()), float(per_rank[:, 1].max()), float(per_rank[:, 2].max()),
                float(per_rank[:, 3].mean()))

    for _ in range(WARMUP):
        step()
    return run, step


def time_group(model_cfg, layouts: list, world: int, rank: int, global_batch: int, seq_len: int,
               min_rounds: int, max_rounds: int, budget_s: float | None, reference=None) -> dict[str, dict]:
    """Records by layout name: the summary of its interleaved samples, or {"error": ...} where it cannot run."""
    entries = ([reference] if reference is not None else []) + [l for l in layouts if l != reference]
    steps, records = {}, {}
    for layout in entries:
        try:
            steps[layout.name()] = _ready(model_cfg, layout, world, rank, global_batch, seq_len)[1]
        except Exception as exc:  # this layout cannot run on this platform; the others still get timed
            records[layout.name()] = {"error": f"{type(exc).__name__}: {exc}"[:500]}
        if world > 1:
            dist.barrier()
    names = list(steps)
    times = {n: [] for n in names}
    busy = {n: [] for n in names}
    pipeline = {n: [] for n in names}
    bubble = {n: [] for n in names}
    t0 = time.monotonic()
    for r in range(max_rounds):
        for i in range(len(names)):
            name = names[(r + i) % len(names)]
            step_s, busy_s, pipe_s, bubble_share = steps[name]()
            times[name].append(step_s)
            busy[name].append(busy_s)
            pipeline[name].append(pipe_s)
            bubble[name].append(bubble_share)
        done = r + 1 >= min_rounds and (
            separated(times)
            or (budget_s is not None and time.monotonic() - t0 >= budget_s))
        flag = torch.tensor([1.0 if done else 0.0])
        if world > 1:
            dist.broadcast(flag, 0)  # every rank stops at the same round
        if flag.item():
            break
    ref = times.get(reference.name()) if reference is not None else None
    for name in names:
        rec = summarise(times[name], ref if name != (reference.name() if reference else None) else None)
        if any(busy[name]):
            rec["stage_busy_s"] = statistics.median(busy[name])  # the busiest pipeline rank's compute
            rec["pipeline_s"] = statistics.median(pipeline[name])  # the slowest rank's pipeline run
            # after it, per round: gradient sync, clipping, the optimiser (the slowest rank's step less its run)
            rec["update_s"] = statistics.median(t - p for t, p in zip(times[name], pipeline[name]))
            rec["bubble"] = statistics.median(bubble[name])  # the ranks' mean share of the run spent waiting
        records[name] = rec
    steps.clear()
    gc.collect()  # free this group's models before the next group builds its own
    return records


class MeasureTask:
    """Time spec["layouts"] on this allocation, in groups of spec["group"] interleaved layouts (every one of them
    by default), each with spec["reference"] if given; rank 0 appends one JSON line per layout to spec["results"]
    after each group. spec["min_rounds"], spec["max_rounds"]: timed steps per layout; spec["budget_s"]: seconds of
    timed rounds per group at most."""

    def __init__(self, spec: dict):
        self.spec = spec

    def __call__(self) -> None:
        from sigma.train.config import load_model_config
        from sigma.tune.profile import _join
        from sigma.tune.space import Layout

        s = self.spec
        rank, world = _join(s.get("threads", 1))
        model_cfg = load_model_config(s["model"], s.get("model_overrides", {}))
        results = Path(s["results"])
        layouts = [Layout.from_dict(d) for d in s["layouts"]]
        reference = Layout.from_dict(s["reference"]) if s.get("reference") else None
        size = s.get("group") or len(layouts)
        try:
            for start in range(0, len(layouts), size):
                group = layouts[start:start + size]
                records = time_group(model_cfg, group, world, rank, s["global_batch"], s["seq_len"],
                                     s.get("min_rounds", 3), s.get("max_rounds", 10), s.get("budget_s"), reference)
                if rank == 0:
                    with results.open("a") as f:
                        for layout in group:
                            f.write(json.dumps({"layout": layout.as_dict(), **records[layout.name()]}) + "\n")
                if world > 1:
                    dist.barrier()
        finally:
            if world > 1 and dist.is_initialized():
                dist.destroy_process_group()
