"""Figures for the local cluster on every Slurm at hand: bring-up, job round trips, and the recovery of a requeued job.

Usage: python bench/cluster.py [--slurm host,trixie,sid] [--runs N] [--no-recovery]
For the machine's own Slurm (host) and the Slurm of each Debian root file system named (built with debootstrap
if missing; see `python -m sigma.slurm.rootfs`), one fresh cluster each, one after the other:
- `sigma cluster up` to 4 idle nodes: first (MariaDB initialises) and again after `down`;
- median/p95 round trip of a trivial sbatch job and of a trivial submitit job (submit -> result);
- Xid-to-first-step recovery: a 3-node KPI job under the real pipeline (a sidecar per node -> controller), an Xid 79
  line in one node's kernel log -> drain, requeue, start_now -> the first training step of the requeued run.
Then each figure as a ratio of the host's (the goal: recovery on 24.11 and 26.05 within 1.5x of 22.05's).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from sigma.slurm.client import Slurm  # noqa: E402
from sigma.slurm.formats import release_text  # noqa: E402
from sigma.slurm.cluster import ClusterSpec, LocalCluster, slurm_release  # noqa: E402

RESULT = "RESULT "  # the line a measuring run prints its figures on


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


def xid_recovery(cluster: LocalCluster, slurm: Slurm, workdir: Path) -> dict:
    """Fault (the Xid line written) -> first step of the requeued run, through sidecars and the controller."""
    from sigma.controller.db import open_db
    from sigma.controller.report.metrics import job_recovery
    from tests.integration.pipeline import Pipeline, wait_for

    with Pipeline(cluster, workdir, remediation={"playbooks": [{"name": "manual", "kind": "manual"}]}) as p:
        job_id = p.submit_kpi_job(slurm, nodes=3, step_time=0.5)
        job = wait_for(lambda: (j := slurm.job(job_id)) and j.state == "RUNNING" and j, what="job running")
        wait_for(lambda: p.steps_since(job_id, 0) >= 9, what="KPIs flowing")
        fault = p.inject_xid79(job.nodes[-1])

        def recovered():
            # the new run's first step, not a last one of the old run's ranks while SLURM kills them
            if not p.query("SELECT 1 FROM events WHERE source = 'kpi' AND kind = 'resume' AND ts > ?", (fault,)):
                return None
            conn = open_db(p.db, readonly=True)
            try:
                recs, _ = job_recovery(conn, 0, time.time())
            finally:
                conn.close()
            return recs and recs[0]["first_step_after"] and recs[0]

        rec = wait_for(recovered, timeout=300, interval=0.5, what="first step after the requeue")
        return {"recovery_s": rec["first_step_after"] - fault, "after_decision_s": rec["after_decision_s"]}


def measure(port_base: int, runs: int, recovery: bool) -> dict:
    """Every figure on the Slurm this process finds; a fresh cluster under a temporary directory."""
    import submitit

    state = Path(tempfile.mkdtemp(prefix="sigma-bench-cluster-"))
    cluster = LocalCluster(state)
    release = release_text(slurm_release())
    t0 = time.perf_counter()
    cluster.up(ClusterSpec(nodes=4, port_base=port_base))
    first = time.perf_counter() - t0
    try:
        cluster.down(keep_munge=True)
        t0 = time.perf_counter()
        cluster.up()
        again = time.perf_counter() - t0
        os.environ.update(cluster.env)
        slurm = Slurm(cluster.conf)
        sb = [sbatch_round_trip(slurm, state) for _ in range(runs)]
        executor = submitit.AutoExecutor(folder=state / "bench-submitit", cluster="slurm")
        executor.update_parameters(timeout_min=5, slurm_partition="debug", nodes=1, tasks_per_node=1)
        st = [submitit_round_trip(executor) for _ in range(runs)]
        out = {"release": release, "up_first_s": first, "up_again_s": again,
               "sbatch_median_s": statistics.median(sb), "sbatch_p95_s": percentile(sb, 0.95),
               "submitit_median_s": statistics.median(st), "submitit_p95_s": percentile(st, 0.95)}
        if recovery:
            out.update(xid_recovery(cluster, slurm, state / "bench-xid"))
        return out
    finally:
        cluster.down(keep_munge=True)


def run_on(where: str, args) -> dict:
    """Measure in a child process: on this machine's Slurm, or inside the named root file system."""
    argv = ["python", "bench/cluster.py", "--measure", "--runs", str(args.runs), "--port-base", str(args.port_base)]
    argv += [] if args.recovery else ["--no-recovery"]
    if where == "host":
        cmd = [sys.executable, *argv[1:]]
    else:
        from sigma.slurm import rootfs

        cmd = rootfs.run_argv(rootfs.build(where), argv, workdir=REPO)
    proc = subprocess.run(cmd, cwd=REPO, stdout=subprocess.PIPE, text=True)
    found = [line[len(RESULT):] for line in proc.stdout.splitlines() if line.startswith(RESULT)]
    if proc.returncode != 0 or not found:
        raise SystemExit(f"the measurement on {where} failed (exit {proc.returncode}):\n{proc.stdout[-2000:]}")
    return json.loads(found[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--slurm", default="host,trixie,sid",
                        help="host (this machine's Slurm) and/or Debian suites whose root file system to use")
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--port-base", type=int, default=18800)
    parser.add_argument("--no-recovery", dest="recovery", action="store_false", help="skip the Xid recovery")
    parser.add_argument("--measure", action="store_true", help=argparse.SUPPRESS)  # the child's role
    args = parser.parse_args()
    if args.measure:
        print(RESULT + json.dumps(measure(args.port_base, args.runs, args.recovery)), flush=True)
        return
    results = {}
    for where in args.slurm.split(","):
        r = results[where] = run_on(where, args)
        print(f"Slurm {r['release']} ({where}): cluster up -> 4 nodes idle: first {r['up_first_s']:.1f} s "
              f"(initialises MariaDB), after down {r['up_again_s']:.1f} s (goal <= 30 s)", flush=True)
        print(f"  sbatch job (submit -> output)     median {r['sbatch_median_s']:.2f} s  p95 {r['sbatch_p95_s']:.2f} s"
              f"  over {args.runs} runs", flush=True)
        print(f"  submitit job (submit -> result)   median {r['submitit_median_s']:.2f} s  "
              f"p95 {r['submitit_p95_s']:.2f} s  over {args.runs} runs", flush=True)
        if "recovery_s" in r:
            print(f"  Xid 79 -> first step of the requeued job {r['recovery_s']:.1f} s "
                  f"({r['after_decision_s']:.1f} s after the requeue decision)", flush=True)
    base = results.get("host")
    if base and len(results) > 1:
        print(f"\nratio to Slurm {base['release']} (host):")
        keys = ["up_first_s", "up_again_s", "sbatch_median_s", "submitit_median_s"]
        keys += ["recovery_s"] if "recovery_s" in base else []
        for where, r in results.items():
            if where != "host":
                print(f"  Slurm {r['release']} ({where}): " + ", ".join(
                    f"{k[:-2]} {r[k] / base[k]:.2f}x" for k in keys if base.get(k)), flush=True)


if __name__ == "__main__":
    main()
