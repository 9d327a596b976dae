"""What each SLURM job's processes on this node are doing: the node's own evidence of a hang, for a job that reports
no KPIs (the controller's process watchdog, sigma/controller/detect/prochang.py).

Every run reads /proc/<pid>/stat of the processes of SLURM jobs on this node and reports, per job (label `job`):
  job.procs.count       processes of the job here (0 for a job SLURM runs here with none of its processes: a node
                        of the allocation its steps do not use)
  job.procs.cpu         cores they used since the previous run (CPU time over wall time; 1.0 = one core busy)
  job.procs.stopped     processes stopped by a signal (state T: SIGSTOP, SIGTSTP)
  job.procs.traced      processes stopped by a debugger (state t): somebody is looking at the job
  job.procs.disk_sleep  processes in uninterruptible sleep (state D: inside the kernel, usually waiting for I/O)
A process belongs to a job when its environment has SLURM_JOB_ID (readable by root's sidecar, or the job's own
user), and to this node unless its SLURMD_NODENAME names another node or its SLURM_CONF another cluster than the
sidecar's (a host emulating several nodes, or several clusters); slurmstepd, the prolog and the epilog do not count. The verdict is cached per process.
"""

from __future__ import annotations

import os
from collections import defaultdict
from dataclasses import dataclass

from sigma.telemetry.base import Collector, CollectorParams, Output, register
from sigma.telemetry.collectors.procs import CLK_TCK


@register("jobprocs")
class JobProcsCollector(Collector):
    @dataclass
    class Params(CollectorParams):
        interval_s: float = 5.0  # a pass over the node's processes; the controller judges a hang over minutes

    def __init__(self, section, params, ctx):
        super().__init__(section, params, ctx)
        self.proc = os.path.join(ctx.host_root, "proc")
        self._job: dict[tuple[int, str], int] = {}  # (pid, start time) -> job id here (0: not a job's, or elsewhere)
        self._cpu: dict[tuple[int, str], float] = {}  # (pid, start time) -> CPU seconds at the previous run
        self._last_ts: float | None = None
        self._conf = os.environ.get("SLURM_CONF", "").encode()  # the cluster this sidecar belongs to

    def collect(self, out: Output) -> None:
        count, cpu, states = defaultdict(int), defaultdict(float), defaultdict(lambda: defaultdict(int))
        seen: dict[tuple[int, str], float] = {}  # the jobs' processes: CPU seconds now
        alive = set()
        for name in os.listdir(self.proc):
            if not name.isdigit() or int(name) == os.getpid():
                continue
            try:
                with open(os.path.join(self.proc, name, "stat"), "rb") as f:
                    raw = f.read().decode("utf-8", "replace")
            except OSError:
                continue  # gone meanwhile
            fields = raw[raw.rfind(")") + 2:].split()  # fields 3.. of proc(5)
            if len(fields) < 20:
                continue
            key = (int(name), fields[19])
            alive.add(key)
            job = self._job.get(key)
            if job is None:
                job = self._job[key] = self._job_here(name)
            if not job:
                continue
            seen[key] = (int(fields[11]) + int(fields[12])) / CLK_TCK
            count[job] += 1
            states[job][fields[0]] += 1
            if key in self._cpu:
                cpu[job] += seen[key] - self._cpu[key]
            elif self._last_ts is not None:
                cpu[job] += seen[key]  # started since the previous run: all its CPU time is in this interval
        elapsed = out.ts - self._last_ts if self._last_ts is not None else 0.0
        self._cpu, self._last_ts = seen, out.ts
        self._job = {k: v for k, v in self._job.items() if k in alive}
        here = set(self.ctx.active_jobs() if callable(self.ctx.active_jobs) else ())
        for job in sorted(set(count) | here):
            labels = {"job": str(job)}
            out.sample("job.procs.count", count.get(job, 0), labels)
            if elapsed > 0:
                out.sample("job.procs.cpu", round(max(0.0, cpu.get(job, 0.0)) / elapsed, 4), labels)
            st = states.get(job, {})
            out.sample("job.procs.stopped", st.get("T", 0), labels)
            out.sample("job.procs.traced", st.get("t", 0), labels)
            out.sample("job.procs.disk_sleep", st.get("D", 0), labels)

    def _job_here(self, pid: str) -> int:
        """The SLURM job this process belongs to on this node, else 0."""
        path = os.path.join(self.proc, pid)
        try:
            with open(os.path.join(path, "environ"), "rb") as f:
                env = dict(item.partition(b"=")[::2] for item in f.read().split(b"\0") if b"=" in item)
            with open(os.path.join(path, "cmdline"), "rb") as f:
                cmdline = f.read()
        except OSError:
            return 0
        job, node, conf = env.get(b"SLURM_JOB_ID", b""), env.get(b"SLURMD_NODENAME"), env.get(b"SLURM_CONF")
        if (not job.isdigit() or b"SLURM_SCRIPT_CONTEXT" in env or cmdline.startswith(b"slurmstepd")
                or (node is not None and node.decode("utf-8", "replace") != self.ctx.node)
                or (conf is not None and self._conf and conf != self._conf)):
            return 0
        return int(job)
