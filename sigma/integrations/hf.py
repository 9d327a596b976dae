"""The platform's job-level protection for a Hugging Face `transformers` Trainer, as a TrainerCallback.

    from sigma.integrations.hf import resume_checkpoint, watch
    trainer = Trainer(model=model, args=args, train_dataset=data)
    watch(trainer)                                                   # or callbacks=[SigmaCallback()]
    trainer.train(resume_from_checkpoint=resume_checkpoint(args.output_dir))

What it does (sigma.kpi underneath):
- a KPI line per optimiser step: loss and grad_norm (from the Trainer's logs when it logs that step: set
  logging_steps=1 to have them every step), step time, tokens/s (with include_num_input_tokens_seen), learning rate,
  and `wait_s`, the time the step waited in DDP's gradient all-reduce (with watch(trainer), which can reach the
  DDP model): from it the controller names a straggler node;
- events: start (and resume, naming the checkpoint), every checkpoint the Trainer saves, evaluations (as a pause
  with heartbeats: no hang), stop; heartbeats from a thread every 5 s;
- just-in-time checkpoints: between steps every rank reads the controller's request and the ranks agree on it
  (one all-reduce of three numbers per step); the Trainer then saves through its own checkpointing
  (`checkpoint-<step>` in output_dir), the callback answers and holds until the requeue;
- NaN: the loss of every forward pass is checked (on the device, read once per step); when any rank's is not
  finite, the update is not applied (the gradients are dropped before the optimiser step), the Trainer saves the
  model as it was before that step, the callback reports `nan_loss` and holds for the controller's requeue; the
  resumed run goes on after the batch that gave the NaN;
- resume_checkpoint(output_dir): the newest checkpoint the callback recorded as saved whole (a save cut off by the
  requeue is never picked), else the Trainer's own newest, else None (a fresh start).
"""

from __future__ import annotations

import math
import os
import time

import torch
from transformers import TrainerCallback
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR, get_last_checkpoint

from sigma import kpi
from sigma.integrations.torch import CollectiveTimer, agree, saved_together


def resume_checkpoint(output_dir: str) -> str | None:
    """What to pass as trainer.train(resume_from_checkpoint=...) after a requeue (None: start fresh)."""
    found = kpi.resume_checkpoint(output_dir)
    if found is None and os.path.isdir(output_dir):
        found = get_last_checkpoint(output_dir)
    return found


def watch(trainer, **kwargs) -> "SigmaCallback":
    """Add a SigmaCallback that can reach the trainer's DDP model (for wait_s); returns it."""
    callback = SigmaCallback(trainer=trainer, **kwargs)
    trainer.add_callback(callback)
    return callback


class SigmaCallback(TrainerCallback):
    def __init__(self, run: kpi.Run | None = None, *, trainer=None, fault_hooks: bool = False, hold: bool = True,
                 eval_max_s: float = 3600.0):
        """run: a sigma.kpi.Run (made at train begin when None); fault_hooks: honour `sigma chaos nan` (testing
        only); hold: after answering a request or a NaN stop, wait for the requeue; eval_max_s: the longest an
        evaluation may run before the controller may call the job hung."""
        self.run = run
        self.trainer = trainer
        self.fault_hooks = fault_hooks
        self.holds = hold
        self.eval_max_s = eval_max_s
        self.stopped_on_nan = False
        self._finite = None  # all losses of the step finite (a device tensor: no sync per forward)
        self._poison = False
        self._t0 = 0.0
        self._tokens = 0
        self._row: dict | None = None  # the step's line, waiting for the Trainer's log of that step
        self._request: kpi.Request | None = None
        self._kind = None  # why the next save happens: 'jit' or 'rollback'
        self._in_eval = False
        self._hook = None

    # ---------- set-up ----------
    def on_train_begin(self, args, state, control, model=None, **kwargs):
        import transformers

        if self.run is None:
            self.run = kpi.Run(rank=args.process_index, trainer=f"transformers {transformers.__version__} Trainer",
                               fault_hooks=self.fault_hooks)
        if model is not None and self._hook is None:
            self._hook = model.register_forward_hook(self._on_forward)
        if self.trainer is not None:
            CollectiveTimer(self.run).attach(self.trainer.model_wrapped)
        resumed = None
        if state.global_step:
            info = kpi.resume_info(args.output_dir)
            resumed = (info["path"] if info and info.get("step") == state.global_step else
                       os.path.join(args.output_dir, f"{PREFIX_CHECKPOINT_DIR}-{state.global_step}"))
        self._tokens = state.num_input_tokens_seen or 0
        self.run.start(state.global_step, resumed_from=resumed, max_steps=state.max_steps,
                       world_size=args.world_size)

    def _on_forward(self, module, inputs, output):
        loss = output.get("loss") if isinstance(output, dict) else None
        if loss is None or not module.training:
            return None
        if self._poison:  # the testing-only fault hook: this forward's loss becomes NaN
            self._poison = False
            output["loss"] = loss = loss * float("nan")
        finite = torch.isfinite(loss.detach()).all()
        self._finite = finite if self._finite is None else self._finite & finite
        return output

    # ---------- every step ----------
    def on_step_begin(self, args, state, control, **kwargs):
        self._t0 = time.perf_counter()
        self._finite = None
        if self.run.nan_injected():
            self._poison = True
        if self._in_eval:  # an evaluation ended without on_evaluate (e.g. it raised and was caught)
            self._end_eval()

    def on_pre_optimizer_step(self, args, state, control, model=None, **kwargs):
        bad = self._finite is not None and not bool(self._finite)
        request, bad = agree(self.run.checkpoint_request(), bad, self.run)
        if bad:  # drop the gradients: the optimiser leaves the weights as the last healthy step had them
            for p in (model.parameters() if model is not None else ()):
                p.grad = None
            self._kind = "rollback"
        elif request is not None:
            self._request, self._kind = request, "jit"

    def on_step_end(self, args, state, control, **kwargs):
        step, dt = state.global_step, time.perf_counter() - self._t0
        if self._kind is not None:
            control.should_save = True  # through the Trainer's own checkpointing, right after this step
        if self._kind == "rollback":
            control.should_training_stop = True
            return control  # no line for a step whose update was dropped
        tokens = (state.num_input_tokens_seen or 0) - self._tokens
        self._tokens = state.num_input_tokens_seen or 0
        self._row = {"step": step, "step_time_s": dt, "tokens": tokens or None}
        if not control.should_log:
            self._flush()
        return control

    def on_log(self, args, state, control, logs=None, **kwargs):
        if self._row is not None and logs:
            self._row.update(loss=logs.get("loss"), grad_norm=logs.get("grad_norm"),
                             learning_rate=logs.get("learning_rate"))
        self._flush()

    def _flush(self) -> None:
        row, self._row = self._row, None
        if row is not None:
            self.run.step(**{k: v for k, v in row.items() if v is not None})

    # ---------- checkpoints ----------
    def on_save(self, args, state, control, **kwargs):
        self._flush()
        step = state.global_step
        path = os.path.join(args.output_dir, f"{PREFIX_CHECKPOINT_DIR}-{step}")
        kind, request = self._kind or "periodic", self._request
        self._kind, self._request = None, None
        if kind == "periodic":
            self.run.checkpoint_saved(step, path, kind=kind, manifest=state.is_world_process_zero)
        else:  # an answer, or a NaN stop: the requeue follows at once, so every rank's part must be written
            saved_together(self.run, step, path, request=request, kind=kind)
        if kind == "rollback":
            self.stopped_on_nan = True
            self.run.nonfinite(step, float("nan"), f"non-finite loss at step {step}: its update was not applied; "
                                                   f"{path} holds the model before it; training stopped")
            if self.holds:
                self.run.hold(max_s=kpi.NAN_HOLD_S)
        elif request is not None and self.holds:
            self.run.hold(request)

    # ---------- evaluation: a pause with heartbeats, not a hang ----------
    def on_prediction_step(self, args, state, control, **kwargs):
        if not self._in_eval and state.global_step:
            self._in_eval = True
            self.run.event("pause", "evaluation", max_s=self.eval_max_s)

    def on_evaluate(self, args, state, control, metrics=None, **kwargs):
        self._end_eval()
        values = {k: v for k, v in (metrics or {}).items() if isinstance(v, (int, float)) and math.isfinite(v)}
        self.run.evaluation(state.global_step, **values)

    def _end_eval(self) -> None:
        if self._in_eval:
            self._in_eval = False
            self.run.event("pause_end", "evaluation")

    def on_train_end(self, args, state, control, **kwargs):
        self._flush()
        if self._hook is not None:
            self._hook.remove()
            self._hook = None
        if not self.stopped_on_nan:
            self.run.stop(state.global_step)
        self.run.close()
