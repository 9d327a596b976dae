"""Predicted (sigma.train.memory) versus measured peak memory of one training step, per layout.

    python bench/memory.py [--only TEXT]      # every layout (or those whose name contains TEXT)

Measured: live tensor bytes under sigma.train.memory.PeakTracker during the second step (the first creates the
optimiser states, as in a long run), plus parameters and optimiser states already alive. Layouts of several ranks
run on gloo, one process per rank, and report each rank's figure. CPU only (float32); CUDA is not measured here.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys

import torch
import torch.multiprocessing as mp

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from sigma.train.config import load_model_config  # noqa: E402
from sigma.train.dims import ParallelDims  # noqa: E402
from sigma.train.memory import PeakTracker, estimate, tensor_bytes  # noqa: E402
from sigma.train.parallel import EPDispatch  # noqa: E402

# name, model preset, overrides, layout, micro-batch, micro-batches, seq_len, recomputed MoE layers
LAYOUTS = [
    ("debug mb4", "debug", {}, {}, 4, 1, 64, ()),
    ("debug mb16", "debug", {}, {}, 16, 1, 64, ()),
    ("tiny mb2 T128", "tiny", {}, {}, 2, 1, 128, ()),
    ("tiny mb4 T256", "tiny", {}, {}, 4, 1, 256, ()),
    ("tiny mb4 T256 recompute all MoE", "tiny", {}, {}, 4, 1, 256, (1, 2, 3)),
    ("tiny top8 mb4 T256", "tiny", {"top_k": 8}, {}, 4, 1, 256, ()),
    ("tiny 8 layers mb2 T256", "tiny", {"n_layers": 8}, {}, 2, 1, 256, ()),
    ("tiny 8 layers mb2 T256 recompute 2", "tiny", {"n_layers": 8}, {}, 2, 1, 256, (6, 7)),
    ("tiny 8 layers pp2 1f1b mb2x4", "tiny", {"n_layers": 8}, {"pp": 2}, 2, 4, 128, ()),
    ("tiny 8 layers pp2 gpipe mb2x4", "tiny", {"n_layers": 8}, {"pp": 2, "schedule": "gpipe"}, 2, 4, 128, ()),
    ("tiny 8 layers pp2 vpp2 mb2x4 [3,1,2,2]", "tiny", {"n_layers": 8},
     {"pp": 2, "vpp": 2, "pp_layers": [3, 1, 2, 2]}, 2, 4, 128, ()),
    ("tiny 8 layers tp2 mb2 T256", "tiny", {"n_layers": 8}, {"tp": 2}, 2, 1, 256, ()),
    ("tiny 8 layers dp2 ep2 zero1 mb2 T256", "tiny", {"n_layers": 8},
     {"world": 2, "ep": 2, "shard_optimizer": True, "ep_dispatch": EPDispatch("capacity", 2.0)}, 2, 1, 256, ()),
    ("tiny 8 layers dp2 ep2 dropless mb2 T256", "tiny", {"n_layers": 8},
     {"world": 2, "ep": 2, "ep_dispatch": EPDispatch("dropless")}, 2, 1, 256, ()),
    ("tiny 8 layers dp2 ep2 cf1.25 mb2 T256", "tiny", {"n_layers": 8},
     {"world": 2, "ep": 2, "ep_dispatch": EPDispatch("capacity", 1.25)}, 2, 1, 256, ()),
]


def world_of(layout) -> int:
    return layout.get("world", layout.get("pp", 1) * layout.get("tp", 1))


def build_dims(model_cfg, layout, mb, n_mb):
    world = world_of(layout)
    layout = {k: v for k, v in layout.items() if k not in ("world", "shard_optimizer", "ep_dispatch")}
    dp = world // (layout.get("pp", 1) * layout.get("tp", 1))
    return ParallelDims.build(world, n_layers=model_cfg.n_layers, n_experts=model_cfg.n_experts,
                              n_heads=model_cfg.n_heads, n_kv_heads=model_cfg.n_kv_heads,
                              global_batch=mb * n_mb * dp, microbatches=n_mb, **layout)


def measure_rank(rank, port, preset, overrides, layout, mb, n_mb, seq_len, recompute, queue):
    import torch.distributed as dist

    from sigma.train.parallelize import build_optimizer, build_parallel, train_step
    from sigma.train.train_config import OptimConfig

    torch.set_num_threads(1)
    model_cfg = load_model_config(preset, overrides)
    dims = build_dims(model_cfg, layout, mb, n_mb)
    shard = layout.get("shard_optimizer", False)
    if dims.world > 1:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=dims.world)
    ep_dispatch = layout.get("ep_dispatch", EPDispatch())
    run = build_parallel(model_cfg, dims, rank, seed=0, recompute_layers=list(recompute), ep_dispatch=ep_dispatch)
    optimizer, named, _ = build_optimizer(run, OptimConfig(fused=False), shard=shard)
    g = torch.Generator().manual_seed(1)
    batch = torch.randint(0, model_cfg.vocab_size, (mb * n_mb * dims.dp, seq_len + 1), generator=g)
    train_step(run, optimizer, named, batch, max_norm=1.0)  # states exist from here on, as in a long run
    static = [p.detach() for p in run.module.parameters()] + [s for st in optimizer.state.values()
                                                              for s in st.values() if torch.is_tensor(s)]
    tracker = PeakTracker(baseline=tensor_bytes(static)).ignore(static)
    with tracker:
        train_step(run, optimizer, named, batch, max_norm=1.0)
    pp_rank = dims.coords(rank)["pp"]
    predicted = estimate(model_cfg, dims, pp_rank, micro_batch=mb, seq_len=seq_len,
                         recompute_layers=tuple(recompute), shard_optimizer=shard, ep_dispatch=ep_dispatch).peak
    queue.put((rank, tracker.peak, predicted))
    if dims.world > 1:
        dist.barrier()
        dist.destroy_process_group()
    queue.close()
    queue.join_thread()
    os._exit(0)


def run_layout(spec):
    name, preset, overrides, layout, mb, n_mb, seq_len, recompute = spec
    world = world_of(layout)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=measure_rank, args=(r, port, preset, overrides, layout, mb, n_mb, seq_len,
                                                    recompute, queue)) for r in range(world)]
    for p in procs:
        p.start()
    results = sorted(queue.get(timeout=600) for _ in procs)
    for p in procs:
        p.join(timeout=60)
    return results


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="", help="run the layouts whose name contains this text")
    args = parser.parse_args(argv)
    print(f"{'layout':42} {'rank':>4} {'predicted MiB':>14} {'measured MiB':>13} {'error':>7}")
    worst = 0.0
    for spec in LAYOUTS:
        if args.only not in spec[0]:
            continue
        for rank, measured, predicted in run_layout(spec):
            err = (predicted - measured) / measured
            worst = max(worst, abs(err))
            print(f"{spec[0]:42} {rank:>4} {predicted / 2**20:14.2f} {measured / 2**20:13.2f} {100 * err:+6.1f}%",
                  flush=True)
    print(f"largest error: {100 * worst:.1f}% (torch {torch.__version__}, {os.cpu_count()} CPUs, float32, CPU)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
