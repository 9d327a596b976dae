"""Atomic, sharded checkpoints with keep-last-K, and finding the newest complete one on start.

A checkpoint is written by every rank through `torch.distributed.checkpoint` into a hidden temporary
directory `.step-<N>.tmp`; after all ranks finished (files fsynced by DCP's writer), rank 0 writes
`complete.json` (temp file + fsync + rename), renames the directory to `step-<N>` and fsyncs the parent.
So a checkpoint directory either is complete or does not exist under its final name: a run killed mid-save
leaves only a temporary directory, which `latest()` ignores and the next save removes.

Asynchronous saves (`save(..., background=True)`): DCP's async_save copies the state to CPU memory and
returns; the writing goes on in a thread while training continues (the coordination collectives use their
own gloo group, so they never meet the training's). DCP's coordinator (rank 0) finishes only after every
rank's files are written and fsynced, so rank 0 marks the checkpoint complete and renames it from its
completion callback, with no barrier. One save is in flight at a time; a crash mid-write leaves only the
temporary directory, and the newest complete checkpoint wins.

SLURM's node-failure requeue restarts the original submission, so the trainer calls `latest()` on start
and resumes by itself.
"""

from __future__ import annotations

import importlib
import json
import os
import re
import shutil
import sys
import threading
import time
import warnings
from concurrent.futures import Future
from contextlib import contextmanager
from pathlib import Path
from typing import Callable

COMPLETE_NAME = "complete.json"
STEP_DIR = re.compile(r"^step-(\d{8})$")


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_json_atomic(path: Path, data: dict) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(data, f, indent=2)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    _fsync_dir(path.parent)


def step_dir_name(step: int) -> str:
    return f"step-{step:08d}"


def checkpoint_step(path: Path) -> int:
    """The step of a checkpoint directory, from its name (`step-<N>`)."""
    match = STEP_DIR.match(Path(path).name)
    if not match:
        raise ValueError(f"{path} is not a checkpoint directory (step-<N>)")
    return int(match.group(1))


def is_complete(path: Path) -> bool:
    match = STEP_DIR.match(path.name)
    marker = path / COMPLETE_NAME
    if not (match and path.is_dir() and marker.is_file()):
        return False
    try:
        return int(json.loads(marker.read_text())["step"]) == int(match.group(1))
    except (ValueError, KeyError, TypeError):
        return False


def complete_checkpoints(root: str | Path) -> list[Path]:
    """Complete checkpoints under root, oldest first."""
    root = Path(root)
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if is_complete(p)]
    return sorted(found, key=lambda p: int(STEP_DIR.match(p.name).group(1)))


def latest_checkpoint(root: str | Path) -> Path | None:
    done = complete_checkpoints(root)
    return done[-1] if done else None


def import_dcp_in_background() -> threading.Thread | None:
    """Import `torch.distributed.checkpoint` in a thread while training goes on. A run that resumed from replicas
    (or started fresh) has not imported it, and the first periodic save would otherwise stop training for the
    import (0.65 s per rank in bench/restart.py's split; 2.6-3.0 s stalls with 2 ranks on 2 busy CPUs in the chaos
    soak). A save that comes before the import is done waits for it on Python's import lock. None if imported."""
    if "torch.distributed.checkpoint" in sys.modules:
        return None
    thread = threading.Thread(target=importlib.import_module, args=("torch.distributed.checkpoint",),
                              name="sigma-dcp-import", daemon=True)
    thread.start()
    return thread


def saved_keys(path: Path) -> set[str]:
    """Flattened keys of a DCP checkpoint ("model.layers.0...", "rng.rank0.cpu")."""
    import torch.distributed.checkpoint as dcp

    return set(dcp.FileSystemReader(str(path)).read_metadata().state_dict_metadata)


def read_meta(path: Path) -> dict:
    return json.loads((Path(path) / COMPLETE_NAME).read_text())


def _first_line(exc: BaseException) -> str:
    """DCP's errors carry every rank's traceback; the first line of the innermost cause says what happened."""
    while True:
        failures = getattr(exc, "failures", None)  # DCP's CheckpointException: {rank: (exception, traceback)}
        if failures:
            exc = next(iter(failures.values()))[0]
        elif exc.__cause__ is not None:
            exc = exc.__cause__
        else:
            break
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"


class CheckpointManager:
    """Save/load one run's checkpoints under root. Collective: every rank calls save/load together."""

    def __init__(self, root: str | Path, keep: int = 3, rank: int = 0,
                 barrier: Callable[[], None] | None = None, async_group=None):
        if keep < 1:
            raise ValueError(f"checkpoint keep must be at least 1, got {keep}")
        self.root = Path(root).expanduser()
        self.keep = keep
        self.rank = rank
        self.barrier = barrier or (lambda: None)
        self.async_group = async_group  # a gloo group of all ranks for background saves (None: one process)
        self._pending: Future | None = None
        self._written = threading.Event()  # cleared while a synchronous save (a just-in-time one) is being written
        self._written.set()
        self._writing = 0  # nested in_flight() blocks of the training thread
        self.last_saved_step: int | None = None  # the step of the last save() or load(): the same on every rank

    def latest(self) -> Path | None:
        return latest_checkpoint(self.root)

    def save(self, step: int, state: dict, meta: dict | None = None, background: bool = False,
             on_complete: Callable[[Path, float], None] | None = None) -> Path:
        """Save state as checkpoint `step`; return its final path. background=True returns once the state is
        copied to CPU memory; on_complete(path, save_s) runs on rank 0 when the checkpoint is complete (in the
        writer thread when in the background). Every rank calls save together."""
        if background:
            return self._save(step, state, meta, True, on_complete)
        with self.in_flight():
            return self._save(step, state, meta, False, on_complete)

    @contextmanager
    def in_flight(self):
        """A synchronous save, and what the training thread does to record it, in one block: a rank that SLURM is
        terminating waits for the whole block (finish_in_flight), so the save's event is not lost to the exit."""
        self._writing += 1
        self._written.clear()
        try:
            yield
        finally:
            self._writing -= 1
            if not self._writing:
                self._written.set()

    def _save(self, step: int, state: dict, meta: dict | None, background: bool,
              on_complete: Callable[[Path, float], None] | None) -> Path:
        import torch.distributed.checkpoint as dcp

        self.wait()
        self.last_saved_step = step
        final = self.root / step_dir_name(step)
        tmp = self.root / f".{step_dir_name(step)}.tmp"
        if self.rank == 0:
            self.root.mkdir(parents=True, exist_ok=True)
            shutil.rmtree(tmp, ignore_errors=True)  # a save of this step that was killed before
        self.barrier()
        started = time.monotonic()
        writer = dcp.FileSystemWriter(str(tmp), sync_files=True)
        with warnings.catch_warnings():  # one process without a process group is a supported case, not a problem
            warnings.filterwarnings("ignore", message="torch.distributed is disabled")
            if background:
                future = dcp.async_save(state, storage_writer=writer, process_group=self.async_group)
            else:
                dcp.save(state, storage_writer=writer)
        if background:
            finished: Future = Future()

            def finish(written: Future) -> None:
                try:
                    written.result()
                    if self.rank == 0:
                        self._finalize(step, tmp, meta, started)
                        if on_complete:
                            on_complete(final, time.monotonic() - started)
                    finished.set_result(final)
                except BaseException as exc:  # raised by wait() in the training thread
                    finished.set_exception(exc)

            future.add_done_callback(finish)
            self._pending = finished
            return final
        self.barrier()
        if self.rank == 0:
            self._finalize(step, tmp, meta, started)
            if on_complete:
                on_complete(final, time.monotonic() - started)
        self.barrier()
        return final

    def _finalize(self, step: int, tmp: Path, meta: dict | None, started: float) -> None:
        """Rank 0, after every rank's files are written: marker, rename, prune."""
        final = self.root / step_dir_name(step)
        write_json_atomic(tmp / COMPLETE_NAME, {"step": step, "time": time.time(),
                                                "save_s": round(time.monotonic() - started, 3), **(meta or {})})
        if final.exists():  # the same step saved again after a resume from an older checkpoint
            stale = self.root / f".{final.name}.old"
            shutil.rmtree(stale, ignore_errors=True)
            os.replace(final, stale)
            shutil.rmtree(stale, ignore_errors=True)
        os.replace(tmp, final)
        _fsync_dir(self.root)
        self.prune()

    def wait(self) -> None:
        """Block until the save in flight (if any) is written and, on rank 0, complete; raise its error."""
        pending, self._pending = self._pending, None
        if pending is not None:
            from torch.distributed.checkpoint.api import CheckpointException

            try:
                pending.result()
            except (Exception, CheckpointException) as exc:  # DCP wraps a full disk in a BaseException subclass
                raise RuntimeError(f"background checkpoint save of step {self.last_saved_step} failed: "
                                   f"{_first_line(exc)}; the newest complete checkpoint is still "
                                   f"{self.latest()}") from exc

    def finish_in_flight(self) -> None:
        """Block until the save in flight, if any, is written (and on rank 0 complete), leaving it to wait(): what
        a rank that SLURM is terminating finishes before it exits (sigma/train/terminate.py). Called from another
        thread: a synchronous save in the training thread (a just-in-time one) counts too."""
        self._written.wait()
        pending = self._pending
        if pending is not None:
            pending.result()

    def prune(self) -> list[Path]:
        """Keep the newest `keep` complete checkpoints; drop older ones and leftovers of killed saves."""
        removed = []
        done = complete_checkpoints(self.root)
        for path in done[:-self.keep]:
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
        for path in self.root.iterdir():
            if path.name.startswith(".step-") and path.is_dir():
                shutil.rmtree(path, ignore_errors=True)
                removed.append(path)
        return removed

    def load(self, path: Path, state: dict) -> dict:
        """Load checkpoint path into state in place (tensors are filled, other values replaced)."""
        import torch.distributed.checkpoint as dcp

        if not is_complete(Path(path)):
            raise ValueError(f"{path} is not a complete checkpoint")
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="torch.distributed is disabled")
            dcp.load(state, storage_reader=dcp.FileSystemReader(str(path)))
        meta = read_meta(path)
        self.last_saved_step = int(meta["step"])
        return meta
