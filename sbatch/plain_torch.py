"""A plain PyTorch training loop (DDP over gloo, its own torch.save checkpoints) with the platform's protection.

The lines marked `# sigma` are all it adds to the loop it would be without the platform: report each step, answer
the controller's just-in-time checkpoint request, stop cleanly on a NaN, resume from the newest checkpoint saved
whole. Run one task per rank under srun (sbatch/plain-torch.sbatch), or alone:
`SLURM_JOB_ID=1 python sbatch/plain_torch.py --ckpt-dir /tmp/plain --steps 50`.
"""

import argparse
import math
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

from sigma import kpi  # sigma
from sigma.integrations.torch import CollectiveTimer, agree, saved_together, slurm_env  # sigma


def batch(step: int, rank: int, size: int = 16):
    """The same batch for the same step and rank on every run: a resumed run goes on where it was."""
    g = torch.Generator().manual_seed(step * 1000 + rank)
    x = torch.randn(size, 32, generator=g)
    return x, x.sum(dim=1, keepdim=True).sin()


def save(model, opt, step: int, ckpt_dir: Path, rank: int) -> Path:
    path = ckpt_dir / f"step-{step}.pt"
    if rank == 0:
        tmp = path.with_suffix(".tmp")
        torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step}, tmp)
        tmp.replace(path)
    return path


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--ckpt-dir", required=True)
    p.add_argument("--steps", type=int, default=1000)
    p.add_argument("--save-every", type=int, default=20)
    p.add_argument("--step-delay", type=float, default=0.0, help="stands in for a bigger model's compute")
    p.add_argument("--fault-hooks", action="store_true", help="honour `sigma chaos nan` (testing only)")
    a = p.parse_args()
    slurm_env()
    torch.set_num_threads(1)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1:
        dist.init_process_group("gloo")
    rank = dist.get_rank() if world > 1 else 0
    run = kpi.Run(rank=rank, trainer="plain PyTorch loop", fault_hooks=a.fault_hooks)  # sigma
    ckpt_dir = Path(a.ckpt_dir)
    ckpt_dir.mkdir(parents=True, exist_ok=True)

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.Linear(64, 1))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    step, resume = 0, kpi.resume_checkpoint(ckpt_dir)  # sigma: the newest checkpoint saved whole
    if resume:
        state = torch.load(resume)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        step = state["step"]
    ddp = torch.nn.parallel.DistributedDataParallel(model) if world > 1 else model
    CollectiveTimer(run).attach(ddp)  # sigma: the all-reduce's waiting time names a straggler
    run.start(step, resumed_from=resume)  # sigma

    while step < a.steps:
        step += 1
        t0 = time.perf_counter()
        x, y = batch(step, rank)
        loss = torch.nn.functional.mse_loss(ddp(x), y)
        if run.nan_injected():  # sigma: the testing-only fault hook
            loss = loss * float("nan")
        loss.backward()
        time.sleep(a.step_delay)
        request, bad = agree(run.checkpoint_request(), not math.isfinite(loss.item()), run)  # sigma
        if bad:  # sigma: the update is not applied, so the model still holds the last healthy step
            path = save(model, opt, step - 1, ckpt_dir, rank)
            saved_together(run, step - 1, path, kind="rollback")  # sigma: once rank 0's file is whole
            run.nonfinite(step, loss.item())  # sigma: the controller requeues the job
            run.hold(max_s=kpi.NAN_HOLD_S)  # sigma
            return 3
        opt.step()
        opt.zero_grad(set_to_none=True)
        run.step(step, loss=loss.item(), tokens=x.shape[0] * world, step_time_s=time.perf_counter() - t0)  # sigma
        if step % a.save_every == 0 or step == a.steps:
            run.checkpoint_saved(step, save(model, opt, step, ckpt_dir, rank))  # sigma
        if request:  # sigma: the controller asks before a requeue
            saved_together(run, step, save(model, opt, step, ckpt_dir, rank), request=request)  # sigma
            run.hold(request)  # sigma: the requeue's SIGTERM comes while holding
    run.stop(step)  # sigma
    return 0


if __name__ == "__main__":
    sys.exit(main())
