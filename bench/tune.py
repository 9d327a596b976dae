"""The tuner against the exhaustive grid on the local SLURM cluster: is its pick as fast as the grid's best?

Usage: python bench/tune.py [--state-dir DIR] [--keep] [--nodes 2] [--gpus-per-node 2] [--global-batch 8]
                            [--steps 3] [--max-steps 8] [--measure 3] [--group 4] [--finalists 4] [--resume]
                            [key=value ...]
Brings up (or reuses) a local cluster under --state-dir and runs `sigma tune` (phase 1 profiling, phase 2 timing
the few best interleaved). Then the exhaustive grid, timed the same way: every layout of the same space, in groups
of --group layouts interleaved round by round with the tuner's pick in every group (so each layout's time is also a
per-round ratio to the pick, comparable across groups timed at different loads); then the grid's --finalists best
by that ratio and the pick, timed together in one more interleaved job. It prints the pick's throughput / the
best's (from that last job, with the confidence interval of the per-round ratio), layouts the tuner measured / the
grid's size, the tuner's wall time, the cost model's median error on the layouts it measured and over the grid,
each measured layout's predicted and measured time with the spread of its steps, and the load of the machine.
Default: the `tiny` preset with 8 layers, 64-token sequences, 4 ranks on 2 nodes.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

from sigma.paths import configs_dir


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--state-dir", default="/tmp/sigma-bench-tune-cluster")
    p.add_argument("--keep", action="store_true", help="leave the cluster up afterwards")
    p.add_argument("--work", default="/tmp/sigma-bench-tune")
    p.add_argument("--nodes", type=int, default=2)
    p.add_argument("--gpus-per-node", type=int, default=2)
    p.add_argument("--global-batch", type=int, default=8)
    p.add_argument("--steps", type=int, default=3, help="timed steps (rounds) per layout at least")
    p.add_argument("--max-steps", type=int, default=8, help="at most, while the best is not told apart")
    p.add_argument("--measure", type=int, default=3)
    p.add_argument("--group", type=int, default=4, help="grid layouts interleaved in one group (with the pick)")
    p.add_argument("--finalists", type=int, default=4, help="the grid's best, timed again with the pick")
    p.add_argument("--resume", action="store_true", help="keep what an earlier run under --work measured")
    p.add_argument("overrides", nargs="*", default=["model_overrides.n_layers=8", "data.seq_len=64"])
    args = p.parse_args()

    from sigma.slurm.cluster import ClusterSpec, LocalCluster
    from sigma.tune.space import Layout
    from sigma.tune.tuner import Request, Tuner

    cluster = LocalCluster(args.state_dir)
    cluster.up(ClusterSpec(nodes=max(4, args.nodes)))
    os.environ.update(cluster.env)
    work = Path(args.work)
    loads = [os.getloadavg()[0]]  # other work on a shared machine moves every figure below
    try:
        config = str(configs_dir() / "train" / "tiny.yaml")
        base = dict(config=config, nodes=args.nodes, gpus_per_node=args.gpus_per_node, global_batch=args.global_batch,
                    overrides=args.overrides, steps=args.steps, max_steps=args.max_steps, resume=args.resume)
        t0 = time.monotonic()
        tuned = Tuner(Request(out=work / "tuner", measure=args.measure, **base)).run()
        wall = time.monotonic() - t0
        walls = work / "walls.json"  # with --resume, the first run's figures
        if args.resume and walls.exists():
            wall = json.loads(walls.read_text())["tuner"]
        loads.append(os.getloadavg()[0])
        pick_layout = Layout.from_dict(tuned["pick"]["keys"])

        grid_tuner = Tuner(Request(out=work / "grid", **base))
        grid_tuner.phase1_path.write_text((work / "tuner" / "phase1.json").read_text())  # same costs, no re-profile
        rows = grid_tuner.candidates(grid_tuner.costs())
        t1 = time.monotonic()
        grid = grid_tuner.measure(rows, group=args.group, reference=pick_layout)
        grid_wall = time.monotonic() - t1
        if args.resume and walls.exists():
            grid_wall = json.loads(walls.read_text())["grid"]
        walls.write_text(json.dumps({"tuner": wall, "grid": grid_wall}))
        loads.append(os.getloadavg()[0])

        ok = {n: r for n, r in grid.items() if "error" not in r}
        vs_pick = {n: (r["vs_reference"]["median"] if "vs_reference" in r else 1.0) for n, r in ok.items()}
        by_name = {r["layout"].name(): r for r in rows}
        finalists = sorted((n for n in ok if n != pick_layout.name()), key=vs_pick.get)[:args.finalists]
        final_tuner = Tuner(Request(out=work / "final", **{**base, "steps": max(5, args.steps),
                                                           "max_steps": max(12, args.max_steps)}))
        final = final_tuner.measure([by_name[n] for n in finalists + [pick_layout.name()]], reference=pick_layout)
        loads.append(os.getloadavg()[0])
    finally:
        if not args.keep:
            cluster.down()

    pick = pick_layout.name()
    predicted = {c["layout"]: c["predicted_s"] for c in tuned["candidates"]}
    best = min(finalists, key=lambda n: final[n]["vs_reference"]["median"])
    ratio = final[best]["vs_reference"]  # best's time / the pick's, per round: the pick's throughput / the best's
    load_text = ", ".join(f"{x:.1f}" for x in loads)
    print(f"tiny ({' '.join(args.overrides)}) on {args.nodes} x {args.gpus_per_node} ranks of the local SLURM "
          f"cluster, global batch {args.global_batch}; {os.cpu_count()} CPUs, load average {load_text} (start, after "
          f"the tuner, after the grid, after the finalists)")
    print(f"timing: layouts interleaved round by round, one step each per round (slowest rank), {args.steps} to "
          f"{args.max_steps} rounds ({max(5, args.steps)} to {max(12, args.max_steps)} for the finalists); spread = "
          f"interquartile range / median of a layout's steps")
    print(f"grid: {len(grid)} layouts ({len(grid) - len(ok)} failed) in groups of {args.group} with the pick, timed "
          f"in {grid_wall:.0f} s; its best by ratio to the pick: "
          + ", ".join(f"{n} {vs_pick[n]:.3f}" for n in finalists))
    print(f"finalists with the pick, one job: best {best}: {1000 * final[best]['step_s']:.1f} ms/step (spread "
          f"{100 * final[best]['spread']:.0f}%, {final[best]['rounds']} rounds); pick {pick}: "
          f"{1000 * final[pick]['step_s']:.1f} ms/step (spread {100 * final[pick]['spread']:.0f}%)"
          if pick in final else f"finalists: best {best}")
    lo, hi = ratio["ci"]
    shown = min(1.0, ratio["median"])
    print(f"pick / best-of-grid throughput: {shown:.3f} (per-round ratio median {ratio['median']:.3f}, 95% CI "
          f"{lo:.3f}-{hi:.3f}; goal >= 0.95){'; the pick was fastest' if ratio['median'] >= 1 else ''}")
    best_row = next(c for c in tuned["candidates"] if c["layout"] == best)
    print(f"rank of the best in the cost model's order: {best_row.get('rank')} ({best_row['status']}"
          + (f": {best_row['why']})" if best_row["why"] else ")"))
    measured = tuned["counts"]["measured"] + tuned["counts"]["failed"]
    print(f"layouts measured / exhaustive: {measured} / {len(grid)} = {measured / len(grid):.3f} (goal <= 0.25)")
    print(f"tuner wall time: {wall:.0f} s (phase 1 profiling + phase 2; the grid took {grid_wall:.0f} s)")
    tuner_rows = [c for c in tuned["candidates"] if c["status"] == "measured"]
    # over the grid: each layout's predicted time / the pick's against its per-round ratio to the pick
    grid_errors = [abs(predicted[n] / predicted[pick] / vs_pick[n] - 1) for n in ok if n != pick]
    grid_seconds_errors = [abs(predicted[n] - r["step_s"]) / r["step_s"] for n, r in ok.items()]
    gauge = tuned["gauge"]["layout"]
    print(f"cost model median error: {100 * tuned['cost_model_median_error']:.1f}% on the {len(tuner_rows)} layouts "
          f"the tuner measured, relative to {gauge} timed in the same rounds (goal <= 15%); "
          f"{100 * statistics.median(grid_errors):.1f}% over the grid, relative to the pick timed in the same rounds; "
          f"in seconds at phase 1's load: {100 * tuned['cost_model_median_error_seconds']:.1f}% and "
          f"{100 * statistics.median(grid_seconds_errors):.1f}%")
    phase1 = json.loads((work / "tuner" / "phase1.json").read_text())
    c = tuned["costs"]
    print(f"phase 1: sharing {phase1['sharing']:.2f} (a rank's compute with every rank busy / alone), load "
          f"{phase1.get('load', 1):.2f} (a lone layer's wall / CPU seconds); calibrated on its real pp=2 steps: "
          f"layers x{c['compute_scale']:.2f}, update (sync, clip, optimiser) x{c.get('update_scale', 1):.2f}, "
          f"layers over tp ranks x{c.get('tp_scale', 1):.2f}, "
          f"all-to-all +{1000 * c.get('exchange_latency_s', 0):.1f} ms a call, error band "
          f"{100 * c.get('band', 0):.0f}%")
    print("the tuner's measured layouts: predicted (its parts) vs measured")
    for c in tuner_rows:
        parts = ", ".join(f"{k} {1000 * v:.0f}" for k, v in c["parts"].items() if v)
        t = c["timing"]
        rel = (f"x{c['predicted_vs_gauge']:.3f} of the gauge predicted, x{t['vs_gauge']:.3f} measured, error "
               f"{100 * (c['predicted_vs_gauge'] / t['vs_gauge'] - 1):+.1f}%") if "vs_gauge" in t else "the gauge"
        print(f"  {c['layout']:28} predicted {1000 * c['predicted_s']:8.1f} ms, measured {1000 * c['measured_s']:8.1f} "
              f"ms (spread {100 * t['spread']:.0f}%, CI {1000 * t['ci_s'][0]:.0f}-{1000 * t['ci_s'][1]:.0f}, "
              f"{t['rounds']} rounds); {rel}  [{parts}]")
    print("grid, fastest first (time / the pick's, per round; with pp > 1 the pipeline's run and the update after "
          "it, predicted / measured in seconds):")
    parts = {c["layout"]: c["parts"] for c in tuned["candidates"]}
    for name in sorted(ok, key=vs_pick.get):
        r = ok[name]
        update = parts[name]["grad_sync"] + parts[name]["optimizer"]
        stage = (f"  pipeline {1000 * (predicted[name] - update):.0f}/{1000 * r['pipeline_s']:.0f} ms, update "
                 f"{1000 * update:.0f}/{1000 * r['update_s']:.0f} ms") if "update_s" in r else ""
        print(f"  {name:30} x{vs_pick[name]:.3f}  {1000 * r['step_s']:8.1f} ms (spread {100 * r['spread']:3.0f}%)  "
              f"predicted x{predicted[name] / predicted[pick]:.3f} ({1000 * predicted[name]:8.1f} ms)  error "
              f"{100 * (predicted[name] / predicted[pick] / vs_pick[name] - 1):+6.1f}%"
              + stage)
    (work / "bench.json").write_text(json.dumps({"tuner": tuned, "grid": grid, "final": final, "loads": loads,
                                                 "wall_s": wall, "grid_wall_s": grid_wall}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
