"""ZeRO-1: AdamW states sharded over the data-parallel ranks, whole tensors per owner.

Gradients are still averaged on every rank (sigma.train.parallelize.sync_and_clip); each parameter's AdamW
state lives on one owner only (dense parameters: one of the dp ranks; routed experts, which already differ across
the ep group: one of the edp ranks). The owner updates the parameter and broadcasts it to its group, so the
states take 1/dp (1/edp) of the memory for one broadcast of the parameters per step. Owners are chosen greedily by
size, so every rank holds about the same number of state elements.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from sigma.train.parallel import _collective, is_expert_param


def assign_owners(sizes: list[int], n: int) -> list[int]:
    """Owner index in [0, n) per tensor: largest first onto the least loaded owner (ties: lowest index)."""
    load = [0] * n
    owners = [0] * len(sizes)
    for i in sorted(range(len(sizes)), key=lambda i: (-sizes[i], i)):
        owner = min(range(n), key=lambda r: (load[r], r))
        owners[i] = owner
        load[owner] += sizes[i]
    return owners


class _Owned:
    """named_parameters() of the owned subset, for the trainer's optimiser builder."""

    def __init__(self, named):
        self._named = named

    def named_parameters(self):
        return iter(self._named)


class ShardedAdamW:
    """The trainer's AdamW (same groups and hyper-parameters) over the parameters this rank owns."""

    def __init__(self, run, named, cfg):
        from sigma.train.trainer import build_optimizer

        self.named = named
        self.owner: dict[str, tuple[object, int]] = {}  # name -> (group, global rank of the owner)
        owned = []
        for kind, group_name in (("dense", "dp"), ("expert", "edp")):
            members = [(n, p) for n, p in named if is_expert_param(n) == (kind == "expert")]
            group = run.group(group_name)
            size = dist.get_world_size(group)
            owners = assign_owners([p.numel() for _, p in members], size)
            for (n, p), o in zip(members, owners):
                self.owner[n] = (group, dist.get_global_rank(group, o))
                if dist.get_global_rank(group, o) == dist.get_rank():
                    owned.append((n, p))
        self.owned_names = {n for n, _ in owned}
        # a rank that owns nothing (more ranks than tensors) only receives broadcasts
        self.inner = build_optimizer(_Owned(owned), cfg, owned[0][1].device)[0] if owned else None

    @property
    def param_groups(self):
        return self.inner.param_groups if self.inner is not None else []

    @property
    def state(self):
        return self.inner.state if self.inner is not None else {}

    def zero_grad(self, set_to_none: bool = True) -> None:
        for _, p in self.named:
            p.grad = None

    @torch.no_grad()
    def step(self) -> None:
        if self.inner is not None:
            self.inner.step()
        for name, p in self.named:
            group, src = self.owner[name]
            with _collective():
                dist.broadcast(p.data.to_local() if hasattr(p.data, "to_local") else p.data, src=src, group=group)
