"""Process groups, data parallelism for dense parameters, and expert parallelism by all-to-all.

Layout of W ranks with expert-parallel degree e: a 2-D mesh (edp = W / e, ep = e). Ranks k*e .. k*e+e-1 form
an EP group that holds one copy of all experts, each rank E/e of them; ranks with the same EP index form an
expert-data-parallel (edp) group. Dense parameters are replicated on all W ranks.

Gradients: every rank's loss is the mean over its own tokens and the objective is the mean over ranks, so
every gradient is divided by W. Dense gradients are summed over all W ranks; expert gradients already hold
the contributions of their whole EP group (the all-to-all backward brings them home) and are summed over the
edp group only. Manual bucketed all-reduce instead of DDP keeps the two kinds of parameters under one rule.

Model code stays single-device: expert parallelism shards each MoE layer's expert weights in place and
replaces the layer's `start_experts` / `compute_experts(x_sorted, tokens_per_expert)` hooks with dispatch ->
local experts -> combine (ExpertParallel): by default a fixed-capacity all-to-all that reads nothing back to the
host and overlaps with the shared expert and the next chunk, or the dropless one with one host read per layer.
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
            if "MASTER_PORT" not in env and "SIGMA_MASTER_PORT" in env:  # the local launcher's free port
                dist_env.master_port = int(env["SIGMA_MASTER_PORT"])
            elif "MASTER_PORT" not in env and "SLURM_JOB_ID" in env:
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

EP_DISPATCH_MODES = ("capacity", "dropless")


@dataclass(frozen=True)
class EPDispatch:
    """How a MoE layer's tokens travel to their experts' ranks (parallel.ep_dispatch, ep_capacity_factor,
    ep_chunks).

    capacity: each rank sends every expert a fixed number of rows per forward (capacity_factor x the even share,
        never more than one per token), so every shape is known from the input's shape and nothing is read back to
        the host; routed copies over capacity are dropped (their expert output is zero: the token keeps its
        residual and shared-expert path) and counted in the `dropped_tokens` KPI. The dispatch is issued
        asynchronously in `chunks` pieces along the capacity: the shared expert computes while the first piece
        travels, and each piece's experts compute while the next piece arrives and the previous one returns.
    dropless: exact per-expert counts; one host read of the split sizes per layer and forward
        (all_to_all_single takes them as Python ints), no overlap.
    """

    mode: str = "dropless"  # exact by default: capacity drops tokens, so it is a choice made knowingly
    capacity_factor: float = 2.0
    chunks: int = 2

    def __post_init__(self):
        if self.mode not in EP_DISPATCH_MODES:
            raise ValueError(f"parallel.ep_dispatch must be one of {', '.join(EP_DISPATCH_MODES)}, got {self.mode!r}")
        if not self.capacity_factor > 0:
            raise ValueError(f"parallel.ep_capacity_factor must be positive, got {self.capacity_factor}")
        if self.chunks < 1:
            raise ValueError(f"parallel.ep_chunks must be at least 1, got {self.chunks}")

    @classmethod
    def from_config(cls, parallel) -> "EPDispatch":
        return cls(parallel.ep_dispatch, parallel.ep_capacity_factor, parallel.ep_chunks)

    def capacity(self, rows: int, n_experts: int, top_k: int) -> int:
        """Rows one rank sends one expert per forward of `rows` routed copies: capacity_factor x rows / n_experts,
        at most rows / top_k (top-k picks distinct experts, so an expert never gets more than one copy per
        token: capacity_factor >= n_experts / top_k never drops), rounded up to a multiple of the chunks."""
        base = max(1, min(math.ceil(self.capacity_factor * rows / n_experts), rows // top_k))
        chunks = min(self.chunks, base)
        return chunks * math.ceil(base / chunks)


class _AllToAll(torch.autograd.Function):
    """all_to_all_single with uneven splits whose backward is the reverse exchange (dropless dispatch)."""

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


class _InFlight:
    """An all-to-all issued but not yet waited for: its work handle and the input it must keep alive."""

    __slots__ = ("work", "source")


class _AllToAllStart(torch.autograd.Function):
    """Issue an equal-split all_to_all_single and return its (not yet filled) output; _AllToAllWait completes it.

    The backward is the reverse exchange, issued and waited at once: the autograd engine runs one node at a time,
    so backward has no independent work to overlap with."""

    @staticmethod
    def forward(ctx, x, group, flight):
        ctx.group = group
        flight.source = x.contiguous()
        out = torch.empty_like(flight.source)
        with _collective():
            flight.work = dist.all_to_all_single(out, flight.source, group=group, async_op=True)
        return out

    @staticmethod
    def backward(ctx, grad):
        grad = grad.contiguous()
        back = torch.empty_like(grad)
        with _collective():
            dist.all_to_all_single(back, grad, group=ctx.group)
        return back, None, None


class _AllToAllWait(torch.autograd.Function):
    """Wait for an _AllToAllStart (on CUDA: the compute stream waits for NCCL's; the host does not block)."""

    @staticmethod
    def forward(ctx, out, flight):
        with _collective():
            flight.work.wait()
        flight.work = flight.source = None
        return out.view_as(out)

    @staticmethod
    def backward(ctx, grad):
        return grad, None


def exchange_async(x: torch.Tensor, group):
    """Start an equal-split all-to-all of x's rows over group; the returned function waits and gives the result."""
    flight = _InFlight()
    out = _AllToAllStart.apply(x, group, flight)
    return lambda: _AllToAllWait.apply(out, flight)


def _gather_or_zero(x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """x[index[i]] for every i, a zero row where index[i] == len(x)."""
    out = x.index_select(0, index.clamp(max=x.shape[0] - 1))
    return out.masked_fill_((index >= x.shape[0]).unsqueeze(-1), 0)


class _PaddedGather(torch.autograd.Function):
    """out[i] = x[index[i]] (zero where index[i] == len(x)) for a one-to-one map between some rows of x and
    some rows of out, whose inverse is `back`: the backward is the gather grad[back[j]]. Both directions are
    gathers (deterministic, no atomic accumulation)."""

    @staticmethod
    def forward(ctx, x, index, back):
        ctx.save_for_backward(back)
        return _gather_or_zero(x, index)

    @staticmethod
    def backward(ctx, grad):
        (back,) = ctx.saved_tensors
        return _gather_or_zero(grad.contiguous(), back), None, None


class ExpertParallel:
    """A MoE layer's expert computation over an expert-parallel group of ep ranks, each holding E/ep experts.

    layer.compute_experts = ep                  # (x_sorted, tokens_per_expert) -> y_sorted, rows in the same order
    layer.start_experts = ep.start              # issue the dispatch; the returned function finishes the layer

    local(x, counts) runs this rank's experts: on rows grouped by local expert with `counts` (dropless), or on
    x [E/ep, rows, dim] with the same rows for every expert (capacity; zero padding rows give zero rows).
    """

    def __init__(self, local, group, ep_size: int, n_experts: int, top_k: int, options: EPDispatch = EPDispatch()):
        if n_experts % ep_size:
            raise ValueError(f"{n_experts} experts cannot be split over parallel.ep={ep_size} ranks")
        self.local, self.group, self.ep_size = local, group, ep_size
        self.n_experts, self.top_k, self.options = n_experts, top_k, options
        self.dropped: torch.Tensor | None = None  # routed copies over capacity since take_dropped(), on the device
        self.routed = 0

    def __call__(self, x_sorted: torch.Tensor, tokens_per_expert: torch.Tensor) -> torch.Tensor:
        return self.start(x_sorted, tokens_per_expert)()

    def start(self, x_sorted: torch.Tensor, tokens_per_expert: torch.Tensor):
        if self.options.mode == "dropless":
            return lambda: expert_parallel_compute(x_sorted, tokens_per_expert, self.local, self.group, self.ep_size)
        return self._start_capacity(x_sorted, tokens_per_expert)

    def take_dropped(self) -> tuple[float, int]:
        """(routed copies dropped, routed copies) since the last call; one host read."""
        out = (0.0 if self.dropped is None else float(self.dropped), self.routed)
        self.dropped, self.routed = None, 0
        return out

    def _start_capacity(self, x_sorted: torch.Tensor, tokens_per_expert: torch.Tensor):
        rows, dim = x_sorted.shape
        E, ep = self.n_experts, self.ep_size
        per_rank = E // ep
        capacity = self.options.capacity(rows, E, self.top_k)
        n = min(self.options.chunks, capacity)
        width = capacity // n  # rows per expert and chunk
        slots = n * E * width  # send buffer rows: chunk, then expert (destination rank, local expert), then row
        dev = x_sorted.device
        counts = tokens_per_expert.to(dev, torch.int64)
        ends = counts.cumsum(0)
        starts = ends - counts
        slot = torch.arange(slots, device=dev)
        expert_of_slot = (slot // width) % E
        pos = (slot // (E * width)) * width + slot % width  # the slot's row within its expert
        row_of_slot = torch.where(pos < counts[expert_of_slot], starts[expert_of_slot] + pos, rows)
        row = torch.arange(rows, device=dev)
        expert_of_row = torch.searchsorted(ends, row, right=True)
        pos = row - starts[expert_of_row]
        slot_of_row = torch.where(pos < capacity, ((pos // width) * E + expert_of_row) * width + pos % width, slots)
        if torch._C._current_graph_task_id() == -1:  # not a recompute inside backward: count once
            dropped = (counts - capacity).clamp(min=0).sum()
            self.dropped = dropped if self.dropped is None else self.dropped + dropped
            self.routed += rows

        send = _PaddedGather.apply(x_sorted, row_of_slot, slot_of_row).view(n, E * width, dim)
        arrivals = [exchange_async(piece, self.group) for piece in send.unbind(0)]  # one backward node for all

        def finish() -> torch.Tensor:
            returns = []
            for arrive in arrivals:  # chunk k computes while chunk k+1 arrives and chunk k-1 travels back
                x = arrive().view(ep, per_rank, width, dim).transpose(0, 1).reshape(per_rank, ep * width, dim)
                y = self.local(x, None).view(per_rank, ep, width, dim).transpose(0, 1).reshape(-1, dim)
                returns.append(exchange_async(y, self.group))
            y_slots = torch.cat([back() for back in returns])
            return _PaddedGather.apply(y_slots, slot_of_row, row_of_slot)

        return finish


def install_expert_parallel(layer, local, group, ep_size: int, options: EPDispatch = EPDispatch()) -> ExpertParallel:
    """Route a MoELayer's expert computation over the ep group (model code stays single-device)."""
    ep = ExpertParallel(local, group, ep_size, layer.n_experts, layer.top_k, options)
    layer.compute_experts = ep
    layer.start_experts = ep.start
    return ep


def dropped_tokens(layers) -> float | None:
    """Share of routed token copies dropped over capacity in these MoE layers since the last call (None when no
    layer has a capacity dispatch); resets the counts."""
    dropped = routed = 0
    for layer in layers:
        ep = getattr(layer, "compute_experts", None)
        if isinstance(ep, ExpertParallel) and ep.options.mode == "capacity":
            d, r = ep.take_dropped()
            dropped, routed = dropped + d, routed + r
    return dropped / routed if routed else None


def expert_parallel_compute(x_sorted: torch.Tensor, tokens_per_expert: torch.Tensor, local_compute,
                            group, ep_size: int) -> torch.Tensor:
    """Dropless dispatch: send each token to the rank holding its expert, run the local experts, send the outputs
    back.

    x_sorted: this rank's routed token copies sorted by global expert id; tokens_per_expert: [E] counts.
    local_compute(x, counts) runs this rank's E/ep experts on tokens sorted by local expert id.
    """
    num_experts = tokens_per_expert.numel()
    per_rank = num_experts // ep_size
    send_counts = tokens_per_expert.to(torch.int64).reshape(ep_size, per_rank).contiguous()
    recv_counts = torch.empty_like(send_counts)
    with _collective():
        dist.all_to_all_single(recv_counts.view(-1), send_counts.view(-1), group=group)  # [source rank, local e]
    # The one host read of the layer: all_to_all_single takes its split sizes as Python ints.
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
