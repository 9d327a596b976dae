"""Collapse experiment: small runs that diverge and runs that do not, several seeds each, judged by
`sigma collapse check`'s rules from the KPIs the trainer writes.

    .venv/bin/python bench/collapse.py [--config configs/train/debug.yaml] [--steps 300] [--seeds 0,1,2]

Per run: the step the first warning fired, the step the loss diverged, the lead ratio (warning step / divergence
step; the paper's goal: <= 0.2), which signal fired first, and false warnings on runs that did not diverge.
"""

from __future__ import annotations

import argparse
import io
import os
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sigma.train.collapse import assess, read_metrics  # noqa: E402
from sigma.train.train_config import load_train_config  # noqa: E402
from sigma.train.trainer import TrainingStopped, train  # noqa: E402

# name -> overrides; the first group is expected to diverge, "stable" not.
# Too high a learning rate, reached by a linear ramp over the whole run without clipping: training first learns,
# then becomes unstable as the rate grows.
HIGH_LR = ["optim.lr=1.0", "optim.min_lr=0.5", "optim.warmup_steps=250", "optim.grad_clip=0"]
VARIANTS = {
    "lr ramp to 1.0, no clip, no qk-norm": HIGH_LR,
    "lr ramp to 1.0, no clip, qk-norm": HIGH_LR + ["model_overrides.qk_norm=true"],
    "stable (preset lr, warm-up, clip)": [],
}
DEPTH = ["model_overrides.n_layers=6"]  # five MoE layers: a profile over depth


def run(config: str, overrides: list[str], steps: int, seed: int, root: Path) -> list[dict]:
    name = f"run{abs(hash((tuple(overrides), seed))) % 10**8}"
    cfg = load_train_config(config, [f"steps={steps}", f"seed={seed}", f"data.seed={seed}", f"name={name}",
                                     f"kpi.dir={root / 'kpi'}", "kpi.param_norm_every=5", "kpi.progress_every=0",
                                     "kpi.heartbeat_s=0", "eval.every=0", "checkpoint.every=0",
                                     f"checkpoint.dir={root / name}", "checkpoint.resume=false",
                                     "checkpoint.background=false", "threads=1", "device=cpu", *overrides])
    os.environ["SIGMA_JOB_ID"] = str(abs(hash(name)) % 10**6)
    try:
        summary = train(cfg, out=io.StringIO())
        path = Path(summary.kpi_path)
    except TrainingStopped:
        path = next((root / "kpi" / f"job-{os.environ['SIGMA_JOB_ID']}").glob("rank-0.*.jsonl"))
    return read_metrics([path])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default="configs/train/debug.yaml")
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--seeds", default="0,1,2")
    args = p.parse_args()
    torch.set_num_threads(1)
    seeds = [int(s) for s in args.seeds.split(",")]
    print(f"{args.config}, {args.steps} steps, seeds {seeds}; {os.cpu_count()} cores, load average "
          f"{os.getloadavg()[0]:.1f}")
    signals = ("norm_valley", "norm_growth", "grad_spikes", "load_skew")
    print(f"{'variant':<36} {'seed':>4} {'warn':>5} {'diverge':>7} {'lead':>5}  "
          + " ".join(f"{s:>11}" for s in signals) + "  first signal")
    per_signal = {s: {v: 0 for v in VARIANTS} for s in signals}
    false_warn = healthy = hit = diverged = 0
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        for variant, overrides in VARIANTS.items():
            for seed in seeds:
                verdict = assess(run(args.config, DEPTH + overrides, args.steps, seed, Path(tmp)))
                warn, div = verdict.warning_step, verdict.first.get("diverged")
                first = min(((s, k) for k, s in verdict.first.items() if k != "diverged"), default=(None, "-"))[1]
                lead = f"{warn / div:.2f}" if warn and div else "-"
                if div:
                    diverged += 1
                    hit += bool(warn and warn <= div / 5)
                else:
                    healthy += 1
                    false_warn += bool(warn)
                for sig in signals:
                    per_signal[sig][variant] += sig in verdict.first
                print(f"{variant:<36} {seed:>4} {warn or '-':>5} {div or '-':>7} {lead:>5}  "
                      + " ".join(f"{verdict.first.get(s, '-'):>11}" for s in signals)
                      + f"  {first}" + (f": {verdict.evidence[first]}" if first != "-" else ""), flush=True)
    for sig, counts in per_signal.items():
        print(f"{sig:<12} fired in " + ", ".join(f"{n}/{len(seeds)} {v}" for v, n in counts.items()))
    print(f"diverged runs warned at or before 1/5 of the divergence step: {hit}/{diverged}; false warnings on "
          f"runs that did not diverge: {false_warn}/{healthy}; {time.perf_counter() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
