"""`sigma numerics record`: train N optimiser steps on a trusted platform and keep what every unit saw and gave.

The step is the trainer's (forward under autocast, cross entropy + aux loss, backward, global-norm clip, AdamW with
warm-up + cosine LR, aux-free bias update) on a small batch, once from random tokens and once from the prepared
corpus, each from the same initial weights.
"""

from __future__ import annotations

import json
import math
import platform
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

import sigma
from sigma.train.numerics.reference import FORMAT, NumericsError, step_path
from sigma.train.numerics.tape import Tape, sampled

DATA_KINDS = ("random", "real")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def build(model_cfg, seed: int, device: torch.device):
    from sigma.train.model import MoETransformer

    torch.manual_seed(seed)
    return MoETransformer(model_cfg).to(device)


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise NumericsError(f"--device {name}: no CUDA device is visible here")
    return torch.device(name)


def batches(kind: str, cfg, vocab_size: int, steps: int, batch: int, seq_len: int) -> list[torch.Tensor]:
    """[batch, seq_len + 1] token rows per step: uniform random tokens, or windows of the prepared corpus."""
    if kind == "random":
        gen = torch.Generator().manual_seed(cfg.seed)
        return [torch.randint(0, vocab_size, (batch, seq_len + 1), generator=gen) for _ in range(steps)]
    from sigma.train import data as data_mod

    path = cfg.data.resolved_path(vocab_size)
    if not (path / data_mod.META_NAME).exists():
        raise NumericsError(f"real-data batches need the prepared corpus at {path}: run `sigma train prepare "
                            f"--out {path} --vocab-size {vocab_size}` (or record with --data random)")
    sampler = data_mod.WindowSampler(data_mod.TokenShards(path), seq_len, batch, cfg.data.seed)
    return [torch.from_numpy(np.asarray(sampler.batch(s), dtype=np.int64)) for s in range(steps)]


def loss_unit(tape: Tape, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """The cross entropy of the trainer as a unit of its own (its inputs: logits and targets)."""
    rec = tape._record("loss", "loss")
    logits, targets = tape.tap_inputs(rec, (logits, targets), keep=tape.keep_args)
    ce = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), targets.reshape(-1))
    return tape.tap_outputs(rec, ce)


def train_step(model, tape: Tape, optimizer, tokens: torch.Tensor, lr: float, grad_clip: float,
               amp_dtype: torch.dtype) -> dict:
    """One optimiser step with the tape running; returns what the candidate needs beyond the unit records."""
    device = next(model.parameters()).device
    tokens = tokens.to(device)
    buffers = {n: b.detach().clone().cpu() for n, b in model.named_buffers() if n.endswith("expert_bias")}
    for group in optimizer.param_groups:
        group["lr"] = lr
    optimizer.zero_grad(set_to_none=True)
    with torch.autocast(device.type, dtype=amp_dtype, enabled=amp_dtype != torch.float32):
        logits, aux = model(tokens[:, :-1])
    ce = loss_unit(tape, logits, tokens[:, 1:])
    (ce + aux).backward()
    tape.finish_step()
    named = [(n, p) for n, p in model.named_parameters() if p.grad is not None]
    grad_norm = math.sqrt(sum(float(p.grad.detach().float().pow(2).sum()) for _, p in named))
    coef = grad_clip / (grad_norm + 1e-6) if grad_clip > 0 and grad_norm > grad_clip else 1.0
    param_grads = {n: sampled(n, p.grad) for n, p in named}
    for _, p in named:
        p.grad.mul_(coef)
    optimizer.step()
    for layer in model.moe_layers():
        if layer.balance == "aux_free":
            layer.update_bias()
    return {"loss": float(ce.detach()), "aux": float(aux.detach()), "grad_norm": grad_norm, "clip_coef": coef,
            "lr": lr, "param_grads": param_grads, "buffers": buffers,
            "params": {n: sampled(n, p) for n, p in model.named_parameters()}}


def record(cfg, out: str | Path, steps: int = 10, batch: int = 2, seq_len: int = 32,
           data: tuple[str, ...] = DATA_KINDS, device: str = "cpu", dtype: str = "float32", log=print) -> dict:
    """Write the reference for run config `cfg` (a TrainConfig) to `out`; returns its metadata."""
    from sigma.train.config import load_model_config
    from sigma.train.trainer import build_optimizer, lr_at

    out = Path(out)
    if (out / "meta.json").exists():
        raise NumericsError(f"{out} already holds a reference; remove it or choose another --out")
    dev, amp = resolve_device(device), DTYPES[dtype]
    model_cfg = load_model_config(cfg.model, {**cfg.model_overrides, "activation_checkpointing": False})
    if seq_len + 1 > model_cfg.max_seq_len + 1 or seq_len < 2:
        raise NumericsError(f"--seq-len {seq_len} must be in [2, max_seq_len={model_cfg.max_seq_len}]")
    model = build(model_cfg, cfg.seed, dev)
    init = {k: v.detach().clone().cpu() for k, v in model.state_dict().items()}
    all_batches = {kind: batches(kind, cfg, model_cfg.vocab_size, steps, batch, seq_len) for kind in data}
    out.mkdir(parents=True, exist_ok=True)
    torch.save(init, out / "init.pt")
    units, t0 = None, time.perf_counter()
    losses = {}
    for kind in data:
        model.load_state_dict(init)
        model.train()
        optimizer, _, _ = build_optimizer(model, cfg.optim, dev)
        tape = Tape(model, cfg.seed).install()
        losses[kind] = []
        try:
            with tape.functions():
                for step in range(1, steps + 1):
                    tape.new_step(step)
                    extra = train_step(model, tape, optimizer, all_batches[kind][step - 1],
                                       lr_at(step, cfg.optim, cfg.steps), cfg.optim.grad_clip, amp)
                    if not math.isfinite(extra["loss"]):
                        raise NumericsError(f"the reference run itself gave a non-finite loss at step {step} "
                                            f"({kind} data): this platform cannot serve as the reference")
                    losses[kind].append(extra["loss"])
                    step_path(out, kind, step).parent.mkdir(parents=True, exist_ok=True)
                    torch.save({"records": {n: r.to_dict() for n, r in tape.records.items()},
                                "forward_order": tape.forward_order, "backward_order": tape.backward_order,
                                **extra}, step_path(out, kind, step))
                    if units is None:
                        units = [[n, tape.records[n].kind] for n in tape.forward_order if tape.records[n].kind]
        finally:
            tape.remove()
        log(f"recorded {steps} steps of {kind} data: loss {losses[kind][0]:.4f} -> {losses[kind][-1]:.4f}")
    meta = {"format": FORMAT, "sigma_version": sigma.__version__, "torch_version": torch.__version__,
            "platform": f"{platform.node()} {platform.machine()} {dev.type}"
                        + (f" {torch.cuda.get_device_name(dev)}" if dev.type == "cuda" else ""),
            "device": dev.type, "dtype": dtype, "threads": torch.get_num_threads(),
            "model": model_cfg.to_dict(), "train": cfg.to_dict(), "steps": steps, "batch": batch,
            "seq_len": seq_len, "data": list(data), "units": units,
            "params": {k: list(v.shape) for k, v in model.named_parameters()}, "losses": losses,
            "seconds": round(time.perf_counter() - t0, 2)}
    (out / "meta.json").write_text(json.dumps(meta, indent=1))
    return meta
