"""The platform's job-level protection for a PyTorch Lightning Trainer, as a Callback.

    from sigma.integrations.lightning import SigmaCallback, resume_checkpoint
    ckpt = ModelCheckpoint(dirpath=CKPT_DIR, every_n_train_steps=500)           # a fixed folder, see below
    trainer = L.Trainer(..., callbacks=[ckpt, SigmaCallback()])
    trainer.fit(model, data, ckpt_path=resume_checkpoint(CKPT_DIR))

What it does (sigma.kpi underneath):
- a KPI line per optimiser step: the loss training_step returned, the gradients' norm (grad_norm=False leaves it
  out; not measured under a sharded strategy), step time, learning rate, tokens/s (with tokens=, a function of the batch), and `wait_s`, the time the step
  waited in DDP's gradient all-reduce (a communication hook on the strategy's DDP model) and in the per-step
  agreement below: from it the controller names a straggler node;
- events: start (and resume, naming the checkpoint fit() was given), every checkpoint a ModelCheckpoint saved
  (reported once the save is complete, at the next batch), validation (a `pause` while it runs: heartbeats go on,
  the hang timeout waits), stop; heartbeats from a thread every 5 s;
- just-in-time checkpoints: before each optimiser step every rank reads the controller's request and the ranks
  agree on it (one all-reduce of three numbers); after the step the Trainer saves through its own checkpointing
  (`trainer.save_checkpoint`, `sigma-step=<step>.ckpt` beside the ModelCheckpoint's files), the callback answers
  and holds until SLURM's SIGTERM (Lightning catches it under SLURM and stops at the end of the batch);
- NaN: the loss of every backward is checked on the device (read once per step, in the agreement); when any rank's
  is not finite the gradients are dropped before the optimiser step (the weights stay as the last healthy step
  left them), the Trainer saves them (`sigma-rollback-step=<step>.ckpt`), the callback reports `nan_loss`, holds
  for the controller's requeue and stops; the resumed run goes on after the batch that gave the NaN;
- resume_checkpoint(dirpath): the newest checkpoint the callback recorded as saved whole (a save cut off by the
  requeue is never picked), else the newest `.ckpt` there, else None: what fit(ckpt_path=...) takes.

Give the ModelCheckpoint a dirpath: by default Lightning writes into a new `version_N` folder each run, where a
requeued run would not look.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable
from pathlib import Path

import lightning.pytorch as pl
import torch
from lightning.pytorch.strategies import DDPStrategy, SingleDeviceStrategy

from sigma import kpi
from sigma.integrations.torch import CollectiveTimer, agree, saved_together

UNSHARDED = (SingleDeviceStrategy, DDPStrategy)  # where this rank's gradients are all of them (their norm is the norm)


def resume_checkpoint(dirpath: str | os.PathLike) -> str | None:
    """What to pass as trainer.fit(..., ckpt_path=...) after a requeue (None: start fresh)."""
    found = kpi.resume_checkpoint(dirpath)
    if found is None:
        saved = sorted(Path(dirpath).glob("*.ckpt"), key=lambda p: p.stat().st_mtime) if Path(dirpath).is_dir() else []
        found = str(saved[-1]) if saved else None
    return found


class SigmaCallback(pl.Callback):
    def __init__(self, run: kpi.Run | None = None, *, dirpath: str | os.PathLike | None = None,
                 tokens: Callable[[object], int] | None = None, grad_norm: bool = True, fault_hooks: bool = False,
                 hold: bool = True, eval_max_s: float = 3600.0):
        """run: a sigma.kpi.Run (made at fit start when None); dirpath: where just-in-time and rollback checkpoints
        go (default: the ModelCheckpoint's folder, else default_root_dir/checkpoints); tokens: batch -> tokens in
        it on this rank; fault_hooks: honour `sigma chaos nan` (testing only); hold: after answering a request or a
        NaN stop, wait for the requeue; eval_max_s: the longest a validation may run before the controller may
        call the job hung."""
        self.run = run
        self.dirpath = dirpath
        self.tokens = tokens
        self.grad_norm = grad_norm
        self.fault_hooks = fault_hooks
        self.holds = hold
        self.eval_max_s = eval_max_s
        self.stopped_on_nan = False
        self._finite = None  # every loss of the step finite (a device tensor: no sync per backward)
        self._norm = None
        self._poison = False
        self._t0: float | None = None  # when the step's first batch began
        self._tokens = 0
        self._last_step = -1
        self._request: kpi.Request | None = None
        self._kind = None  # why the step ends in a save: 'jit' or 'rollback'
        self._in_eval = False
        self._own_save = False
        self._own_step = -1  # the step of the newest just-in-time or rollback save (the manifest names that one)
        self._saving_step: int | None = None  # a ModelCheckpoint save began for this step ...
        self._reported: set[tuple[str, float]] = set()  # ... and these files (path, mtime) were reported

    # ---------- set-up ----------
    def setup(self, trainer, pl_module, stage):
        if self.run is None and stage == "fit":
            self.run = kpi.Run(rank=trainer.global_rank, trainer=f"lightning {pl.__version__} Trainer",
                               fault_hooks=self.fault_hooks)

    def on_train_start(self, trainer, pl_module):
        CollectiveTimer(self.run).attach(trainer.strategy.model)
        self._last_step = trainer.global_step
        resumed = trainer.ckpt_path if trainer.global_step else None
        self.run.start(trainer.global_step, resumed_from=resumed, max_steps=trainer.max_steps,
                       world_size=trainer.world_size)

    def _dir(self, trainer) -> Path:
        if self.dirpath is not None:
            return Path(self.dirpath)
        cb = trainer.checkpoint_callback
        return Path(cb.dirpath) if cb is not None and cb.dirpath else Path(trainer.default_root_dir) / "checkpoints"

    # ---------- every step ----------
    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self._report_saved(trainer)
        self._end_eval()
        if self._t0 is None:
            self._t0, self._tokens = time.perf_counter(), 0
        if self.tokens is not None:
            self._tokens += self.tokens(batch)
        if self.run.nan_injected():
            self._poison = True

    def on_before_backward(self, trainer, pl_module, loss):
        if self._poison:  # the testing-only fault hook: this backward's loss (and so its gradients) become NaN
            self._poison = False
            loss.mul_(float("nan"))
        finite = torch.isfinite(loss.detach()).all()
        self._finite = finite if self._finite is None else self._finite & finite

    def on_before_optimizer_step(self, trainer, pl_module, optimizer):
        bad = self._finite is not None and not bool(self._finite)
        self._finite = None
        request, bad = agree(self.run.checkpoint_request(), bad, self.run)
        if bad:  # drop the gradients: the optimiser leaves the weights as the last healthy step had them
            for group in optimizer.param_groups:
                for p in group["params"]:
                    p.grad = None
            self._kind = "rollback"
        elif request is not None:
            self._request, self._kind = request, "jit"
        if self.grad_norm and not bad and isinstance(trainer.strategy, UNSHARDED):
            grads = [p.grad for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
            self._norm = torch.nn.utils.get_total_norm(grads) if grads else None

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        step = trainer.global_step
        if step == self._last_step:
            return  # accumulating gradients: the optimiser step is still to come
        self._last_step = step
        if self._kind == "rollback":  # no line for a step whose update was dropped
            self._t0 = None
            self._stop_on_nan(trainer, step)
            return
        loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
        lr = trainer.optimizers[0].param_groups[0].get("lr") if trainer.optimizers else None
        norm, self._norm = self._norm, None
        t0, self._t0 = self._t0, None
        self.run.step(step, loss=loss, grad_norm=norm, tokens=self._tokens or None,
                      step_time_s=time.perf_counter() - t0 if t0 is not None else None, learning_rate=lr)
        if self._kind == "jit":
            request, self._kind, self._request = self._request, None, None
            path = self._save(trainer, f"sigma-step={step}.ckpt")
            saved_together(self.run, step, path, request=request)
            if self.holds:
                self.run.hold(request, done=lambda: trainer.received_sigterm)

    def _stop_on_nan(self, trainer, step: int) -> None:
        self._kind = None
        path = self._save(trainer, f"sigma-rollback-step={step}.ckpt")
        saved_together(self.run, step, path, kind="rollback")
        self.stopped_on_nan = True
        self.run.nonfinite(step, float("nan"), f"non-finite loss at step {step}: its update was not applied; {path} "
                                               f"holds the model before it; training stopped")
        if self.holds:
            self.run.hold(max_s=kpi.NAN_HOLD_S, done=lambda: trainer.received_sigterm)
        trainer.should_stop = True

    # ---------- checkpoints ----------
    def _save(self, trainer, name: str) -> str:
        """Through Lightning's own checkpointing (every rank: it is a collective)."""
        path = self._dir(trainer) / name
        self._own_save, self._own_step = True, trainer.global_step
        try:
            trainer.save_checkpoint(path)
        finally:
            self._own_save = False
        return str(path)

    def on_save_checkpoint(self, trainer, pl_module, checkpoint):
        if not self._own_save:
            self._saving_step = int(checkpoint.get("global_step", trainer.global_step))

    def _report_saved(self, trainer) -> None:
        """Report the files the ModelCheckpoints saved since the last call (a save is complete once the Trainer goes
        on: its checkpoint callbacks run last in a hook, and the next hook comes after them)."""
        if self._saving_step is None:
            return
        for cb in trainer.checkpoint_callbacks:
            for path in {cb.last_model_path, cb.best_model_path, *getattr(cb, "best_k_models", {})}:
                try:
                    key = (str(path), os.stat(path).st_mtime) if path else None
                except OSError:
                    continue
                if key and key not in self._reported:
                    self._reported.add(key)
                    # a ModelCheckpoint save of the step just saved for a request or a NaN is the same state: the
                    # manifest keeps naming ours, and so the resumed run says why it resumed there
                    self.run.checkpoint_saved(self._saving_step, path,
                                              manifest=trainer.is_global_zero and self._saving_step != self._own_step)
        self._saving_step = None

    # ---------- validation: a pause with heartbeats, not a hang ----------
    def on_validation_start(self, trainer, pl_module):
        self._report_saved(trainer)
        if self.run is not None and not trainer.sanity_checking and trainer.global_step:
            self._in_eval = True
            self.run.event("pause", "validation", max_s=self.eval_max_s)

    def on_validation_end(self, trainer, pl_module):
        if self._in_eval:
            self._end_eval()
            metrics = {k: float(v) for k, v in trainer.callback_metrics.items()
                       if getattr(v, "numel", lambda: 1)() == 1 and math.isfinite(float(v))}
            self.run.evaluation(trainer.global_step, **metrics)

    def _end_eval(self) -> None:
        if self._in_eval:
            self._in_eval = False
            self.run.event("pause_end", "validation")

    # ---------- the end ----------
    def on_train_end(self, trainer, pl_module):
        self._report_saved(trainer)
        if not self.stopped_on_nan:
            self.run.stop(trainer.global_step)

    def on_exception(self, trainer, pl_module, exception):
        if self.run is not None:  # SLURM's SIGTERM (a requeue) ends fit() here
            self._report_saved(trainer)

    def teardown(self, trainer, pl_module, stage):
        if stage == "fit" and self.run is not None:
            self.run.close()
