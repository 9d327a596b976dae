"""Mixture-of-Experts FFN: top-k router, SwiGLU experts computed as one grouped GEMM over expert-sorted tokens.

Data flow of MoELayer.forward for N tokens:
    router -> top-k expert ids [N, k] and weights [N, k]
    sort the N*k (token, expert) pairs by expert id      -> x_sorted [N*k, dim], tokens_per_expert [E]
    start_experts / compute_experts(x_sorted, tokens_per_expert) -> y_sorted [N*k, dim]  (expert parallelism
                                                          replaces these; the shared expert runs in between)
    unsort, weight by the routing weights, sum over k     -> [N, dim] (+ shared expert)
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch import nn

from sigma.train.config import ModelConfig

GROUPED_MM_CPU_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


class _ContiguousGrad(torch.autograd.Function):
    """Identity whose backward makes the incoming gradient contiguous.

    torch._grouped_mm's backward rejects stride-0 (expanded) gradients, e.g. the gradient of `y.sum()`.
    """

    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return grad.contiguous()


class _Dispatch(torch.autograd.Function):
    """x_sorted = x[order // top_k]: each token copied once per chosen expert, rows grouped by expert.

    The backward is a gather plus a sum over the k copies instead of autograd's index_put with accumulation,
    which is several times slower on CPU.
    """

    @staticmethod
    def forward(ctx, x, order, inverse, top_k):
        ctx.save_for_backward(inverse)
        ctx.top_k = top_k
        return x.index_select(0, order // top_k)

    @staticmethod
    def backward(ctx, grad):
        (inverse,) = ctx.saved_tensors
        grad = grad.index_select(0, inverse)
        return grad.view(-1, ctx.top_k, grad.shape[-1]).sum(1), None, None, None


class _PermuteRows(torch.autograd.Function):
    """out = x[perm] for a permutation perm whose inverse is given; the backward is the inverse gather."""

    @staticmethod
    def forward(ctx, x, perm, inverse):
        ctx.save_for_backward(inverse)
        return x.index_select(0, perm)

    @staticmethod
    def backward(ctx, grad):
        (inverse,) = ctx.saved_tensors
        return grad.index_select(0, inverse), None, None


@functools.cache
def _grouped_mm_eager():
    """torch._grouped_mm kept out of a torch.compile graph. Made on first use under compile, not at import:
    torch.compiler.disable imports torch._dynamo (seconds of every rank's start-up, restarts included)."""
    return torch.compiler.disable(lambda x, w_t, offs: torch._grouped_mm(x, w_t, offs=offs))


def grouped_mm(x: torch.Tensor, w_t: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
    """Rows x[offs[g-1]:offs[g]] @ w_t[g] for every group g; x [M, K], w_t [G, K, N] -> [M, N]."""
    # torch.compile's shape rules for _grouped_mm accept bf16 only; other dtypes run eagerly inside a graph.
    compiled_other_dtype = x.dtype != torch.bfloat16 and torch.compiler.is_compiling()
    mm = _grouped_mm_eager() if compiled_other_dtype else torch._grouped_mm
    return _ContiguousGrad.apply(mm(x, w_t, offs=offs))


@functools.cache
def _cuda_supports_grouped_mm(index: int, dtype: torch.dtype) -> bool:
    """Asked of the device once per dtype with a small forward and backward: which dtypes torch._grouped_mm runs
    on CUDA depends on the torch release and the GPU (bf16 from sm80; float32 too on sm90 with torch 2.11)."""
    if torch.cuda.get_device_capability(index) < (8, 0):
        return False
    device = torch.device("cuda", index)
    try:
        x = torch.ones(32, 16, dtype=dtype, device=device, requires_grad=True)
        w = torch.ones(2, 16, 16, dtype=dtype, device=device, requires_grad=True)  # [E, out, in] as the layer's
        offs = torch.tensor([16, 32], dtype=torch.int32, device=device)
        grouped_mm(x, w.transpose(1, 2), offs).sum().backward()
        torch.cuda.synchronize(device)
    except (RuntimeError, NotImplementedError):
        return False
    return True


def grouped_mm_supported(device: torch.device, dtype: torch.dtype, *widths: int) -> bool:
    """Whether torch._grouped_mm handles these operands: dtype per device, rows 16-byte aligned."""
    if not hasattr(torch, "_grouped_mm"):
        return False
    size = torch.empty((), dtype=dtype).element_size()
    if any((w * size) % 16 for w in widths):
        return False
    if device.type == "cpu":
        return dtype in GROUPED_MM_CPU_DTYPES
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        return _cuda_supports_grouped_mm(index, dtype)
    return False


class GroupedExperts(nn.Module):
    """n_experts SwiGLU FFNs stored as stacked weights (nn.Linear layout: [E, out, in]).

    w1 (gate) [E, hidden, dim], w3 (up) [E, hidden, dim], w2 (down) [E, dim, hidden].
    """

    def __init__(self, n_experts: int, dim: int, hidden: int, impl: str = "auto"):
        super().__init__()
        self.n_experts, self.dim, self.hidden = n_experts, dim, hidden
        self.impl = impl
        self.w1 = nn.Parameter(torch.empty(n_experts, hidden, dim))
        self.w2 = nn.Parameter(torch.empty(n_experts, dim, hidden))
        self.w3 = nn.Parameter(torch.empty(n_experts, hidden, dim))
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self, std: float = 0.02, out_std: float | None = None) -> None:
        """Gaussian init; out_std (default std) for the output projection w2."""
        nn.init.normal_(self.w1, 0.0, std)
        nn.init.normal_(self.w3, 0.0, std)
        nn.init.normal_(self.w2, 0.0, std if out_std is None else out_std)

    def compute_dtype(self, x: torch.Tensor) -> torch.dtype:
        """The dtype the expert GEMMs run in: autocast's when it is on (torch._grouped_mm is not an autocast op,
        so the cast is done here), else the input's."""
        if torch.is_autocast_enabled(x.device.type):
            return torch.get_autocast_dtype(x.device.type)
        return x.dtype

    def resolved_impl(self, x: torch.Tensor) -> str:
        dtype = self.compute_dtype(x)
        same = torch.is_autocast_enabled(x.device.type) or x.dtype == self.w1.dtype
        ok = grouped_mm_supported(x.device, dtype, self.dim, self.hidden) and same
        if self.impl == "grouped_mm" and not ok:
            raise ValueError(
                f"expert_impl=grouped_mm cannot run {x.dtype} on {x.device.type} with dim={self.dim}, "
                f"expert_hidden={self.hidden}: torch._grouped_mm needs float32/bfloat16/float16 on CPU or a dtype "
                "this CUDA device runs it in (bfloat16 from compute capability 8.0; float32 where torch and the GPU "
                "support it), matching input and weight dtypes, and rows of a multiple of "
                "16-byte (dim and expert_hidden multiples of 16 / element size); use expert_impl=auto or loop")
        if self.impl != "auto":
            return self.impl
        return "grouped_mm" if ok else "loop"

    def forward(self, x_sorted: torch.Tensor, tokens_per_expert: torch.Tensor | None = None) -> torch.Tensor:
        """x_sorted [M, dim] grouped by expert (group e has tokens_per_expert[e] rows) -> [M, dim]; or x [E, R, dim],
        R rows for every expert (a capacity-padded dispatch; no counts) -> [E, R, dim]."""
        if x_sorted.dim() == 3:
            return self._padded(x_sorted)
        if tokens_per_expert is None or tokens_per_expert.numel() != self.n_experts:
            got = "none" if tokens_per_expert is None else tokens_per_expert.numel()
            raise ValueError(f"tokens_per_expert has {got} entries for {self.n_experts} experts")
        impl = self.resolved_impl(x_sorted)
        if impl == "grouped_mm":
            return self._grouped(x_sorted, tokens_per_expert)
        if impl == "loop":
            return self._loop(x_sorted, tokens_per_expert)
        raise ValueError(f"unknown expert implementation {impl!r}; use auto, grouped_mm or loop")

    def _grouped(self, x: torch.Tensor, tokens_per_expert: torch.Tensor) -> torch.Tensor:
        offs = torch.cumsum(tokens_per_expert, 0, dtype=torch.int32)
        # Under autocast the fp32 master weights and inputs are cast here, as autocast does for nn.Linear; the
        # gradients flow back through the casts to the fp32 weights.
        dtype = self.compute_dtype(x)
        x = x.to(dtype).contiguous()
        w1, w2, w3 = (w.to(dtype).transpose(1, 2) for w in (self.w1, self.w2, self.w3))
        h = F.silu(grouped_mm(x, w1, offs)) * grouped_mm(x, w3, offs)
        return grouped_mm(h, w2, offs)

    def _padded(self, x: torch.Tensor) -> torch.Tensor:
        """[E, R, dim], R rows per expert (zero rows give zero): equal groups, so the grouped GEMM's offsets are a
        constant made on the device (no count is read); batched GEMMs where the grouped GEMM does not apply."""
        groups, rows, dim = x.shape
        if groups != self.n_experts:
            raise ValueError(f"padded expert input has {groups} groups for {self.n_experts} experts")
        if self.resolved_impl(x) == "grouped_mm":
            counts = torch.full((groups,), rows, dtype=torch.int32, device=x.device)
            return self._grouped(x.reshape(groups * rows, dim), counts).view(groups, rows, -1)
        dtype = self.compute_dtype(x)
        x = x.to(dtype)
        w1, w2, w3 = (w.to(dtype).transpose(1, 2) for w in (self.w1, self.w2, self.w3))
        h = F.silu(torch.bmm(x, w1)) * torch.bmm(x, w3)
        return torch.bmm(h, w2)

    def _loop(self, x: torch.Tensor, tokens_per_expert: torch.Tensor) -> torch.Tensor:
        out = []
        for e, chunk in enumerate(torch.split(x, tokens_per_expert.tolist())):
            if chunk.shape[0] == 0:
                continue
            h = F.silu(chunk @ self.w1[e].T) * (chunk @ self.w3[e].T)
            out.append(h @ self.w2[e].T)
        if not out:
            return x.new_zeros(x.shape)
        return torch.cat(out)


class FeedForward(nn.Module):
    """SwiGLU FFN: w2(silu(w1 x) * w3 x). Dense layers and the shared expert."""

    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.w1 = nn.Linear(dim, hidden, bias=False)
        self.w2 = nn.Linear(hidden, dim, bias=False)
        self.w3 = nn.Linear(dim, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class Router(nn.Module):
    """Top-k gate. Returns expert ids [N, k], routing weights [N, k] (float32), all scores [N, E] (float32) and the
    logits [N, E] (float32, for the z-loss)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.n_experts, self.top_k = cfg.n_experts, cfg.top_k
        self.score_func, self.norm_topk_prob, self.route_scale = cfg.score_func, cfg.norm_topk_prob, cfg.route_scale
        self.jitter = cfg.router_jitter
        self.gate = nn.Linear(cfg.dim, cfg.n_experts, bias=False)

    def forward(self, x: torch.Tensor, expert_bias: torch.Tensor | None = None):
        if self.training and self.jitter > 0:
            # Draws from the torch RNG: checkpoints carry its state so a resumed run draws the same noise.
            x = x * torch.empty_like(x).uniform_(1.0 - self.jitter, 1.0 + self.jitter)
        logits = self.gate(x).float()
        scores = logits.softmax(-1) if self.score_func == "softmax" else logits.sigmoid()
        # The bias only steers which experts are picked; the weights come from the unbiased scores (DeepSeek-V3).
        choice = scores if expert_bias is None else scores + expert_bias.float()
        ids = choice.topk(self.top_k, dim=-1).indices
        weights = scores.gather(-1, ids)
        if self.norm_topk_prob and self.top_k > 1:
            weights = weights / weights.sum(-1, keepdim=True)
        return ids, weights * self.route_scale, scores, logits


class MoELayer(nn.Module):
    """Router + GroupedExperts (+ shared expert), with Switch aux loss or aux-loss-free expert bias balancing."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.n_experts, self.top_k = cfg.n_experts, cfg.top_k
        self.balance, self.aux_loss_coef, self.bias_update_speed = cfg.balance, cfg.aux_loss_coef, cfg.bias_update_speed
        self.balance_scope, self.z_loss_coef = cfg.balance_scope, cfg.router_z_loss_coef
        # balance_scope=global_batch: sums a [E] tensor of token counts over all data-parallel ranks. Set by the
        # trainer when distributed; the model itself knows no process groups (one process: the identity).
        self.sum_over_ranks = None
        self.router = Router(cfg)
        self.experts = GroupedExperts(cfg.n_experts, cfg.dim, cfg.expert_hidden, cfg.expert_impl)
        self.shared = FeedForward(cfg.dim, cfg.n_shared_experts * cfg.expert_hidden) if cfg.n_shared_experts else None
        # Aux-free balancing: added to the scores for expert choice only; moved by update_bias(). Checkpointed.
        self.register_buffer("expert_bias", torch.zeros(cfg.n_experts, dtype=torch.float32))
        # Tokens routed per expert in the last forward (float32, detached): KPIs and the bias update.
        self.register_buffer("last_load", torch.zeros(cfg.n_experts, dtype=torch.float32), persistent=False)

    def _apply(self, fn, recurse=True):
        # model.to(bfloat16) would cast the bias too, and bf16 cannot resolve bias_update_speed-sized steps:
        # the balancing buffers stay float32 whatever the parameters' dtype.
        before = {name: getattr(self, name) for name in ("expert_bias", "last_load")}
        super()._apply(fn, recurse)
        for name, old in before.items():
            new = getattr(self, name)
            if new.dtype != torch.float32 and new.device.type != "meta":
                setattr(self, name, old.to(device=new.device, dtype=torch.float32))
        return self

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x [..., dim] -> (out [..., dim], aux scalar: balance loss and router z-loss, already coefficient-scaled)."""
        shape = x.shape
        x = x.reshape(-1, shape[-1])
        bias = self.expert_bias if self.balance == "aux_free" else None
        ids, weights, scores, logits = self.router(x, bias)

        flat_ids = ids.reshape(-1)
        # scatter_add instead of bincount: bincount synchronises with the GPU to size its output.
        tokens_per_expert = flat_ids.new_zeros(self.n_experts).scatter_add_(0, flat_ids, torch.ones_like(flat_ids))
        order = torch.argsort(flat_ids, stable=True)
        inverse = torch.empty_like(order)
        inverse[order] = torch.arange(order.numel(), device=order.device)
        # Cast to the experts' compute dtype before the copy per chosen expert: k times fewer elements to cast,
        # and under autocast the gathers (and an expert-parallel exchange) move half the bytes.
        x_sorted = _Dispatch.apply(x.to(self.experts.compute_dtype(x)), order, inverse, self.top_k)
        finish_experts = self.start_experts(x_sorted, tokens_per_expert)
        # Independent of the routed experts: computes while an expert-parallel dispatch is in flight.
        shared = self.shared(x) if self.shared is not None else None
        y_sorted = finish_experts()

        # Unsort into (token, slot) order, then weight and sum the k expert outputs of each token.
        y = _PermuteRows.apply(y_sorted, inverse, order).view(-1, self.top_k, shape[-1])
        out = torch.bmm(weights.to(y.dtype).unsqueeze(1), y).squeeze(1)
        if shared is not None:
            out = out + shared

        with torch.no_grad():
            self.last_load.copy_(tokens_per_expert)
        aux = self._aux_loss(scores, tokens_per_expert) if self.balance == "aux_loss" else scores.new_zeros(())
        if self.z_loss_coef:
            aux = aux + self.z_loss_coef * torch.logsumexp(logits, -1).square().mean()
        return out.reshape(shape), aux

    def compute_experts(self, x_sorted: torch.Tensor, tokens_per_expert: torch.Tensor) -> torch.Tensor:
        """Expert FFNs on tokens sorted by expert id; tokens_per_expert has one count per expert.

        Expert parallelism replaces this method: dispatch rows to the ranks owning the experts, run the local
        GroupedExperts there, and return rows in the same order.
        """
        return self.experts(x_sorted, tokens_per_expert)

    def start_experts(self, x_sorted: torch.Tensor, tokens_per_expert: torch.Tensor):
        """Begin the expert computation; the returned function completes it and gives compute_experts' result.

        Expert parallelism replaces this to issue its all-to-all here, so that the shared expert computes while
        the tokens travel; one device simply defers to compute_experts."""
        return lambda: self.compute_experts(x_sorted, tokens_per_expert)

    def _aux_loss(self, scores: torch.Tensor, tokens_per_expert: torch.Tensor) -> torch.Tensor:
        """Switch Transformer loss E * sum_e f_e * P_e: f = fraction of routed slots, P = mean router probability."""
        if self.score_func_is_sigmoid:
            scores = scores / scores.sum(-1, keepdim=True)
        counts = tokens_per_expert.float()
        if self.balance_scope == "global_batch" and self.sum_over_ranks is not None:
            # Qwen's global-batch balancing: experts may specialise per rank as long as the whole batch balances.
            counts = self.sum_over_ranks(counts.clone())
        f = counts / counts.sum().clamp(min=1)
        p = scores.mean(0)
        return self.aux_loss_coef * self.n_experts * torch.dot(f.detach(), p)

    @property
    def score_func_is_sigmoid(self) -> bool:
        return self.router.score_func == "sigmoid"

    @torch.no_grad()
    def update_bias(self, load: torch.Tensor | None = None) -> None:
        """Aux-free balancing step: raise the bias of underloaded experts, lower overloaded ones.

        load: tokens per expert to balance (default: last_load); pass a load summed over data-parallel ranks
        and micro-batches so every rank applies the same update.
        """
        load = (self.last_load if load is None else load).float().to(self.expert_bias.device)
        self.expert_bias += self.bias_update_speed * torch.sign(load.mean() - load)
