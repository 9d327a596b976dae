"""Report a training job to the platform from any trainer: `from sigma import kpi`.

Standard library only (no torch, nothing else of sigma's), so a training script of any framework can import it.

    run = kpi.Run()                                     # rank from RANK / SLURM_PROCID
    run.start(step, resumed_from=path)                  # once the state is loaded
    run.step(step, loss=loss, grad_norm=gn, tokens=n)   # every optimiser step
    if (req := run.checkpoint_request()):               # between steps: the controller asks before a requeue
        save(...); run.checkpoint_saved(step, path, request=req); run.hold(req)
    run.checkpoint_saved(step, path)                    # the job's own periodic checkpoints too
    resume = kpi.resume_checkpoint(ckpt_dir)            # after a requeue: the newest checkpoint saved whole

Everything goes through the KPI protocol of docs/telemetry.md: each rank appends JSON lines to
`$SIGMA_KPI_DIR/job-<SLURM_JOB_ID>/rank-<RANK>.<NODE>.jsonl`, which the node's sidecar tails, and reads the
controller's just-in-time checkpoint request from the control file the sidecar writes beside it
(sigma/telemetry/control.py). Where the platform is absent (not a SLURM job, no KPI directory, a file that cannot be
written) a Run is a no-op that says so once on stderr; it never raises into the training loop and never waits on
anything but `hold`, which a caller asks for.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import socket
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from sigma.telemetry.control import NAN_TRIGGER, REQUEST_NAME, read_request

DEFAULT_KPI_DIR = "/var/spool/sigma/kpi"
REQUIRED_FIELDS = ("ts", "job_id", "rank")
METRIC_FIELDS = ("loss", "grad_norm", "step_time_s", "tokens_per_s", "mfu")
MANIFEST = "sigma-checkpoint.json"  # beside a job's checkpoints: the newest one saved whole (resume_checkpoint)
MAX_HOLD_S = 300.0  # hold after an answer no longer than this, whatever the deadline says (a clock far off)
NAN_HOLD_S = 120.0  # after a NaN stop, wait this long for the controller's requeue before ending the run
HEARTBEAT_S = 5.0  # the controller calls a node silent after 15 s without one (detect/laggard.py)


def job_id_from_env(env=None) -> int:
    """SLURM's job id; under submitit's local executor its job id; 0 for a bare process."""
    env = os.environ if env is None else env
    for key in ("SLURM_ARRAY_JOB_ID", "SLURM_JOB_ID", "SUBMITIT_LOCAL_JOB_ID", "SIGMA_JOB_ID"):
        value = env.get(key, "")
        if value.isdigit():
            return int(value)
    return 0


def rank_from_env(env=None) -> int:
    """The global rank: torchrun's RANK, else SLURM's task id, else 0."""
    env = os.environ if env is None else env
    for key in ("RANK", "SLURM_PROCID"):
        if env.get(key, "").isdigit():
            return int(env[key])
    return 0


def node_name(env=None) -> str:
    env = os.environ if env is None else env
    return env.get("SLURMD_NODENAME") or socket.gethostname().split(".")[0]


def kpi_path(kpi_dir: str | Path, job_id: int, rank: int, node: str) -> Path:
    return Path(kpi_dir) / f"job-{job_id}" / f"rank-{rank}.{node}.jsonl"


def _clean(value):
    """JSON has no NaN/Inf: write them as strings so every line stays valid JSON."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    return value


class KpiWriter:
    """One rank's KPI file: every line written whole with one write, under a lock (threads share it)."""

    def __init__(self, rank: int, kpi_dir: str | Path | None = None, job_id: int | None = None,
                 node: str | None = None):
        self.rank = rank
        self.job_id = job_id_from_env() if job_id is None else job_id
        self.node = node or node_name()
        explicit = kpi_dir or os.environ.get("SIGMA_KPI_DIR")
        self.path = kpi_path(explicit or DEFAULT_KPI_DIR, self.job_id, rank, self.node)
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except PermissionError:
            if explicit:
                raise
            # No sidecar spool on this machine (e.g. a laptop): keep the KPIs where the user can read them.
            self.path = kpi_path(Path.home() / ".local" / "state" / "sigma" / "kpi", self.job_id, rank, self.node)
            self.path.parent.mkdir(parents=True, exist_ok=True)
        # Line-buffered append: a line is on disk (page cache) as soon as it is written, whole.
        self._file = open(self.path, "a", buffering=1, encoding="utf-8")
        self._lock = threading.Lock()
        self._stop = threading.Event()

    def _write(self, record: dict, raw: dict | None = None) -> dict:
        """raw: metric values written as they are (a NaN loss as JSON's NaN, which the sidecar reads as a
        non-finite loss), everything else cleaned."""
        line = {"ts": time.time(), "job_id": self.job_id, "rank": self.rank, **_clean(record), **(raw or {})}
        text = json.dumps(line, separators=(",", ":")) + "\n"
        with self._lock:
            if not self._file.closed:
                self._file.write(text)
        return line

    def start_heartbeat(self, interval_s: float) -> None:
        """A `heartbeat` event every interval_s from a thread: it goes on while the training loop waits in a
        collective for a stuck peer, and stops when this process is stopped, so a hung rank is the silent one."""
        if interval_s <= 0:
            return

        def beat():
            while not self._stop.wait(interval_s):
                try:
                    self.event("heartbeat", "alive")
                except (OSError, ValueError):
                    return  # the file went away (closed, disk gone): the silence says it

        threading.Thread(target=beat, name="kpi-heartbeat", daemon=True).start()

    def metrics(self, step: int, **values) -> dict:
        return self._write({"step": int(step), **values})

    def event(self, event: str, message: str, /, **fields) -> dict:
        return self._write({"event": event, "message": message, **fields})

    def close(self) -> None:
        self._stop.set()
        with self._lock:
            if not self._file.closed:
                self._file.flush()
                os.fsync(self._file.fileno())
                self._file.close()


def read_kpis(path: str | Path) -> list[dict]:
    """All lines of one KPI file (for tests and tools); a torn last line from a killed writer is skipped."""
    records = []
    for line in Path(path).read_text().splitlines():
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return records


@dataclass(frozen=True)
class Request:
    """The controller's just-in-time checkpoint request: save the step just finished before `deadline` (unix s)."""
    id: int
    deadline: float


def resume_checkpoint(directory: str | Path) -> str | None:
    """The checkpoint to resume from after a requeue: the newest one `Run.checkpoint_saved` recorded in its
    directory (written only once the save was complete, so a save cut off by the requeue is never picked), if it
    is still there; None for a fresh start."""
    info = resume_info(directory)
    return info["path"] if info else None


def resume_info(directory: str | Path) -> dict | None:
    """The manifest behind resume_checkpoint: {"path", "step", "kind", "request", "job_id", "ts"}, or None."""
    try:
        info = json.loads((Path(directory) / MANIFEST).read_text())
        return info if isinstance(info, dict) and Path(info["path"]).exists() else None
    except (OSError, ValueError, KeyError, TypeError):
        return None


_warned: set[str] = set()


def _warn(what: str) -> None:
    """One line on stderr (the job's output) per kind of trouble, per process."""
    if what not in _warned:
        _warned.add(what)
        print(f"sigma.kpi: {what}", file=sys.stderr, flush=True)


def _process_start() -> float:
    """When this process started (unix s): a control file older than that was written for an earlier run."""
    try:
        ticks = int(Path("/proc/self/stat").read_text().rpartition(")")[2].split()[19])
        boot = next(float(line.split()[1]) for line in Path("/proc/stat").read_text().splitlines()
                    if line.startswith("btime "))
        return boot + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, StopIteration):
        return time.time()


class Run:
    """One rank's reporter. Every method is safe to call with the platform absent (a no-op) and never raises."""

    def __init__(self, rank: int | None = None, *, trainer: str = "", heartbeat_s: float = HEARTBEAT_S,
                 fault_hooks: bool = False, kpi_dir: str | Path | None = None, job_id: int | None = None,
                 node: str | None = None):
        """trainer: what runs (on the start event); fault_hooks: honour `sigma chaos nan` (testing only)."""
        self.rank = rank_from_env() if rank is None else rank
        self.trainer = trainer
        self.heartbeat_s = heartbeat_s
        self.fault_hooks = fault_hooks
        self.job_id = job_id_from_env() if job_id is None else job_id
        self.node = node or node_name()
        self.since = _process_start()
        self.answered = 0  # the newest request id answered (by this run, or by the checkpoint it resumed from)
        self._writer: KpiWriter | None = None
        self.path: Path | None = None  # this rank's KPI file (None when reporting is off)
        self._last_step_t: float | None = None
        self._wait_s = 0.0
        self._wait_lock = threading.Lock()
        directory = kpi_dir or os.environ.get("SIGMA_KPI_DIR")
        if not self.job_id:
            _warn("not a SLURM job (no SLURM_JOB_ID): the platform does not watch this run; KPI reporting is off")
        elif directory is None and not Path(DEFAULT_KPI_DIR).is_dir():
            _warn(f"no KPI directory ($SIGMA_KPI_DIR unset, no {DEFAULT_KPI_DIR}): this node runs no sigma sidecar, "
                  f"so the platform does not watch this job; KPI reporting is off")
        else:
            try:
                self._writer = KpiWriter(self.rank, directory or DEFAULT_KPI_DIR, self.job_id, self.node)
                self.path = self._writer.path
            except OSError as exc:
                _warn(f"cannot write KPIs under {directory or DEFAULT_KPI_DIR} ({exc}): KPI reporting is off")

    @property
    def enabled(self) -> bool:
        return self._writer is not None

    def _write(self, record: dict, raw: dict | None = None) -> None:
        if self._writer is None:
            return
        try:
            self._writer._write(record, raw)
        except (OSError, ValueError, TypeError) as exc:  # a full disk, a value JSON cannot take: say it, go on
            _warn(f"a KPI line could not be written ({exc}); later lines are still tried")

    # ---------- what the run reports ----------
    def start(self, step: int = 0, *, resumed_from: str | Path | None = None, checkpoint_kind: str | None = None,
              answers_requests: bool = True, **fields) -> None:
        """The run began at `step` (after loading its state). resumed_from: the checkpoint it loaded (a `resume`
        event with its kind: `jit`, `periodic`, `rollback`); answers_requests: it polls checkpoint_request between
        steps, so the controller asks before a requeue and waits for the answer."""
        if resumed_from is not None:
            info = resume_info(Path(resumed_from).parent) or {}
            if info.get("path") == str(resumed_from):
                self.answered = max(self.answered, int(info.get("request") or 0))
                checkpoint_kind = checkpoint_kind or info.get("kind")
            self.event("resume", f"resumed from {resumed_from} at step {step}", step=int(step),
                       checkpoint=str(resumed_from), checkpoint_kind=checkpoint_kind or "periodic")
        self.event("start", f"{self.trainer or 'training'} from step {step} on node {self.node}, rank {self.rank}",
                   step=int(step), trainer=self.trainer, jit_poll_every=1 if answers_requests else 0,
                   fault_hooks=["nan"] if self.fault_hooks else [], **fields)
        self._last_step_t = time.perf_counter()
        if self._writer is not None:
            self._writer.start_heartbeat(self.heartbeat_s)

    def step(self, step: int, *, loss=None, grad_norm=None, tokens: float | None = None,
             step_time_s: float | None = None, **extra) -> None:
        """One optimiser step finished. tokens: processed in it by this rank (gives tokens_per_s); step_time_s:
        measured from the previous call when not given; loss and grad_norm may be tensors (read with float())."""
        now = time.perf_counter()
        if step_time_s is None and self._last_step_t is not None:
            step_time_s = now - self._last_step_t
        self._last_step_t = now
        if self._writer is None:
            return
        record: dict = {"step": int(step)}
        raw = {}
        for key, value in (("loss", loss), ("grad_norm", grad_norm)):
            if value is not None:
                with contextlib.suppress(TypeError, ValueError, RuntimeError):
                    raw[key] = float(value)  # NaN stays NaN: the sidecar stores it as a non-finite loss
        if step_time_s is not None:
            record["step_time_s"] = round(float(step_time_s), 6)
            if tokens and step_time_s > 0:
                record["tokens_per_s"] = float(tokens) / float(step_time_s)
        with self._wait_lock:
            if self._wait_s:
                record["wait_s"], self._wait_s = round(self._wait_s, 6), 0.0
        self._write({**record, **extra}, raw)

    def event(self, name: str, message: str = "", /, **fields) -> None:
        """Any event (`eval`, `checkpoint`, ...): stored with the job, shown by `sigma jobs` and `sigma explain`."""
        self._write({"event": name, "message": message, **fields})

    def evaluation(self, step: int, **metrics) -> None:
        self.event("eval", f"evaluation at step {step}: " + ", ".join(f"{k} {v}" for k, v in metrics.items()),
                   step=int(step), **metrics)

    def heartbeat(self, message: str = "alive") -> None:
        """A sign of life (start() also beats from a thread every heartbeat_s: a stopped process falls silent)."""
        self.event("heartbeat", message)

    @contextlib.contextmanager
    def paused(self, reason: str, max_s: float):
        """A legitimate stretch without steps (an evaluation, a data download): the controller's hang timeout
        waits up to max_s longer while the heartbeats go on."""
        self.event("pause", reason, max_s=float(max_s))
        try:
            yield
        finally:
            self.event("pause_end", reason)
            self._last_step_t = time.perf_counter()

    def add_wait(self, seconds: float) -> None:
        """Time spent waiting for the other ranks in a collective (any thread): reported as the next step's
        `wait_s`, from which the controller tells which node the others wait for (a straggler)."""
        with self._wait_lock:
            self._wait_s += max(0.0, float(seconds))

    @contextlib.contextmanager
    def waiting(self):
        """Around a blocking collective: its time is added to the step's `wait_s`."""
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.add_wait(time.perf_counter() - t0)

    def nonfinite(self, step: int, loss, message: str = "") -> None:
        """The loss went NaN/Inf at `step` and training stops (after saving the last healthy step, if it can):
        the controller restarts the job from its newest checkpoint."""
        self.event("nan_loss", message or f"non-finite loss {loss} at step {step}", step=int(step), loss=loss)

    def stop(self, step: int, message: str = "") -> None:
        """The run ends by itself (done, or stopped): the controller does not wait for it to answer a request."""
        self.event("stop", message or f"finished at step {step}", step=int(step))

    # ---------- checkpoints ----------
    def checkpoint_request(self) -> Request | None:
        """The controller's newest unanswered request for this node, or None. One small file read; in a job of
        several nodes the ranks must agree (only healthy nodes are asked): sigma.integrations.torch.agree."""
        if self._writer is None:
            return None
        found, deadline = read_request(self._writer.path.parent / REQUEST_NAME.format(node=self.node), time.time(),
                                       self.since)
        return Request(found, deadline) if found > self.answered else None

    def checkpoint_saved(self, step: int, path: str | Path, *, request: Request | None = None,
                         kind: str | None = None, save_s: float | None = None, manifest: bool | None = None) -> None:
        """A checkpoint of `step` is complete at `path`: a `checkpoint` event (naming `request`, the controller's
        answer) and, by rank 0 (manifest), the record resume_checkpoint reads, beside it in its directory."""
        kind = kind or ("jit" if request else "periodic")
        if request is not None:
            self.answered = max(self.answered, request.id)
        fields = {"step": int(step), "path": str(path), "kind": kind}
        if request is not None:
            fields["request"] = request.id
        if save_s is not None:
            fields["save_s"] = round(float(save_s), 3)
        if manifest if manifest is not None else self.rank == 0:  # first: an answer is followed by the requeue
            self._record(Path(path), {**fields, "request": request.id if request else 0, "job_id": self.job_id,
                                      "ts": time.time()})
        self.event("checkpoint", f"{kind} checkpoint of step {step}: {path}"
                   + (f" for request {request.id}" if request else ""), **fields)

    @staticmethod
    def _record(path: Path, info: dict) -> None:
        target = path.parent / MANIFEST
        tmp = target.with_name(f".{MANIFEST}.{os.getpid()}.tmp")
        try:
            tmp.write_text(json.dumps(info))
            os.replace(tmp, target)  # whole or not at all
        except OSError as exc:
            _warn(f"cannot record the checkpoint in {target} ({exc}): a requeued run will not find it there")

    def hold(self, request: Request | None = None, max_s: float = MAX_HOLD_S, tick_s: float = 0.25,
             done: Callable[[], bool] | None = None) -> None:
        """After answering `request` (or reporting a NaN stop, request None): wait for the requeue (SLURM's
        SIGTERM ends the process) until the request's deadline, at most max_s, so that no step is trained that the
        requeue would throw away. Returns then (the controller went away: training goes on, or ends), or as soon
        as done() is true (a framework that catches SIGTERM itself, as Lightning does under SLURM, says so there)."""
        if self._writer is None:
            return
        until = time.time() + max_s
        if request is not None and request.deadline:
            until = min(until, request.deadline)
        while (left := until - time.time()) > 0 and not (done and done()):
            time.sleep(min(tick_s, left))

    # ---------- testing-only fault hook ----------
    def nan_injected(self) -> bool:
        """`sigma chaos nan` asked for a NaN loss (only with fault_hooks=True): True once per request."""
        if not self.fault_hooks or self._writer is None:
            return False
        try:
            (self._writer.path.parent / NAN_TRIGGER).unlink()
            return True
        except OSError:  # absent, or another rank consumed it
            return False

    def close(self) -> None:
        if self._writer is not None:
            with contextlib.suppress(OSError, ValueError):
                self._writer.close()
            self._writer = None

    def __enter__(self) -> "Run":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
