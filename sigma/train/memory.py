"""Peak memory of one rank of a training step, predicted from the model config and the layout, and measured.

    est = estimate(model_cfg, dims, pp_rank=0, micro_batch=2, seq_len=128)   # MemoryEstimate, bytes per part
    measured = PeakTracker() ... (a step under it) ... .peak                   # live tensor bytes, any device

Prediction = parameters + optimizer states + the larger of two moments:
  backward peak  : the saved activations of every in-flight micro-batch, the output head's transients
                   (logits, log-probabilities and their gradients: 4 x tokens x vocab) or one recomputed
                   layer, whichever is larger, and the gradients alive then (the head's only when every
                   forward precedes every backward, all of them under 1F1B); a last pipeline stage also holds
                   the logits of every micro-batch (torch.distributed.pipelining keeps outputs to merge them)
  optimizer step : all gradients plus AdamW's temporaries (about one parameter-sized buffer)
Saved activations per token and layer follow what autograd keeps for this model's code (model.py, moe.py):
norm inputs and outputs, q/k/v and the attention output, the SwiGLU hidden tensors (4 per FFN), and for an MoE
layer the router scores plus top_k copies of the token and the expert hidden tensors (under the expert-parallel
capacity dispatch: every slot of its padded buffer, capacity_factor x the routed copies or fewer, and its
hidden tensors; padding computes and is kept like a token). A recomputed layer keeps
only its input and re-creates one layer's activations at a time in backward.

Pipeline in-flight micro-batches per stage rank r of p (m micro-batches): GPipe m; 1F1B min(p - r, m);
interleaved 1F1B with v virtual stages: min(2 (p - r - 1) + (v - 1) p + 1, m v) chunks of 1/v of the rank's
layers (Megatron-LM's warm-up count).
"""

from __future__ import annotations

import weakref
from dataclasses import asdict, dataclass

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from sigma.train.config import ModelConfig
from sigma.train.dims import ParallelDims
from sigma.train.parallel import EPDispatch

INDEX_BYTES = 8  # int64 routing indices
HEAD_TRANSIENTS = 4  # logits, log-probabilities, their gradient and the logits' gradient (tokens x vocab each)


@dataclass
class MemoryEstimate:
    params: int
    grads: int
    optimizer: int
    activations: int  # saved activations of the in-flight micro-batches at the backward peak
    transient: int  # output head transients (last stage) and a recomputed layer
    in_flight: float  # micro-batches (or VPP chunks, in units of the rank's whole layers) alive at once
    peak: int

    def as_dict(self) -> dict:
        return asdict(self)


def stage_param_counts(cfg: ModelConfig, dims: ParallelDims, pp_rank: int) -> tuple[int, int]:
    """(parameters held by this rank, of which routed-expert parameters) under tp, ep and the stage split."""
    tp, ep = dims.tp, dims.ep
    layers = [layer for stage in dims.stages_of(pp_rank) for layer in dims.layers_of_stage(stage)]
    hd = cfg.head_dim
    attn = (2 * cfg.n_heads * hd + 2 * cfg.n_kv_heads * hd) * cfg.dim // tp
    total = expert_total = 0
    for layer in layers:
        total += attn + 2 * cfg.dim
        if layer < cfg.n_dense_layers:
            total += 3 * cfg.dim * cfg.dense_hidden // tp
        else:
            experts = (cfg.n_experts // ep) * 3 * cfg.dim * cfg.expert_hidden // tp
            total += cfg.dim * cfg.n_experts + cfg.n_shared_experts * 3 * cfg.dim * cfg.expert_hidden // tp + experts
            expert_total += experts
    if pp_rank == 0:
        total += cfg.vocab_size * cfg.dim
    if pp_rank == dims.pp - 1:
        total += cfg.dim + (0 if cfg.tie_embeddings and dims.pp == 1 else cfg.vocab_size * cfg.dim)
    return total, expert_total


def layer_activation_elems(cfg: ModelConfig, layer: int, tokens: int, tp: int = 1,
                           capacity: float = 1.0, ep_slots: int = 0) -> tuple[int, int]:
    """(floating-point elements, int64 elements) autograd saves for one layer over `tokens` tokens.

    capacity: tokens an expert rank computes relative to the balanced share (1.0 = perfectly even routing).
    ep_slots: rows of the expert-parallel capacity dispatch's buffer (0: no such dispatch); the experts then
    compute every slot, padding included, and x_sorted is not kept (only the unsorted expert output is)."""
    d, hd = cfg.dim, cfg.head_dim
    q, kv = cfg.n_heads * hd // tp, cfg.n_kv_heads * hd // tp
    # attention: norm in/out, q, k, v, SDPA output and the reshaped wo input, residual into the FFN norm, its output
    elems = tokens * (d + d + q + 2 * kv + q + q + d + d)
    ints = 0
    if layer < cfg.n_dense_layers:
        elems += tokens * 4 * cfg.dense_hidden // tp
    else:
        k = cfg.top_k
        if ep_slots:
            # router scores and weights; the unsorted expert output; the received slots and their SwiGLU hiddens;
            # the slot <-> row maps of the dispatch and the combine
            elems += tokens * (cfg.n_experts + k) + tokens * k * d + ep_slots * (d + 4 * cfg.expert_hidden // tp)
            elems += tokens * 4 * cfg.n_shared_experts * cfg.expert_hidden // tp
            return elems, 3 * tokens * k + tokens * k + ep_slots
        routed = int(round(tokens * k * capacity))
        # router scores, routing weights; x_sorted and the unsorted expert output (top_k copies of d);
        # SwiGLU hidden tensors of the routed copies; the shared expert's SwiGLU
        elems += tokens * (cfg.n_experts + k) + routed * (2 * d + 4 * cfg.expert_hidden // tp)
        elems += tokens * 4 * cfg.n_shared_experts * cfg.expert_hidden // tp
        ints += 3 * tokens * k  # expert ids, sort order and its inverse
    return elems, ints


def in_flight_microbatches(dims: ParallelDims, pp_rank: int) -> float:
    """Micro-batches whose activations one pipeline rank holds at its peak, in units of all its layers."""
    p, m, v = dims.pp, dims.microbatches, dims.vpp
    if p == 1:
        return 1.0  # micro-batches run one after another, each backward before the next forward
    if dims.schedule == "gpipe":
        return float(m)
    if dims.schedule == "1f1b":
        return float(min(p - pp_rank, m))
    chunks = min(2 * (p - pp_rank - 1) + (v - 1) * p + 1, m * v)
    return chunks / v


def estimate(cfg: ModelConfig, dims: ParallelDims, pp_rank: int = 0, micro_batch: int = 1, seq_len: int = 128,
             act_bytes: int = 4, param_bytes: int = 4, shard_optimizer: bool = False,
             recompute_layers: tuple[int, ...] = (), capacity: float = 1.0,
             keep_outputs: bool = True, ep_dispatch: EPDispatch | None = None) -> MemoryEstimate:
    """Predicted peak bytes of one rank: pp_rank's stages, micro_batch sequences of seq_len per micro-batch.
    keep_outputs: the last stage keeps every micro-batch's logits (torch.distributed.pipelining does; a trainer
    that computes the loss per micro-batch on the last stage, as Megatron-LM does, does not).
    ep_dispatch: with ep > 1, the capacity dispatch's padded buffers replace the routed copies (None or dropless:
    the routed copies scaled by `capacity`)."""
    n_params, n_expert = stage_param_counts(cfg, dims, pp_rank)
    params = n_params * param_bytes
    grads = params
    # AdamW: exp_avg and exp_avg_sq; sharded: dense states over dp ranks, expert states over the edp ranks
    states = 2 * param_bytes
    optimizer = (states * ((n_params - n_expert) // dims.dp + n_expert // dims.edp) if shard_optimizer
                 else states * n_params)

    tokens = micro_batch * seq_len
    layers = [layer for stage in dims.stages_of(pp_rank) for layer in dims.layers_of_stage(stage)]
    per_mb, biggest = 0, 0
    ep_slots = 0
    if dims.ep > 1 and ep_dispatch is not None and ep_dispatch.mode == "capacity":
        ep_slots = cfg.n_experts * ep_dispatch.capacity(tokens * cfg.top_k, cfg.n_experts, cfg.top_k)
    for layer in layers:
        elems, ints = layer_activation_elems(cfg, layer, tokens, dims.tp, capacity, ep_slots)
        full = elems * act_bytes + ints * INDEX_BYTES
        biggest = max(biggest, full)
        per_mb += tokens * cfg.dim * act_bytes if layer in recompute_layers else full
    last = pp_rank == dims.pp - 1
    if last:
        per_mb += 2 * tokens * cfg.dim * act_bytes  # final norm input and output
    flight = in_flight_microbatches(dims, pp_rank)
    activations = int(per_mb * flight)
    # The head's transients are gone before backward reaches a recomputed layer: the larger of the two counts.
    transient = max(HEAD_TRANSIENTS * tokens * cfg.vocab_size * 4 if last else 0, biggest if recompute_layers else 0)
    if last and dims.pp > 1 and keep_outputs:
        activations += (dims.microbatches - 1) * tokens * cfg.vocab_size * 4  # the schedule keeps every output
    step_temp = params  # foreach AdamW's intermediate of one parameter-sized buffer
    # Backward frees activations while gradients appear: when every forward precedes every backward (one
    # micro-batch, GPipe) the peak is at backward's start (only the head's gradient exists) or at the optimiser
    # step (all gradients). 1F1B schedules run forwards after the first backward: all gradients and the
    # in-flight activations coexist.
    if dims.schedule != "gpipe" and dims.microbatches > 1:
        first_grads = grads
    elif last:
        first_grads = (cfg.vocab_size * cfg.dim + cfg.dim) * param_bytes
    else:
        first_grads = grads // max(1, len(layers))
    peak = params + optimizer + max(activations + transient + first_grads, grads + step_temp)
    return MemoryEstimate(params=params, grads=grads, optimizer=optimizer, activations=activations,
                          transient=transient, in_flight=flight, peak=peak)


class PeakTracker(TorchDispatchMode):
    """Peak bytes of live tensor storages created under it, plus those alive when it started (`baseline`).

    Works on every device (CPU has no allocator statistics): each op's output storages are counted until they
    are freed (weakref). Storages that exist before entering (parameters, optimiser states) form the baseline,
    which the caller passes in."""

    def __init__(self, baseline: int = 0):
        super().__init__()
        self.baseline = baseline
        self.live = 0
        self.peak = baseline
        self._seen: dict[int, weakref.ref] = {}
        self._known: set[int] = set()

    def ignore(self, tensors) -> "PeakTracker":
        """Storages already in the baseline (in-place updates to them must not count again)."""
        for t in tensors:
            self._known.add(_plain(t).untyped_storage().data_ptr())
        return self

    def _freed(self, key: int, nbytes: int) -> None:
        if self._seen.pop(key, None) is not None:
            self.live -= nbytes

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_leaves(out):
            if not isinstance(t, torch.Tensor) or type(t) is not torch.Tensor:
                continue
            storage = t.untyped_storage()
            key = storage.data_ptr()
            if key == 0 or key in self._seen or key in self._known:
                continue
            nbytes = storage.nbytes()
            self._seen[key] = weakref.ref(storage, lambda _, k=key, n=nbytes: self._freed(k, n))
            self.live += nbytes
            self.peak = max(self.peak, self.baseline + self.live)
        return out


def _plain(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if hasattr(t, "to_local") else t  # a DTensor's bytes are its local shard's


def tensor_bytes(tensors) -> int:
    seen, total = set(), 0
    for t in tensors:
        storage = _plain(t).untyped_storage()
        if storage.data_ptr() not in seen:
            seen.add(storage.data_ptr())
            total += storage.nbytes()
    return total
