"""End-to-end training throughput on this CPU: tokens/s, MFU and HFU of the debug and tiny presets, 1 and 2 processes.

Usage: python bench/train_e2e.py [--steps N] [--presets debug,tiny] [--cores C] [--dtypes float32,bfloat16]
                                 [--peak-flops F] [--compare-host-malloc]
Runs the real trainer entry point (one process, or torchrun with 2 processes over gloo: data parallel, and
data + expert parallel with ep=2) on a small prepared slice of the standard library, and reads the figures
back from the KPI files the runs write. The first two steps (warm-up) are left out of the means. C cores are
split evenly between the processes, so 1- and 2-process rows compare the same hardware. MFU is against the
fixed peak the trainer states (the `sigma train calibrate` record for this CPU, thread count and dtype, or
--peak-flops); without one the trainer reports no MFU and neither does this table. Each preset trains on BPE data
prepared to its own vocabulary. --compare-host-malloc also runs every row with keep_freed_host_memory=false
(glibc's default allocation) and prints the trainer's default against it.
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


def run(preset: str, procs: int, ep: int, steps: int, cores: int, data: Path, work: Path, dtype: str,
        peak: float, keep_freed: bool = True) -> dict:
    threads = max(1, cores // procs)
    kpi = work / f"kpi-{preset}-{procs}-{ep}-{dtype}-{keep_freed}"
    args = ["--config", str(configs_dir() / "train" / f"{preset}.yaml"), f"steps={steps}",
            f"data.path={data}", "data.prepare_if_missing=false", f"threads={threads}", "kpi.progress_every=0",
            f"parallel.ep={ep}", "checkpoint.every=0", f"checkpoint.dir={kpi.with_name('ckpt-' + kpi.name)}",
            f"optim.warmup_steps={min(5, steps)}", "device=cpu", f"dtype={dtype}", f"peak_flops={peak}",
            "eval.every=0", "checkpoint.background=false", f"keep_freed_host_memory={str(keep_freed).lower()}"]
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
            "mfu": statistics.mean(r["mfu"] for r in metrics) if metrics[0].get("mfu") is not None else None,
            "hfu": statistics.mean(r["hfu"] for r in metrics) if metrics[0].get("hfu") is not None else None,
            "peak": start.get("peak_source"),
            "step_ms": 1000 * statistics.median(r["step_time_s"] for r in metrics),
            "loss": metrics[-1]["loss"], "params": start["params"], "threads": threads}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--presets", default="debug,tiny")
    parser.add_argument("--cores", type=int, default=min(2, os.cpu_count() or 1))
    parser.add_argument("--dtypes", default="float32,bfloat16")
    parser.add_argument("--peak-flops", type=float, default=0.0, help="stated peak per process (default: the "
                                                                       "trainer's: `sigma train calibrate`)")
    parser.add_argument("--compare-host-malloc", action="store_true",
                        help="also run each row with glibc's default allocation (keep_freed_host_memory=false)")
    args = parser.parse_args()
    if args.steps <= 2:
        parser.error(f"--steps {args.steps}: the first 2 steps are warm-up and left out; give at least 3")
    from sigma.train.config import load_model_config

    with tempfile.TemporaryDirectory(prefix="sigma-bench-train-") as tmp:
        work = Path(tmp)
        print(f"end-to-end training on CPU ({args.cores} core(s), {args.steps} steps, first {SKIP} left out; "
              f"fp32 master weights, bf16 = autocast)")
        print(f"{'preset':<7} {'dtype':<9} {'layout':<18} {'params/rank':>11} {'threads':>7} {'step ms':>8} "
              f"{'tokens/s':>10} {'vs 1 proc':>9} {'MFU':>7} {'HFU':>7}"
              + (f" {'default malloc tok/s':>20} {'kept/default':>12}" if args.compare_host_malloc else ""))
        peaks = set()
        for preset in args.presets.split(","):
            vocab = load_model_config(preset).vocab_size
            data = work / f"data-{vocab}"
            if not data.exists():
                prepare(data, max_mb=2.0, vocab_size=vocab)
            for dtype in args.dtypes.split(","):
                base = None
                for procs, ep, label in ((1, 1, "1 process"), (2, 1, "2 procs DP"), (2, 2, "2 procs DP+EP=2")):
                    r = run(preset, procs, ep, args.steps, args.cores, data, work, dtype, args.peak_flops)
                    base = base or r["tokens_per_s"]
                    pct = lambda v: f"{100 * v:6.2f}%" if v is not None else "    n/a"  # noqa: E731
                    extra = ""
                    if args.compare_host_malloc:
                        d = run(preset, procs, ep, args.steps, args.cores, data, work, dtype, args.peak_flops, False)
                        extra = f" {d['tokens_per_s']:>20,.0f} {r['tokens_per_s'] / d['tokens_per_s']:>11.2f}x"
                    print(f"{preset:<7} {dtype:<9} {label:<18} {r['params']:>11,} {r['threads']:>7} "
                          f"{r['step_ms']:>8.1f} {r['tokens_per_s']:>10,.0f} {r['tokens_per_s'] / base:>8.2f}x "
                          f"{pct(r['mfu'])} {pct(r['hfu'])}{extra}", flush=True)
                    peaks.add(r["peak"])
        for peak in sorted(p for p in peaks if p):
            print(f"peak: {peak}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
