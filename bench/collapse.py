"""Collapse experiment: small runs that diverge and runs that do not, several seeds each, judged by
`sigma collapse check`'s rules (sigma/train/collapse.py) from the KPIs the trainer writes.

    .venv/bin/python bench/collapse.py [--config configs/train/debug.yaml] [--tune-seeds 0,1] [--seeds 2,3,4]
                                       [--workers 1] [--runs DIR] [--variants "A;B"] [--report-only]

Divergence, precisely: the loss is non-finite, or its 20-step moving average stays above 1.1 x its lowest moving
average for 20 steps in a row; the divergence step is the first of those steps (`Thresholds.diverge`, `window`).
Per run: each signal's first step, the warning step (the earliest signal), the divergence step, the lead ratio
(warning step / divergence step; the paper's goal: <= 0.2). Per signal, over the diverged runs: how many it warned
at or before 1/5 of the divergence step; over the runs that did not diverge: how many it fired in (false warnings).

The thresholds were set by looking at the tuning seeds only; the held-out seeds were judged with them unchanged.
Training KPIs go to --runs (one JSON per run) and are reused on the next call, so the judgement can be re-run
without training again.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sigma.train.collapse import Thresholds, assess  # noqa: E402

# A linear learning-rate ramp to 1.2 (then a cosine to 0.6), no clipping: the run first learns, then, as the rate
# grows past what the model tolerates, its loss climbs back and stays there: a late divergence. The slow ramp takes
# 600 steps to get there, so a precursor has room to come first. Constant rates up to 0.3 after a short warm-up did
# not diverge in 500 steps on this preset (docs/stability.md), which is why the rate keeps rising.
NO_CLIP = ["optim.min_lr=0.6", "optim.lr=1.2", "optim.grad_clip=0"]
def constant_lr(lr: float) -> list[str]:
    return [f"optim.lr={lr}", f"optim.min_lr={lr}", "optim.warmup_steps=10", "optim.grad_clip=0"]


VARIANTS = {  # name -> (overrides, steps, meant to diverge)
    "ramp 200 to lr 1.2, no clip": (NO_CLIP + ["optim.warmup_steps=200"], 250, True),
    "ramp 200 to lr 1.2, no clip, qk-norm": (NO_CLIP + ["optim.warmup_steps=200", "model_overrides.qk_norm=true"],
                                             250, True),
    "ramp 600 to lr 1.2, no clip": (NO_CLIP + ["optim.warmup_steps=600"], 700, True),
    "preset (lr 3e-3, warm-up, clip)": ([], 250, False),
    "lr 0.01 constant, no clip": (constant_lr(0.01), 700, False),
    # Too high a constant rate: the loss neither diverges within the run nor learns like the runs above; neither
    # kind of run, so reported apart (--variants to train them, e.g. for seed 0 only).
    "lr 0.04 constant, no clip": (constant_lr(0.04), 600, None),
    "lr 0.3 constant, no clip": (constant_lr(0.3), 500, None),
}
DEPTH = ["model_overrides.n_layers=6"]  # five MoE layers: a profile over depth
SIGNALS = ("attn_logits", "log_z_drift", "router_collapse", "norm_valley", "norm_growth", "grad_spikes",
           "load_skew")


def run(config: str, overrides: list[str], steps: int, seed: int, root: Path) -> list[dict]:
    """Train one run with the real trainer on CPU (one thread) and return its rank-0 KPI lines."""
    import torch

    from sigma.train.collapse import read_metrics
    from sigma.train.train_config import load_train_config
    from sigma.train.trainer import TrainingStopped, train

    torch.set_num_threads(1)
    name = f"run{abs(hash((tuple(overrides), seed))) % 10**8}"
    cfg = load_train_config(config, [f"steps={steps}", f"seed={seed}", f"data.seed={seed}", f"name={name}",
                                     f"kpi.dir={root / 'kpi'}", "kpi.param_norm_every=5", "kpi.progress_every=0",
                                     "kpi.heartbeat_s=0", "eval.every=0", "checkpoint.every=0",
                                     f"checkpoint.dir={root / name}", "checkpoint.resume=false",
                                     "checkpoint.background=false", "threads=1", "device=cpu", *overrides])
    os.environ["SIGMA_JOB_ID"] = str(abs(hash(name)) % 10**6)
    try:
        path = Path(train(cfg, out=io.StringIO()).kpi_path)
    except TrainingStopped:  # a non-finite loss stops the trainer: that is a divergence, keep its KPIs
        path = next((root / "kpi" / f"job-{os.environ['SIGMA_JOB_ID']}").glob("rank-0.*.jsonl"))
    return read_metrics([path])


def _train(job: tuple) -> tuple[str, int, float]:
    config, variant, overrides, steps, seed, out = job
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        metrics = run(config, DEPTH + overrides, steps, seed, Path(tmp))
    Path(out).write_text(json.dumps(metrics))
    return variant, seed, time.perf_counter() - t0


def run_file(runs: Path, variant: str, seed: int) -> Path:
    overrides, steps, _ = VARIANTS[variant]
    slug = "".join(c if c.isalnum() else "-" for c in variant).strip("-")
    return runs / f"{slug}.seed{seed}.steps{steps}.json"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default="configs/train/debug.yaml")
    p.add_argument("--tune-seeds", default="0,1", help="seeds the thresholds were set on")
    p.add_argument("--seeds", default="2,3,4", help="held-out seeds")
    p.add_argument("--workers", type=int, default=1, help="runs trained at once (one thread each)")
    p.add_argument("--runs", default="/tmp/sigma-collapse-runs", help="KPIs of every run (reused when present)")
    p.add_argument("--variants", help="a subset, separated by semicolons: " + "; ".join(VARIANTS))
    p.add_argument("--report-only", action="store_true", help="judge the stored runs; train none")
    args = p.parse_args()
    sets = {"tune": [int(s) for s in args.tune_seeds.split(",") if s],
            "held-out": [int(s) for s in args.seeds.split(",") if s]}
    variants = [v for v in VARIANTS if not args.variants or v in args.variants.split(";")]
    runs = Path(args.runs)
    runs.mkdir(parents=True, exist_ok=True)
    print(f"{args.config} + {' '.join(DEPTH)}, tuning seeds {sets['tune']}, held-out seeds {sets['held-out']}; "
          f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f}; thresholds {vars(Thresholds())}")
    jobs = [(args.config, v, VARIANTS[v][0], VARIANTS[v][1], seed, str(run_file(runs, v, seed)))
            for seed in sets["tune"] + sets["held-out"] for v in variants  # tuning runs first
            if not args.report_only and not run_file(runs, v, seed).is_file()]
    t0 = time.perf_counter()
    with ProcessPoolExecutor(max_workers=args.workers) as pool:
        for variant, seed, seconds in pool.map(_train, jobs):
            print(f"  trained {variant}, seed {seed}: {seconds:.0f} s", flush=True)
    if jobs:
        print(f"trained {len(jobs)} runs in {time.perf_counter() - t0:.0f} s ({args.workers} at once); "
              f"load average {os.getloadavg()[0]:.1f}")
    for label, seeds in sets.items():
        if seeds:
            report(label, seeds, variants, runs)
    return 0


def loss_averages(metrics: list[dict], window: int = 20) -> tuple[float, float, float]:
    """Lowest, highest and last value of the loss's moving average after its first window (as `assess` keeps it)."""
    alpha, ema, seen = 2.0 / (window + 1), None, []
    for row in metrics:
        loss = float(row["loss"])
        ema = loss if ema is None else ema + alpha * (loss - ema)
        seen.append(ema)
    seen = seen[window:] or seen
    return min(seen), max(seen), seen[-1]


def extremes(runs: list[list[dict]], window: int = Thresholds.window) -> str:
    """Largest attention logit, largest output log Z drift and lowest router entropy (after the first window) over
    the given runs: where the thresholds of those signals must stay clear of."""
    logit, drift, entropy = 0.0, 0.0, 1.0
    for metrics in runs:
        rows = [m for m in metrics if "attn_logit_max" in m]
        if rows:
            logit = max(logit, *(max(m["attn_logit_max"]) for m in rows))
            drift = max(drift, *(abs(m["output_log_z"] - rows[0]["output_log_z"]) for m in rows))
            entropy = min(entropy, *(min(m["router_entropy"]) for m in rows if m["step"] > window))
    return f"attention logit {logit:.1f}, log Z drift {drift:.2f}, router entropy {entropy:.3f}"


def report(label: str, seeds: list[int], variants: list[str], runs: Path) -> None:
    print(f"\n{label} seeds {seeds}")
    width = max(len(v) for v in variants)
    print(f"{'variant':<{width}} {'seed':>4} {'steps':>5} {'warn':>5} {'diverge':>7} {'lead':>5}  "
          + " ".join(f"{s:>{len(s)}}" for s in SIGNALS) + "  verdict     loss average best/peak/end")
    lead_ok = {s: 0 for s in SIGNALS + ("any",)}
    leads = {s: [] for s in SIGNALS + ("any",)}
    false = {s: 0 for s in SIGNALS + ("any",)}
    stable = stable_warned = 0  # runs of the variants meant to stay stable (all of them did not diverge)
    diverged = healthy = stalled = stalled_warned = 0
    for variant in variants:
        for seed in seeds:
            path = run_file(runs, variant, seed)
            if not path.is_file():
                if VARIANTS[variant][2] is not None:  # the too-high constant rates are trained on request only
                    print(f"{variant:<{width}} {seed:>4}  not trained")
                continue
            metrics = json.loads(path.read_text())
            verdict = assess(metrics)
            warn, div = verdict.warning_step, verdict.first.get("diverged")
            lead = f"{warn / div:.2f}" if warn and div else "-"
            row = (f"{variant:<{width}} {seed:>4} {VARIANTS[variant][1]:>5} {warn or '-':>5} {div or '-':>7} "
                   f"{lead:>5}  " + " ".join(f"{verdict.first.get(s, '-'):>{len(s)}}" for s in SIGNALS)
                   + f"  {verdict.state:<11} " + "/".join(f"{x:.2f}" for x in loss_averages(metrics)))
            print(row, flush=True)
            if VARIANTS[variant][2] is None:  # neither kind: not counted
                stalled += 1
                stalled_warned += bool(warn)
                continue
            diverged += bool(div)
            healthy += not div
            stable += VARIANTS[variant][2] is False
            stable_warned += VARIANTS[variant][2] is False and bool(warn)
            for sig in SIGNALS + ("any",):
                first = warn if sig == "any" else verdict.first.get(sig)
                if div:
                    lead_ok[sig] += bool(first and first <= div / 5)
                    leads[sig].append(f"{first / div:.2f}" if first else "none")
                else:
                    false[sig] += bool(first)
    print(f"{label:<8} runs that did not diverge, at their extreme (the margin a threshold has): "
          + extremes([json.loads(run_file(runs, v, s).read_text()) for v in variants for s in seeds
                      if run_file(runs, v, s).is_file() and VARIANTS[v][2] is False]))
    for sig in SIGNALS + ("any",):
        name = "any signal" if sig == "any" else sig
        print(f"{label:<8} {name:<15} warned at or before 1/5 of the divergence step in {lead_ok[sig]}/{diverged} "
              f"diverged runs (lead ratios: {', '.join(leads[sig]) or '-'}); fired in {false[sig]}/{healthy} runs "
              f"that did not diverge")
    print(f"{label:<8} of the runs that did not diverge, the variants meant to stay stable: a signal fired in "
          f"{stable_warned}/{stable} (the rest: runs of the unstable variants whose loss did not stay up long enough "
          f"to count as diverged)")
    if stalled:
        print(f"{label:<8} too high a constant rate: a signal fired in {stalled_warned}/{stalled} runs (not counted "
              f"above: their loss did not diverge, nor learn like the others)")


if __name__ == "__main__":
    sys.exit(main())
