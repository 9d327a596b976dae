"""Phase 1 of the tuner, one process per rank (submitit on SLURM, or local processes): profile the platform.

ProfileTask (phase 1) measures, with every rank of its allocation busy at once (so shared cores and links count):
- forward + backward of one dense layer, one MoE layer and the output head for each micro-batch size, every rank
  at once and rank 0 alone, in alternating rounds: the lone call's CPU seconds and how much longer than them it
  lasted (the machine's load then), and how much slower a rank computes while every rank does (ranks sharing cores);
- all_reduce, all_to_all and p2p of several sizes in groups of 2..world ranks, inside a node and across nodes;
- the optimiser's CPU seconds per parameter;
- real pp=2 training steps per schedule, and with experts or layers over 2 ranks, interleaved: the bubble against the
  schedule's theoretical one, the slowest rank's pipeline run and what followed it (gradient sync, clipping, the
  optimiser), the busiest rank's compute (the trainer's KPIs): sigma.tune.calibrate holds the cost model to them.
Timing layouts for real (phase 2, and the exhaustive grid of bench/tune.py) is sigma.tune.measure's.
"""

from __future__ import annotations

import os
import statistics
import time

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

def measure_compute(model_cfg, rank: int, world: int, seq_len: int, mbs_list: list[int], reps: int) -> list[dict]:
    """Forward + backward of a dense layer, an MoE layer and the head per micro-batch size, in rounds that time
    each twice: every rank at once (`seconds`, shared cores and all), then rank 0 alone while the others wait
    (`alone`); back to back, so load from elsewhere that comes and goes hits both alike. Rank 0's per-round
    ratios busy / alone (`ratios`) say how much ranks that share cores slow each other."""
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
        fns = {}
        for kind, block in blocks.items():
            def step(block=block):
                y, aux = block(x, cos, sin)
                (y.float().pow(2).mean() + (aux if aux is not None else 0)).backward()
            fns[kind] = step

        def head():
            logits = model.output(model.norm(x))
            torch.nn.functional.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), targets).backward()
        fns["head"] = head
        for kind, fn in fns.items():
            fn()  # warm-up
            busy, alone, cpu = [], [], []
            for _ in range(reps):
                busy.append(_once(fn, world)[0])
                if rank == 0:
                    wall, used = _once(fn, 1)
                    alone.append(wall)
                    cpu.append(used)
                if world > 1:
                    dist.barrier()
            point = {"kind": kind, "tokens": mbs * seq_len, "seconds": statistics.median(busy)}
            if rank == 0:
                point["alone"] = statistics.median(alone)
                point["cpu"] = statistics.median(cpu)
                point["ratios"] = [b / a for b, a in zip(busy, alone)]
                point["load"] = [a / c for a, c in zip(alone, cpu) if c > 0]
            out.append(point)
    return out


def _once(fn, world: int) -> tuple[float, float]:
    """One call, started together on every rank (world > 1): (wall seconds, this thread's CPU seconds)."""
    if world > 1:
        dist.barrier()
    t0, c0 = time.perf_counter(), time.thread_time()
    fn()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return time.perf_counter() - t0, time.thread_time() - c0


def measure_tp_compute(model_cfg, rank: int, world: int, seq_len: int, mbs_list: list[int], reps: int,
                       max_tp: int) -> list[dict]:
    """Forward + backward of a dense and an MoE layer split over tp ranks (DTensor, the tp all-reduces included),
    for tp = 2, 4, .. up to max_tp: what a layer costs under tp, beyond compute / tp. Each call is paired with the
    whole layer on every rank (every rank busy in both, started together, back to back), and the median of the
    per-pair ratios (`vs_tp1`) is kept: a ratio holds still where the machine's load moves between calls, where
    the seconds of one call do not."""
    from sigma.config import ConfigError
    from sigma.train.dims import ParallelDims
    from sigma.train.model import MoETransformer
    from sigma.train.parallelize import build_parallel

    torch.manual_seed(0)
    whole = MoETransformer(model_cfg).to(_device())
    plain = {"moe": whole.layers[model_cfg.n_dense_layers]}
    if model_cfg.n_dense_layers:
        plain["dense"] = whole.layers[0]
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
                fns = {"tp": step, "whole": lambda block=plain[kind]: step(block)}
                for fn in fns.values():
                    fn()  # warm-up
                split, ratios = [], []
                for _ in range(reps):
                    tp_s = _once(fns["tp"], world)[0]
                    whole_s = _once(fns["whole"], world)[0]
                    split.append(tp_s)
                    ratios.append(tp_s / whole_s)
                out.append({"kind": f"{kind}@tp{tp}", "tokens": mbs * seq_len, "seconds": statistics.median(split),
                            "vs_tp1": statistics.median(ratios)})
        tp *= 2
    return out


def measure_optimizer(reps: int, numel: int = 1 << 22) -> float:
    """CPU seconds per parameter of the trainer's AdamW step (per tensor, as build_optimizer runs it)."""
    p = torch.nn.Parameter(torch.randn(numel, device=_device()))
    p.grad = torch.randn_like(p)
    opt = torch.optim.AdamW([p], lr=1e-3, foreach=False)
    opt.step()  # warm-up: the state is allocated
    return statistics.median(_once(opt.step, 1)[1] for _ in range(reps)) / numel


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


def measure_real_steps(model_cfg, rank: int, world: int, seq_len: int, rounds: int, max_tp: int) -> dict[str, dict]:
    """Real pp=2 training steps of `world` sequences (one per micro-batch): 1F1B and interleaved 1F1B, and where
    the model allows it, 1F1B with experts over 2 ranks (`ep2`) and with layers over 2 tp ranks (`tp2`); timed
    interleaved round by round (sigma.tune.measure), so load that comes and goes hits them alike. Per run: the
    bubble against (p - 1) / (v m + p - 1), the slowest rank's pipeline run and what followed it (gradient sync,
    clipping, the optimiser), the step's spread. sigma.tune.calibrate holds the cost model to them."""
    from sigma.config import ConfigError
    from sigma.tune.measure import time_group
    from sigma.tune.space import Layout

    if world < 2 or world % 2 or model_cfg.n_layers < 2:
        return {}
    runs = {"1f1b": Layout(pp=2), "interleaved_1f1b": Layout(pp=2, vpp=2)}
    if (world // 2) % 2 == 0 and model_cfg.n_moe_layers:
        runs["ep2"] = Layout(pp=2, ep=2)
    if world % 4 == 0 and max_tp >= 2:
        runs["tp2"] = Layout(tp=2, pp=2)
    valid = {}
    for key, layout in runs.items():
        try:
            valid[key] = (layout, layout.dims(world, model_cfg, world))
        except ConfigError:
            continue  # too few layers for vpp 2, experts or heads that do not split over 2 ranks
    records = time_group(model_cfg, [layout for layout, _ in valid.values()], world, rank, world, seq_len, rounds,
                         rounds, None)
    out = {}
    for key, (layout, dims) in valid.items():
        rec = records[layout.name()]
        if "error" in rec:
            raise RuntimeError(f"phase 1's real step {layout.name()} failed: {rec['error']}")
        out[key] = {"measured": rec["bubble"], "theory": 1 / (layout.vpp * dims.microbatches + 1),
                    "busy_s": rec["stage_busy_s"], "pipeline_s": rec["pipeline_s"], "update_s": rec["update_s"],
                    "step_s": rec["step_s"], "spread": rec["spread"], "layout": layout.as_dict(),
                    "global_batch": world, "microbatches": dims.microbatches, "dp": dims.dp, "tokens": seq_len,
                    "rounds": rec["rounds"]}
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
        compute = measure_compute(model_cfg, rank, world, s["seq_len"], s["mbs"], s.get("compute_reps", 7))
        if world > 1:
            dist.barrier()
            compute += measure_tp_compute(model_cfg, rank, world, s["seq_len"], s["mbs"], s.get("compute_reps", 7),
                                          s.get("max_tp", world))
        optimizer = measure_optimizer(s.get("reps", 3))
        links = measure_links(rank, world, nodes, s.get("sizes", SIZES), s.get("reps", 3)) \
            if world > 1 else []
        bubbles = measure_real_steps(model_cfg, rank, world, s["seq_len"], s.get("steps", 5),
                                     s.get("max_tp", world)) if world > 1 else {}
        extra = {f"{kind}_step": bubbles.pop(f"{kind}2") for kind in ("ep", "tp") if f"{kind}2" in bubbles}
        gathered = [compute]
        if world > 1:
            gathered = [None] * world
            dist.all_gather_object(gathered, compute)
            dist.destroy_process_group()
        if rank:
            return None
        # the median over ranks of each point (every rank computed at once, on its share of the cores), and rank 0's
        # alone; sharing: the median of rank 0's paired busy / alone ratios over every point and round
        ratios = [x for p in compute for x in p.pop("ratios", [])]
        load = statistics.median([x for p in compute for x in p.pop("load", [])] or [1.0])
        merged = [dict(point, seconds=statistics.median(r[i]["seconds"] for r in gathered))
                  for i, point in enumerate(compute)]
        sharing = statistics.median(ratios) if world > 1 else 1.0
        return {"compute": merged, "sharing": max(1.0, sharing), "load": load,
                "optimizer_s_per_param": optimizer, "links": links, "bubbles": bubbles, "world": world,
                "nodes": sorted(set(nodes)), **extra}
