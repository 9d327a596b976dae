"""End-to-end training throughput on this CPU: tokens/s and MFU of the debug and tiny presets, 1 and 2 processes.

Usage: python bench/train_e2e.py [--steps N] [--presets debug,tiny] [--cores C]
Runs the real trainer entry point (one process, or torchrun with 2 processes over gloo: data parallel, and
data + expert parallel with ep=2) on a small prepared slice of the standard library, and reads the figures
back from the KPI files the runs write. The first two steps (warm-up) are left out of the means. C cores are
split evenly between the processes, so 1- and 2-process rows compare the same hardware. MFU is against the
measured GEMM peak of the threads each process has (sigma.train.flops.peak_flops).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from sigma.paths import configs_dir
from sigma.train.data import prepare
from sigma.train.kpi import read_kpis

SKIP = 2


def run(preset: str, procs: int, ep: int, steps: int, cores: int, data: Path, work: Path) -> dict:
    threads = max(1, cores // procs)
    kpi = work / f"kpi-{preset}-{procs}-{ep}"
    args = ["--config", str(configs_dir() / "train" / f"{preset}.yaml"), f"steps={steps}",
            f"data.path={data}", "data.prepare_if_missing=false", f"threads={threads}", "kpi.progress_every=0",
            f"parallel.ep={ep}", "checkpoint.every=0", f"checkpoint.dir={work / f'ckpt-{preset}-{procs}-{ep}'}",
            f"optim.warmup_steps={min(5, steps)}", "device=cpu"]
    env = {**os.environ, "SIGMA_KPI_DIR": str(kpi), "SIGMA_JOB_ID": "1", "OMP_NUM_THREADS": str(threads)}
    env.pop("SLURM_JOB_ID", None)
    if procs == 1:
        cmd = [sys.executable, "-m", "sigma.train.trainer", *args]
    else:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={procs}",
               "-m", "sigma.train.trainer", *args]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1800)
    if proc.returncode:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{proc.stderr[-3000:]}")
    rank0 = next((kpi / "job-1").glob("rank-0.*.jsonl"))
    records = read_kpis(rank0)
    metrics = [r for r in records if "event" not in r][SKIP:]
    start = next(r for r in records if r.get("event") == "start")
    return {"tokens_per_s": statistics.mean(r["tokens_per_s"] for r in metrics),
            "mfu": statistics.mean(r["mfu"] for r in metrics),
            "step_ms": 1000 * statistics.median(r["step_time_s"] for r in metrics),
            "loss": metrics[-1]["loss"], "params": start["params"], "threads": threads}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--presets", default="debug,tiny")
    parser.add_argument("--cores", type=int, default=min(2, os.cpu_count() or 1))
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="sigma-bench-train-") as tmp:
        work = Path(tmp)
        prepare(work / "data", max_mb=2.0)
        print(f"end-to-end training on CPU ({args.cores} core(s), {args.steps} steps, first {SKIP} left out)")
        print(f"{'preset':<7} {'layout':<18} {'params/rank':>11} {'threads':>7} {'step ms':>8} {'tokens/s':>10} "
              f"{'vs 1 proc':>9} {'MFU':>7}")
        for preset in args.presets.split(","):
            base = None
            for procs, ep, label in ((1, 1, "1 process"), (2, 1, "2 procs DP"), (2, 2, "2 procs DP+EP=2")):
                r = run(preset, procs, ep, args.steps, args.cores, work / "data", work)
                base = base or r["tokens_per_s"]
                print(f"{preset:<7} {label:<18} {r['params']:>11,} {r['threads']:>7} {r['step_ms']:>8.1f} "
                      f"{r['tokens_per_s']:>10,.0f} {r['tokens_per_s'] / base:>8.2f}x {100 * r['mfu']:>6.2f}%",
                      flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
