"""Which SLURM jobs run on this node right now, without a SLURM call per collector run.

Sources (configurable, unioned):
- proc: the steps slurmd runs here. Every step has a socket <node>_<job>.<step> in slurmd's spool directory from
  its start to its end, so where that directory is readable a refresh is one listdir, exact from the step's
  first moment. Without it, slurmstepd processes are scanned instead (each names its step in its title,
  "slurmstepd: [123.batch]"; on a host emulating several nodes the step's children carry SLURMD_NODENAME),
  every proc_rescan_s. No SLURM traffic either way.
- kpi: jobs whose KPI files for this node grew recently (any trainer following the KPI protocol).
- squeue: a cached `Slurm().jobs()` poll (sigma.slurm) every squeue_refresh_s; one controller RPC per node per
  poll, so keep it slow on large clusters.
The result is cached and refreshed every refresh_s by the agent; rows are tagged with the cached JSON list.

owner(job_id) says who may write KPIs for a job: the uid the job runs as, when SLURM (the proc and squeue
sources, never the KPI files themselves) says the job runs on this node; the uid comes from SLURM once per job.
"""

from __future__ import annotations

import json
import logging
import os
import re
import time

log = logging.getLogger("sigma.telemetry.jobs")

STEP_TITLE = re.compile(rb"slurmstepd: \[(\d+)\.")
STEP_SOCKET = re.compile(r"^(.+)_(\d+)\.\d+")  # <node>_<job>.<step>[.<het component>]
OWNER_RETRY_S = 10.0  # a failed owner lookup is retried after this long


def _slurm_job_uid(job_id: int) -> int | None:
    from sigma.slurm.client import Slurm

    job = Slurm().job(job_id)
    return job.user_id if job is not None and job.user_id >= 0 else None


def spool_jobs(node: str, spool_dir: str) -> set[int] | None:
    """Job ids with a step socket of `node` in slurmd's spool directory; None when it cannot be read."""
    try:
        names = os.listdir(spool_dir)
    except OSError:
        return None
    return {int(m.group(2)) for m in map(STEP_SOCKET.match, names) if m and m.group(1) == node}


def slurmstepd_jobs(node: str, proc_root: str = "/proc", check_node: bool = True) -> set[int]:
    """Job ids of the slurmstepd processes that belong to `node`.

    A job counts when one of its steps names this node, or when none of its steps names any node (a real node
    runs one slurmd; steps without tasks, like the extern step, carry no node name)."""
    seen: dict[int, set] = {}
    try:
        pids = [p for p in os.listdir(proc_root) if p.isdigit()]
    except OSError:
        return set()
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
        names = seen.setdefault(int(m.group(1)), set())
        if check_node:
            step_node = _step_node(proc_root, pid)
            if step_node is not None:
                names.add(step_node)
    return {job for job, names in seen.items() if not names or node in names}


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
                 kpi_active_s: float = 120.0, squeue_refresh_s: float = 30.0, check_node: bool = True,
                 spool_dir: str = "", proc_rescan_s: float = 60.0, owner_lookup=None):
        self.node = node
        self.sources = list(sources)
        self.proc_root = proc_root
        self.kpi_jobs = kpi_jobs  # callable(within_s) -> set[int], from the KPI collector
        self.kpi_active_s = kpi_active_s
        self.squeue_refresh_s = squeue_refresh_s
        self.check_node = check_node
        self.spool_dir = spool_dir
        self.proc_rescan_s = proc_rescan_s
        self._proc_at = 0.0
        self._proc_jobs: set[int] = set()
        self._squeue_at = 0.0
        self._squeue_jobs: set[int] = set()
        self.jobs: list[int] = []
        self.jobs_json = "[]"
        self.slurm_jobs: set[int] = set()  # what SLURM says runs here (without the KPI source)
        self.owner_lookup = owner_lookup or _slurm_job_uid  # job_id -> uid or None
        self._owners: dict[int, int] = {}
        self._owner_failed_at: dict[int, float] = {}

    def refresh(self) -> list[int]:
        found: set[int] = set()
        if "proc" in self.sources:
            found |= self._proc()
        if "squeue" in self.sources:
            found |= self._squeue()
        self.slurm_jobs = set(found)
        if "kpi" in self.sources and self.kpi_jobs is not None:
            found |= self.kpi_jobs(self.kpi_active_s)
        self.jobs = sorted(found)
        self.jobs_json = json.dumps(self.jobs)
        return self.jobs

    def owner(self, job_id: int) -> int | None:
        """The uid job_id runs as, if SLURM runs it on this node now; None if it does not (or not known yet)."""
        if job_id not in self.slurm_jobs:
            return None
        uid = self._owners.get(job_id)
        if uid is None:
            if time.monotonic() - self._owner_failed_at.get(job_id, -1e9) < OWNER_RETRY_S:
                return None
            try:
                uid = self.owner_lookup(job_id)
            except Exception as exc:  # SLURM busy: the job's KPI files wait, nothing is read unchecked
                log.warning("cannot look up the owner of job %s: %s", job_id, exc)
                uid = None
            if uid is None:
                self._owner_failed_at[job_id] = time.monotonic()
                return None
            self._owners[job_id] = uid
        return uid

    def _proc(self) -> set[int]:
        if self.spool_dir and (jobs := spool_jobs(self.node, self.spool_dir)) is not None:
            return jobs
        # no readable spool directory (no slurmd here, or an unusual SlurmdSpoolDir): scan /proc now and then
        now = time.monotonic()
        if now - self._proc_at >= self.proc_rescan_s or not self._proc_at:
            self._proc_at = now
            self._proc_jobs = slurmstepd_jobs(self.node, self.proc_root, self.check_node)
        return self._proc_jobs

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
