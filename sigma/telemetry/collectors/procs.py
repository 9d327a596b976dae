"""The busiest processes on the node that are not part of a SLURM job: who else takes the CPU the job's ranks
wait for (noise attribution names them as CPU-contention evidence).

Every run reads /proc/<pid>/stat of every process, takes the CPU time (utime + stime) since the previous run, and
reports the `top` processes above `min_cpu_pct` as host.proc.cpu_pct (100 = one core) with labels pid and comm.
A process belongs to a job when its cgroup path names one (`job_<id>`, SLURM's cgroup plugins) or its environment
has SLURM_JOB_ID (where readable: root's sidecar, or the job's own user); the verdict is cached per process.
Kernel threads and the sidecar itself are left out.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass

from sigma.telemetry.base import Collector, CollectorParams, Output, labels_json, register

CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


@register("procs")
class ProcsCollector(Collector):
    @dataclass
    class Params(CollectorParams):
        interval_s: float = 5.0  # a pass over every process: keep it slower than the host collector
        top: int = 5  # processes reported per run
        min_cpu_pct: float = 10.0  # ... using at least this much CPU (100 = one core)

    def __init__(self, section, params, ctx):
        super().__init__(section, params, ctx)
        self.proc = os.path.join(ctx.host_root, "proc")
        self._last: dict[int, tuple[str, float]] = {}  # pid -> (start time, cpu seconds) at the previous run
        self._last_ts: float | None = None
        self._job: dict[tuple[int, str], bool] = {}  # (pid, start time) -> belongs to a job

    def collect(self, out: Output) -> None:
        now, seen = out.ts, {}
        for name in os.listdir(self.proc):
            if not name.isdigit() or int(name) == os.getpid():
                continue
            pid = int(name)
            try:
                with open(os.path.join(self.proc, name, "stat"), "rb") as f:
                    raw = f.read().decode("utf-8", "replace")
            except OSError:
                continue  # gone meanwhile
            comm = raw[raw.find("(") + 1:raw.rfind(")")]
            fields = raw[raw.rfind(")") + 2:].split()  # fields 3.. of proc(5)
            if len(fields) < 20 or fields[1] in ("0", "2") or pid == 2:  # kernel threads (children of kthreadd)
                continue
            start = fields[19]
            seen[pid] = (start, comm, (int(fields[11]) + int(fields[12])) / CLK_TCK)
        busy = []
        if self._last_ts is not None and now > self._last_ts:
            for pid, (start, comm, cpu) in seen.items():
                last = self._last.get(pid)
                if last is None or last[0] != start:
                    continue
                pct = 100.0 * (cpu - last[1]) / (now - self._last_ts)
                if pct >= self.params.min_cpu_pct and not self._in_job(pid, start):
                    busy.append((pct, pid, comm))
        self._last = {pid: (start, cpu) for pid, (start, _, cpu) in seen.items()}
        self._last_ts = now
        self._job = {k: v for k, v in self._job.items() if k[0] in seen}
        for pct, pid, comm in sorted(busy, reverse=True)[:self.params.top]:
            out.samples.append((now, "host.proc.cpu_pct", round(pct, 1), labels_json({"pid": str(pid), "comm": comm})))

    def _in_job(self, pid: int, start: str) -> bool:
        key = (pid, start)
        if key not in self._job:
            self._job[key] = _job_process(os.path.join(self.proc, str(pid)))
        return self._job[key]


def _job_process(path: str) -> bool:
    with contextlib.suppress(OSError), open(os.path.join(path, "cgroup")) as f:
        if "/job_" in f.read():
            return True
    try:
        with open(os.path.join(path, "environ"), "rb") as f:
            return b"\0SLURM_JOB_ID=" in b"\0" + f.read()
    except OSError:
        return False
