"""Just-in-time checkpoints: save the current step when the controller asks, and the last healthy step on NaN.

The controller, about to requeue a job, asks its healthy nodes through their sidecars; each sidecar writes the
control file `<KPI dir>/job-<id>/checkpoint-request.<node>.json` (sigma/telemetry/control.py). Between steps every
rank reads its node's file and the ranks agree on the newest request with one small all-reduce (a rank whose node
was not asked, the bad node, learns it from the others), then all save the step they have just finished and each
logs a `checkpoint` event naming the request: the controller's answer. A request is answered once: the checkpoint
records its id, so a run resumed from it does not save again for the same request.

On a NaN/Inf loss the ranks stop before the optimiser applies the bad gradient, so the model and optimiser still
hold the previous step; `JitCheckpoints.rollback` saves that step (with the sampler position and RNG state from
before the poisoned step) when no checkpoint of it exists yet, and the requeued run resumes from the last healthy
step, never from a NaN state.
"""

from __future__ import annotations

import contextlib
import datetime
import threading
import time
from pathlib import Path

import torch

from sigma.telemetry.control import REQUEST_NAME, read_request  # the control file the sidecar writes


def save_errors() -> tuple:
    """What a failed save raises: DCP wraps a rank's ENOSPC/EFBIG/EIO in a BaseException subclass. Imported only
    when a save failed (the save imported DCP already): a start-up that resumes from a replica never pays for it."""
    from torch.distributed.checkpoint.api import CheckpointException

    return Exception, CheckpointException

MAX_HOLD_S = 300.0  # a deadline further away than this (a clock far off) holds no longer


class JitCheckpoints:
    """Per rank: poll the control file, agree on requests, save; and the NaN rollback save."""

    def __init__(self, job_dir: Path, node: str, ctx, poll_every: int = 1, answered: int = 0,
                 since: float | None = None):
        self.path = Path(job_dir) / REQUEST_NAME.format(node=node)
        self.ctx = ctx
        self.poll_every = poll_every
        self.answered = answered  # newest request id already answered (from the checkpoint resumed)
        # when this run's process started: a control file written before is an earlier run's request, answered
        # by the checkpoint or replica this run resumed from (a replica does not record the request it answered),
        # and answering it again would save once more and hold until its deadline, the requeue long done
        self.since = since
        self._before_step = None  # (sampler state, RNG state) at the start of the current step
        # the newest step whose state the model and optimiser hold, with its sampler and RNG state; the lock is
        # held while the training thread changes them (optimiser step, bias update), which needs no collective
        self.lock = threading.Lock()
        self.boundary: tuple[int, dict, dict] | None = None
        self.settled_at = time.monotonic()
        self.step_s = 0.0  # between the last two settled steps

    def requested(self, step: int) -> tuple[int, float]:
        """Collective every poll_every steps: (id, deadline) of the newest unanswered request any rank's node was
        given, or (0, 0.0)."""
        if not self.poll_every or step % self.poll_every:
            return 0, 0.0
        found, deadline = read_request(self.path, time.time(), self.since)
        newest = torch.tensor([found, deadline] if found > self.answered else [0, 0], dtype=torch.float64,
                              device=self.ctx.device)  # NCCL reduces only device tensors
        if self.ctx.distributed:
            import torch.distributed as dist

            dist.all_reduce(newest, op=dist.ReduceOp.MAX)  # ids and deadlines: float64 holds both exactly
        found, deadline = int(newest[0].item()), float(newest[1].item())
        if found:
            self.answered = found
        return found, deadline

    def begin_step(self, sampler_state: dict, rng: dict) -> None:
        """Remember where the step starts from: a NaN rollback saves exactly this."""
        self._before_step = (sampler_state, rng)

    @contextlib.contextmanager
    def mutating(self):
        """Around the optimiser step and the bias update: the state is neither the last step's nor the next's."""
        with self.lock:
            yield

    def settled(self, step: int, sampler_state: dict, rng: dict) -> None:
        """Step `step` is complete: model and optimiser hold its state until the next `mutating`."""
        with self.lock:
            now = time.monotonic()
            self.boundary = (step, sampler_state, rng)
            self.step_s, self.settled_at = now - self.settled_at, now

    def rollback_state(self, state: dict, step: int) -> dict | None:
        """The checkpoint state of step - 1 (model and optimiser untouched by the poisoned step), or None when
        there is nothing to roll back to."""
        if self._before_step is None or step < 2:
            return None
        sampler_state, rng = self._before_step
        state["trainer"] = {"step": step - 1, "sampler": sampler_state}
        state["rng"] = rng
        return state


def saved_request(meta: dict) -> int:
    """The request id a checkpoint answered (0: a periodic one)."""
    try:
        return int(meta.get("request") or 0)
    except (TypeError, ValueError):
        return 0


def _meta(ctx, kind: str, **extra) -> dict:
    return {"world_size": ctx.world_size, "ep": ctx.ep_size, "kind": kind, **extra}


def save_requested(request: tuple[int, float], ckpt, step: int, state: dict, ctx, kpi, loss: float) -> Path | None:
    """Every rank together: save the step just finished for request (id, deadline) (unless this very step's
    periodic checkpoint is already on its way), answer with a `checkpoint` event naming the request, then hold
    until the deadline: the requeue is coming, and a step trained now would be lost with it. Should the requeue
    not come (the controller went away), training goes on after the deadline."""
    request, deadline = request
    from sigma.train.checkpoint import step_dir_name

    started = time.monotonic()
    if ckpt.last_saved_step == step:  # decided alike on every rank: each called save() for this step
        ckpt.wait()
        path = ckpt.root / step_dir_name(step)
    else:
        try:
            path = ckpt.save(step, state, _meta(ctx, "jit", loss=loss, request=request), background=False)
        except save_errors() as exc:  # DCP raises on every rank; a full disk leaves the older checkpoints as they are
            kpi.event("checkpoint_failed", f"just-in-time checkpoint of step {step} for request {request} failed: "
                                           f"{exc}; the newest complete checkpoint is {ckpt.latest()}", step=step,
                      request=request)
            return None
    save_s = round(time.monotonic() - started, 3)
    kpi.event("checkpoint", f"just-in-time checkpoint of step {step} for request {request}: {path}", step=step,
              path=str(path), save_s=save_s, kind="jit", request=request)
    if deadline:
        why = hold(min(deadline, time.time() + MAX_HOLD_S), default_store(ctx), request)
        if why != "deadline":  # the requeue is under way and reached the others, not this rank: leave as they did
            from sigma.train import terminate

            terminate.leave(f"the other ranks left after the just-in-time checkpoint of step {step} ({why}), "
                            f"this rank got no SIGTERM (its node's slurmd gone?)")
    return path


LEFT_KEY = "sigma/jit-left/{request}"  # set in the process group's store by a rank leaving after an answer
STORE_CHECK_S = 2.0  # one store check while holding waits at most this long


def default_store(ctx):
    """The process group's key-value store (served by rank 0's process), or None in a single process."""
    if not ctx.distributed:
        return None
    from torch.distributed import distributed_c10d

    return distributed_c10d._get_default_store()


def hold(until: float, store, request: int, tick_s: float = 0.25) -> str:
    """Wait after answering a request until `until` (its deadline), SIGTERM (the requeue: terminate.py exits), or
    another rank's leaving: a rank whose node's slurmd is gone gets no SIGTERM, and holding on would keep the
    requeued job from ending (SLURM waits for its processes) until the deadline. Each rank marks its SIGTERM exit in
    the store; a store that stops answering means rank 0's process, which serves it, is gone. Returns why the hold
    ended ('deadline', 'peer left', 'store gone')."""
    from sigma.train import terminate

    key = LEFT_KEY.format(request=request)
    unregister = (terminate.finish_before_exit(lambda: store.set(key, "1")) if store is not None
                  else (lambda: None))
    timeout = store.timeout if store is not None else None
    if store is not None:  # a server on a machine that died never resets the connection: bound each check
        store.set_timeout(datetime.timedelta(seconds=STORE_CHECK_S))
    try:
        while (left := until - time.time()) > 0:
            time.sleep(min(tick_s, left))
            if store is None:
                continue
            try:
                if store.check([key]):
                    return "peer left"
            except Exception:  # noqa: BLE001 - any failure to reach the store: its server's process is gone
                return "store gone"
        return "deadline"
    finally:
        unregister()
        if store is not None:
            with contextlib.suppress(Exception):
                store.set_timeout(timeout)


def save_rollback(jit: JitCheckpoints, ckpt, step: int, state: dict, ctx, kpi) -> Path | None:
    """Every rank together, on a NaN/Inf loss at `step`: save step - 1 (the last healthy one) unless a checkpoint
    of it exists; a failed save is logged, never raised (the NaN stop is what the run reports)."""
    ckpt.wait()
    if ckpt.last_saved_step == step - 1 or jit.rollback_state(state, step) is None:
        return None
    started = time.monotonic()
    # a SIGTERM meanwhile (a requeue, a cancel) ends the rank only once the save and its record are written
    with ckpt.in_flight():
        try:
            path = ckpt.save(step - 1, state, _meta(ctx, "rollback"), background=False)
        except save_errors() as exc:  # a full disk: the older checkpoints are left as they are
            kpi.event("checkpoint_failed", f"rollback checkpoint of step {step - 1} failed: {exc}", step=step - 1)
            return None
        kpi.event("checkpoint", f"rollback checkpoint of step {step - 1}, the last before the non-finite loss: "
                  f"{path}", step=step - 1, path=str(path), save_s=round(time.monotonic() - started, 3),
                  kind="rollback")
    return path


BLOCKED_AFTER_S = 2.0  # a request unanswered this long (or 3 step times) with no step finished: the thread is stuck


class BlockedAnswer:
    """A thread per rank that answers a request while the training thread cannot: blocked in a collective with a
    hung rank, it never reaches the between-steps poll.

    What is consistent then: the training thread changes model and optimiser only between `mutating` and
    `settled` (optimiser step, bias update), a stretch with no collective in it, so a thread blocked in a collective
    is either before the step's optimiser step (the state is the previous step's) or after the step's bias update
    (the step's); `JitCheckpoints.boundary` names that step, with the sampler and RNG state taken when it ended.
    This thread copies that state under the lock (a training thread that comes back waits for the copy) and keeps
    it as a replica of the step on the checkpoint directory (replica.PeerReplicas.keep_on_disk), with the replicas
    its node holds: the hung rank's state comes from the replica it sent its peer, as nothing can read it from the
    stopped process. The requeued run resumes from that set when it is complete, else
    from the newest complete set or the periodic checkpoint (its `resume` event says which)."""

    def __init__(self, jit: JitCheckpoints, replicas, take_state, kpi, interval_s: float = 0.25):
        self.jit, self.replicas, self.take_state, self.kpi = jit, replicas, take_state, kpi
        self.interval_s = interval_s
        self.answered = jit.answered
        self._seen: dict[int, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="sigma-jit-blocked", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.poll(time.time(), time.monotonic())
            except Exception as exc:  # never a reason to stop training; the controller's deadline covers it
                self.kpi.event("checkpoint_failed", f"answer while blocked failed: {exc}")

    def poll(self, now: float, mono: float) -> int:
        """Answer the newest request if the training thread finished no step since it came, nor for
        BLOCKED_AFTER_S (or three of its step times) before now; returns the step kept, or 0."""
        found, _ = read_request(self.jit.path, now, self.jit.since)
        if not found or found <= max(self.answered, self.jit.answered):
            return 0
        seen = self._seen.setdefault(found, mono)
        # stuck: no step finished since the request came, nor for BLOCKED_AFTER_S (or three step times) before
        # now; counted from the last finished step, not from the request, so a job hung long before the controller
        # asked (its hang timeout, a dead node's) is answered at once rather than BLOCKED_AFTER_S later
        if self.jit.settled_at > seen or mono - self.jit.settled_at < max(BLOCKED_AFTER_S, 3 * self.jit.step_s):
            return 0  # the training thread is stepping: it answers at its next poll
        self.answered = found
        started = time.monotonic()
        with self.jit.lock:
            if self.jit.boundary is None:
                return 0
            step, sampler_state, rng = self.jit.boundary
            state = self.take_state(step, sampler_state, rng)
        kept = self.replicas.keep_on_disk(step, state)
        missing = [r for r in range(self.replicas.ctx.world_size) if r not in kept]
        where = (f"every rank's state of step {step} is now on disk" if not missing else
                 f"rank(s) {', '.join(map(str, missing))} not held for step {step} here: the resume takes them "
                 f"from another node's answer or replica, else from the newest complete replica set or periodic "
                 f"checkpoint")
        self.kpi.event("checkpoint", f"just-in-time checkpoint of step {step} for request {found} while blocked in "
                                     f"a collective: rank(s) {', '.join(map(str, kept))} kept under "
                                     f"{self.replicas.shared}; {where}", step=step, kind="jit-blocked",
                       request=found, blocked=True, ranks=kept, missing=missing, path=str(self.replicas.shared),
                       save_s=round(time.monotonic() - started, 3))
        return step
