"""Per-step noise counters of one rank, for the KPI line: what a slow step waited for on this process.

- gc_s: time inside Python's garbage collector (gc.callbacks), automatic or manual;
- majflt: major page faults (a page of a mapped data shard or of the program that had to come from disk, e.g.
  after the page cache evicted it under memory pressure), from /proc/self/stat;
- cpu_wait_s: time this process's threads were runnable but waited for a CPU (another process had it), summed
  over /proc/self/task/*/schedstat; cpu_s: the CPU time they got (the same files), which the wait is judged
  against;
- blocked_s: time the training thread was neither running nor runnable (off the CPU, asleep: reading data,
  page faults, locks, collectives; the attribution takes the KPI line's collective `wait_s` off it);
- io_wait_s: time blocked on block I/O (delay accounting, only where the kernel has it on:
  /proc/sys/kernel/task_delayacct = 1; otherwise the key is absent rather than a misleading 0).

The controller's noise attribution (sigma.controller.detect.noise) reads them from the KPI rows. GcPressure is the
testing-only source of GC pauses behind `sigma chaos gc-pressure`.
"""

from __future__ import annotations

import gc
import os
import threading
import time
from pathlib import Path

CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _delayacct_on() -> bool:
    try:
        return Path("/proc/sys/kernel/task_delayacct").read_text().strip() == "1"
    except OSError:
        return False


class StepNoise:
    def __init__(self, proc: str = "/proc/self"):
        self.proc = proc
        self.io = _delayacct_on()
        self.tid = str(threading.get_native_id())  # the thread that runs the steps
        self._gc_s = 0.0
        self._gc_t0: float | None = None
        self._last = None
        gc.callbacks.append(self._on_gc)

    def close(self) -> None:
        if self._on_gc in gc.callbacks:
            gc.callbacks.remove(self._on_gc)

    def _on_gc(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._gc_t0 = time.perf_counter()
        elif self._gc_t0 is not None:
            self._gc_s += time.perf_counter() - self._gc_t0
            self._gc_t0 = None

    def _counters(self) -> tuple:
        fields = Path(self.proc, "stat").read_text().rpartition(")")[2].split()  # fields 3.. of proc(5)
        majflt, blkio = int(fields[9]), int(fields[39]) / CLK_TCK if len(fields) > 39 else 0.0
        wait_ns, run_ns, on_cpu_ns = 0, 0, 0
        try:
            tasks = os.listdir(os.path.join(self.proc, "task"))
        except OSError:
            tasks = []
        for tid in tasks:
            try:
                run, wait = Path(self.proc, "task", tid, "schedstat").read_text().split()[:2]
            except (OSError, ValueError):
                continue  # the thread ended meanwhile
            wait_ns, run_ns = wait_ns + int(wait), run_ns + int(run)
            if tid == self.tid:
                on_cpu_ns = int(run) + int(wait)
        return self._gc_s, majflt, wait_ns / 1e9, blkio, time.perf_counter() - on_cpu_ns / 1e9, run_ns / 1e9

    def begin(self) -> None:
        self._last = self._counters()

    def sample(self) -> dict:
        """Counters since begin() (or the previous sample): the payload keys of a KPI metrics line."""
        now = self._counters()
        last = self._last or now
        self._last = now
        out = {"gc_s": round(now[0] - last[0], 6), "majflt": now[1] - last[1],
               "cpu_wait_s": round(now[2] - last[2], 6), "cpu_s": round(now[5] - last[5], 6),
               "blocked_s": round(max(0.0, now[4] - last[4]), 6)}
        if self.io:
            out["io_wait_s"] = round(now[3] - last[3], 6)
        return out


class GcPressure:
    """While the trigger file exists: every step, make a batch of objects in reference cycles and keep the last
    KEEP_STEPS batches alive (each full collection walks them), dropping the oldest for the collector to free,
    as a trainer whose data pipeline churns Python objects does. The file's content is the number of objects per step (default 20000)."""

    KEEP_STEPS = 20

    def __init__(self, trigger: Path | None):
        self.trigger = trigger
        self.live: list = []

    def step(self) -> bool:
        if self.trigger is None or not self.trigger.exists():
            self.live.clear()
            return False
        try:
            n = int(self.trigger.read_text().split()[0])
        except (OSError, ValueError, IndexError):
            n = 20000
        batch = [{"i": i} for i in range(n)]
        for a, b in zip(batch[0::2], batch[1::2]):  # pairs in a cycle: refcounting alone never frees them
            a["peer"], b["peer"] = b, a
        self.live.append(batch)
        del self.live[:-self.KEEP_STEPS]  # the oldest batch is garbage now, for the collector to find
        return True
