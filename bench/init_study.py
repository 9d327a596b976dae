"""Initialisation study: Gaussian (one std for every matrix) versus scaled-output (Megatron) initialisation on the
same preset, same seeds, same data.

    .venv/bin/python bench/init_study.py [--config configs/train/debug.yaml] [--steps 300] [--seeds 0,1]
                                         [--lr 0.01] [--png init_study.png]

Prints per init: final loss (mean of the last 20 steps), gradient-norm spikes (steps above 3 x the running median
of the previous 20), the MoE parameter-norm profile at the end, and the collapse verdict; draws the loss curves,
the gradient norms and the norm profiles into one PNG.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.collapse import DEPTH, run  # noqa: E402
from sigma.train.collapse import assess  # noqa: E402

INITS = {"gaussian": ["model_overrides.init=gaussian"], "scaled": ["model_overrides.init=scaled"]}


def spikes(grads: list[float], window: int = 20, factor: float = 3.0) -> int:
    return sum(1 for i in range(window, len(grads)) if grads[i] > factor * statistics.median(grads[i - window:i]))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default="configs/train/debug.yaml")
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--seeds", default="0,1")
    p.add_argument("--lr", type=float, default=0.01, help="peak learning rate of both arms")
    p.add_argument("--png", default="init_study.png")
    args = p.parse_args()
    torch.set_num_threads(1)
    seeds = [int(s) for s in args.seeds.split(",")]
    print(f"{args.config} + {' '.join(DEPTH)}, lr {args.lr}, {args.steps} steps, seeds {seeds}; "
          f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f}")
    print(f"{'init':<9} {'seed':>4} {'final loss':>10} {'spikes':>6}  {'verdict':<10} end profile (MoE layer norms)")
    runs, t0 = {}, time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        for init, overrides in INITS.items():
            for seed in seeds:
                metrics = run(args.config, DEPTH + overrides + [f"optim.lr={args.lr}", f"optim.min_lr={args.lr / 10}"],
                              args.steps, seed, Path(tmp))
                runs[(init, seed)] = metrics
                losses = [float(m["loss"]) for m in metrics]
                grads = [float(m["grad_norm"]) for m in metrics]
                verdict = assess(metrics)
                profile = verdict.norms[-1][1] if verdict.norms else []
                print(f"{init:<9} {seed:>4} {statistics.mean(losses[-20:]):>10.4f} {spikes(grads):>6}  "
                      f"{verdict.state:<10} [{', '.join(f'{n:.2f}' for n in profile)}]", flush=True)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    colours = {"gaussian": "tab:red", "scaled": "tab:blue"}
    for (init, seed), metrics in runs.items():
        steps = [m["step"] for m in metrics]
        axes[0].plot(steps, [float(m["loss"]) for m in metrics], color=colours[init], alpha=0.7, label=f"{init} s{seed}")
        axes[1].plot(steps, [float(m["grad_norm"]) for m in metrics], color=colours[init], alpha=0.7)
        norms = [m["moe_param_norm"] for m in metrics if "moe_param_norm" in m]
        if norms:
            axes[2].plot(range(len(norms[-1])), norms[-1], marker="o", color=colours[init], alpha=0.7)
    axes[0].set_title("training loss"), axes[0].legend(fontsize=7)
    axes[1].set_title("gradient norm"), axes[1].set_yscale("log")
    axes[2].set_title("MoE parameter norm per layer at the end"), axes[2].set_xlabel("MoE layer")
    fig.tight_layout()
    fig.savefig(args.png, dpi=100)
    print(f"wrote {args.png}; {time.perf_counter() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
