"""KPIs that precede a training collapse, measured on the training forward of a reporting step.

The small-scale-proxy literature (Wortsman et al. 2023; Dehghani et al. 2023) names two early precursors of a loss
divergence, both visible long before the loss moves: attention logits that grow without bound (without qk-norm), and
output logits whose log-partition function log Z drifts away from zero (what z-loss prevents). With them, the
router's entropy (a collapsing router sends every token to the same experts). `sigma collapse check` judges them.

    with PrecursorProbe(model) as probe:   # forward hooks for this step only
        forward_backward(...)
    kpi_fields = probe.values()

KPI fields (each measured on the first micro-batch of the step, under no_grad, so the step itself is unchanged):
  attn_logit_max   per layer: the largest |q.k| / sqrt(head_dim) over heads and causal positions
  output_log_z     mean over tokens of logsumexp of the output logits (in nats; 0 is what z-loss pulls towards)
  router_entropy   per MoE layer: mean entropy of the router's scores over tokens, divided by log(n_experts)
"""

from __future__ import annotations

import math

import torch

from sigma.train.model import Attention
from sigma.train.moe import Router


CHUNK = 1 << 24  # elements of one intermediate: a long sequence's T x T logits are never held for all heads at once


@torch.no_grad()
def attention_logit_max(attn: Attention, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> float:
    q, k = attn.queries_keys(x, cos, sin)
    if k.shape[1] != q.shape[1]:  # grouped-query attention: each key head serves several query heads
        k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
    t, d = q.shape[-2], q.shape[-1]
    q, k = q.reshape(-1, t, d), k.reshape(-1, t, d)  # [B * H, T, D]
    causal = torch.ones(t, t, dtype=torch.bool, device=q.device).tril()
    top = torch.zeros((), device=q.device)
    step = max(1, CHUNK // (t * t))
    for i in range(0, q.shape[0], step):
        logits = (q[i:i + step].float() @ k[i:i + step].float().transpose(-1, -2)).abs()
        top = torch.maximum(top, logits.masked_fill(~causal, 0.0).amax())
    return float(top) / math.sqrt(d)


@torch.no_grad()
def mean_log_z(logits: torch.Tensor) -> float:
    """Mean over tokens of logsumexp over the vocabulary, in float32, a chunk of tokens at a time."""
    flat = logits.reshape(-1, logits.shape[-1])
    step = max(1, CHUNK // flat.shape[-1])
    total = sum(torch.logsumexp(flat[i:i + step].float(), -1).sum() for i in range(0, flat.shape[0], step))
    return float(total) / flat.shape[0]


@torch.no_grad()
def score_entropy(scores: torch.Tensor) -> float:
    """Mean entropy of each token's scores (normalised to sum 1: sigmoid scores too) over log(n): 1 is uniform."""
    p = scores.float() / scores.float().sum(-1, keepdim=True).clamp_min(1e-30)
    entropy = -(p * p.clamp_min(1e-30).log()).sum(-1).mean()
    return max(0.0, float(entropy)) / math.log(scores.shape[-1])  # p a hair above 1 would give -0.0


class PrecursorProbe:
    """Forward hooks on the attention modules, the routers and the output head while the `with` block runs. Only
    the first call of each module counts (the first micro-batch; a checkpointed layer's recomputation is skipped)."""

    def __init__(self, model, enabled: bool = True):
        self.model, self.enabled = model, enabled
        self.attn: dict[int, float] = {}
        self.router: dict[int, float] = {}
        self.log_z: float | None = None
        self._handles = []

    def __enter__(self) -> PrecursorProbe:
        if not self.enabled:
            return self
        layers = getattr(self.model, "layers", [])
        for index, layer in enumerate(layers):
            self._handles.append(layer.attn.register_forward_hook(self._on_attention(index)))
        for index, moe in enumerate(self.model.moe_layers()):
            self._handles.append(moe.router.register_forward_hook(self._on_router(index)))
        if getattr(self.model, "output", None) is not None:
            self._handles.append(self.model.output.register_forward_hook(self._on_output))
        return self

    def __exit__(self, *exc) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    def _on_attention(self, index: int):
        def hook(module: Attention, args, _output) -> None:
            if index not in self.attn:
                self.attn[index] = attention_logit_max(module, *args[:3])
        return hook

    def _on_router(self, index: int):
        def hook(_module: Router, _args, output) -> None:
            if index not in self.router:
                self.router[index] = score_entropy(output[2])
        return hook

    def _on_output(self, _module, _args, logits: torch.Tensor) -> None:
        if self.log_z is None:
            self.log_z = mean_log_z(logits)

    def values(self) -> dict:
        """The KPI fields measured (none when the probe was off or saw no forward), to 5 significant digits."""
        out = {}
        if self.attn:
            out["attn_logit_max"] = [_short(self.attn[i]) for i in sorted(self.attn)]
        if self.log_z is not None:
            out["output_log_z"] = _short(self.log_z)
        if self.router:
            out["router_entropy"] = [_short(self.router[i]) for i in sorted(self.router)]
        return out


def _short(x: float) -> float:
    return float(f"{x:.5g}")
