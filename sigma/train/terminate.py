"""Leave at once when SLURM ends the job, instead of sitting out KillWait.

SLURM ends a job's processes (a requeue, `scancel`, the end of the time limit) with SIGTERM and kills them with
SIGKILL `KillWait` seconds later; the job is listed PENDING again (a requeue) only once they are gone. submitit
ignores SIGTERM (it acts on its own USR2 before a timeout), so a requeued rank used to wait out all of KillWait.
Nothing a rank holds needs that time: checkpoints and replicas become visible only by rename, so a process killed
mid-write leaves the previous one. The one thing worth finishing is a checkpoint being written (a background one,
or a just-in-time one the training thread is saving); the rank waits for it (SLURM's SIGKILL bounds the wait) and
then exits with 128 + SIGTERM.

A Python signal handler runs only when the main thread executes Python code, never while it is blocked in a
collective with a hung peer. The C-level handler runs at once in whichever thread the kernel picked (numpy's
OpenBLAS threads, started before us, are candidates too) and writes the signal number to the wakeup file
descriptor, so a thread of its own reads that pipe and acts on SIGTERM whatever the main thread is doing.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from collections.abc import Callable

_before_exit: dict[int, Callable[[], None]] = {}  # id -> what to finish first (a checkpoint in flight)
_lock = threading.Lock()
_installed = False


def exit_on_sigterm() -> bool:
    """From now on a SIGTERM ends this process once the registered waits are done. Call it from the main thread
    (after submitit installed its handlers); returns False where it cannot apply."""
    global _installed
    if _installed:
        return True
    if threading.current_thread() is not threading.main_thread():
        return False
    read_fd, write_fd = os.pipe()
    os.set_blocking(write_fd, False)  # the C handler must never block
    signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
    signal.signal(signal.SIGTERM, lambda *_: None)  # the work is done by the thread below, not in the main thread
    threading.Thread(target=_wait_for_sigterm, args=(read_fd,), name="sigma-sigterm", daemon=True).start()
    _installed = True
    return True


def finish_before_exit(wait: Callable[[], None]) -> Callable[[], None]:
    """Register `wait` (blocks until something in flight is done) to run before a SIGTERM exit; returns the
    function that unregisters it."""
    with _lock:
        key = id(wait)
        _before_exit[key] = wait

    def remove() -> None:
        with _lock:
            _before_exit.pop(key, None)
    return remove


def _wait_for_sigterm(read_fd: int) -> None:
    # other handled signals (submitit's SIGCONT, USR2) pass by; a closed pipe ends the watch
    if not any(signal.SIGTERM in chunk for chunk in iter(lambda: os.read(read_fd, 64), b"")):
        return
    leave("SIGTERM from SLURM (requeue, cancel or time limit)")


def leave(why: str) -> None:
    """Finish what is registered (a checkpoint in flight), then exit as SLURM's SIGTERM would: 128 + SIGTERM."""
    started = time.monotonic()
    with _lock:
        waits = list(_before_exit.values())
    for wait in waits:
        try:
            wait()
        except BaseException as exc:  # a failed save leaves the older checkpoint; say so and go
            print(f"sigma train: on leaving: {exc}", file=sys.stderr, flush=True)
    print(f"sigma train: {why}: exiting now"
          + (f" after {time.monotonic() - started:.1f}s finishing what was in flight" if waits else ""),
          file=sys.stderr, flush=True)
    os._exit(128 + signal.SIGTERM)
