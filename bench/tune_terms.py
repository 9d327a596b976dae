"""The tuner's cost model term by term against the trainer's own figures, for pipeline depths 1, 2 and 4.

Usage: python bench/tune_terms.py [--rounds 5] [--work /tmp/sigma-bench-tune-terms] [--port 29631]
Four gloo ranks as local processes (1 thread each): phase 1 (sigma.tune.profile.ProfileTask), then one job that
builds pp1 / pp2 / pp4 layouts at micro-batch sizes 1 and 2 (and ep2, ep4, ZeRO-1 and vpp2 variants) and times
them interleaved round by round, recording per step and rank the pipeline's run (forward + backward: the trainer's
forward_backward) and the update after it (sync_and_clip and the optimiser step), each timed around the trainer's
own function. It prints, per layout, the cost model's pipeline run and update against the measured ones, and each
layout's step time relative to plain data parallelism timed in the same rounds, predicted against measured:
before (the layer scale taken from the busiest rank's compute in phase 1's pp=2 steps divided by the whole
core sharing, no update calibration) and after (sigma.tune.calibrate).
Default: the `tiny` preset with 8 layers, 64-token sequences, global batch 8.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

LAYOUTS = ["tp1 pp1 ep1 mbs1", "tp1 pp1 ep1 mbs2", "tp1 pp1 ep4 mbs2", "tp1 pp2 ep1 mbs1", "tp1 pp2 ep1 mbs2",
           "tp1 pp2 ep2 mbs2", "tp1 pp2 ep2 mbs2 zero1", "tp1 pp2 ep2 vpp2 mbs2", "tp1 pp4 ep1 mbs1",
           "tp1 pp4 ep1 mbs2"]
WORLD, GLOBAL_BATCH, SEQ_LEN, OVERRIDES = 4, 8, 64, {"n_layers": 8}


def parse(name: str):
    from sigma.tune.space import Layout

    kw = {}
    for tok in name.split():
        for key in ("tp", "pp", "ep", "vpp", "mbs"):
            if tok.startswith(key) and tok[len(key):].isdigit():
                kw[key] = int(tok[len(key):])
    return Layout(zero="zero1" in name.split(), **kw)


def worker(rank: int, args) -> None:
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(WORLD), LOCAL_RANK=str(rank % 2), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(args.port))
    work = Path(args.work)
    if args.what == "profile":
        from sigma.tune.profile import ProfileTask

        raw = ProfileTask({"model": "tiny", "model_overrides": OVERRIDES, "seq_len": SEQ_LEN, "mbs": [1, 2, 4],
                           "max_tp": 2})()
        if raw:
            (work / "phase1.json").write_text(json.dumps({**raw, "mbs": [1, 2, 4]}, indent=1))
        return
    import torch
    import torch.distributed as dist

    import sigma.train.parallelize as trainer
    from sigma.train.config import load_model_config
    from sigma.train.parallelize import build_optimizer, build_parallel, train_step
    from sigma.train.train_config import OptimConfig
    from sigma.tune.profile import _join

    rank, world = _join(1)
    spent: dict[str, float] = {}

    def timed(fn, key):
        def wrapper(*a, **kw):
            t0 = time.perf_counter()
            out = fn(*a, **kw)
            spent[key] = spent.get(key, 0.0) + time.perf_counter() - t0
            return out
        return wrapper

    trainer.forward_backward = timed(trainer.forward_backward, "pipeline")
    trainer.sync_and_clip = timed(trainer.sync_and_clip, "update")
    model_cfg = load_model_config("tiny", OVERRIDES)
    batch = torch.randint(0, model_cfg.vocab_size, (GLOBAL_BATCH, SEQ_LEN + 1),
                          generator=torch.Generator().manual_seed(7))
    steps = {}
    for name in LAYOUTS:
        layout = parse(name)
        run = build_parallel(model_cfg, layout.dims(world, model_cfg, GLOBAL_BATCH), rank, seed=0)
        optimizer, named, _ = build_optimizer(run, OptimConfig(fused=False), shard=layout.zero)
        optimizer.step = timed(optimizer.step, "update")

        def step(run=run, optimizer=optimizer, named=named) -> list[list[float]]:
            dist.barrier()
            spent.clear()
            t0 = time.perf_counter()
            train_step(run, optimizer, named, batch)
            mine = torch.tensor([time.perf_counter() - t0, spent["pipeline"], spent["update"]], dtype=torch.float64)
            every = [torch.zeros_like(mine) for _ in range(world)]
            dist.all_gather(every, mine)
            return [t.tolist() for t in every]
        step()  # warm-up
        steps[name] = step
    samples = {n: [] for n in steps}
    for r in range(args.rounds):
        for i in range(len(LAYOUTS)):
            name = LAYOUTS[(r + i) % len(LAYOUTS)]
            samples[name].append(steps[name]())
    if rank == 0:
        (work / "measured.json").write_text(json.dumps(samples))
    dist.destroy_process_group()


def before(raw: dict, model, costs):
    """The layer scale as the previous version took it: the busiest pipeline rank's compute in phase 1's pp=2 steps
    (the rank with the last stage and the head) over its layers timed one by one x the whole sharing, as if every
    rank computed all the time; gradient sync and optimiser uncalibrated."""
    from dataclasses import replace

    from sigma.tune.calibrate import phase1_dims

    ratios = []
    for schedule, run in raw["bubbles"].items():
        dims = phase1_dims(run, schedule, raw["world"], model)
        layers = [x for st in dims.stages_of(dims.pp - 1) for x in dims.layers_of_stage(st)]
        per_mb = sum(costs.compute["dense" if x < model.n_dense_layers else "moe"][0]
                     + costs.compute["dense" if x < model.n_dense_layers else "moe"][1] * run["tokens"]
                     for x in layers) + costs.compute["head"][0] + costs.compute["head"][1] * run["tokens"]
        ratios.append(run["busy_s"] / (run["microbatches"] * per_mb * raw["sharing"]))
    scale = statistics.median(ratios)
    return replace(costs, compute={k: [a * scale, b * scale] for k, (a, b) in costs.compute.items()},
                   compute_scale=scale)


def report(args) -> None:
    from sigma.train.config import load_model_config
    from sigma.tune.calibrate import UPDATE_PARTS, pipeline_part
    from sigma.tune.cost import predict
    from sigma.tune.tuner import fit_costs

    work = Path(args.work)
    raw = json.loads((work / "phase1.json").read_text())
    samples = json.loads((work / "measured.json").read_text())
    model = load_model_config("tiny", OVERRIDES)
    models = {"before": before(raw, model, fit_costs(raw, 2, None)), "after": fit_costs(raw, 2, None, model)}
    c = models["after"]
    print(f"tiny (8 layers, {SEQ_LEN}-token sequences, global batch {GLOBAL_BATCH}) on {WORLD} gloo ranks as local "
          f"processes, 1 thread each; {os.cpu_count()} CPUs, load average {args.loads}")
    print(f"phase 1: sharing {raw['sharing']:.2f}, load {raw['load']:.2f}; layer scale before "
          f"{models['before'].compute_scale:.2f}, after {c.compute_scale:.2f}; update x{c.update_scale:.2f}; "
          f"all-to-all +{1000 * c.exchange_latency_s:.1f} ms a call; error band {100 * c.band:.0f}%")
    print(f"{args.rounds} interleaved rounds; per layout the median over rounds of the slowest rank's figures; "
          f"'vs dp' = step / tp1 pp1 ep1 mbs1's step in the same round (median)")
    gauge = [max(r[0] for r in rnd) for rnd in samples[LAYOUTS[0]]]
    errors = {k: [] for k in models}
    for name in LAYOUTS:
        layout = parse(name)
        dims = layout.dims(WORLD, model, GLOBAL_BATCH)
        rounds = samples[name]
        step = statistics.median(max(r[0] for r in rnd) for rnd in rounds)
        pipe = statistics.median(max(r[1] for r in rnd) for rnd in rounds)
        update = statistics.median(max(r[2] for r in rnd) for rnd in rounds)
        vs = statistics.median(max(r[0] for r in rnd) / g for rnd, g in zip(rounds, gauge))
        line = f"  {name:24} measured: pipeline {1000 * pipe:5.0f} update {1000 * update:4.0f} ms, vs dp x{vs:.3f}"
        for key, costs in models.items():
            pred = predict(costs, model, dims, layout.mbs, SEQ_LEN, layout.zero)
            ref = predict(costs, model, parse(LAYOUTS[0]).dims(WORLD, model, GLOBAL_BATCH), 1, SEQ_LEN)
            rel = pred.step_s / ref.step_s
            err = rel / vs - 1
            if name != LAYOUTS[0]:
                errors[key].append(abs(err))
            line += (f" | {key}: {1000 * pipeline_part(pred.parts):5.0f} "
                     f"{1000 * sum(pred.parts[k] for k in UPDATE_PARTS):4.0f} ms, x{rel:.3f} ({100 * err:+.0f}%)")
        print(line)
    print("median |error| of the step relative to plain data parallelism: " +
          ", ".join(f"{k} {100 * statistics.median(v):.1f}%" for k, v in errors.items()))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--work", default="/tmp/sigma-bench-tune-terms")
    p.add_argument("--port", type=int, default=29631)
    args = p.parse_args()
    import torch.multiprocessing as mp

    Path(args.work).mkdir(parents=True, exist_ok=True)
    loads = [os.getloadavg()[0]]
    for what in ("profile", "measure"):
        args.what = what
        mp.spawn(worker, args=(args,), nprocs=WORLD)
        loads.append(os.getloadavg()[0])
    args.loads = ", ".join(f"{x:.1f}" for x in loads) + " (start, after phase 1, after the timing)"
    report(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
