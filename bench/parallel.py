"""Tokens/s and MFU per layout of the `tiny` preset on 4 gloo ranks (CPU), side by side with DP-only.

    python bench/parallel.py [--steps 6] [--seq-len 128] [--batch 16] [--only pp]
    python bench/parallel.py --dispatch      # expert-parallel dispatch: dropless (host read) vs capacity

Every layout trains the same global batch with sigma.train.parallelize.train_step, one process per rank, one
torch thread each. The first two steps are warm-up (shape inference, optimiser state); the rest are timed.
MFU = tokens/s per rank x FLOPs per token / the one-thread CPU GEMM peak (sigma.train.flops), measured once. The bubble
column is the pipeline schedule's idle share in theory, (p - 1) / (v m + p - 1), `measured` the mean over ranks of
the share of the schedule's run a rank's stages did not compute (ParallelRun.kpi["bubble"]); `wait` is the largest
share of a step one rank spent inside all-reduces and all-to-alls (pipeline sends and receives are not included);
`dropped` the mean share of routed token copies over the expert-parallel capacity.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import time

import torch
import torch.multiprocessing as mp

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

LAYOUTS = [
    ("dp4 (baseline)", {}),
    ("dp2 ep2", {"ep": 2}),
    ("tp2 dp2", {"tp": 2}),
    ("tp2 ep2", {"tp": 2, "ep": 2}),
    ("pp2 dp2 1f1b", {"pp": 2, "microbatches": 4}),
    ("pp2 dp2 gpipe", {"pp": 2, "schedule": "gpipe", "microbatches": 4}),
    ("pp2 dp2 vpp2", {"pp": 2, "vpp": 2, "microbatches": 4}),
    ("pp4 1f1b", {"pp": 4, "microbatches": 4}),
    ("pp2 ep2", {"pp": 2, "ep": 2, "microbatches": 4}),
]
# The expert-parallel dispatch side by side: the dropless one (its split sizes read back to the host once per
# layer and forward) against the capacity one (fixed shapes, no host read, chunks issued asynchronously).
DISPATCH_LAYOUTS = [
    ("dp2 ep2 dropless", {"ep": 2, "dispatch": ("dropless", 2.0, 1)}),
    ("dp2 ep2 cap2.0 x2", {"ep": 2, "dispatch": ("capacity", 2.0, 2)}),
    ("dp2 ep2 cap2.0 x1", {"ep": 2, "dispatch": ("capacity", 2.0, 1)}),
    ("dp2 ep2 cap4.0 x2", {"ep": 2, "dispatch": ("capacity", 4.0, 2)}),  # n_experts / top_k: never drops
]
WORLD = 4


def worker(rank, port, layout, args, peak, queue):
    import torch.distributed as dist

    from sigma.train.config import load_model_config
    from sigma.train.dims import ParallelDims
    from sigma.train.flops import flops_per_token
    from sigma.train.parallel import EPDispatch, collective_wait_s, dropped_tokens
    from sigma.train.parallelize import build_optimizer, build_parallel, train_step
    from sigma.train.train_config import OptimConfig

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD)
    cfg = load_model_config("tiny", {"n_layers": 8})
    layout = dict(layout)
    dispatch = EPDispatch(*layout.pop("dispatch", ("dropless",)))  # the trainer's default
    dims = ParallelDims.build(WORLD, n_layers=cfg.n_layers, n_experts=cfg.n_experts, n_heads=cfg.n_heads,
                              n_kv_heads=cfg.n_kv_heads, global_batch=args.batch, **layout)
    run = build_parallel(cfg, dims, rank, seed=0, ep_dispatch=dispatch)
    optimizer, named, _ = build_optimizer(run, OptimConfig(fused=False))
    g = torch.Generator().manual_seed(0)
    data = [torch.randint(0, cfg.vocab_size, (args.batch, args.seq_len + 1), generator=g) for _ in range(args.steps)]
    times, busy, bubbles, drops = [], [], [], []
    for step, batch in enumerate(data):
        dist.barrier()
        t0, w0 = time.perf_counter(), collective_wait_s()
        train_step(run, optimizer, named, batch)
        dt = time.perf_counter() - t0
        if step >= 2:
            times.append(dt)
            busy.append((collective_wait_s() - w0) / dt)
            bubbles.append(run.kpi.get("bubble", 0.0))
            drops.append(run.kpi.get("dropped_tokens", 0.0))
    step_s = torch.tensor(times).median().item()
    tps = args.batch * args.seq_len / step_s
    mfu = tps / WORLD * flops_per_token(cfg, args.seq_len) / peak
    queue.put((rank, step_s, tps, mfu, max(busy), dims, sum(bubbles) / len(bubbles), sum(drops) / len(drops)))
    dist.barrier()
    dist.destroy_process_group()
    queue.close()
    queue.join_thread()
    os._exit(0)


def run_layout(layout, args, peak):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=worker, args=(r, port, layout, args, peak, queue)) for r in range(WORLD)]
    for p in procs:
        p.start()
    results = sorted((queue.get(timeout=900) for _ in procs), key=lambda r: r[0])
    for p in procs:
        p.join(timeout=60)
    return results


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--only", default="", help="layouts whose name contains this text (the baseline always runs)")
    parser.add_argument("--dispatch", action="store_true",
                        help="compare the expert-parallel dispatches (dropless vs capacity) instead of the layouts")
    args = parser.parse_args(argv)
    from sigma.train.flops import PeakUnknown, calibrated_cpu_peak, measure_gemm_peak

    torch.set_num_threads(1)
    try:  # `sigma train calibrate`'s figure when there is one, else measured once here
        peak = calibrated_cpu_peak(torch.float32, 1).flops
    except PeakUnknown:
        peak = max(measure_gemm_peak(torch.float32, 1, runs=3, seconds=0.5))  # one denominator for every layout
    print(f"tiny (8 layers), {WORLD} gloo ranks x 1 thread, global batch {args.batch} x {args.seq_len} tokens, "
          f"median of {args.steps - 2} steps; CPU peak {peak / 1e9:.1f} GFLOP/s per thread; "
          f"torch {torch.__version__}, {os.cpu_count()} CPUs")
    layouts = DISPATCH_LAYOUTS if args.dispatch else LAYOUTS
    first = "vs first" if args.dispatch else "vs dp4"
    print(f"{'layout':18} {'step ms':>9} {'tokens/s':>10} {first:>8} {'MFU':>7} {'bubble':>7} {'measured':>8} "
          f"{'wait':>6} {'dropped':>8}")
    base = None
    for name, layout in layouts:
        if base is not None and args.only not in name:
            continue
        results = run_layout(layout, args, peak)
        step_s = max(r[1] for r in results)
        tps = min(r[2] for r in results)
        mfu = min(r[3] for r in results)
        busy = max(r[4] for r in results)
        dims = results[0][5]
        bubble = (dims.pp - 1) / (dims.vpp * dims.microbatches + dims.pp - 1) if dims.pp > 1 else 0.0
        measured = sum(r[6] for r in results) / len(results)
        dropped = sum(r[7] for r in results) / len(results)
        base = base or tps
        print(f"{name:18} {1000 * step_s:9.1f} {tps:10,.0f} {tps / base:7.2f}x {100 * mfu:6.2f}% "
              f"{100 * bubble:6.1f}% {100 * measured:7.1f}% {100 * busy:5.1f}% {100 * dropped:7.2f}%", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
