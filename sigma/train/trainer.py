"""The training loop: one process per rank, started by submitit, srun, torchrun or directly.

    python -m sigma.train.trainer --config configs/train/debug.yaml steps=20   # what every rank runs

Per step: the rank's slice of the global batch -> forward (+ optional autocast) -> global loss (all ranks agree
on NaN/Inf and stop together with a `nan_loss` event) -> backward -> gradient averaging (parallel.py) -> global
norm clip -> AdamW (fused where the device has it) with warm-up + cosine LR -> aux-loss-free bias update from
the load summed over ranks -> KPI line -> progress line (rank 0) -> periodic checkpoint.
Layouts with tensor or pipeline parallelism or ZeRO-1 compute that step through sigma.train.layout_step (the
rest of the loop is the same).

Noise control (Sigma paper): automatic GC is disabled and run every `gc_every` steps and after each checkpoint,
so collections never land at random inside steps of different ranks; `drop_page_cache` empties the page cache
before start so that every run reads its data from the same (cold) state.
"""

from __future__ import annotations

import argparse
import gc
import math
import os
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F

from sigma.train import data as data_mod
from sigma.train.adamw import AdamW  # torch's, minus the seconds of importing torch._dynamo
from sigma.train.checkpoint import CheckpointManager, checkpoint_step, import_dcp_in_background
from sigma.train.host_malloc import kept_freed_memory
from sigma.train.jit import BlockedAnswer, JitCheckpoints, save_requested, save_rollback, saved_request
from sigma.train.kpi import KpiWriter, throughput_stability
from sigma.train.noise import GcPressure, StepNoise
from sigma.train.parallel import (DistContext, EPDispatch, clip_gradients, collective_wait_s, dropped_tokens,
                                  init_distributed, install_expert_parallel, is_expert_param, shutdown,
                                  sync_gradients)
from sigma.train.parallelize import is_dp_ep_only
from sigma.train.precursors import PrecursorProbe
from sigma.train.replica import local_state, peer_replicas, resume_from_replicas
from sigma.train.terminate import exit_on_sigterm, finish_before_exit
from sigma.train.train_config import OptimConfig, TrainConfig, check_layout, load_train_config

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


class TrainingStopped(RuntimeError):
    """Training stopped on purpose (NaN/Inf loss); the KPI file holds the event."""


@dataclass
class RunSummary:
    start_step: int = 0
    last_step: int = 0
    resumed_from: str | None = None
    losses: dict[int, float] = field(default_factory=dict)
    tokens_per_s: list[float] = field(default_factory=list)
    mfu: list[float | None] = field(default_factory=list)  # None: no stated peak (see the start event)
    eval_losses: dict[int, float] = field(default_factory=dict)
    world_size: int = 1
    kpi_path: str = ""


def lr_at(step: int, cfg: OptimConfig, total_steps: int) -> float:
    """LR of 1-based optimiser step `step`: linear warm-up, then cosine from lr down to min_lr at total_steps."""
    if cfg.warmup_steps and step <= cfg.warmup_steps:
        return cfg.lr * step / cfg.warmup_steps
    span = max(1, total_steps - cfg.warmup_steps)
    progress = min(1.0, (step - cfg.warmup_steps) / span)
    return cfg.min_lr + 0.5 * (cfg.lr - cfg.min_lr) * (1 + math.cos(math.pi * progress))


# ---------------------------------------------------------------- model set-up

def build_model(cfg: TrainConfig, ctx: DistContext):
    from sigma.train.config import load_model_config
    from sigma.train.model import MoETransformer

    model_cfg = load_model_config(cfg.model, cfg.model_overrides)
    check_layout(cfg, ctx.world_size, model_cfg.n_experts)
    torch.manual_seed(cfg.seed)  # identical initial weights on every rank (and in a one-process run)
    model = MoETransformer(model_cfg).to(ctx.device)
    if cfg.parallel.recompute.moe_layers or cfg.parallel.recompute.policy != "none":
        from sigma.train.recompute import Recompute
        rc = cfg.parallel.recompute
        model.recompute = Recompute(model, rc.moe_layers, rc.policy, rc.count)
    if ctx.ep_size > 1:
        apply_expert_parallel(model, ctx, EPDispatch.from_config(cfg.parallel))
    if ctx.distributed and model_cfg.balance_scope == "global_batch":
        for layer in model.moe_layers():
            layer.sum_over_ranks = ctx.all_reduce_sum  # every rank's routed counts of all experts
    return model, model_cfg


def apply_expert_parallel(model, ctx: DistContext, options: EPDispatch = EPDispatch()) -> None:
    """Keep this rank's E/ep experts of every MoE layer and route its tokens through all-to-all."""
    for layer in model.moe_layers():
        experts = layer.experts
        per_rank = experts.n_experts // ctx.ep_size
        keep = slice(ctx.ep_rank * per_rank, (ctx.ep_rank + 1) * per_rank)
        for name in ("w1", "w2", "w3"):
            full = getattr(experts, name)
            setattr(experts, name, torch.nn.Parameter(full.detach()[keep].clone()))
        experts.n_experts = per_rank
        install_expert_parallel(layer, experts, ctx.ep_group, ctx.ep_size, options)


def build_optimizer(model, cfg: OptimConfig, device: torch.device):
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    decay = [p for n, p in named if p.ndim >= 2 and "embeddings" not in n]
    no_decay = [p for n, p in named if not (p.ndim >= 2 and "embeddings" not in n)]
    fused = cfg.fused and device.type in torch.utils._foreach_utils._get_fused_kernels_supported_devices()
    opt = AdamW([{"params": decay, "weight_decay": cfg.weight_decay},
                 {"params": no_decay, "weight_decay": 0.0}],
                lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), eps=cfg.eps,
                fused=True if fused else None, foreach=None if fused else True)
    # Create the (zero) state now, exactly as AdamW's first step would, so checkpoints always hold it.
    for group in opt.param_groups:
        for p in group["params"]:
            opt.state[p] = {
                "step": torch.zeros((), dtype=torch.float32, device=p.device if fused else "cpu"),
                "exp_avg": torch.zeros_like(p, memory_format=torch.preserve_format),
                "exp_avg_sq": torch.zeros_like(p, memory_format=torch.preserve_format)}
    return opt, named, fused


# ---------------------------------------------------------------- checkpoint state

def _shardable(name: str, tensor: torch.Tensor, ctx: DistContext):
    """Expert shards become DTensors (Shard(0) over ep) so checkpoints reshard across EP degrees."""
    if ctx.ep_size > 1 and is_expert_param(name):
        from torch.distributed.tensor import DTensor, Replicate, Shard

        return DTensor.from_local(tensor, ctx.mesh, [Replicate(), Shard(0)], run_check=False)
    return tensor


def rng_key(rank: int) -> str:
    return f"rank{rank}"


def rng_state(ctx: DistContext) -> dict:
    """This rank's torch RNG state (CPU, and CUDA when used) under a per-rank key: dropout and router jitter draw
    from it, so an exact resume needs it back."""
    state = {"cpu": torch.get_rng_state()}
    if ctx.device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(ctx.device)
    return {rng_key(ctx.rank): state}


def restore_rng(state: dict, ctx: DistContext) -> None:
    mine = state[rng_key(ctx.rank)]
    torch.set_rng_state(mine["cpu"])
    if "cuda" in mine:
        torch.cuda.set_rng_state(mine["cuda"], ctx.device)


def checkpoint_state(model, optimizer, named, ctx: DistContext, trainer_state: dict) -> dict:
    params = dict(named)
    model_sd = {n: _shardable(n, t, ctx) for n, t in model.state_dict().items()}
    optim_sd = {}
    for n, p in params.items():
        st = optimizer.state[p]
        optim_sd[n] = {"step": st["step"], "exp_avg": _shardable(n, st["exp_avg"], ctx),
                       "exp_avg_sq": _shardable(n, st["exp_avg_sq"], ctx)}
    return {"model": model_sd, "optim": optim_sd, "trainer": trainer_state, "rng": rng_state(ctx)}


def _copy_back(holder, target: torch.Tensor) -> None:
    local = holder.to_local() if hasattr(holder, "to_local") else holder
    if local.data_ptr() != target.data_ptr():
        target.copy_(local)


def restore_state(state: dict, model, optimizer, named) -> None:
    """After an in-place DCP load, make sure every model/optimiser tensor holds the loaded values."""
    with torch.no_grad():
        live = model.state_dict()
        for n, holder in state["model"].items():
            _copy_back(holder, live[n])
        for n, p in named:
            st = optimizer.state[p]
            for key in ("step", "exp_avg", "exp_avg_sq"):
                _copy_back(state["optim"][n][key], st[key])


# ---------------------------------------------------------------- noise control

def drop_page_cache(files: list[Path]) -> str:
    """Drop the whole page cache when allowed (root), else evict just the data shards; return what was done."""
    try:
        os.sync()
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("1\n")
        return "dropped the page cache (/proc/sys/vm/drop_caches)"
    except OSError:
        for path in files:
            fd = os.open(path, os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)
        return f"evicted {len(files)} data shard(s) from the page cache (posix_fadvise DONTNEED)"


# ---------------------------------------------------------------- metrics

def moe_param_norms(model, ctx: DistContext) -> list[float]:
    """L2 norm of each MoE layer's parameters (router, experts over all EP shards, shared expert)."""
    norms = []
    for layer in model.moe_layers():
        sq_dense = torch.zeros((), device=ctx.device)
        sq_expert = torch.zeros((), device=ctx.device)
        for name, p in layer.named_parameters():
            value = p.detach().float().pow(2).sum()
            if name.startswith("experts."):
                sq_expert += value
            else:
                sq_dense += value
        if ctx.ep_size > 1:
            ctx.all_reduce_sum(sq_expert, ctx.ep_group)
        norms.append(math.sqrt(float(sq_dense + sq_expert)))
    return norms


def _progress_line(step: int, total: int, loss: float, aux: float, gnorm: float, lr: float, tps: float,
                   mfu: float | None, dt: float) -> str:
    mfu_text = f"{100 * mfu:5.2f}%" if mfu is not None else "  n/a"
    return (f"step {step:>6}/{total} | loss {loss:7.4f} | aux {aux:.4f} | gnorm {gnorm:7.3f} | lr {lr:.2e} | "
            f"{tps:9,.0f} tok/s | mfu {mfu_text} | {1000 * dt:7.1f} ms")


# ---------------------------------------------------------------- the loop

def train(cfg: TrainConfig, out=None) -> RunSummary:
    out = out or sys.stdout  # looked up per call: a default bound at import outlives a replaced stdout
    startup = {"process": _process_started(), "imported": time.time()}  # where a restart's time goes
    gc_was_enabled = gc.isenabled()
    if cfg.gc_manual:
        gc.disable()
    try:
        torch.set_num_threads(max(1, cfg.threads))
        ctx = init_distributed(cfg.parallel.ep, cfg.parallel.backend, cfg.device)
        startup["process_group"] = time.time()
        try:
            kpi = KpiWriter(ctx.rank, cfg.kpi.dir or None)
            summary = RunSummary(world_size=ctx.world_size, kpi_path=str(kpi.path))
            try:
                with kept_freed_memory(cfg.keep_freed_host_memory and ctx.device.type == "cpu") as kept:
                    _train(cfg, ctx, kpi, summary, out, startup, host_memory_kept=kept)
            finally:
                kpi.close()
        finally:
            shutdown(ctx)
    finally:
        if gc_was_enabled:
            gc.enable()
    return summary


def _process_started() -> float | None:
    """When this process started (epoch seconds), from /proc: the restart bench splits interpreter start and
    imports from what follows."""
    try:
        import psutil

        return psutil.Process().create_time()
    except Exception:  # not worth failing a run over
        return None


def _consume(trigger: Path) -> bool:
    """A one-shot trigger file: True once (the run restarted from a checkpoint must not hit it again); one rank's NaN
    reaches every rank through the loss all-reduce, so it does not matter which rank takes it."""
    try:
        trigger.unlink()
        return True
    except FileNotFoundError:
        return False


def forward_backward(model, batch: torch.Tensor, micro_batches: int, amp_dtype: torch.dtype, device: torch.device,
                     poison: bool = False) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Gradient accumulation: forward and backward each micro-batch of this rank's rows, gradients summed with the
    loss scaled by 1 / micro_batches, so the step sees the mean over the rank's batch. Returns the mean CE and aux
    losses (detached) and the tokens routed per expert summed over the micro-batches ([MoE layers, E] or None)."""
    ce_sum = torch.zeros((), device=device)
    aux_sum = torch.zeros((), device=device)
    loads = None
    for chunk in batch.chunk(micro_batches):
        inputs, targets = chunk[:, :-1], chunk[:, 1:]
        with torch.autocast(device.type, dtype=amp_dtype, enabled=amp_dtype != torch.float32):
            logits, aux = model(inputs)
        if poison:
            logits = logits * float("nan")  # testing only: a numerical fault inside the forward pass
        ce = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), targets.reshape(-1))
        ((ce + aux) / micro_batches).backward()
        ce_sum += ce.detach()
        aux_sum += aux.detach().float()
        if model.moe_layers():
            load = torch.stack([layer.last_load for layer in model.moe_layers()])
            loads = load if loads is None else loads + load
    return ce_sum / micro_batches, aux_sum / micro_batches, loads


@torch.no_grad()
def evaluate(model, sampler, batches: int, micro_batches: int, amp_dtype: torch.dtype, ctx: DistContext) -> float:
    """Mean cross entropy over the same `batches` global batches of held-out windows (all ranks together)."""
    model.eval()
    try:
        total = torch.zeros((), device=ctx.device)
        for index in range(batches):
            rows = torch.from_numpy(sampler.batch(index)).to(ctx.device)
            for chunk in rows.chunk(micro_batches):
                with torch.autocast(ctx.device.type, dtype=amp_dtype, enabled=amp_dtype != torch.float32):
                    logits, _ = model(chunk[:, :-1])
                total += F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), chunk[:, 1:].reshape(-1))
        ctx.all_reduce_sum(total)
        return float(total) / (batches * micro_batches * ctx.world_size)
    finally:
        model.train()


def stated_peak(cfg: TrainConfig, ctx: DistContext, amp_dtype: torch.dtype):
    """The fixed peak MFU is measured against, or None with the reason (then MFU is not reported)."""
    from sigma.train.flops import PeakUnknown, peak_flops

    try:
        return peak_flops(ctx.device, amp_dtype, cfg.peak_flops), None
    except PeakUnknown as exc:
        return None, str(exc)


def load_data(cfg: TrainConfig, ctx: DistContext, vocab_size: int, dp_rank: int | None = None,
              dp_size: int | None = None):
    """Train and held-out samplers over the prepared data (rank 0 prepares it first when missing); each
    data-parallel rank reads its rows (every rank is one, unless tp or pp ranks share them)."""
    dp_rank = ctx.rank if dp_rank is None else dp_rank
    dp_size = ctx.world_size if dp_size is None else dp_size
    data_path = cfg.data.resolved_path(vocab_size)
    if ctx.rank == 0 and cfg.data.prepare_if_missing and not (data_path / data_mod.META_NAME).exists():
        data_mod.prepare(data_path, max_mb=cfg.data.prepare_max_mb, tokenizer=cfg.data.tokenizer,
                         vocab_size=vocab_size)
    ctx.barrier()
    shards = data_mod.TokenShards(data_path)
    if shards.vocab_size > vocab_size:
        raise ValueError(f"data vocabulary ({shards.vocab_size}, {data_path}) is larger than the model's "
                         f"vocab_size ({vocab_size}): prepare the data with --vocab-size {vocab_size}")
    sampler = data_mod.WindowSampler(shards, cfg.data.seq_len, cfg.data.global_batch, cfg.data.seed,
                                     dp_rank=dp_rank, dp_size=dp_size)
    held_out = None
    if cfg.eval.every:
        held_out = data_mod.WindowSampler(data_mod.TokenShards(data_path, split="eval"), cfg.data.seq_len,
                                          cfg.data.global_batch, cfg.data.seed, dp_rank=dp_rank,
                                          dp_size=dp_size)
    return shards, sampler, held_out


def _train(cfg: TrainConfig, ctx: DistContext, kpi: KpiWriter, summary: RunSummary, out,
           startup: dict | None = None, host_memory_kept: bool = False) -> None:
    from sigma.train.checkpoint import saved_keys
    from sigma.train.config import load_model_config
    from sigma.train.flops import flops_per_token, hardware_flops_per_token

    is_main = ctx.rank == 0
    startup = dict(startup or {})
    model_cfg = load_model_config(cfg.model, cfg.model_overrides)
    if cfg.data.seq_len > model_cfg.max_seq_len:
        raise ValueError(f"data.seq_len {cfg.data.seq_len} exceeds the model's max_seq_len {model_cfg.max_seq_len}")
    dims = check_layout(cfg, ctx.world_size, model_cfg.n_experts)
    layout = None  # dp x ep: this module's loop; tp, pp, ZeRO-1: sigma.train.layout_step
    if not is_dp_ep_only(dims, cfg.parallel.shard_optimizer):
        from sigma.train.layout_step import LayoutStep

        layout = LayoutStep(cfg, ctx, model_cfg, dims)
        model, optimizer, named, fused = layout.run.module, layout.optimizer, layout.named, layout.fused
        shards, sampler, held_out = load_data(cfg, ctx, model_cfg.vocab_size, layout.dp_rank, dims.dp)
    else:
        shards, sampler, held_out = load_data(cfg, ctx, model_cfg.vocab_size)
        model, model_cfg = build_model(cfg, ctx)
        optimizer, named, fused = build_optimizer(model, cfg.optim, ctx.device)
    async_group = None
    if cfg.checkpoint.background and ctx.distributed:
        import torch.distributed as dist

        async_group = dist.new_group(backend="gloo")  # background saves coordinate apart from training
    ckpt = CheckpointManager(cfg.path(cfg.checkpoint.dir), cfg.checkpoint.keep, ctx.rank, ctx.barrier, async_group)
    unregister = finish_before_exit(ckpt.finish_in_flight)  # a SIGTERM exit lets a save being written finish
    amp_dtype = DTYPES[cfg.dtype]
    aux_free = model_cfg.balance == "aux_free"
    micro_batches = dims.microbatches  # data.micro_batch and parallel.microbatches, reconciled by check_layout

    startup["built"] = time.time()  # model, optimiser and data ready
    step = 0
    meta = {}
    latest = ckpt.latest() if cfg.checkpoint.resume else None
    # in-memory peer replicas (sigma/train/replica.py): a complete set newer than the disk checkpoint wins, and
    # then the disk checkpoint is not read at all (a restart's time goes to one load, not two)
    replicas = peer_replicas(cfg, ctx, kpi, ckpt.root)
    if replicas is not None and cfg.checkpoint.resume:
        disk_step = checkpoint_step(latest) if latest is not None else 0
        newer = resume_from_replicas(replicas, disk_step, model, optimizer, named, sampler, ctx, kpi, restore_rng)
        if newer is not None:
            step, latest = newer, None
    if latest is not None:
        trainer_state = {"step": 0, "sampler": sampler.state_dict()}
        state = (layout.state(trainer_state, rng_state(ctx)) if layout is not None
                 else checkpoint_state(model, optimizer, named, ctx, trainer_state))
        has_rng = f"rng.{rng_key(ctx.rank)}.cpu" in saved_keys(latest)
        if not has_rng:  # an older checkpoint, or one written by fewer ranks
            del state["rng"]
        meta = ckpt.load(latest, state)
        if layout is not None:
            layout.restore(state)
        else:
            restore_state(state, model, optimizer, named)
        if has_rng:
            restore_rng(state["rng"], ctx)
        sampler.load_state_dict(state["trainer"]["sampler"])
        step = int(state["trainer"]["step"])
        summary.resumed_from = str(latest)
        kpi.event("resume", f"resumed from {latest} at step {step}", step=step, checkpoint=str(latest),
                  saved_world_size=meta.get("world_size"), rng_restored=has_rng,
                  checkpoint_kind=meta.get("kind", "periodic"))
    summary.start_step = step
    startup["state_loaded"] = time.time()
    if cfg.drop_page_cache and ctx.local_rank == 0:
        kpi.event("page_cache", drop_page_cache(shards.files()))
    tokens_per_step = cfg.data.global_batch * cfg.data.seq_len
    flops_token = flops_per_token(model_cfg, cfg.data.seq_len)
    hw_flops_token = hardware_flops_per_token(model_cfg, cfg.data.seq_len)
    peak, no_peak = stated_peak(cfg, ctx, amp_dtype)
    kpi.event("start", f"training steps {step + 1}..{cfg.steps} of {cfg.model} on {ctx.world_size} rank(s), "
                       f"ep={ctx.ep_size}, {ctx.device.type}/{ctx.backend}, fused AdamW={fused}, "
                       f"{micro_batches} micro-batch(es)/step; "
                       + (f"MFU against {peak.flops:.4g} FLOP/s ({peak.source})" if peak else f"no MFU: {no_peak}"),
              step=step, world_size=ctx.world_size, ep=ctx.ep_size, layout=dims.describe(), flops_per_token=flops_token,
              hardware_flops_per_token=hw_flops_token, peak_flops=peak.flops if peak else None,
              peak_source=peak.source if peak else no_peak, micro_batches=micro_batches,
              data_vocab_size=shards.vocab_size, params=sum(p.numel() for p in model.parameters()),
              jit_poll_every=cfg.checkpoint.jit_poll_every, startup=startup, host_memory_kept=host_memory_kept,
              fault_hooks=["nan"] if cfg.fault.nan_trigger else [],
              jit_when_blocked=bool(replicas is not None and layout is None and cfg.checkpoint.jit_poll_every))
    if is_main:
        print(f"sigma train: {cfg.name}: model {cfg.model} ({model_cfg.n_layers} layers, {model_cfg.n_experts} "
              f"experts top-{model_cfg.top_k}), {ctx.world_size} rank(s) ep={ctx.ep_size}"
              + (f" ({dims.describe()})" if layout is not None else "") + f", steps {step + 1}.."
              f"{cfg.steps}, {tokens_per_step} tokens/step" + (f", resumed from {latest}" if latest else ""),
              file=out, flush=True)
        if peak is None:
            print(f"sigma train: MFU not reported: {no_peak}", file=out, flush=True)
    started_fresh = step == 0
    gc.collect()
    if cfg.gc_manual:
        gc.freeze()  # the model, optimiser and imports live all run long: later collections skip them
    kpi.start_heartbeat(cfg.kpi.heartbeat_s)
    # noise control: what each step waited for (GC, page faults, CPU) goes on its KPI line
    noise = StepNoise()
    pressure = GcPressure(kpi.path.parent / f"inject-gc.{kpi.node}" if cfg.fault.gc_trigger else None)

    def checkpoint_done(path: Path, save_s: float, at_step: int) -> None:
        kpi.event("checkpoint", f"saved {path}", step=at_step, path=str(path), save_s=round(save_s, 3))

    # just-in-time checkpoints asked for by the controller, and the NaN rollback (sigma/train/jit.py)
    jit = JitCheckpoints(kpi.path.parent, kpi.node, ctx, cfg.checkpoint.jit_poll_every, saved_request(meta),
                         since=startup.get("process"))

    def full_state(trainer_state: dict) -> dict:
        return (layout.state(trainer_state, rng_state(ctx)) if layout is not None
                else checkpoint_state(model, optimizer, named, ctx, trainer_state))

    jit.settled(step, sampler.state_dict(), rng_state(ctx))
    blocked = None  # answers a request while a hung rank blocks this one in a collective (needs the replicas)
    if replicas is not None and layout is None and cfg.checkpoint.jit_poll_every:
        blocked = BlockedAnswer(jit, replicas, lambda at, sampler_state, rng: local_state(
            model, optimizer, named, rng, {"step": at, "sampler": sampler_state}), kpi)

    first_step = step + 1
    try:
        while step < cfg.steps:
            step += 1
            if cfg.fault.kill_at_step == step and started_fresh:
                ckpt.wait()  # the checkpoints before the kill are on disk, so the test knows what a resume finds
                if replicas is not None:
                    replicas.wait()  # ... and the replicas in memory
                kpi.event("fault", f"fault.kill_at_step: killing rank {ctx.rank} at step {step}", step=step)
                kpi.close()
                os.kill(os.getpid(), signal.SIGKILL)
            if cfg.fault.hang_at_step == step and started_fresh and ctx.rank == cfg.fault.hang_rank:
                ckpt.wait()
                if replicas is not None:
                    replicas.wait()  # the replica of the previous step has reached the peer
                kpi.event("fault", f"fault.hang_at_step: stopping rank {ctx.rank} at step {step}", step=step)
                os.kill(os.getpid(), signal.SIGSTOP)  # as `sigma chaos hang` does; the others block in a collective
            t0, wait0 = time.perf_counter(), collective_wait_s()
            noise.begin()
            pressure.step()
            if cfg.fault.step_delay_s:
                time.sleep(cfg.fault.step_delay_s)
            lr = lr_at(step, cfg.optim, cfg.steps)
            for group in optimizer.param_groups:
                group["lr"] = lr
            jit.begin_step(sampler.state_dict(), rng_state(ctx))
            batch = torch.from_numpy(sampler.next()).to(ctx.device, non_blocking=True)
            poison = cfg.fault.nan_at_step == step or (cfg.fault.nan_trigger
                                                       and _consume(kpi.path.parent / "inject-nan"))
            layout_kpi = {}
            if layout is not None:  # the whole optimiser step, bias update and recompute re-pick included
                loss_value, aux_value, gnorm, loads, layout_kpi = layout.step(batch, poison)
            else:
                optimizer.zero_grad(set_to_none=True)
                reporting = bool(cfg.kpi.param_norm_every) and step % cfg.kpi.param_norm_every == 0
                with PrecursorProbe(model, enabled=reporting) as probe:  # collapse precursors, on the norms' steps
                    ce, aux, loads = forward_backward(model, batch, micro_batches, amp_dtype, ctx.device, poison)
                layout_kpi = probe.values()  # (no layout: the step's own extra KPI fields)
                # with the losses, whether a replica round is in flight on any rank: all skip the next one alike
                busy = ce.new_tensor(float(replicas is not None and replicas.busy()))
                losses = torch.stack([ce, aux, busy])
                ctx.all_reduce_sum(losses)
                loss_value, aux_value, busy = (losses / ctx.world_size).tolist()
                if loads is not None:  # before the optimiser step: the state changes with no collective inside
                    ctx.all_reduce_sum(loads)
            if not (math.isfinite(loss_value) and math.isfinite(aux_value)):
                if cfg.checkpoint.nan_rollback:  # before the event: the controller requeues on it, at once
                    save_rollback(jit, ckpt, step, full_state({}), ctx, kpi)
                message = (f"non-finite loss {loss_value} (aux {aux_value}) at step {step}; training stopped, "
                           f"the newest checkpoint is {ckpt.latest()}")
                kpi.event("nan_loss", message, step=step, loss=loss_value)
                if is_main:
                    print(f"sigma train: {message}", file=out, flush=True)
                raise TrainingStopped(message)
            if layout is None:
                sync_gradients(ctx, named)
                gnorm = clip_gradients(ctx, named, cfg.optim.grad_clip)
                if replicas is not None:
                    replicas.wait_copied()  # the replica round in flight has copied the previous step's state
                with jit.mutating():  # no collective in here (jit.BlockedAnswer relies on it)
                    optimizer.step()
                    if loads is not None and aux_free:
                        for layer, load in zip(model.moe_layers(), loads):
                            layer.update_bias(load)
                jit.settled(step, sampler.state_dict(), rng_state(ctx))
                if replicas is not None:  # at once: a rank stopped later in the step has sent its replica already
                    replicas.after_step(step, lambda: local_state(model, optimizer, named, rng_state(ctx), {
                        "step": step, "sampler": sampler.state_dict()}, copy=False), busy_anywhere=busy > 0)
            if loads is not None and layout is None and hasattr(model, "recompute"):
                # the balanced policy re-picks its layers from the step's routing
                model.recompute.update(dict(zip(range(model_cfg.n_dense_layers, model_cfg.n_layers), loads)))
            if ctx.device.type == "cuda":
                torch.cuda.synchronize()
            if cfg.gc_manual and cfg.gc_every and step % cfg.gc_every == 0:
                gc.collect()  # the same step on every rank, counted in the step's time: one pause all ranks share
            dt = time.perf_counter() - t0
            tps = tokens_per_step / dt
            mfu = tps / ctx.world_size * flops_token / peak.flops if peak else None
            summary.losses[step] = loss_value
            summary.tokens_per_s.append(tps)
            summary.mfu.append(mfu)
            summary.last_step = step
            extra = dict(layout_kpi)  # with pp: pipeline_s, stage_busy_s, bubble of this rank
            if replicas is not None:
                extra.update(replicas.kpis())  # the newest step replicated, the rounds skipped
            if peak:
                extra["hfu"] = tps / ctx.world_size * hw_flops_token / peak.flops
            if loads is not None:
                extra["expert_load"] = loads.to(torch.int64).tolist()
            dropped = dropped_tokens(model.moe_layers()) if layout is None else None
            if dropped is not None:
                extra["dropped_tokens"] = round(dropped, 6)  # routed copies over the ep capacity, this rank
            if cfg.kpi.param_norm_every and step % cfg.kpi.param_norm_every == 0:
                extra["moe_param_norm"] = (layout.moe_param_norms() if layout is not None
                                           else moe_param_norms(model, ctx))
            if held_out is not None and (step % cfg.eval.every == 0 or step == cfg.steps):
                te = time.perf_counter()
                eval_loss = (layout.evaluate(held_out, cfg.eval.batches, ctx.device) if layout is not None
                             else evaluate(model, held_out, cfg.eval.batches, micro_batches, amp_dtype, ctx))
                # its own time, apart from the step's: a step with an evaluation is not a slow step
                eval_s = round(time.perf_counter() - te, 4)
                extra.update(eval_loss=eval_loss, eval_ppl=math.exp(min(eval_loss, 80.0)), eval_s=eval_s)
                summary.eval_losses[step] = eval_loss
                kpi.event("eval", f"held-out loss {eval_loss:.4f}, perplexity {extra['eval_ppl']:.2f} at step "
                                  f"{step} ({eval_s:.2f} s)", step=step, eval_loss=eval_loss,
                          eval_ppl=extra["eval_ppl"], tokens=cfg.eval.batches * tokens_per_step, eval_s=eval_s)
                if is_main and cfg.kpi.progress_every:
                    print(f"eval   {step:>6}/{cfg.steps} | loss {eval_loss:7.4f} | ppl {extra['eval_ppl']:9.2f}",
                          file=out, flush=True)
            kpi.metrics(step, loss=loss_value, aux_loss=aux_value, grad_norm=gnorm, step_time_s=dt,
                        tokens_per_s=tps, mfu=mfu, lr=lr, wait_s=collective_wait_s() - wait0, **noise.sample(),
                        **extra)
            if step == first_step and cfg.checkpoint.every:  # after the first step: the restart does not wait
                import_dcp_in_background()
            if is_main and cfg.kpi.progress_every and (step % cfg.kpi.progress_every == 0 or step == cfg.steps):
                print(_progress_line(step, cfg.steps, loss_value, aux_value, gnorm, lr, tps, mfu, dt), file=out,
                      flush=True)
            if step == cfg.steps or (cfg.checkpoint.every and step % cfg.checkpoint.every == 0):
                trainer_state = {"step": step, "sampler": sampler.state_dict()}
                state = (layout.state(trainer_state, rng_state(ctx)) if layout is not None
                         else checkpoint_state(model, optimizer, named, ctx, trainer_state))
                ckpt.save(step, state, {"world_size": ctx.world_size, "ep": ctx.ep_size, "layout": dims.describe(),
                                        "loss": loss_value},
                          background=cfg.checkpoint.background,
                          on_complete=lambda path, save_s, at=step: checkpoint_done(path, save_s, at))
                gc.collect()
            if (request := jit.requested(step))[0]:
                save_requested(request, ckpt, step, full_state({"step": step, "sampler": sampler.state_dict()}), ctx,
                               kpi, loss_value)
    finally:
        if blocked is not None:
            blocked.close()
        try:
            ckpt.wait()  # a save in flight finishes (or fails loudly) before the run ends
        finally:
            unregister()
        if replicas is not None:
            replicas.close()
        noise.close()
    if replicas is not None:
        replicas.close(finished=True)  # the final checkpoint is on disk: free the nodes' memory
    stability = throughput_stability(summary.tokens_per_s)  # the run's Table 11 figures, on its stop event
    kpi.event("stop", f"finished at step {step}" + (
        f"; step throughput min/peak {stability['min_over_peak']:.3f}, mean/peak {stability['mean_over_peak']:.3f},"
        f" std {stability['std']:.4g} tokens/s" if stability else ""), step=step, throughput_stability=stability)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sigma.train.trainer",
                                     description="Run one rank of a sigma training run (srun/torchrun/submitit).")
    parser.add_argument("--config", required=True, help="run preset YAML (configs/train/<preset>.yaml)")
    parser.add_argument("overrides", nargs="*", help="key=value overrides, e.g. steps=20 parallel.ep=2")
    args = parser.parse_args(argv)
    cfg = load_train_config(args.config, args.overrides)
    if cfg.launch.exit_on_sigterm:
        exit_on_sigterm()
    try:
        train(cfg)
    except TrainingStopped:
        return 3
    return 0


if __name__ == "__main__":
    sys.exit(main())
