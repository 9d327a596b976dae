"""`sigma tune`: pick a training layout for an allocation (docs/train-parallel.md, "Tuner").

    sigma tune --config configs/train/tiny.yaml --nodes 2 --gpus-per-node 2 --global-batch 16 [--budget 30]
    sigma tune --what-if configs/tune/paper-2048.yaml --config configs/train/tiny.yaml --nodes 256 \
               --gpus-per-node 8 --global-batch 4096
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def register(subparsers) -> None:
    p = subparsers.add_parser("tune", help="search tp x pp x ep x vpp x micro-batch layouts: profile, model, "
                                           "measure the few best",
                              description="Phase 1 profiles this platform with short jobs (submitit: SLURM, or "
                                          "local processes) and fits a cost model; phase 2 prunes layouts that do "
                                          "not fit in memory or are dominated, ranks the rest and times the few best "
                                          "for real. Writes the chosen layout as a trainer config.")
    p.add_argument("--config", required=True, help="trainer preset, e.g. configs/train/tiny.yaml")
    p.add_argument("--nodes", type=int, required=True, help="nodes of the target allocation")
    p.add_argument("--gpus-per-node", type=int, required=True, help="ranks per node")
    p.add_argument("--global-batch", type=int, required=True, help="sequences per optimiser step")
    p.add_argument("--budget", type=float, metavar="MINUTES", help="time for phase 2's measurements; fewer layouts "
                                                                    "are timed when they would not fit")
    p.add_argument("--measure", type=int, default=3, help="best-ranked layouts timed for real (default: %(default)s), "
                                                          "with the fastest predicted of each pipeline depth, and those "
                                                          "within the model's error band while at most a fifth of all")
    p.add_argument("--steps", type=int, default=3, help="timed steps per measured layout at least, one per round "
                                                        "of the layouts in turn (default: %(default)s)")
    p.add_argument("--max-steps", type=int, default=12, help="at most, while the fastest is not told apart from "
                                                            "the runner-up with confidence (default: %(default)s)")
    p.add_argument("--memory-gb", type=float, help="memory per rank (default: the node's memory / ranks per node)")
    p.add_argument("--recompute", action="store_true", help="also search recomputing every MoE layer (less "
                                                            "memory, more compute; always searched with --what-if)")
    p.add_argument("--max-tp", type=int, help="largest tp degree (default: --gpus-per-node)")
    p.add_argument("--what-if", metavar="FABRIC", help="a fabric file (configs/tune/*.yaml): phase 2 on the cost "
                                                       "model alone, for a scale that cannot run here")
    p.add_argument("--out", help="directory of the run's state and results (default: runs/tune/<preset>)")
    p.add_argument("--resume", action="store_true", help="keep phase 1 and the layouts already measured under --out")
    p.add_argument("--top", type=int, default=15, help="candidate rows shown (default: %(default)s; --json has all)")
    p.add_argument("--json", action="store_true", help="print the whole result as JSON")
    p.add_argument("overrides", nargs="*", metavar="key=value", help="trainer config overrides, e.g. "
                                                                     "model_overrides.n_layers=8 data.seq_len=128")
    p.set_defaults(func=run)


def run(args) -> int:
    from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    from sigma.cli import CommandError, console
    from sigma.tune.tuner import Request, Tuner, TuneError

    for name in ("nodes", "gpus_per_node", "global_batch", "measure", "steps", "max_steps"):
        if getattr(args, name) < 1:
            raise CommandError(f"--{name.replace('_', '-')} must be at least 1, got {getattr(args, name)}")
    preset = Path(args.config).stem
    out = Path(args.out or f"runs/tune/{preset}" + ("-what-if" if args.what_if else "")).expanduser()
    req = Request(config=args.config, nodes=args.nodes, gpus_per_node=args.gpus_per_node,
                  global_batch=args.global_batch, out=out, overrides=args.overrides, budget_min=args.budget,
                  measure=args.measure, steps=args.steps, max_steps=args.max_steps, memory_gb=args.memory_gb,
                  max_tp=args.max_tp,
                  resume=args.resume, what_if=args.what_if, recompute=args.recompute)
    progress = Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(),
                        TextColumn("{task.completed}/{task.total}"), TimeElapsedColumn(),
                        console=console() if not args.json else None, transient=False,
                        disable=args.json or not sys.stderr.isatty() and not sys.stdout.isatty())
    try:
        with progress:
            result = Tuner(req, progress).run()
    except TuneError as exc:
        raise CommandError(str(exc)) from None
    if args.json:
        print(json.dumps(result, indent=1))
        return 0
    print_result(result, args.top)
    return 0


def print_result(result: dict, top: int) -> None:
    from rich.table import Table

    from sigma.cli import console

    out = console()
    order = {"measured": 0, "ranked": 1, "failed": 2, "pruned": 3}
    rows = sorted(result["candidates"], key=lambda r: (order[r["status"]], r["predicted_s"]))
    table = Table(title=f"{result['model']} on {result['world']} ranks ({result['nodes']} x {result['gpus_per_node']}), "
                        f"global batch {result['global_batch']} x {result['seq_len']} tokens")
    for col in ("layout", "dp", "predicted ms", "measured ms", "spread", "error vs gauge", "memory GiB", "status"):
        table.add_column(col, justify="left" if col in ("layout", "status") else "right")
    for r in rows[:top]:
        measured = r.get("measured_s")
        err = ""
        if "predicted_vs_gauge" in r and "vs_gauge" in r.get("timing", {}):  # against the gauge, same rounds
            err = f"{100 * (r['predicted_vs_gauge'] / r['timing']['vs_gauge'] - 1):+.1f}%"
        elif measured and r["layout"] == result.get("gauge", {}).get("layout"):
            err = "gauge"
        status = r["status"] + (f" #{r['rank']}" if "rank" in r and r["status"] == "ranked" else "")
        status += f": {r['why']}" if r["why"] else ""
        table.add_row(r["layout"], str(r["dp"]), f"{1000 * r['predicted_s']:,.1f}",
                      f"{1000 * measured:,.1f}" if measured else "",
                      f"{100 * r['timing']['spread']:.0f}% x{r['timing']['rounds']}" if "timing" in r else "", err,
                      f"{r['memory_gib']:.2f}", status)
    out.print(table)
    c = result["counts"]
    out.print(f"{len(result['candidates'])} layouts: {c['measured']} measured, {c['ranked']} ranked only, "
              f"{c['pruned']} pruned, {c['failed']} failed; {len(rows) - min(top, len(rows))} not shown (--top, --json)")
    for line in result["constraints"]:
        out.print(f"  - {line}")
    if "cost_model_median_error" in result:
        out.print(f"cost model median error on the measured layouts, relative to {result['gauge']['layout']} timed in "
                  f"the same rounds: {100 * result['cost_model_median_error']:.1f}% (in seconds, at phase 1's load: "
                  f"{100 * result['cost_model_median_error_seconds']:.1f}%)")
    pick = result["pick"]
    basis = f"measured {1000 * pick['measured_s']:,.1f} ms" if "measured_s" in pick else \
        f"predicted {1000 * pick['predicted_s']:,.1f} ms (cost model only)"
    out.print(f"pick: {pick['layout']} (dp {pick['dp']}), {basis} per step; trainer config: "
              f"{result['trainer_config']}")
