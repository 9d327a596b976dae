"""The tuner's jobs, one process per rank (submitit on SLURM, or local processes): profile the platform, or time
layouts for real.

ProfileTask (phase 1) measures, with every rank of its allocation busy at once (so shared cores and links count):
- forward + backward of one dense layer, one MoE layer and the output head for each micro-batch size, and the
  same on rank 0 alone: how much slower a rank computes while every rank does (ranks sharing cores);
- all_reduce, all_to_all and p2p of several sizes in groups of 2..world ranks, inside a node and across nodes;
- the optimiser's seconds per parameter;
- the bubble of a pp=2 pipeline per schedule, against the schedule's theoretical bubble.
MeasureTask (phase 2, and the exhaustive grid of bench/tune.py) trains each given layout for a few steps on random
tokens and appends one JSON line per layout to a results file as it goes, so a failed or preempted job keeps what
it measured (`sigma tune --resume` measures only the rest).
"""

from __future__ import annotations

import json
import os
import statistics
import time
from pathlib import Path

import torch
import torch.distributed as dist

WARMUP = 1
# message bytes per rank: latency-bound to bandwidth-bound (the trainer's gradient buckets are 32 MiB)
SIZES = [1 << 16, 1 << 20, 1 << 23]


def _join(threads: int) -> tuple[int, int]:
    """Join this job's process group (gloo/nccl from the job environment); (rank, world)."""
    import datetime

    from sigma.train.parallel import launch_env

    torch.set_num_threads(max(1, threads))
    info = launch_env() or {"rank": 0, "world_size": 1, "local_rank": 0}
    if torch.cuda.is_available():  # one accelerator per rank of a node
        torch.cuda.set_device(info["local_rank"] % torch.cuda.device_count())
    if info["world_size"] > 1 and not dist.is_initialized():
        backend = "nccl" if torch.cuda.is_available() else "gloo"
        dist.init_process_group(backend, rank=info["rank"], world_size=info["world_size"],
                                timeout=datetime.timedelta(seconds=300))
    return info["rank"], info["world_size"]


def _timed(fn, reps: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _device() -> torch.device:
    return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")


# ---------------------------------------------------------------- phase 1

def measure_compute(model_cfg, seq_len: int, mbs_list: list[int], reps: int) -> list[dict]:
    from sigma.train.model import MoETransformer

    device = _device()
    torch.manual_seed(0)
    model = MoETransformer(model_cfg).to(device)
    cos, sin = model.rope_cos[:seq_len], model.rope_sin[:seq_len]
    blocks = {"moe": model.layers[model_cfg.n_dense_layers]}
    if model_cfg.n_dense_layers:
        blocks["dense"] = model.layers[0]
    out = []
    for mbs in mbs_list:
        x = torch.randn(mbs, seq_len, model_cfg.dim, device=device, requires_grad=True)
        targets = torch.randint(0, model_cfg.vocab_size, (mbs * seq_len,), device=device)
        for kind, block in blocks.items():
            def step(block=block):
                y, aux = block(x, cos, sin)
                (y.float().pow(2).mean() + (aux if aux is not None else 0)).backward()
            out.append({"kind": kind, "tokens": mbs * seq_len, "seconds": _timed(step, reps)})

        def head():
            logits = model.output(model.norm(x))
            torch.nn.functional.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), targets).backward()
        out.append({"kind": "head", "tokens": mbs * seq_len, "seconds": _timed(head, reps)})
    return out


def measure_tp_compute(model_cfg, rank: int, world: int, seq_len: int, mbs_list: list[int], reps: int,
                       max_tp: int) -> list[dict]:
    """Forward + backward of a dense and an MoE layer split over tp ranks (DTensor, the tp all-reduces included),
    for tp = 2, 4, .. up to max_tp: what a layer costs under tp, beyond compute / tp."""
    from sigma.config import ConfigError
    from sigma.train.dims import ParallelDims
    from sigma.train.parallelize import build_parallel

    out = []
    tp = 2
    while tp <= min(world, max_tp):
        if world % tp:
            break
        hidden = {"expert_hidden": model_cfg.expert_hidden}
        if model_cfg.n_dense_layers:
            hidden["dense_hidden"] = model_cfg.dense_hidden
        try:
            dims = ParallelDims.build(world, tp=tp, n_layers=model_cfg.n_layers, n_experts=model_cfg.n_experts,
                                      n_heads=model_cfg.n_heads, n_kv_heads=model_cfg.n_kv_heads,
                                      hidden_sizes=hidden, global_batch=world // tp)
        except ConfigError:
            break  # tp does not divide the model's heads or hidden sizes
        run = build_parallel(model_cfg, dims, rank, seed=0, device=_device())
        model = run.module
        cos, sin = model.rope_cos[:seq_len], model.rope_sin[:seq_len]
        blocks = {"moe": model.layers[model_cfg.n_dense_layers]}
        if model_cfg.n_dense_layers:
            blocks["dense"] = model.layers[0]
        for mbs in mbs_list:
            torch.manual_seed(mbs)  # the same input on every tp rank (a replicated activation)
            x = torch.randn(mbs, seq_len, model_cfg.dim, device=_device(), requires_grad=True)
            for kind, block in blocks.items():
                def step(block=block):
                    y, aux = block(x, cos, sin)
                    (y.float().pow(2).mean() + (aux if aux is not None else 0)).backward()
                dist.barrier()
                out.append({"kind": f"{kind}@tp{tp}", "tokens": mbs * seq_len, "seconds": _timed(step, reps)})
        tp *= 2
    return out


def measure_optimizer(reps: int, numel: int = 1 << 20) -> float:
    p = torch.nn.Parameter(torch.randn(numel, device=_device()))
    p.grad = torch.randn_like(p)
    opt = torch.optim.AdamW([p], lr=1e-3, foreach=True)
    return _timed(opt.step, reps) / numel


def measure_links(rank: int, world: int, nodes: list[str], sizes: list[int], reps: int) -> list[dict]:
    """Every rank joins every group (new_group is collective); the figures are rank 0's group's."""
    out = []
    device = _device()
    n = 2
    while n <= world:
        if world % n == 0:
            for layout in ("consecutive", "strided"):
                if layout == "strided" and n == world:
                    continue
                if layout == "consecutive":
                    parts = [list(range(k * n, (k + 1) * n)) for k in range(world // n)]
                else:
                    step = world // n
                    parts = [list(range(j, world, step)) for j in range(step)]
                groups = [dist.new_group(p) for p in parts]
                mine = next(i for i, p in enumerate(parts) if rank in p)
                group, members = groups[mine], parts[mine]
                inter = len({nodes[r] for r in parts[0]}) > 1
                for nbytes in sizes:
                    x = torch.ones(nbytes // 4, device=device)
                    y = torch.empty_like(x)
                    ops = {"all_reduce": lambda: dist.all_reduce(x, group=group),
                           "all_to_all": lambda: dist.all_to_all_single(y, x, group=group)}
                    if n == 2:
                        peer = members[1 - members.index(rank)]
                        ops["p2p"] = lambda peer=peer: _ping_pong(x, y, peer, rank < peer)
                    for op, fn in ops.items():
                        dist.barrier()
                        seconds = _timed(fn, reps)
                        if op == "p2p":
                            seconds /= 2  # one way of the round trip
                        out.append({"op": op, "n": n, "bytes": nbytes, "inter": inter, "seconds": seconds})
        n *= 2
    return out


def _ping_pong(x, y, peer: int, first: bool) -> None:
    if first:
        dist.send(x, peer)
        dist.recv(y, peer)
    else:
        dist.recv(y, peer)
        dist.send(x, peer)


def measure_bubbles(model_cfg, rank: int, world: int, seq_len: int, steps: int) -> dict[str, dict]:
    """Bubble of pp=2 (dp = world / 2) per schedule, 2 micro-batches per rank, vs (p - 1) / (v m + p - 1)."""
    from sigma.train.dims import ParallelDims
    from sigma.train.parallelize import build_optimizer, build_parallel, train_step
    from sigma.train.train_config import OptimConfig

    if world < 2 or world % 2 or model_cfg.n_layers < 2:
        return {}
    out = {}
    dp = world // 2
    for schedule, vpp in (("gpipe", 1), ("1f1b", 1), ("interleaved_1f1b", 2)):
        if model_cfg.n_layers < 2 * vpp:
            continue
        dims = ParallelDims.build(world, pp=2, vpp=vpp, schedule=schedule, microbatches=2, n_layers=model_cfg.n_layers,
                                  n_experts=model_cfg.n_experts, global_batch=2 * dp)
        run = build_parallel(model_cfg, dims, rank, seed=0)
        optimizer, named, _ = build_optimizer(run, OptimConfig(fused=False))
        g = torch.Generator().manual_seed(1)
        bubbles = []
        for step in range(steps + WARMUP):
            batch = torch.randint(0, model_cfg.vocab_size, (2 * dp, seq_len + 1), generator=g)
            train_step(run, optimizer, named, batch)
            if step >= WARMUP:
                bubbles.append(run.kpi["bubble"])
        value = torch.tensor([statistics.median(bubbles)], dtype=torch.float64)
        dist.all_reduce(value)
        theory = (2 - 1) / (vpp * 2 + 2 - 1)
        out[schedule] = {"measured": float(value) / world, "theory": theory}
    return out


class ProfileTask:
    """Phase 1 on every rank of a small allocation; rank 0 returns the measurements."""

    def __init__(self, spec: dict):
        self.spec = spec

    def __call__(self) -> dict | None:
        from sigma.train.config import load_model_config

        s = self.spec
        rank, world = _join(s.get("threads", 1))
        model_cfg = load_model_config(s["model"], s.get("model_overrides", {}))
        node = os.environ.get("SLURMD_NODENAME") or os.uname().nodename
        nodes = [node]
        if world > 1:
            nodes = [None] * world
            dist.all_gather_object(nodes, node)
            dist.barrier()
        compute = measure_compute(model_cfg, s["seq_len"], s["mbs"], s.get("reps", 3))
        alone = []  # rank 0's layers again while the others wait: how much ranks slow each other down
        if world > 1:
            dist.barrier()
            if rank == 0:
                alone = measure_compute(model_cfg, s["seq_len"], s["mbs"][-1:], s.get("reps", 3))
            dist.barrier()
            compute += measure_tp_compute(model_cfg, rank, world, s["seq_len"], s["mbs"], s.get("reps", 3),
                                          s.get("max_tp", world))
        optimizer = measure_optimizer(s.get("reps", 3))
        links = measure_links(rank, world, nodes, s.get("sizes", SIZES), s.get("reps", 3)) \
            if world > 1 else []
        bubbles = measure_bubbles(model_cfg, rank, world, s["seq_len"], s.get("steps", 2)) if world > 1 else {}
        gathered = [compute]
        if world > 1:
            gathered = [None] * world
            dist.all_gather_object(gathered, compute)
            dist.destroy_process_group()
        if rank:
            return None
        # the median over ranks of each point: every rank computed at once, on its share of the cores
        merged = [dict(point, seconds=statistics.median(r[i]["seconds"] for r in gathered))
                  for i, point in enumerate(compute)]
        busy = {(p["kind"], p["tokens"]): p["seconds"] for p in merged}
        sharing = statistics.median([busy[(p["kind"], p["tokens"])] / p["seconds"] for p in alone]) if alone else 1.0
        return {"compute": merged, "sharing": max(1.0, sharing), "optimizer_s_per_param": optimizer, "links": links,
                "bubbles": bubbles, "world": world, "nodes": sorted(set(nodes))}


# ---------------------------------------------------------------- phase 2: layouts for real

def measure_layout(model_cfg, layout, world: int, rank: int, global_batch: int, seq_len: int, steps: int) -> dict:
    """Median step seconds (the slowest rank's, per step) of `steps` timed steps after a warm-up."""
    from sigma.train.parallelize import build_optimizer, build_parallel, train_step
    from sigma.train.train_config import OptimConfig

    dims = layout.dims(world, model_cfg, global_batch)
    run = build_parallel(model_cfg, dims, rank, seed=0, device=_device())
    optimizer, named, _ = build_optimizer(run, OptimConfig(fused=False), shard=layout.zero)
    g = torch.Generator().manual_seed(7)
    times = []
    for step in range(steps + WARMUP):
        batch = torch.randint(0, model_cfg.vocab_size, (global_batch, seq_len + 1), generator=g).to(_device())
        if world > 1:
            dist.barrier()
        t0 = time.perf_counter()
        train_step(run, optimizer, named, batch)
        elapsed = torch.tensor([time.perf_counter() - t0], dtype=torch.float64)
        if world > 1:
            dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
        if step >= WARMUP:
            times.append(float(elapsed))
    step_s = statistics.median(times)
    return {"step_s": step_s, "tokens_per_s": global_batch * seq_len / step_s}


class MeasureTask:
    """Time each of spec["layouts"] in turn on this allocation; rank 0 appends a JSON line per layout to
    spec["results"] (an error is recorded for that layout, and the job goes on with the next)."""

    def __init__(self, spec: dict):
        self.spec = spec

    def __call__(self) -> None:
        from sigma.train.config import load_model_config
        from sigma.tune.space import Layout

        s = self.spec
        rank, world = _join(s.get("threads", 1))
        model_cfg = load_model_config(s["model"], s.get("model_overrides", {}))
        results = Path(s["results"])
        try:
            for entry in s["layouts"]:
                layout = Layout.from_dict(entry)
                try:
                    record = measure_layout(model_cfg, layout, world, rank, s["global_batch"], s["seq_len"],
                                            s.get("steps", 3))
                except Exception as exc:  # this layout failed on this platform; the rest still get measured
                    record = {"error": f"{type(exc).__name__}: {exc}"[:500]}
                if world > 1:
                    dist.barrier()
                if rank == 0:
                    with results.open("a") as f:
                        f.write(json.dumps({"layout": layout.as_dict(), **record}) + "\n")
        finally:
            if world > 1 and dist.is_initialized():
                dist.destroy_process_group()
