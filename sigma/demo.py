"""`sigma demo`: the main job on the local SLURM cluster, as a user would run it."""

from __future__ import annotations

import argparse
import subprocess
import time
from pathlib import Path


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("demo", help="run the main job end to end on a local SLURM cluster",
                       description="Bring the local cluster up, run a job on it through submitit, show the cluster.")
    p.add_argument("--state-dir", type=Path, default=None, help="cluster state directory")
    p.add_argument("--down", action="store_true", help="stop the cluster at the end")
    p.set_defaults(func=run_demo)


def _square_on_node(x: int) -> tuple[str, int]:
    import os

    return os.environ.get("SLURMD_NODENAME", "?"), x * x


def run_demo(args) -> int:
    import submitit

    from sigma.slurm.cluster import LocalCluster

    cluster = LocalCluster(args.state_dir)
    t0 = time.monotonic()
    spec, already = cluster.up()
    print(f"[{time.monotonic() - t0:5.1f}s] cluster '{spec.name}' {'was already up' if already else 'up'}: "
          f"{spec.nodes} nodes, state in {cluster.state_dir}")
    import os

    os.environ.update(cluster.env)
    executor = submitit.AutoExecutor(folder=cluster.state_dir / "demo" / "submitit", cluster="slurm")
    executor.update_parameters(timeout_min=5, slurm_partition=spec.partition, nodes=1, tasks_per_node=1)
    job = executor.submit(_square_on_node, 12)
    print(f"[{time.monotonic() - t0:5.1f}s] submitted job {job.job_id} through submitit")
    node, value = job.result()
    print(f"[{time.monotonic() - t0:5.1f}s] job {job.job_id} ran on {node} and returned {value}")
    print(subprocess.run(["sinfo", "-N", "-l"], env={**os.environ}, capture_output=True, text=True).stdout)
    if args.down:
        cluster.down()
        print("cluster stopped")
    else:
        print(f"the cluster keeps running; stop it with: sigma cluster down"
              f"{' --state-dir ' + str(args.state_dir) if args.state_dir else ''}")
    return 0
