"""The trainer's step under a tp, pp (GPipe, 1F1B, interleaved) or ZeRO-1 layout, in float32 or bfloat16 autocast.

`sigma train` runs dp x ep layouts with its own loop (trainer.py); any other layout is built and stepped here
through sigma.train.parallelize, behind the handful of operations the loop needs: one optimiser step on this
rank's rows, the held-out loss, the MoE parameter norms, and checkpoint state under full-model names (so a run
requeued onto another allocation resumes under another layout).
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist

from sigma.train import parallelize as par
from sigma.train.dims import ParallelDims
from sigma.train.parallel import EPDispatch, _collective, is_expert_param


class LayoutStep:
    def __init__(self, cfg, ctx, model_cfg, dims: ParallelDims):
        rc = cfg.parallel.recompute
        self.dims, self.model_cfg, self.max_norm = dims, model_cfg, cfg.optim.grad_clip
        self.run = par.build_parallel(model_cfg, dims, ctx.rank, seed=cfg.seed, device=ctx.device,
                                      recompute_layers=list(rc.moe_layers), recompute_policy=rc.policy,
                                      recompute_count=rc.count, ep_dispatch=EPDispatch.from_config(cfg.parallel),
                                      amp_dtype=torch.bfloat16 if cfg.dtype == "bfloat16" else torch.float32)
        if dims.dp > 1 and model_cfg.balance_scope == "global_batch":
            dp_group = self.run.group("dp")
            for layer in self.run.moe_by_id.values():
                layer.sum_over_ranks = lambda t, _g=dp_group: _sum(t, _g)
        self.optimizer, self.named, self.fused = par.build_optimizer(self.run, cfg.optim,
                                                                     shard=cfg.parallel.shard_optimizer)

    @property
    def dp_rank(self) -> int:
        return self.run.coords["dp"]

    def step(self, local: torch.Tensor, poison: bool = False):
        """(loss, aux, grad norm, tokens per expert [n_moe, E] or None, KPI extras of the layout)."""
        loss, aux, gnorm, loads = par.local_step(self.run, self.optimizer, self.named, local, self.max_norm, poison)
        extra = {k: round(v, 6) for k, v in self.run.kpi.items() if k != "step_s"}
        return loss, aux, gnorm, loads, extra

    @torch.no_grad()
    def evaluate(self, sampler, batches: int, device: torch.device) -> float:
        self.run.module.eval()
        try:
            total = sum(par.eval_loss_sum(self.run, torch.from_numpy(sampler.batch(i)).to(device))
                        for i in range(batches))
        finally:
            self.run.module.train()
        value = _sum(torch.tensor([total], dtype=torch.float64), self.run.group("dp") if self.dims.dp > 1 else None)
        return float(value[0]) / (batches * self.dims.microbatches * self.dims.dp)

    @torch.no_grad()
    def moe_param_norms(self) -> list[float]:
        """L2 norm of each MoE layer's parameters: expert slices summed over ep and tp, tp-sharded dense ones over
        tp, replicated ones once; layers held by other pipeline ranks come in over pp."""
        cfg, run = self.model_cfg, self.run
        sliced = torch.zeros(cfg.n_moe_layers, dtype=torch.float64)  # expert slices: differ over ep and tp
        tp_sharded = torch.zeros_like(sliced)
        replicated = torch.zeros_like(sliced)
        for layer_id, layer in run.moe_by_id.items():
            row = layer_id - cfg.n_dense_layers
            for name, p in layer.named_parameters():
                sq = par._local(p).detach().double().pow(2).sum()
                if is_expert_param(name):
                    sliced[row] += sq
                elif par._is_tp_sharded(p):
                    tp_sharded[row] += sq
                else:
                    replicated[row] += sq
        for name in ("ep", "tp"):
            if getattr(self.dims, name) > 1:
                _sum(sliced, run.group(name))
        if self.dims.tp > 1:
            _sum(tp_sharded, run.group("tp"))
        total = sliced + tp_sharded + replicated
        if self.dims.pp > 1:
            _sum(total, run.group("pp"))
        return [math.sqrt(float(v)) for v in total]

    def state(self, trainer_state: dict, rng: dict) -> dict:
        state = par.checkpoint_state(self.run, self.optimizer, self.named, 0)
        del state["step"]
        return {**state, "trainer": trainer_state, "rng": rng}

    def restore(self, state: dict) -> None:
        par.restore_loaded(self.run, self.optimizer, self.named, state)

    def moe_layers(self):
        return list(self.run.moe_by_id.values())


def _sum(tensor: torch.Tensor, group) -> torch.Tensor:
    with _collective():
        dist.all_reduce(tensor, group=group)
    return tensor
