"""The torch side of sigma.kpi for any loop: agree on what one rank saw, time the gradient all-reduce.

- agree: the controller asks only a job's healthy nodes for a just-in-time checkpoint, and a NaN may show on one
  rank's loss only; every rank must save (a collective) and stop together, so they agree with one small all-reduce
  per step (MAX of request id, deadline, and a non-finite flag; float64 holds ids and unix times exactly).
- saved_together: a checkpoint reported (and a request answered) only once every rank's part and the manifest are
  on disk.
- CollectiveTimer: a DDP communication hook around the default all-reduce that adds the time each bucket's
  all-reduce took to the step's `wait_s`, the time this rank waited for the others. A straggler's ranks wait little
  (they arrive last), the others wait for it: the controller names the node from that (detect/laggard.py).
"""

from __future__ import annotations

import threading
import time

import torch
import torch.distributed as dist

from sigma.kpi import Request, Run


def distributed() -> bool:
    return dist.is_available() and dist.is_initialized()


def agree(request: Request | None, nonfinite: bool = False, run: Run | None = None) -> tuple[Request | None, bool]:
    """Every rank together (a collective when torch.distributed is up): the newest request any rank's node got,
    and whether any rank saw a non-finite loss. With `run`, the time it waited for the others is added to the
    step's wait_s: a rank held up anywhere before this point (a stopped or slow node) makes the others wait here."""
    if not distributed():
        return request, nonfinite
    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else "cpu"
    t = torch.tensor([request.id if request else 0, request.deadline if request else 0, float(nonfinite)],
                     dtype=torch.float64, device=device)
    started = time.perf_counter()
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    rid, deadline, bad = t.tolist()
    if run is not None:
        run.add_wait(time.perf_counter() - started)
    return (Request(int(rid), deadline) if rid else None), bool(bad)


def saved_together(run: Run, step: int, path, *, request: Request | None = None, kind: str | None = None) -> None:
    """Report a checkpoint every rank took part in once all of it is on disk: the ranks meet (each one's part is
    written), rank 0 records it in the manifest, they meet again, and only then does each rank report it. An answer
    to a request is followed at once by the requeue, which ends every rank: a rank that answered while rank 0 was
    still writing (its node not the one asked) would cut that save off, and the requeued run would resume from an
    older one."""
    if not distributed():
        run.checkpoint_saved(step, path, request=request, kind=kind)
        return
    first = dist.get_rank() == 0
    dist.barrier()
    if first:
        run.checkpoint_saved(step, path, request=request, kind=kind, manifest=True)
    dist.barrier()
    if not first:
        run.checkpoint_saved(step, path, request=request, kind=kind, manifest=False)


class CollectiveTimer:
    """Time spent inside DDP's gradient all-reduces, added to the run's next step as `wait_s`. Buckets overlap:
    only the time not already counted is added (their union)."""

    def __init__(self, run: Run):
        self.run = run
        self._lock = threading.Lock()
        self._counted_until = 0.0

    def attach(self, ddp_model) -> bool:
        """Register on a DistributedDataParallel model (before its first backward); False where that is not
        possible (not DDP, or a communication hook is registered already)."""
        if not isinstance(ddp_model, torch.nn.parallel.DistributedDataParallel):
            return False
        try:
            ddp_model.register_comm_hook(state=None, hook=self.hook)
        except RuntimeError:
            return False
        return True

    def hook(self, state, bucket):
        from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

        started = time.perf_counter()

        def done(fut):
            ended = time.perf_counter()
            with self._lock:
                begin = max(started, self._counted_until)
                self._counted_until = max(self._counted_until, ended)
            if ended > begin:
                self.run.add_wait(ended - begin)
            return fut.value()

        return allreduce_hook(state, bucket).then(done)


def slurm_env(env=None) -> dict[str, str]:
    """torch.distributed's env:// variables for a task of `srun` (one task per rank), where a launcher such as
    torchrun has not set them: RANK, WORLD_SIZE, LOCAL_RANK from SLURM, MASTER_ADDR = the node that launched the
    step, MASTER_PORT from the job id and its restart count (a requeued run must not meet the old run's port)."""
    import os
    import zlib

    env = os.environ if env is None else env
    if "SLURM_PROCID" not in env or "RANK" in env:
        return {}
    seed = f"{env.get('SLURM_CONF', '')}:{env.get('SLURM_JOB_ID', '0')}:{env.get('SLURM_RESTART_COUNT', '0')}"
    values = {"RANK": env["SLURM_PROCID"], "WORLD_SIZE": env.get("SLURM_NTASKS", "1"),
              "LOCAL_RANK": env.get("SLURM_LOCALID", "0"),
              "MASTER_ADDR": env.get("MASTER_ADDR") or env.get("SLURM_LAUNCH_NODE_IPADDR") or "127.0.0.1",
              "MASTER_PORT": env.get("MASTER_PORT") or str(20000 + zlib.crc32(seed.encode()) % 40000)}
    env.update(values)
    return values
