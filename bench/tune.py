"""The tuner against the exhaustive grid on the local SLURM cluster: is its pick as fast as the grid's best?

Usage: python bench/tune.py [--state-dir DIR] [--keep] [--nodes 2] [--gpus-per-node 2] [--global-batch 8]
                            [--steps 2] [--measure 3] [--resume] [key=value ...]
Brings up (or reuses) a local cluster under --state-dir, runs `sigma tune` (phase 1 profiling, phase 2 measuring
the few best), then times every layout of the same space for real (the exhaustive grid, one job), and prints:
the pick's throughput / the grid's best (both from the grid's measurements, taken the same way), layouts the tuner
measured / the grid's size, the tuner's wall time, and the cost model's median error on the layouts it measured
(and on the whole grid). Default: the `tiny` preset with 8 layers, 64-token sequences, 4 ranks on 2 nodes.
"""

from __future__ import annotations

import argparse
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
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--measure", type=int, default=3)
    p.add_argument("--resume", action="store_true", help="keep what an earlier run under --work measured")
    p.add_argument("overrides", nargs="*", default=["model_overrides.n_layers=8", "data.seq_len=64"])
    args = p.parse_args()

    from sigma.slurm.cluster import ClusterSpec, LocalCluster
    from sigma.tune.tuner import Request, Tuner, read_measured

    cluster = LocalCluster(args.state_dir)
    cluster.up(ClusterSpec(nodes=max(4, args.nodes)))
    os.environ.update(cluster.env)
    work = Path(args.work)
    load_before = os.getloadavg()[0]  # other work on a shared machine moves every figure below
    try:
        config = str(configs_dir() / "train" / "tiny.yaml")
        base = dict(config=config, nodes=args.nodes, gpus_per_node=args.gpus_per_node,
                    global_batch=args.global_batch, overrides=args.overrides, steps=args.steps, resume=args.resume)
        t0 = time.monotonic()
        tuned = Tuner(Request(out=work / "tuner", measure=args.measure, **base)).run()
        wall = time.monotonic() - t0

        grid_tuner = Tuner(Request(out=work / "grid", **base))
        grid_tuner.phase1_path.write_text((work / "tuner" / "phase1.json").read_text())  # same costs, no re-profile
        rows = grid_tuner.candidates(grid_tuner.costs())
        t1 = time.monotonic()
        grid = grid_tuner.measure(rows)
        grid_wall = time.monotonic() - t1
    finally:
        if not args.keep:
            cluster.down()

    ok = {name: rec for name, rec in grid.items() if "error" not in rec}
    best_name = min(ok, key=lambda n: ok[n]["step_s"])
    pick = tuned["pick"]["layout"]
    predicted = {c["layout"]: c["predicted_s"] for c in tuned["candidates"]}
    grid_errors = [abs(predicted[n] - r["step_s"]) / r["step_s"] for n, r in ok.items()]
    ratio = ok[best_name]["step_s"] / ok[pick]["step_s"] if pick in ok else float("nan")
    measured = tuned["counts"]["measured"] + tuned["counts"]["failed"]
    print(f"tiny ({' '.join(args.overrides)}) on {args.nodes} x {args.gpus_per_node} ranks of the local SLURM "
          f"cluster, global batch {args.global_batch}, {args.steps} timed steps per layout (median, slowest rank); "
          f"load average {load_before:.1f} before, {os.getloadavg()[0]:.1f} after, {os.cpu_count()} CPUs")
    print(f"grid: {len(grid)} layouts ({len(grid) - len(ok)} failed), timed in {grid_wall:.0f} s; best "
          f"{best_name}: {1000 * ok[best_name]['step_s']:.1f} ms/step")
    print(f"tuner pick: {pick}: {1000 * ok[pick]['step_s']:.1f} ms/step in the grid's run, "
          f"{1000 * tuned['pick']['measured_s']:.1f} ms/step in the tuner's own")
    print(f"pick / best-of-grid throughput: {ratio:.3f} (goal >= 0.95)")
    print(f"layouts measured / exhaustive: {measured} / {len(grid)} = {measured / len(grid):.3f} (goal <= 0.25)")
    print(f"tuner wall time: {wall:.0f} s (phase 1 profiling + phase 2; the grid took {grid_wall:.0f} s)")
    print(f"cost model median error: {100 * tuned['cost_model_median_error']:.1f}% on the {tuned['counts']['measured']}"
          f" layouts the tuner measured (goal <= 15%), {100 * statistics.median(grid_errors):.1f}% over the grid")
    print("rank of the grid's best in the cost model's order: "
          + str(next((c.get("rank") for c in tuned["candidates"] if c["layout"] == best_name), None))
          + f" ({next(c['status'] + (': ' + c['why'] if c['why'] else '') for c in tuned['candidates'] if c['layout'] == best_name)})")
    print("grid, fastest first:")
    for name in sorted(ok, key=lambda n: ok[n]["step_s"]):
        print(f"  {name:30} {1000 * ok[name]['step_s']:9.1f} ms  predicted {1000 * predicted[name]:9.1f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
