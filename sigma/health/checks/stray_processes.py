"""Stray processes left from earlier jobs on this node: they hold memory, accelerators and CPU.

A job's processes carry SLURM_JOB_ID and SLURMD_NODENAME in their environment; a job is running on this node
while slurmd keeps a step socket for it in its spool directory. Processes of a job that is neither running nor
the job being started are strays. With `kill: true` (default) they are killed and only survivors fail.
"""

from __future__ import annotations

import os
import signal
import time

from sigma.health import facts
from sigma.health.facts import Proc
from sigma.health.result import Result, failed, passed, skipped

CATEGORY = "process"


def find_strays(procs: list[Proc], node: str, active_jobs: set[int], current_job: int | None,
                own_pids: set[int] = frozenset(), slurm_conf: str | None = None) -> list[Proc]:
    """slurm_conf: only processes of jobs of that cluster (several local clusters may share one host)."""
    strays = []
    for p in procs:
        job = p.env.get("SLURM_JOB_ID", "")
        if not job.isdigit() or p.pid in own_pids:
            continue
        if "SLURM_SCRIPT_CONTEXT" in p.env:  # prolog/epilog scripts, ours included
            continue
        if p.env.get("SLURMD_NODENAME", node) != node:  # emulated nodes share one process table
            continue
        if slurm_conf and p.env.get("SLURM_CONF", slurm_conf) != slurm_conf:
            continue
        if int(job) in active_jobs or int(job) == current_job:
            continue
        strays.append(p)
    return strays


def check_stray_processes(strays: list[Proc], survivors: list[Proc] | None = None) -> Result:
    """survivors: strays still alive after a kill attempt (None when no kill was attempted)."""
    remaining = strays if survivors is None else survivors
    if not strays:
        return passed("no stray processes from earlier jobs")
    desc = ", ".join(f"{p.pid}:{p.name}(job {p.env.get('SLURM_JOB_ID')})" for p in remaining[:5])
    if remaining:
        return failed(f"{len(remaining)} stray process(es) from finished jobs: {desc}",
                      pids=[p.pid for p in remaining])
    return passed(f"killed {len(strays)} stray process(es) from finished jobs",
                  killed=[p.pid for p in strays])


def kill(procs: list[Proc], grace_s: float = 2.0) -> list[Proc]:
    """SIGTERM, wait up to grace_s, SIGKILL; return the ones still alive."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for p in procs:
            try:
                os.kill(p.pid, sig)
            except ProcessLookupError:
                pass
            except PermissionError:
                continue
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline and any(_alive(p.pid) for p in procs):
            time.sleep(0.05)
        procs = [p for p in procs if _alive(p.pid)]
        if not procs:
            break
    return procs


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[-1].split()[0] != "Z"
    except OSError:
        return False


def own_pids() -> set[int]:
    """This process and its ancestors (a manual run inside a job must not count itself)."""
    pids, pid = set(), os.getpid()
    while pid > 1 and pid not in pids:
        pids.add(pid)
        try:
            with open(f"/proc/{pid}/stat") as f:
                pid = int(f.read().rsplit(")", 1)[-1].split()[1])
        except (OSError, ValueError, IndexError):
            break
    return pids


def run(ctx, args: dict) -> Result:
    active = facts.active_jobs(ctx)
    if active is None:
        return skipped("slurmd spool directory not found: cannot tell running jobs from finished ones")
    strays = find_strays(facts.processes(ctx), ctx.node, active, ctx.job_id, own_pids(),
                         os.environ.get("SLURM_CONF"))
    if strays and args.get("kill", True) and str(ctx.root) == "/":
        return check_stray_processes(strays, kill(strays, float(args.get("grace_s", 2.0))))
    return check_stray_processes(strays)
