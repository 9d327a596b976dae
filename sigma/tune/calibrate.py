"""The cost model held to phase 1's own real training steps: what the parts timed one by one cost inside a step.

    costs = calibrate(costs, raw, model)   # raw: phase1.json; scales compute and the update, sets the error band

Phase 1 times layers, collectives and AdamW one by one, then runs real pp=2 training steps per schedule, and with
experts or layers over 2 ranks (the trainer's `pipeline_s` and `step_s`). Two things differ inside a real step:
the layers run inside the schedule with the other ranks of the job competing for the same cores, and after the
pipeline the step averages
gradients in flat buckets, computes their norm, clips and steps the optimiser, which costs more than the
collectives and AdamW of the fits alone. So the model predicts phase 1's own pp=2 layouts (the schedule simulated
with shared cores, as for any layout) and takes ratios, measured / predicted:

- `compute_scale`: the slowest rank's pipeline run over the predicted one (compute, bubble and sharing together,
  so the shared cores are counted once, by the simulation), applied to every layer's cost;
- `update_scale`: what followed the pipeline (step_s - pipeline_s) over the predicted gradient sync + optimiser;
- `exchange_latency_s`: where phase 1 also ran the step with experts over 2 ranks, what each all-to-all adds
  inside a step beyond the same call timed alone (on shared cores a call waits for a peer off its core); the
  model adds it to every all-to-all and to each of ZeRO-1's per-tensor broadcasts, collective calls alike;
- `tp_scale`: where phase 1 also ran the step with layers over 2 tp ranks, that step's pipeline run over the
  predicted one, applied to the layers timed over tp ranks.

Only phase 1's runs are used, never a layout phase 2 times. `band` is how far the model can be trusted to rank
two layouts: the larger of the steps' own spread in phase 1 (interquartile range / median) and how much the two
schedules' compute scales disagree; phase 2 measures every layout predicted within it of the best.
"""

from __future__ import annotations

import statistics
from dataclasses import replace

from sigma.train.config import ModelConfig
from sigma.train.dims import ParallelDims
from sigma.tune.cost import Costs, Link, predict
from sigma.tune.space import Layout

UPDATE_PARTS = ("grad_sync", "optimizer")
ROUNDS = 4  # fixed-point rounds for the compute scale: the links' part of a pipeline run is not scaled
MAX_BAND = 0.5  # wider than this the model ranks nothing: the few measured still bound the cost


def pipeline_part(parts: dict[str, float]) -> float:
    return sum(v for k, v in parts.items() if k not in UPDATE_PARTS)


def phase1_dims(run: dict, schedule: str, world: int, model: ModelConfig) -> ParallelDims:
    """The layout of one of phase 1's real steps (sigma.tune.profile.measure_real_steps)."""
    if "layout" in run:
        return Layout.from_dict(run["layout"]).dims(world, model, run["global_batch"])
    return ParallelDims.build(world, pp=2, vpp=2 if schedule == "interleaved_1f1b" else 1, ep=run.get("ep", 1),
                              schedule=schedule, microbatches=run["microbatches"], n_layers=model.n_layers,
                              n_experts=model.n_experts, global_batch=run["microbatches"] * run["dp"])


def scaled(costs: Costs, compute: float, update: float) -> Costs:
    return replace(costs, compute={k: [a * compute, b * compute] for k, (a, b) in costs.compute.items()},
                   compute_scale=costs.compute_scale * compute, update_scale=costs.update_scale * update)


def calibrate(costs: Costs, raw: dict, model: ModelConfig) -> Costs:
    """costs with layer and update costs scaled to phase 1's real pp=2 steps, and the model's error band; unchanged
    where phase 1 recorded no such step (one rank, or a phase1.json of an older version)."""
    runs = {s: r for s, r in raw.get("bubbles", {}).items() if "pipeline_s" in r and "update_s" in r}
    if not runs:
        return costs
    compute_ratios, update_ratios, spreads = [], [], []
    for schedule, run in runs.items():
        dims = phase1_dims(run, schedule, raw["world"], model)
        scale = 1.0
        for _ in range(ROUNDS):
            pred = predict(scaled(costs, scale, 1.0), model, dims, 1, run["tokens"])
            scale *= run["pipeline_s"] / pipeline_part(pred.parts)
        compute_ratios.append(scale)
        update = sum(pred.parts[k] for k in UPDATE_PARTS)
        if update > 0 and run["update_s"] > 0:
            update_ratios.append(run["update_s"] / update)
        spreads.append(run.get("spread", 0.0))
    compute = statistics.median(compute_ratios)
    update = statistics.median(update_ratios) if update_ratios else 1.0
    disagree = max(abs(r / compute - 1) for r in compute_ratios)
    band = min(MAX_BAND, max(statistics.median(spreads), disagree))
    out = replace(scaled(costs, compute, update), band=band)
    if "ep_step" in raw:
        out = with_exchange_latency(out, raw["ep_step"], raw["world"], model)
    if "tp_step" in raw:
        out = with_tp_scale(out, raw["tp_step"], raw["world"], model)
    return out


def with_tp_scale(costs: Costs, run: dict, world: int, model: ModelConfig) -> Costs:
    """The layers over tp ranks (`moe@tp2`, timed alone in pairs with the whole layer) scaled to phase 1's real
    step with tp=2: inside a step each of their all-reduces waits for its peer and every operation pays the
    sharded tensors' overhead."""
    tp_kinds = [k for k in costs.compute if "@tp" in k]
    if not tp_kinds:
        return costs
    dims = phase1_dims(run, "1f1b", world, model)
    scale = 1.0
    for _ in range(ROUNDS):
        trial = replace(costs, compute={k: [a * scale, b * scale] if k in tp_kinds else [a, b]
                                        for k, (a, b) in costs.compute.items()})
        pred = predict(trial, model, dims, run["layout"]["mbs"], run["tokens"])
        scale *= run["pipeline_s"] / pipeline_part(pred.parts)
    return replace(trial, tp_scale=scale)


def with_all_to_all_alpha(costs: Costs, extra: float) -> Costs:
    links = {k: Link(v.alpha + extra, v.beta) if k.startswith("all_to_all/") else v for k, v in costs.links.items()}
    return replace(costs, links=links, exchange_latency_s=costs.exchange_latency_s + extra)


def with_exchange_latency(costs: Costs, run: dict, world: int, model: ModelConfig) -> Costs:
    """The latency an all-to-all adds inside a real step beyond the same call timed alone: phase 1's step with
    experts over 2 ranks against its prediction, per unit of all-to-all latency the prediction holds (on shared
    cores each call waits for a peer that may be off its core). Never negative: a faster step is noise."""
    dims = phase1_dims(run, "1f1b", world, model)
    base = pipeline_part(predict(costs, model, dims, 1, run["tokens"]).parts)
    step = 1e-3
    per_second = (pipeline_part(predict(with_all_to_all_alpha(costs, step), model, dims, 1, run["tokens"]).parts)
                  - base) / step  # seconds of pipeline per second of latency: the calls on the critical path
    if per_second <= 0 or run["pipeline_s"] <= base:
        return costs
    return with_all_to_all_alpha(costs, (run["pipeline_s"] - base) / per_second)
