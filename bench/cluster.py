"""Figures for the local cluster: `sigma cluster up` to all nodes idle, and job round trips.

Usage: python bench/cluster.py [--runs N] [--state-dir DIR]
Prints: cold and warm bring-up times, and median/p95 round trip of a trivial sbatch job and a trivial
submitit job (submit -> result). The state directory is a fresh temporary one unless given.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

import submitit

from sigma.slurm.client import Slurm
from sigma.slurm.cluster import ClusterSpec, LocalCluster


def percentile(values, q):
    values = sorted(values)
    return values[min(len(values) - 1, int(round(q * (len(values) - 1))))]


def sbatch_round_trip(slurm: Slurm, out_dir: Path) -> float:
    out = out_dir / f"rt-{time.monotonic_ns()}.out"
    t0 = time.perf_counter()
    slurm.submit(None, "-N1", f"--output={out}", wrap="echo done")
    while not (out.exists() and out.read_text().strip() == "done"):
        time.sleep(0.02)
    return time.perf_counter() - t0


def submitit_round_trip(executor) -> float:
    t0 = time.perf_counter()
    assert executor.submit(int, "7").result() == 7
    return time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--state-dir", type=Path, default=None)
    parser.add_argument("--port-base", type=int, default=18800)
    args = parser.parse_args()
    state = args.state_dir or Path(tempfile.mkdtemp(prefix="sigma-bench-cluster-"))
    cluster = LocalCluster(state)
    cluster.down(keep_munge=True)

    t0 = time.perf_counter()
    cluster.up(ClusterSpec(nodes=4, port_base=args.port_base))
    first = time.perf_counter() - t0
    cluster.down(keep_munge=True)
    t0 = time.perf_counter()
    cluster.up()
    again = time.perf_counter() - t0
    print(f"cluster up -> 4 nodes idle: first {first:.1f} s (initialises MariaDB), after down {again:.1f} s "
          f"(goal <= 30 s)")

    os.environ.update(cluster.env)
    slurm = Slurm(cluster.conf)
    sb = [sbatch_round_trip(slurm, state) for _ in range(args.runs)]
    executor = submitit.AutoExecutor(folder=state / "bench-submitit", cluster="slurm")
    executor.update_parameters(timeout_min=5, slurm_partition="debug", nodes=1, tasks_per_node=1)
    st = [submitit_round_trip(executor) for _ in range(args.runs)]
    for name, values in (("sbatch job (submit -> output)", sb), ("submitit job (submit -> result)", st)):
        print(f"{name:34} median {statistics.median(values):.2f} s  p95 {percentile(values, 0.95):.2f} s  "
              f"over {len(values)} runs")
    cluster.down(keep_munge=True)


if __name__ == "__main__":
    main()
