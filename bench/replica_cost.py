"""What in-memory peer replicas cost a training step: the same 2-rank run with `checkpoint.replica_every` 0 (off),
N and 1, in interleaved rounds (drift on a shared machine hits every setting alike).

    python bench/replica_cost.py [--preset debug] [--rounds 3] [--steps 40] [--every 0 5 1] [--seq-len 128]
                                 [--batch 8]

Each run trains the preset on 2 gloo ranks (torchrun, CPU, one thread a rank) and reads the ranks' KPI
lines: the step time is the slower rank's per step, the median over the steps after the first `--skip` (start-up
and warm-up excluded). Prints per setting the median of the rounds' medians, the ratio to replicas off, and the host
memory the replicas held (the replica directory's largest size while the run stepped: the rank's own state and its
peer's, the newest two steps of each).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from sigma.paths import configs_dir  # noqa: E402
from sigma.train.data import prepare  # noqa: E402
from sigma.train.kpi import read_kpis  # noqa: E402


def tree_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) if path.exists() else 0


def run(work: Path, data: Path, preset: str, every: int, steps: int, seq_len: int, batch: int,
        tag: str) -> tuple[list[float], int]:
    """(per-step time of the slower rank, the replica directory's peak bytes) of one run."""
    out = work / tag
    shutil.rmtree(out, ignore_errors=True)
    shm = Path("/dev/shm") / f"sigma-replica-cost-{os.getpid()}-{tag}"
    env = {**os.environ, "SIGMA_KPI_DIR": str(out / "kpi"), "SIGMA_JOB_ID": "1", "OMP_NUM_THREADS": "1"}
    env.pop("SLURM_JOB_ID", None)
    argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
            "-m", "sigma.train.trainer", "--config", str(configs_dir() / "train" / f"{preset}.yaml"),
            f"data.path={data}", "data.prepare_if_missing=false", f"data.seq_len={seq_len}",
            f"data.global_batch={batch}", "threads=1", "kpi.progress_every=0", "eval.every=0", f"steps={steps}",
            f"checkpoint.dir={out / 'ckpt'}", "checkpoint.every=0", f"checkpoint.replica_every={every}",
            f"checkpoint.replica_dir={shm}"]
    peak, done = [0], threading.Event()

    def watch():  # the replicas live only while the run does: a finished run frees them
        while not done.wait(0.2):
            peak[0] = max(peak[0], tree_bytes(shm))

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=1800)
    finally:
        done.set()
        watcher.join()
        shutil.rmtree(shm, ignore_errors=True)
    if proc.returncode != 0:
        raise SystemExit(f"run replica_every={every} failed:\n{proc.stderr[-3000:]}")
    per_step: dict[int, float] = {}
    for path in (out / "kpi" / "job-1").glob("rank-*.jsonl"):
        for r in read_kpis(path):
            if "event" not in r and r.get("step_time_s"):
                per_step[r["step"]] = max(per_step.get(r["step"], 0.0), r["step_time_s"])
    return [per_step[s] for s in sorted(per_step)], peak[0]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="debug")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--skip", type=int, default=5, help="first steps left out (start-up, warm-up)")
    ap.add_argument("--every", type=int, nargs="+", default=[0, 5, 1])
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--work", type=Path, default=None)
    a = ap.parse_args()
    work = a.work or Path(tempfile.mkdtemp(prefix="sigma-replica-cost-"))
    data = work / "data"
    if not data.exists():
        prepare(data, max_mb=0.5, shard_tokens=100_000, vocab_size=512)
    load = [os.getloadavg()[0]]
    medians: dict[int, list[float]] = {e: [] for e in a.every}
    peaks: dict[int, int] = {e: 0 for e in a.every}
    for r in range(a.rounds):
        order = a.every[r % len(a.every):] + a.every[:r % len(a.every)]  # rotated: no setting always first
        for every in order:
            times, peak = run(work, data, a.preset, every, a.steps, a.seq_len, a.batch, f"r{r}-e{every}")
            medians[every].append(statistics.median(times[a.skip:]))
            peaks[every] = max(peaks[every], peak)
            print(f"round {r + 1} replica_every={every}: median step {1000 * medians[every][-1]:.1f} ms "
                  f"({len(times) - a.skip} steps), replicas held {peaks[every] / 1e6:.1f} MB", flush=True)
        load.append(os.getloadavg()[0])
    base = statistics.median(medians[a.every[0]])
    print(f"\n{a.preset} preset, 2 gloo ranks (1 thread each), seq {a.seq_len}, global batch {a.batch}, {a.rounds} rounds "
          f"of {a.steps} steps; load average {min(load):.1f}-{max(load):.1f}")
    print(f"{'replica_every':>13}  {'step (median)':>13}  {'vs ' + str(a.every[0]):>7}  {'rounds':>24}  replicas held")
    for every in a.every:
        m = statistics.median(medians[every])
        rounds = ", ".join(f"{1000 * x:.0f}" for x in medians[every])
        print(f"{every:>13}  {1000 * m:>10.1f} ms  {m / base:>6.3f}x  {rounds:>21} ms  {peaks[every] / 1e6:.1f} MB")


if __name__ == "__main__":
    main()
