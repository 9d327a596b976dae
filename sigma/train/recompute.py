"""Selective activation recompute of chosen transformer blocks, applied from outside the model.

    rc = Recompute(model, moe_layers=[2, 3])                 # fixed set
    rc = Recompute(model, policy="balanced", count=2)        # re-picked from the routing loads: rc.update(loads)

A recomputed block keeps only its input during forward and runs again inside backward (torch.utils.checkpoint,
non-reentrant), trading one extra block forward for its saved activations. MoE blocks with the most even routing
come first under the balanced policy: their recompute costs the same FLOPs as any other, but their all-to-all
and grouped GEMM are the most predictable to replay, and an even layer has no hot expert whose activations
would dominate the peak anyway.
"""

from __future__ import annotations

import torch
from torch.utils.checkpoint import checkpoint

from sigma.config import ConfigError


def routing_imbalance(load: torch.Tensor) -> float:
    """Coefficient of variation of tokens per expert (0 = perfectly even)."""
    load = load.float()
    mean = load.mean()
    return float(load.std(unbiased=False) / mean) if mean > 0 else 0.0


def most_balanced(loads: dict[int, torch.Tensor], count: int) -> list[int]:
    """The `count` layer ids with the most even routing (ties: lower layer id first)."""
    ranked = sorted(loads, key=lambda layer: (routing_imbalance(loads[layer]), layer))
    return sorted(ranked[:count])


class Recompute:
    """Wraps every MoE block of `model` (those present: a pipeline stage holds some) once; `active` decides."""

    def __init__(self, model, moe_layers: list[int] | None = None, policy: str = "none", count: int = 0,
                 blocks=None):
        blocks = list(blocks if blocks is not None else model.layers)
        self.moe_ids = [b.layer_id for b in blocks if b.is_moe]
        n_layers = model.cfg.n_layers if hasattr(model, "cfg") else None
        moe_all = set(range(model.cfg.n_dense_layers, n_layers)) if n_layers else set(self.moe_ids)
        bad = [i for i in moe_layers or [] if i not in moe_all]
        if bad:
            raise ConfigError("[parallel.recompute.moe_layers]", f"layers {bad} are not MoE layers; the MoE layers "
                                                                 f"are {sorted(moe_all)}")
        if policy not in ("none", "balanced"):
            raise ConfigError("[parallel.recompute.policy]", f"unknown policy {policy!r}; use none or balanced")
        if policy == "balanced" and not 0 < count <= len(moe_all):
            raise ConfigError("[parallel.recompute.count]", f"balanced recompute needs 1 <= count <= "
                                                            f"{len(moe_all)} MoE layers, got {count}")
        self.policy, self.count = policy, count
        # Before any routing is seen the balanced policy starts from the last layers (the smallest in-flight count).
        self.active: set[int] = set(moe_layers or (sorted(moe_all)[-count:] if policy == "balanced" else []))
        for block in blocks:
            if block.is_moe:
                self._wrap(block)

    def _wrap(self, block) -> None:
        forward = block.forward

        def maybe_recomputed(x, cos, sin, _forward=forward, _id=block.layer_id):
            if _id in self.active and torch.is_grad_enabled():
                return checkpoint(_forward, x, cos, sin, use_reentrant=False)
            return _forward(x, cos, sin)

        block.forward = maybe_recomputed

    def update(self, loads: dict[int, torch.Tensor]) -> list[int]:
        """Balanced policy: re-pick the recomputed layers from the latest loads ({layer id: tokens per expert})."""
        if self.policy == "balanced" and loads:
            self.active = set(most_balanced(loads, self.count))
        return sorted(self.active)
