"""What in-memory peer replicas cost a training step: the same 2-rank run with `checkpoint.replica_every` 0 (off),
N and 1, in interleaved rounds (drift on a shared machine hits every setting alike).

    python bench/replica_cost.py [--preset debug] [--rounds 3] [--steps 40] [--every 0 5 1] [--seq-len 128]
                                 [--batch 8] [--baseline DIR]

Each run trains the preset on 2 gloo ranks (CPU, one thread a rank), each started by a torchrun of its own as a
node of its own (its own SLURMD_NODENAME), so that every replica is sent to the peer as between real nodes, and reads
the ranks' KPI lines: the step time is the slower rank's per step, the median over the steps after the first `--skip` (start-up
and warm-up excluded). Prints per setting the median of the rounds' medians, the ratio to replicas off, the
replication rounds actually written (a round due while the previous one is in flight is skipped: `replica_step`
and `replica_skipped` on the KPI lines) and the host memory the replicas held (the replica directory's largest size
while the run stepped: the rank's own state and its peer's, the newest two steps of each).

`--baseline DIR`: a checkout of another version of this repository (e.g. `git archive main | tar -x -C DIR`); its
trainer runs the settings with replicas on as extra columns of the same rounds ("N (baseline)"), side by side.
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
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


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(work: Path, data: Path, preset: str, every: int, steps: int, seq_len: int, batch: int,
        tag: str, tree: Path | None = None) -> tuple[list[float], int, int | None]:
    """(per-step time of the slower rank, the replica directory's peak bytes, replication rounds written by rank 0
    as its KPI lines tell, None where they do not) of one run of this checkout's trainer, or `tree`'s."""
    out = work / tag
    shutil.rmtree(out, ignore_errors=True)
    shm = Path("/dev/shm") / f"sigma-replica-cost-{os.getpid()}-{tag}"
    env = {**os.environ, "SIGMA_KPI_DIR": str(out / "kpi"), "SIGMA_JOB_ID": "1", "OMP_NUM_THREADS": "1"}
    env.pop("SLURM_JOB_ID", None)
    trainer = ["-m", "sigma.train.trainer"]
    if tree is not None:  # the editable install's finder would import this checkout: the launcher drops it
        launcher = work / "baseline_trainer.py"
        launcher.write_text("import runpy, sys\n"
                            "sys.meta_path[:] = [f for f in sys.meta_path if '__editable__' not in "
                            "getattr(f, '__module__', '')]\n"
                            f"sys.path.insert(0, {str(tree)!r})\n"
                            "runpy.run_module('sigma.train.trainer', run_name='__main__', alter_sys=True)\n")
        trainer = [str(launcher)]
    port = free_port()
    argv = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc_per_node", "1",
            "--master_addr", "127.0.0.1", "--master_port", str(port), *trainer, "--config", str(configs_dir() / "train" / f"{preset}.yaml"),
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
    try:  # two "nodes" of one rank each (their own SLURMD_NODENAME): every replica goes to the other one
        procs = [subprocess.Popen(argv[:3] + ["--node_rank", str(n)] + argv[3:], text=True,
                                  env={**env, "SLURMD_NODENAME": f"bench-node{n}"}, stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT) for n in range(2)]
        outputs = [p.communicate(timeout=1800)[0] for p in procs]
    finally:
        done.set()
        watcher.join()
        shutil.rmtree(shm, ignore_errors=True)
    for p, output in zip(procs, outputs):
        if p.returncode != 0:
            raise SystemExit(f"run replica_every={every} failed:\n{output[-3000:]}")
    per_step: dict[int, float] = {}
    written: set[int] = set()
    for path in (out / "kpi" / "job-1").glob("rank-*.jsonl"):
        for r in read_kpis(path):
            if "event" not in r and r.get("step_time_s"):
                per_step[r["step"]] = max(per_step.get(r["step"], 0.0), r["step_time_s"])
                if path.name.startswith("rank-0.") and r.get("replica_step"):
                    written.add(r["replica_step"])
    rounds = len(written) if every and (tree is None or written) else None
    return [per_step[s] for s in sorted(per_step)], peak[0], rounds


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
    ap.add_argument("--baseline", type=Path, default=None,
                    help="a checkout of another version, run as extra columns (settings with replicas on)")
    a = ap.parse_args()
    work = a.work or Path(tempfile.mkdtemp(prefix="sigma-replica-cost-"))
    data = work / "data"
    if not data.exists():
        prepare(data, max_mb=0.5, shard_tokens=100_000, vocab_size=512)
    load = [os.getloadavg()[0]]
    settings = [(e, None) for e in a.every] + ([(e, a.baseline) for e in a.every if e] if a.baseline else [])
    label = {s: f"{s[0]}" + (" (baseline)" if s[1] else "") for s in settings}
    medians: dict[tuple, list[float]] = {s: [] for s in settings}
    peaks: dict[tuple, int] = {s: 0 for s in settings}
    rounds_written: dict[tuple, list[int]] = {s: [] for s in settings}
    for r in range(a.rounds):
        order = settings[r % len(settings):] + settings[:r % len(settings)]  # rotated: no setting always first
        for setting in order:
            every, tree = setting
            tag = f"r{r}-e{every}" + ("-base" if tree else "")
            times, peak, written = run(work, data, a.preset, every, a.steps, a.seq_len, a.batch, tag, tree)
            medians[setting].append(statistics.median(times[a.skip:]))
            peaks[setting] = max(peaks[setting], peak)
            if written is not None:
                rounds_written[setting].append(written)
            print(f"round {r + 1} replica_every={label[setting]}: median step {1000 * medians[setting][-1]:.1f} ms "
                  f"({len(times) - a.skip} steps), replicas held {peaks[setting] / 1e6:.1f} MB"
                  + (f", {written} replication rounds written in {a.steps} steps" if written is not None else ""),
                  flush=True)
        load.append(os.getloadavg()[0])
    base = statistics.median(medians[settings[0]])
    print(f"\n{a.preset} preset, 2 gloo ranks (1 thread each), seq {a.seq_len}, global batch {a.batch}, {a.rounds} rounds "
          f"of {a.steps} steps; load average {min(load):.1f}-{max(load):.1f}")
    print(f"{'replica_every':>20}  {'step (median)':>13}  {'vs ' + label[settings[0]]:>7}  {'rounds':>24}  "
          f"{'rounds written':>14}  replicas held")
    for setting in settings:
        m = statistics.median(medians[setting])
        rounds = ", ".join(f"{1000 * x:.0f}" for x in medians[setting])
        written = (f"{statistics.median(rounds_written[setting]):.0f} of {a.steps // setting[0]}"
                   if rounds_written[setting] else "-")
        print(f"{label[setting]:>20}  {1000 * m:>10.1f} ms  {m / base:>6.3f}x  {rounds:>21} ms  {written:>14}  "
              f"{peaks[setting] / 1e6:.1f} MB")


if __name__ == "__main__":
    main()
