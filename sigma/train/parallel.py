"""Process groups, data parallelism for dense parameters, and expert parallelism by all-to-all.

Layout of W ranks with expert-parallel degree e: a 2-D mesh (edp = W / e, ep = e). Ranks k*e .. k*e+e-1 form
an EP group that holds one copy of all experts, each rank E/e of them; ranks with the same EP index form an
expert-data-parallel (edp) group. Dense parameters are replicated on all W ranks.

Gradients: every rank's loss is the mean over its own tokens and the objective is the mean over ranks, so
every gradient is divided by W. Dense gradients are summed over all W ranks; expert gradients already hold
the contributions of their whole EP group (the all-to-all backward brings them home) and are summed over the
edp group only. Manual bucketed all-reduce instead of DDP keeps the two kinds of parameters under one rule.

Model code stays single-device: expert parallelism shards each MoE layer's expert weights in place and
replaces the layer's `compute_experts(x_sorted, tokens_per_expert)` hook with dispatch -> local experts ->
combine.
"""

from __future__ import annotations

import datetime
import math
import os
import random
import time
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
import torch.distributed as dist


@dataclass
class DistContext:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    ep_size: int = 1
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    backend: str = "none"
    mesh: object = None  # DeviceMesh ("edp", "ep") when distributed
    ep_group: object = None
    edp_group: object = None

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    @property
    def ep_rank(self) -> int:
        return self.rank % self.ep_size

    @property
    def edp_size(self) -> int:
        return self.world_size // self.ep_size

    def barrier(self) -> None:
        if self.distributed:
            with _collective():
                dist.barrier()

    def all_reduce_sum(self, tensor: torch.Tensor, group=None) -> torch.Tensor:
        if self.distributed:
            with _collective():
                dist.all_reduce(tensor, op=dist.ReduceOp.SUM, group=group)
        return tensor

    def broadcast_object(self, obj):
        if not self.distributed:
            return obj
        box = [obj]
        dist.broadcast_object_list(box, src=0)
        return box[0]


_COLLECTIVE_WAIT_S = [0.0]


@contextmanager
def _collective():
    """Time spent inside collectives, mostly waiting for peers: the rank the others wait for waits least."""
    t0 = time.perf_counter()
    try:
        yield
    finally:
        _COLLECTIVE_WAIT_S[0] += time.perf_counter() - t0


def collective_wait_s() -> float:
    """Seconds this process has spent inside collectives so far."""
    return _COLLECTIVE_WAIT_S[0]


def master_port(job_id: str, slurm_conf: str) -> int:
    """Rendezvous port, equal on every rank: from the job id and the cluster's config path, because job ids
    repeat across clusters that share hosts (submitit seeds from the job id alone)."""
    return random.Random(f"{slurm_conf}:{job_id}").randint(20000, 60000)


def launch_env() -> dict[str, int] | None:
    """Export MASTER_ADDR/PORT, RANK, WORLD_SIZE, LOCAL_RANK for env:// and return them, or None when alone.

    torchrun (or a caller) sets RANK/WORLD_SIZE itself; under SLURM (submitit or plain srun) and submitit's
    local executor, submitit's TorchDistributedEnvironment derives them from the job environment.
    """
    env = os.environ
    if "RANK" not in env or "WORLD_SIZE" not in env:
        if "SLURM_PROCID" in env and "SLURM_NTASKS" in env or "SUBMITIT_LOCAL_JOB_ID" in env:
            from submitit.helpers import TorchDistributedEnvironment

            if "SUBMITIT_EXECUTOR" not in env:  # a task of plain srun (sbatch/train.sbatch), not of submitit
                env["SUBMITIT_EXECUTOR"] = "slurm"
            dist_env = TorchDistributedEnvironment()
            if "MASTER_PORT" not in env and "SLURM_JOB_ID" in env:
                dist_env.master_port = master_port(env["SLURM_JOB_ID"], env.get("SLURM_CONF", ""))
            dist_env.export(set_cuda_visible_devices=False)
        else:
            return None
    return {"rank": int(env["RANK"]), "world_size": int(env["WORLD_SIZE"]),
            "local_rank": int(env.get("LOCAL_RANK", 0))}


def init_distributed(ep_size: int = 1, backend: str = "auto", device: str = "auto",
                     timeout_s: float = 300.0) -> DistContext:
    """Join the job's process group (if it has more than one rank) and build the EP/edp groups."""
    info = launch_env() or {"rank": 0, "world_size": 1, "local_rank": 0}
    use_cuda = torch.cuda.is_available() if device == "auto" else device == "cuda"
    if use_cuda and not torch.cuda.is_available():
        raise RuntimeError("device=cuda asked for, but torch sees no CUDA device")
    if use_cuda:
        torch.cuda.set_device(info["local_rank"] % torch.cuda.device_count())
        dev = torch.device("cuda", torch.cuda.current_device())
    else:
        dev = torch.device("cpu")
    ctx = DistContext(rank=info["rank"], world_size=info["world_size"], local_rank=info["local_rank"],
                      ep_size=ep_size, device=dev)
    if ctx.world_size % ep_size:
        raise ValueError(f"world size {ctx.world_size} is not divisible by parallel.ep={ep_size}")
    if not ctx.distributed:
        return ctx
    ctx.backend = ("nccl" if use_cuda else "gloo") if backend == "auto" else backend
    if not dist.is_initialized():
        dist.init_process_group(ctx.backend, rank=ctx.rank, world_size=ctx.world_size,
                                timeout=datetime.timedelta(seconds=timeout_s),
                                device_id=dev if ctx.backend == "nccl" else None)
    from torch.distributed.device_mesh import init_device_mesh

    ctx.mesh = init_device_mesh(dev.type, (ctx.edp_size, ep_size), mesh_dim_names=("edp", "ep"))
    ctx.ep_group = ctx.mesh.get_group("ep")
    ctx.edp_group = ctx.mesh.get_group("edp")
    return ctx


def shutdown(ctx: DistContext) -> None:
    if ctx.distributed and dist.is_initialized():
        dist.destroy_process_group()


# ---------------------------------------------------------------- gradients

def is_expert_param(name: str) -> bool:
    """Expert weights are sharded under EP; everything else (router, attention, shared expert) is dense."""
    return ".experts." in f".{name}"


def _bucketed_all_reduce(tensors: list[torch.Tensor], group, bucket_numel: int = 1 << 23) -> None:
    """Sum tensors over group in flat buckets (one collective per bucket instead of one per tensor)."""
    bucket: list[torch.Tensor] = []
    size = 0
    for t in tensors + [None]:
        if t is not None and (not bucket or (size + t.numel() <= bucket_numel and t.dtype == bucket[0].dtype)):
            bucket.append(t)
            size += t.numel()
            continue
        if bucket:
            flat = torch.cat([b.reshape(-1) for b in bucket])
            with _collective():
                dist.all_reduce(flat, op=dist.ReduceOp.SUM, group=group)
            offset = 0
            for b in bucket:
                b.copy_(flat[offset:offset + b.numel()].view_as(b))
                offset += b.numel()
        bucket, size = ([t], t.numel()) if t is not None else ([], 0)


def sync_gradients(ctx: DistContext, named_params: list[tuple[str, torch.nn.Parameter]]) -> None:
    """Average gradients as described in the module docstring (no-op on one rank)."""
    if not ctx.distributed:
        return
    dense, expert = [], []
    for name, p in named_params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)  # a rank whose tokens skipped a parameter still joins the collective
        (expert if is_expert_param(name) else dense).append(p.grad)
    _bucketed_all_reduce(dense, None)
    if ctx.edp_size > 1:
        _bucketed_all_reduce(expert, ctx.edp_group)
    for g in dense + expert:
        g.div_(ctx.world_size)


def clip_gradients(ctx: DistContext, named_params: list[tuple[str, torch.nn.Parameter]],
                   max_norm: float) -> float:
    """Global gradient norm over all (replicated and sharded) parameters; scale gradients to max_norm if > 0."""
    dev = ctx.device
    dense_sq = torch.zeros((), device=dev, dtype=torch.float32)
    expert_sq = torch.zeros((), device=dev, dtype=torch.float32)
    grads = []
    for name, p in named_params:
        if p.grad is None:
            continue
        grads.append(p.grad)
        sq = p.grad.detach().float().pow(2).sum()
        if is_expert_param(name):
            expert_sq += sq
        else:
            dense_sq += sq
    if ctx.ep_size > 1:
        with _collective():
            dist.all_reduce(expert_sq, op=dist.ReduceOp.SUM, group=ctx.ep_group)
    total = math.sqrt(float(dense_sq + expert_sq))
    if max_norm > 0 and math.isfinite(total) and total > max_norm:
        scale = max_norm / (total + 1e-6)
        for g in grads:
            g.mul_(scale)
    return total


# ---------------------------------------------------------------- expert parallelism

class _AllToAll(torch.autograd.Function):
    """all_to_all_single with uneven splits whose backward is the reverse exchange."""

    @staticmethod
    def forward(ctx, x, out_splits, in_splits, group):
        ctx.splits = (out_splits, in_splits)
        ctx.group = group
        out = x.new_empty((sum(out_splits),) + tuple(x.shape[1:]))
        with _collective():
            dist.all_to_all_single(out, x.contiguous(), out_splits, in_splits, group=group)
        return out

    @staticmethod
    def backward(ctx, grad):
        out_splits, in_splits = ctx.splits
        back = grad.new_empty((sum(in_splits),) + tuple(grad.shape[1:]))
        with _collective():
            dist.all_to_all_single(back, grad.contiguous(), in_splits, out_splits, group=ctx.group)
        return back, None, None, None


def all_to_all(x: torch.Tensor, out_splits: list[int], in_splits: list[int], group) -> torch.Tensor:
    return _AllToAll.apply(x, out_splits, in_splits, group)


def expert_parallel_compute(x_sorted: torch.Tensor, tokens_per_expert: torch.Tensor, local_compute,
                            group, ep_size: int) -> torch.Tensor:
    """Send each token to the rank holding its expert, run the local experts, send the outputs back.

    x_sorted: this rank's routed token copies sorted by global expert id; tokens_per_expert: [E] counts.
    local_compute(x, counts) runs this rank's E/ep experts on tokens sorted by local expert id.
    """
    num_experts = tokens_per_expert.numel()
    per_rank = num_experts // ep_size
    send_counts = tokens_per_expert.to(torch.int64).reshape(ep_size, per_rank).contiguous()
    recv_counts = torch.empty_like(send_counts)
    with _collective():
        dist.all_to_all_single(recv_counts.view(-1), send_counts.view(-1), group=group)  # [source rank, local e]
    # The one host sync of the layer: all_to_all_single takes its split sizes as Python ints.
    splits = torch.cat([send_counts.sum(1), recv_counts.sum(1)]).tolist()
    send_splits, recv_splits = splits[:ep_size], splits[ep_size:]
    x_recv = all_to_all(x_sorted, recv_splits, send_splits, group)  # grouped by source rank, then expert
    # Regroup (source, expert) segments as (expert, source) so each local expert's tokens are contiguous: a stable
    # sort of the rows by local expert id, computed on the device (output_size known: no further sync).
    expert_of_segment = torch.arange(per_rank, device=recv_counts.device).repeat(ep_size)
    expert_of_row = torch.repeat_interleave(expert_of_segment, recv_counts.reshape(-1),
                                            output_size=sum(recv_splits))
    perm = torch.argsort(expert_of_row, stable=True).to(x_sorted.device)
    y_local = local_compute(x_recv.index_select(0, perm), recv_counts.sum(0).to(tokens_per_expert.device))
    y_recv = y_local.index_select(0, torch.argsort(perm))  # back to (source, expert) order
    return all_to_all(y_recv, send_splits, recv_splits, group)
