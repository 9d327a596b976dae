"""A synthetic synchronous training rank that speaks the KPI protocol (run one per task with srun).

Every rank appends metrics lines to $SIGMA_KPI_DIR/job-<id>/rank-<rank>.<node>.jsonl. Ranks advance in lock-step
(a rank starts step s only when every rank finished s-1, like a collective), so one stopped rank stalls the job
as it would in real data-parallel training; the ranks that were not stopped get one step further. Rank 0 writes a
checkpoint step every 10 steps and a requeued run resumes from it.

usage: kpi_job.py [STEP_TIME_S [STEPS]]

Ranks meet (the stand-in for a collective) in the job's KPI directory, or in $KPI_JOB_SYNC_DIR/job-<id> where the
KPI directory is each node's own (ranks on several hosts that share a file system, not their KPI directory).
"""

import json
import math
import os
import socket
import sys
import time
from pathlib import Path


def main() -> int:
    step_time = float(sys.argv[1]) if len(sys.argv) > 1 else 0.5
    steps = int(sys.argv[2]) if len(sys.argv) > 2 else 1_000_000
    job = int(os.environ["SLURM_JOB_ID"])
    rank = int(os.environ.get("SLURM_PROCID", 0))
    world = int(os.environ.get("SLURM_NTASKS", 1))
    node = os.environ.get("SLURMD_NODENAME") or socket.gethostname().split(".")[0]
    restart = int(os.environ.get("SLURM_RESTART_COUNT", 0))
    kdir = Path(os.environ.get("SIGMA_KPI_DIR", "/var/spool/sigma/kpi")) / f"job-{job}"
    meet = Path(os.environ["KPI_JOB_SYNC_DIR"]) / f"job-{job}" if os.environ.get("KPI_JOB_SYNC_DIR") else kdir
    sync = meet / f"sync-{restart}"
    sync.mkdir(parents=True, exist_ok=True)
    kdir.mkdir(parents=True, exist_ok=True)
    ckpt = meet / "checkpoint"
    start = int(ckpt.read_text()) if ckpt.exists() else 0
    out = open(kdir / f"rank-{rank}.{node}.jsonl", "a", buffering=1)
    out.write(json.dumps({"ts": time.time(), "job_id": job, "rank": rank, "event": "start" if restart == 0
                          else "resume", "message": f"run {restart} from step {start}"}) + "\n")
    for step in range(start, start + steps):
        while True:  # the collective: wait for every rank to finish the previous step
            done = [max(_read(sync / f"rank-{r}"), start - 1) for r in range(world)]  # a resumed run starts at start
            if min(done) >= step - 1:
                break
            time.sleep(0.05)
        t0 = time.time()
        time.sleep(step_time)
        dt = time.time() - t0
        loss = 5.0 * math.exp(-step / 400.0) + 1.0
        out.write(json.dumps({"ts": time.time(), "job_id": job, "rank": rank, "step": step, "loss": loss,
                              "step_time_s": dt, "tokens_per_s": 4096 / dt, "model": "kpi-demo"}) + "\n")
        tmp = sync / f".rank-{rank}"
        tmp.write_text(str(step))
        tmp.replace(sync / f"rank-{rank}")
        if rank == 0 and step % 10 == 0:
            tmp = meet / ".checkpoint"
            tmp.write_text(str(step))
            tmp.replace(ckpt)
    return 0


def _read(path: Path) -> int:
    try:
        return int(path.read_text())
    except (OSError, ValueError):
        return -1


if __name__ == "__main__":
    sys.exit(main())
