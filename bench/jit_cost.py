"""What a just-in-time checkpoint and an in-memory peer replica cost at scale, by arithmetic (no simulation).

    python bench/jit_cost.py [--model sigma-200b-a20b] [--world 2048] [--tp 1] [--pp 8] [--ep 8]
                             [--disk-gbps 2] [--fs-gbps 100] [--net-gbps 25] [--shard-optimizer]

Per rank (the pipeline stage holding the most parameters; sigma.train.memory.stage_param_counts): the bytes of its
checkpoint state (fp32 master weights + AdamW's two moments, ZeRO-1 sharded with --shard-optimizer), the host
memory an in-memory replica takes (its peer's shard plus the staging copy of its own), the time to write the
shard to storage at --disk-gbps per rank (and, as torch.distributed.checkpoint does, with each replicated tensor
written once, through a file system of --fs-gbps in all) and to send it to a peer at --net-gbps per rank. Ranks save in
parallel, so the per-rank times are the checkpoint's times. The bandwidths are stated, not measured: pass your site's.
"""

from __future__ import annotations

import argparse

from sigma.train.config import load_model_config
from sigma.train.dims import ParallelDims
from sigma.train.flops import param_counts
from sigma.train.memory import stage_param_counts

GB = 1e9
FP32 = 4


def costs(model: str, world: int, tp: int, pp: int, ep: int, disk_gbps: float, net_gbps: float, fs_gbps: float,
          shard_optimizer: bool) -> dict:
    cfg = load_model_config(model)
    dims = ParallelDims.build(world, tp=tp, pp=pp, ep=ep, n_layers=cfg.n_layers, n_experts=cfg.n_experts,
                              n_heads=cfg.n_heads, n_kv_heads=cfg.n_kv_heads, global_batch=world)
    worst = max(range(pp), key=lambda r: stage_param_counts(cfg, dims, r)[0])
    params, expert = stage_param_counts(cfg, dims, worst)
    weights = params * FP32
    moments = 2 * FP32 * (((params - expert) // dims.dp + expert // dims.edp) if shard_optimizer else params)
    shard = weights + moments
    total = param_counts(cfg).total
    whole = total * 3 * FP32  # one copy of every weight and both moments: what the checkpoint holds
    return {"model": model, "layout": f"world {world} = tp {tp} x pp {pp} x dp {dims.dp} (ep {ep}, edp {dims.edp})",
            "pp_rank": worst, "params_per_rank": params, "expert_params_per_rank": expert,
            "weights_gb": weights / GB, "optimizer_gb": moments / GB, "shard_gb": shard / GB,
            "replica_host_gb": 2 * shard / GB, "model_params": total,
            "disk_s": shard / (disk_gbps * GB), "net_s": shard / (net_gbps * GB), "whole_gb": whole / GB,
            "fs_s": max(whole / (fs_gbps * GB), whole / world / (disk_gbps * GB)), "fs_gbps": fs_gbps,
            "disk_gbps": disk_gbps, "net_gbps": net_gbps, "shard_optimizer": shard_optimizer}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="sigma-200b-a20b")
    p.add_argument("--world", type=int, default=2048)
    p.add_argument("--tp", type=int, default=1)
    p.add_argument("--pp", type=int, default=8)
    p.add_argument("--ep", type=int, default=8)
    p.add_argument("--disk-gbps", type=float, default=2.0, help="storage write bandwidth per rank, GB/s")
    p.add_argument("--fs-gbps", type=float, default=100.0, help="file system write bandwidth in all, GB/s")
    p.add_argument("--net-gbps", type=float, default=25.0, help="network bandwidth per rank to its peer, GB/s")
    p.add_argument("--shard-optimizer", action="store_true", help="ZeRO-1: AdamW moments sharded over dp")
    args = p.parse_args(argv)
    c = costs(args.model, args.world, args.tp, args.pp, args.ep, args.disk_gbps, args.net_gbps, args.fs_gbps,
              args.shard_optimizer)
    print(f"{c['model']} ({c['model_params'] / 1e9:.1f} B parameters), {c['layout']}, "
          f"optimizer {'ZeRO-1 sharded' if c['shard_optimizer'] else 'replicated'}; largest stage: pp rank "
          f"{c['pp_rank']}")
    rows = [("parameters per rank", f"{c['params_per_rank'] / 1e9:.2f} B ({c['expert_params_per_rank'] / 1e9:.2f} B "
                                    f"routed experts)"),
            ("fp32 weights per rank", f"{c['weights_gb']:.1f} GB"),
            ("AdamW moments per rank", f"{c['optimizer_gb']:.1f} GB"),
            ("checkpoint shard per rank", f"{c['shard_gb']:.1f} GB"),
            ("replica host memory per rank (peer's shard + own staging copy)", f"{c['replica_host_gb']:.1f} GB"),
            ("whole checkpoint (one copy of every weight and moment)", f"{c['whole_gb']:.0f} GB"),
            (f"save, every rank writing its whole shard at {c['disk_gbps']:g} GB/s", f"{c['disk_s']:.1f} s"),
            (f"save, one copy of each tensor (DCP), file system at {c['fs_gbps']:g} GB/s in all", f"{c['fs_s']:.1f} s"),
            (f"send to the peer at {c['net_gbps']:g} GB/s per rank", f"{c['net_s']:.2f} s")]
    width = max(len(r[0]) for r in rows)
    for name, value in rows:
        print(f"  {name.ljust(width)}  {value}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
