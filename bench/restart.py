"""Where a requeued job's restart time goes, on the local cluster, before and after the restart cuts: a 2-node
expert-parallel `debug` job is requeued with `scontrol requeue` (what the controller does once it decided) and its
time to the first step again is split:

  requeue -> pending          SLURM ends the run (SIGTERM, then SIGKILL after KillWait) and lists it PENDING again
  pending -> running          BeginTime: SLURM holds a requeued job ~2 minutes; `scontrol update StartTime=now`
                              (the controller's start_now) lets it start at once
  running -> rank process     prolog, srun/submitit launching one process per rank
  process -> imported         Python, torch, sigma and submitit imports, unpickling the task
  imported -> process group   torch.distributed init (rendezvous of all ranks)
  process group -> built      model, optimiser, data shards
  built -> state loaded       the newest checkpoint (and a newer in-memory replica) read and applied
  state loaded -> first step  the first training step after the resume

usage: python bench/restart.py [--rounds 1] [--begin-time] [--replicas] [--state-dir DIR] [--baseline DIR]
                               [--imports-only]
Columns, each measured on a job of its own, interleaved round by round:
  before       launch.exit_on_sigterm=false: the ranks ignore SLURM's SIGTERM (as submitit does) until SIGKILL
  after        the defaults: a rank exits on SIGTERM (sigma/train/terminate.py)
  BeginTime    (--begin-time) the defaults, but SLURM's BeginTime left alone (no start_now)
Starts its own local cluster (a temporary state directory unless given, ports derived from this checkout) and stops
it afterwards.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from sigma.slurm.client import Slurm  # noqa: E402
from sigma.slurm.cluster import ClusterSpec, LocalCluster  # noqa: E402
from sigma.train.kpi import read_kpis  # noqa: E402
from tests.conftest import wait_for  # noqa: E402

PHASES = ["requeue -> pending", "pending -> running", "running -> rank process", "process -> imported",
          "imported -> process group", "process group -> built", "built -> state loaded",
          "state loaded -> first step"]


def submit(cluster: LocalCluster, data: Path, work: Path, replicas: bool, overrides: list[str]):
    from sigma.train.launch import submit as submit_job
    from sigma.train.train_config import load_train_config

    os.environ.update(cluster.env)
    cfg = load_train_config(REPO / "configs" / "train" / "debug.yaml", [
        f"data.path={data}", "data.prepare_if_missing=false", "data.seq_len=32", "data.global_batch=4", "threads=1",
        "steps=100000", "checkpoint.every=5", "kpi.progress_every=0", f"checkpoint.dir={work / 'ckpt'}",
        "launch.executor=slurm", "launch.nodes=2", "launch.gpus_per_node=1", "parallel.ep=2", "launch.timeout_min=30",
        f"launch.folder={work / 'submitit'}", "fault.step_delay_s=0.15", "checkpoint.jit_poll_every=0",
        *([f"checkpoint.replica_every=1", f"checkpoint.replica_dir={work / 'shm'}"] if replicas else []),
        *overrides])
    return int(submit_job(cfg).job_id)


def rank0_records(cluster: LocalCluster, job_id: int, since: float) -> list[dict]:
    kpi = Path(cluster.env["SIGMA_KPI_DIR"]) / f"job-{job_id}"
    return sorted((r for path in kpi.glob("rank-0.*.jsonl") for r in read_kpis(path) if r["ts"] >= since),
                  key=lambda r: r["ts"])


def steps(records: list[dict]) -> list[int]:
    return [r["step"] for r in records if "event" not in r]


def one_restart(slurm: Slurm, cluster: LocalCluster, job_id: int, release: bool) -> dict[str, float]:
    before = time.time()
    wait_for(lambda: len(steps(rank0_records(cluster, job_id, before))) >= 8, timeout=300, what="8 steps")
    restarts = slurm.job(job_id).restarts
    requeued = time.time()
    slurm.requeue(job_id)
    pending = wait_for(lambda: (j := slurm.job(job_id)) and j.state == "PENDING" and j.restarts > restarts
                       and time.time(), timeout=120, interval=0.1, what="pending")
    if release:
        wait_for(lambda: slurm.job(job_id).reason == "BeginTime", timeout=30, interval=0.1, what="BeginTime")
        slurm.start_now(job_id)
    running = wait_for(lambda: slurm.job(job_id).state == "RUNNING" and time.time(), timeout=400, interval=0.1,
                       what="running again")
    def new_run():  # the old run's last steps may land after the requeue: the new run starts with `start`
        records = rank0_records(cluster, job_id, requeued)
        start = next((r for r in records if r.get("event") == "start"), None)
        first = start and next((r["ts"] for r in records if "event" not in r and r["ts"] > start["ts"]), None)
        return first and (start, first)

    start, first = wait_for(new_run, timeout=300, what="the first step after the restart")
    up = start.get("startup") or {}
    marks = [requeued, pending, running, up.get("process"), up.get("imported"), up.get("process_group"),
             up.get("built"), up.get("state_loaded"), first]
    if None in marks:
        raise SystemExit(f"the trainer's start event has no startup times: {start}")
    out = {name: b - a for name, a, b in zip(PHASES, marks, marks[1:])}
    out["total: requeue -> first step"] = first - requeued
    return out


MODES = {  # column -> (train overrides, release the BeginTime)
    "before": (["launch.exit_on_sigterm=false"], True),
    "after": ([], True),
    "BeginTime": ([], False),
}


def measure(slurm: Slurm, cluster: LocalCluster, work: Path, mode: str, replicas: bool, n: int) -> dict:
    """One fresh job of `mode`, requeued once after 8 steps; its phases."""
    overrides, release = MODES[mode]
    job_dir = work / f"{mode}-{n}"
    job_id = submit(cluster, work / "data", job_dir, replicas, overrides)
    try:
        return one_restart(slurm, cluster, job_id, release)
    finally:
        slurm.cancel(job_id)
        wait_for(lambda: (j := slurm.job(job_id)) is None or j.state not in ("RUNNING", "COMPLETING", "PENDING"),
                 timeout=60, interval=0.2, what=f"job {job_id} gone")


def import_split(tree: Path | None = None) -> dict[str, float]:
    """Seconds a fresh interpreter spends importing the trainer (`python -X importtime`) of this checkout, or of
    `tree` (another version of it), split into torch, torch._dynamo and torch.distributed.checkpoint where the
    start-up imports them, and this project's own modules (their self time); then, timed apart, what building the
    trainer's optimiser costs (torch's own AdamW imports torch._dynamo on first use) and what importing
    torch.distributed.checkpoint costs afterwards (what the first checkpoint load or save pays if the start-up
    did not)."""
    import subprocess

    prelude = ("import sys; sys.meta_path[:] = [f for f in sys.meta_path if '__editable__' not in "
               f"getattr(f, '__module__', '')]; sys.path.insert(0, {str(tree)!r}); " if tree else "")
    code = (prelude + "import time, sys; import sigma.train.launch, sigma.train.trainer; t = time.perf_counter(); "
            "import torch; from sigma.train.train_config import OptimConfig; "
            "sigma.train.trainer.build_optimizer(torch.nn.Linear(4, 4), OptimConfig(), torch.device('cpu')); "
            "print(time.perf_counter() - t); t = time.perf_counter(); "
            "import torch.distributed.checkpoint; print(time.perf_counter() - t)")
    proc = subprocess.run([sys.executable, "-X", "importtime", "-c", code], capture_output=True, text=True,
                          check=True, cwd=tree or REPO)
    cumulative, own, first = {}, 0.0, True
    for line in proc.stderr.splitlines():
        parts = line.removeprefix("import time:").split("|")
        if len(parts) != 3 or not parts[0].strip().isdigit():
            continue
        self_us, cum_us, name = int(parts[0]), int(parts[1]), parts[2].strip()
        if not first:
            continue
        cumulative.setdefault(name, cum_us / 1e6)
        if name == "sigma" or name.startswith("sigma."):
            own += self_us / 1e6
        if name == "sigma.train.trainer":
            first = False  # what follows is the DCP import timed apart
    total = cumulative.get("sigma.train.launch", 0.0) + cumulative.get("sigma.train.trainer", 0.0)
    optimiser, dcp = (float(x) for x in proc.stdout.split())
    return {"all": total, "torch": cumulative.get("torch", 0.0), "torch._dynamo": cumulative.get("torch._dynamo", 0.0),
            "torch.distributed.checkpoint": cumulative.get("torch.distributed.checkpoint", 0.0),
            "sigma (own)": own, "then the optimiser built": optimiser, "then DCP, when first needed": dcp}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--begin-time", action="store_true", help="also a column with SLURM's BeginTime left alone")
    parser.add_argument("--replicas", action="store_true", help="checkpoint.replica_every=1 in the job")
    parser.add_argument("--state-dir", default=None)
    parser.add_argument("--baseline", type=Path, default=None,
                        help="a checkout of another version: its trainer's imports are split too, side by side")
    parser.add_argument("--imports-only", action="store_true", help="only the import split (no cluster)")
    args = parser.parse_args()
    if args.imports_only:
        print_imports(args.baseline)
        return 0

    digest = int(hashlib.sha1(str(REPO).encode()).hexdigest()[:8], 16)
    state = Path(args.state_dir or tempfile.mkdtemp(prefix="sigma-bench-restart-"))
    work = Path(tempfile.mkdtemp(prefix="sigma-bench-restart-work-"))
    cluster = LocalCluster(state)
    cluster.up(ClusterSpec(nodes=4, port_base=30000 + (digest % 400) * 25))
    try:
        from sigma.train.data import prepare

        prepare(work / "data", max_mb=0.5, shard_tokens=100_000, vocab_size=512)
        slurm = Slurm(cluster.conf)
        slurm.env["SBATCH_OUTPUT"] = str(work / "slurm-%j.out")
        names = ["before", "after"] + (["BeginTime"] if args.begin_time else [])
        results: dict[str, list[dict]] = {name: [] for name in names}
        loads = []
        for n in range(args.rounds):
            for name in names:
                results[name].append(measure(slurm, cluster, work, name, args.replicas, n))
                loads.append(os.getloadavg()[0])
        print(f"restart of a 2-node EP=2 debug job on the local cluster ({os.cpu_count()} CPUs, 1-minute load "
              f"average {min(loads):.1f}-{max(loads):.1f} after each measurement), {args.rounds} round(s), median "
              f"seconds" + (", in-memory replicas on" if args.replicas else ""))
        print(f"{'phase':<30}" + "".join(f"{n:>12}" for n in names))
        for phase in PHASES + ["total: requeue -> first step"]:
            print(f"{phase:<30}" + "".join(f"{statistics.median(r[phase] for r in results[n]):>12.2f}"
                                              for n in names))
    finally:
        cluster.down(keep_munge=True)  # munged may serve other clusters on this machine
    print_imports(args.baseline)
    return 0


def print_imports(baseline: Path | None) -> None:
    """The import split of this checkout (and of `baseline`), interleaved twice."""
    trees = [("this checkout", None)] + ([("baseline", baseline)] if baseline else [])
    runs: dict[str, list[dict[str, float]]] = {name: [] for name, _ in trees}
    loads = [os.getloadavg()[0]]
    for _ in range(2):
        for name, tree in trees:
            runs[name].append(import_split(tree))
            loads.append(os.getloadavg()[0])
    print(f"imports of a fresh rank (python -X importtime, median of 2, load average {min(loads):.1f}-"
          f"{max(loads):.1f}), seconds:")
    keys = list(runs[trees[0][0]][0])
    print(f"{'':<16}" + "".join(f"{k:>{len(k) + 2}}" for k in keys))
    for name, _ in trees:
        print(f"{name:<16}" + "".join(f"{statistics.median(r[k] for r in runs[name]):>{len(k) + 2}.2f}"
                                      for k in keys))


if __name__ == "__main__":
    sys.exit(main())
