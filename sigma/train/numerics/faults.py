"""Numerical faults, injected by name into whatever runs inside `inject(...)`: the failures a new platform shows.

Each one replaces a kernel-level function or method for the duration of the context (the model code is not edited),
so the fault travels through the real forward, backward and optimiser step like a wrong vendor kernel would.

    with inject("flash_attn_grad") as fault:   # fault.step: the optimiser step, set by whoever runs the steps
        check(ref)
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch
import torch.nn.functional as F

import sigma.train.moe as moe_mod
import sigma.train.numerics.tape as tape_mod


@dataclass(frozen=True)
class Fault:
    name: str
    module: str  # the table row(s) that must be flagged, comma-separated
    what: str


FAULTS = {f.name: f for f in (
    Fault("flash_attn_grad", "attention", "attention backward drops the first quarter of the key blocks from dK and "
                                          "dV (a wrong flash-attention gradient; the forward is right)"),
    Fault("gemm_equal_tiles", "attention", "GEMMs with equal M/N tiles (square weights) skip the last K tile"),
    Fault("grouped_gemm_ep", "experts", "grouped GEMM writes the rows of the second expert-parallel rank's experts "
                                        "one row off"),
    Fault("layernorm_grad_accum", "norm,q_norm,k_norm", "norm weight gradient keeps half of an accumulator that is "
                                                        "never reset: the error grows every step"),
    Fault("router_accum", "router", "router weights of odd experts drift by 2% more every step"),
    Fault("rng", "router,residual", "a different random generator: the same seed gives another stream (router "
                                    "jitter, dropout)"),
    Fault("dropout_rng", "residual", "dropout reuses its first mask: the generator is not advanced"),
    Fault("bf16_reduction", "loss", "the loss mean accumulates in bfloat16"),
)}


class FaultState:
    def __init__(self, name: str):
        self.name, self.step = name, 0
        self.memory: dict = {}


@contextlib.contextmanager
def _patched(owner, attr: str, replacement):
    original = getattr(owner, attr)
    setattr(owner, attr, replacement(original))
    try:
        yield
    finally:
        setattr(owner, attr, original)


@contextlib.contextmanager
def inject(name: str):
    """Patch the fault `name` in; yields its state (set `.step` before each optimiser step)."""
    if name not in FAULTS:
        raise ValueError(f"unknown numerical fault {name!r}; faults: {', '.join(FAULTS)}")
    state = FaultState(name)
    with _PATCHES[name](state):
        yield state


# ---------------------------------------------------------------- the faults

class _SkipKeyBlocksGrad(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, original, kwargs):
        ctx.save_for_backward(q, k, v)
        ctx.original, ctx.kwargs = original, kwargs
        return original(q, k, v, **kwargs)

    @staticmethod
    def backward(ctx, grad):
        q, k, v = (t.detach().requires_grad_(True) for t in ctx.saved_tensors)
        with torch.enable_grad():
            out = ctx.original(q, k, v, **ctx.kwargs)
        dq, dk, dv = torch.autograd.grad(out, (q, k, v), grad)
        skip = k.shape[-2] // 4
        dk, dv = dk.clone(), dv.clone()
        dk[..., :skip, :] = 0
        dv[..., :skip, :] = 0
        return dq, dk, dv, None, None


def _flash_attn_grad(state):
    return _patched(F, "scaled_dot_product_attention",
                    lambda orig: lambda q, k, v, **kw: _SkipKeyBlocksGrad.apply(q, k, v, orig, kw))


def _gemm_equal_tiles(state):
    def make(orig):
        def linear(x, weight, bias=None):
            if weight.ndim == 2 and weight.shape[0] == weight.shape[1]:
                keep = weight.shape[1] - weight.shape[1] // 8
                return orig(x[..., :keep], weight[:, :keep], bias)
            return orig(x, weight, bias)
        return linear
    return _patched(F, "linear", make)


def _grouped_gemm_ep(state):
    def make(orig):
        def grouped_mm(x, w_t, offs):
            out = orig(x, w_t, offs)
            groups = w_t.shape[0]
            starts = torch.cat([offs.new_zeros(1), offs[:-1]]).tolist()
            perm = torch.arange(out.shape[0], device=out.device)
            for g in range(groups // 2, groups):  # the experts of the second of two expert-parallel ranks
                lo, hi = starts[g], int(offs[g])
                if hi - lo > 1:
                    perm[lo:hi] = torch.roll(perm[lo:hi], 1)
            return out.index_select(0, perm)
        return grouped_mm
    return _patched(moe_mod, "grouped_mm", make)


class _LeakyGrad(torch.autograd.Function):
    @staticmethod
    def forward(ctx, weight, state):
        ctx.state = state
        ctx.key = id(weight)
        return weight.view_as(weight)

    @staticmethod
    def backward(ctx, grad):
        stale = ctx.state.memory.get(ctx.key)
        out = grad if stale is None else grad + 0.5 * stale
        ctx.state.memory[ctx.key] = out.detach()
        return out, None


def _layernorm_grad_accum(state):
    def make(orig):
        def rms_norm(x, shape, weight=None, eps=None):
            if weight is not None and weight.requires_grad:
                weight = _LeakyGrad.apply(weight, state)
            return orig(x, shape, weight, eps)
        return rms_norm
    return _patched(F, "rms_norm", make)


def _router_accum(state):
    def make(orig):
        def forward(self, x, expert_bias=None):
            ids, weights, scores, logits = orig(self, x, expert_bias)
            drift = 1.0 + 0.02 * state.step * (ids % 2).to(weights.dtype)
            return ids, weights * drift, scores, logits
        return forward
    return _patched(moe_mod.Router, "forward", make)


def _rng(state):
    return _patched(tape_mod, "seed_rng", lambda orig: lambda seed: orig((int(seed) + 1) % (2**62)))


def _dropout_rng(state):
    def make(orig):
        def dropout(x, p=0.5, training=True, inplace=False):
            if not training or p == 0:
                return orig(x, p, training, inplace)
            key = (tuple(x.shape), x.device, x.dtype)
            if key not in state.memory:
                state.memory[key] = torch.empty_like(x).bernoulli_(1 - p)
            return x * state.memory[key] / (1 - p)
        return dropout
    return _patched(F, "dropout", make)


def _bf16_reduction(state):
    def make(orig):
        def cross_entropy(logits, target, *args, **kwargs):
            if args or kwargs.get("reduction", "mean") != "mean" or set(kwargs) - {"reduction"}:
                return orig(logits, target, *args, **kwargs)
            per_token = orig(logits, target, reduction="none")
            total = torch.zeros((), dtype=torch.bfloat16, device=per_token.device)
            for chunk in per_token.split(8):  # a bf16 accumulator, as a kernel with the wrong accumulate type
                total = (total + chunk.sum().to(torch.bfloat16)).to(torch.bfloat16)
            return total.float() / per_token.numel()
        return cross_entropy
    return _patched(F, "cross_entropy", make)


_PATCHES = {"flash_attn_grad": _flash_attn_grad, "gemm_equal_tiles": _gemm_equal_tiles,
            "grouped_gemm_ep": _grouped_gemm_ep, "layernorm_grad_accum": _layernorm_grad_accum,
            "router_accum": _router_accum, "rng": _rng, "dropout_rng": _dropout_rng,
            "bf16_reduction": _bf16_reduction}
