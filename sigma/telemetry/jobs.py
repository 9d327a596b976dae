"""Which SLURM jobs run on this node right now, without a SLURM call per collector run.

Sources (configurable, unioned):
- proc: slurmstepd processes. Each names its step in its title ("slurmstepd: [123.batch]"); on a host with
  several emulated nodes the step's child processes carry SLURMD_NODENAME in their environment, which tells
  whose step it is. Costs one scan of /proc/*/comm per refresh, no SLURM traffic.
- kpi: jobs whose KPI files for this node grew recently (any trainer following the KPI protocol).
- squeue: a cached `Slurm().jobs()` poll (sigma.slurm) every squeue_refresh_s; one controller RPC per node per
  poll, so keep it slow on large clusters.
The result is cached and refreshed every refresh_s by the agent; rows are tagged with the cached JSON list.
"""

from __future__ import annotations

import json
import logging
import os
import re
import time

log = logging.getLogger("sigma.telemetry.jobs")

STEP_TITLE = re.compile(rb"slurmstepd: \[(\d+)\.")


def slurmstepd_jobs(node: str, proc_root: str = "/proc", check_node: bool = True) -> set[int]:
    """Job ids of the slurmstepd processes that belong to `node`."""
    jobs = set()
    try:
        pids = [p for p in os.listdir(proc_root) if p.isdigit()]
    except OSError:
        return jobs
    for pid in pids:
        try:
            with open(f"{proc_root}/{pid}/comm", "rb") as f:
                if f.read(10) != b"slurmstepd":
                    continue
            with open(f"{proc_root}/{pid}/cmdline", "rb") as f:
                m = STEP_TITLE.search(f.read(200))
        except OSError:
            continue
        if m is None:
            continue
        job = int(m.group(1))
        if not check_node or _step_node(proc_root, pid) in (node, None):
            jobs.add(job)
    return jobs


def _step_node(proc_root: str, pid: str) -> str | None:
    """SLURMD_NODENAME from the step's processes (the step itself or its children); None if none tells."""
    candidates = [pid]
    try:
        with open(f"{proc_root}/{pid}/task/{pid}/children") as f:
            candidates += f.read().split()
    except OSError:
        pass
    for cand in candidates:
        try:
            with open(f"{proc_root}/{cand}/environ", "rb") as f:
                env = f.read()
        except OSError:
            continue
        for var in env.split(b"\0"):
            if var.startswith(b"SLURMD_NODENAME="):
                return var[16:].decode()
    return None


class JobTracker:
    def __init__(self, node: str, sources: list[str], *, proc_root: str = "/proc", kpi_jobs=None,
                 kpi_active_s: float = 120.0, squeue_refresh_s: float = 30.0, check_node: bool = True):
        self.node = node
        self.sources = list(sources)
        self.proc_root = proc_root
        self.kpi_jobs = kpi_jobs  # callable(within_s) -> set[int], from the KPI collector
        self.kpi_active_s = kpi_active_s
        self.squeue_refresh_s = squeue_refresh_s
        self.check_node = check_node
        self._squeue_at = 0.0
        self._squeue_jobs: set[int] = set()
        self.jobs: list[int] = []
        self.jobs_json = "[]"

    def refresh(self) -> list[int]:
        found: set[int] = set()
        if "proc" in self.sources:
            found |= slurmstepd_jobs(self.node, self.proc_root, self.check_node)
        if "kpi" in self.sources and self.kpi_jobs is not None:
            found |= self.kpi_jobs(self.kpi_active_s)
        if "squeue" in self.sources:
            found |= self._squeue()
        self.jobs = sorted(found)
        self.jobs_json = json.dumps(self.jobs)
        return self.jobs

    def _squeue(self) -> set[int]:
        now = time.monotonic()
        if now - self._squeue_at >= self.squeue_refresh_s:
            self._squeue_at = now
            try:
                from sigma.slurm.client import Slurm

                self._squeue_jobs = {j.job_id for j in Slurm().jobs()
                                     if j.state == "RUNNING" and self.node in j.nodes}
            except Exception as exc:  # keep the last answer: a slow controller must not stall telemetry
                log.warning("squeue job lookup failed: %s", exc)
        return self._squeue_jobs
