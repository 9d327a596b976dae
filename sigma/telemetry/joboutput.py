"""One line into a job's own output: what the researcher reads, where a sidecar's log or event never reaches them.

The job's processes on this node are found by their SLURM environment (`SLURM_JOB_ID`, and `SLURMD_NODENAME`
where several emulated nodes share a host); the line is appended to the standard output of the first one whose
stdout is the job's output file, else a pipe to slurmstepd (srun forwards it to the same file). Opening
/proc/PID/fd/1 needs the right to read that process (root's sidecar, or the job's own user). Best effort: a job
whose processes are gone or unreadable gets no line, and nothing fails.
"""

from __future__ import annotations

import os
import stat


def job_processes(job_id: int, node: str, proc: str = "/proc") -> list[int]:
    """Pids on this host that belong to the job's steps on `node` (oldest first)."""
    want, on = f"SLURM_JOB_ID={job_id}".encode(), f"SLURMD_NODENAME={node}".encode()
    pids = []
    for name in os.listdir(proc):
        if not name.isdigit():
            continue
        try:
            with open(os.path.join(proc, name, "environ"), "rb") as f:
                env = f.read().split(b"\0")
        except OSError:
            continue
        named = [e for e in env if e.startswith(b"SLURMD_NODENAME=")]
        if want in env and (not named or on in named):
            pids.append(int(name))
    return sorted(pids)


def tell_job(job_id: int, node: str, line: str, proc: str = "/proc") -> bool:
    """Append `line` to the job's output; True when it was written."""
    candidates = []
    for pid in job_processes(job_id, node, proc):
        fd = os.path.join(proc, str(pid), "fd", "1")
        try:
            mode = os.stat(fd).st_mode
        except OSError:
            continue
        if stat.S_ISREG(mode):
            candidates.insert(0, fd)  # the output file itself (the batch script's stdout)
        elif stat.S_ISFIFO(mode):
            candidates.append(fd)
    for fd in candidates:
        try:
            with open(fd, "a", encoding="utf-8") as f:
                f.write(line.rstrip("\n") + "\n")
            return True
        except OSError:
            continue
    return False
