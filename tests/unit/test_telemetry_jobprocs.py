"""The jobprocs collector on real processes: a job's process (found by its SLURM environment) using CPU, then
stopped with SIGSTOP; processes of another node, of the prolog, or of no job are not the job's."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from sigma.telemetry.base import Output
from tests.unit.telemetry_helpers import make

BUSY = "import time\nwhile True:\n    t = time.perf_counter()\n    while time.perf_counter() - t < 0.05: pass\n    time.sleep(0.05)"


def spawn(**env):
    return subprocess.Popen([sys.executable, "-c", BUSY], env={**os.environ, **env})


def collect(c) -> dict:
    out = Output()
    c.collect(out)
    return {(m, labels): v for _, m, v, labels in out.samples}


def test_a_jobs_processes_cpu_and_stop_are_reported_per_job():
    job = spawn(SLURM_JOB_ID="424242", SLURMD_NODENAME="node7")
    others = [spawn(SLURM_JOB_ID="424243", SLURMD_NODENAME="node8"),  # the same job id space, another node
              spawn(SLURM_JOB_ID="424244", SLURMD_NODENAME="node7", SLURM_SCRIPT_CONTEXT="prolog_slurmd"),
              spawn()]
    try:
        c = make("jobprocs", node="node7")
        c.ctx.active_jobs = lambda: [424242, 424245]  # 424245: SLURM runs it here, with no process here
        first = collect(c)
        key = '{"job":"424242"}'
        assert first[("job.procs.count", key)] == 1 and ("job.procs.cpu", key) not in first  # no interval yet
        assert {labels for _, labels in first} == {key, '{"job":"424245"}'}
        time.sleep(1.5)
        running = collect(c)
        assert running[("job.procs.cpu", key)] > 0 and running[("job.procs.stopped", key)] == 0
        assert running[("job.procs.count", '{"job":"424245"}')] == 0
        job.send_signal(signal.SIGSTOP)
        time.sleep(0.3)  # the stop takes effect, and the interval's CPU before it is counted now
        collect(c)
        time.sleep(1.0)
        stopped = collect(c)
        assert stopped[("job.procs.stopped", key)] == 1 and stopped[("job.procs.cpu", key)] <= 0.02
        assert stopped[("job.procs.traced", key)] == 0
    finally:
        for p in [job, *others]:
            p.send_signal(signal.SIGCONT)
            p.kill()
            p.wait()
