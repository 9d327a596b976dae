"""Throughput noise on the local cluster: each cause injected at its source into a real training job, named by the
attribution, and the job's throughput stability before and after the fix, side by side.

Setup: a 4-node local SLURM cluster with a sidecar per node pushing to `sigma controller run` (the real pipeline);
a training job (`python -m sigma.train.trainer`, debug preset) of one rank on node1, bound to the first CPU
(`taskset`, as `--cpu-bind` does on a real node), so another CPU is free to move a hog to. One rank, because the
emulated nodes share one kernel: pages that ranks on two emulated nodes both map (torch's libraries, the data) are
shared pages, which the kernel's per-process reclaim leaves alone. For each kind, two jobs:

  kind          before (cause present)                         after (the fix)
  cpu-hog       `sigma chaos cpu-hog --workers 2 --percent 50    the hog moved to a CPU no rank uses
                --period 2` on node1: processes busy 1 s of
                every 2 s on the CPU its rank uses
  page-cache    `sigma chaos page-cache` on node1: a filler in   caches dropped and the filler gone (the rank's
                the cache, the job's mapped pages reclaimed     pages stay resident: `drop_page_cache: true`)
                every 1 s (process_madvise MADV_PAGEOUT)
  io-stall      `sigma chaos io-stall` on node1: synced writes   the writer moved off the node
                + the job's mapped pages reclaimed every 1 s
  gc-pressure   `sigma chaos gc-pressure` on node1: its rank     the same churn with manual GC after a freeze of
                churns objects; Python's automatic GC           the setup's objects (`gc_manual: true`,
                (`gc_manual: false`)                            `gc_every: 50`)

Figures: per kind the cause `sigma noise` names for the ranks (from the controller database, over the steps after
the injection) against the injected one, and the job's step-throughput std, cv, min/peak and mean/peak before and
after (each step at its slowest rank's tokens/s), with the machine's load average (the build VM is shared: its
other work is noise in every figure); at the end causes attributed correctly / injected.

usage: python bench/noise.py [--kinds cpu-hog page-cache io-stall gc-pressure] [--steps 60] [--state-dir DIR]
"""

from __future__ import annotations

import argparse
import hashlib
import os
import signal
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from sigma.chaos.inject import Chaos  # noqa: E402
from sigma.controller.db import open_db  # noqa: E402
from sigma.controller.detect.noise import job_stability  # noqa: E402
from sigma.controller.report.noise import job_noise  # noqa: E402
from sigma.slurm.client import Slurm  # noqa: E402
from sigma.slurm.cluster import ClusterSpec, LocalCluster  # noqa: E402
from tests.integration.pipeline import Pipeline, wait_for  # noqa: E402

KINDS = ("cpu-hog", "page-cache", "io-stall", "gc-pressure")
EXPECTED = {"cpu-hog": "cpu-contention", "page-cache": "page-cache", "io-stall": "io-stall", "gc-pressure": "gc"}
NODE = "node1"
GC_EVERY = 50  # the fix's synchronised manual collection interval
HOG_PERCENT, HOG_PERIOD_S = 50.0, 2.0  # the hog is busy 1 s of every 2 s: it comes and goes, like a cron job


def submit(slurm: Slurm, cluster: LocalCluster, workdir: Path, data: Path, steps: int, cpu: int,
           extra: list[str]) -> int:
    """One rank on NODE, bound to one CPU."""
    args = [f"data.path={data}", "data.prepare_if_missing=false", "data.seq_len=32", "data.global_batch=4",
            "threads=1", f"steps={steps}", "checkpoint.every=0", "eval.every=0", "kpi.progress_every=0",
            f"checkpoint.dir={workdir}/ckpt-{time.time_ns()}", "fault.gc_trigger=true", *extra]
    rank = (f"exec taskset -c {cpu} {sys.executable} -m sigma.train.trainer --config {REPO}/configs/train/debug.yaml {' '.join(args)}")
    return slurm.submit(None, "-N1", "-w", NODE, "--ntasks-per-node=1", f"--output={workdir}/job-%j.out",
                        f"--export=ALL,SIGMA_KPI_DIR={cluster.env['SIGMA_KPI_DIR']}",
                        wrap=f"srun bash -c '{rank}'")


def steps_in_db(p: Pipeline, job_id: int) -> int:
    return p.query("SELECT COUNT(DISTINCT step) AS n FROM kpis WHERE job_id = ? AND step IS NOT NULL",
                   (job_id,))[0]["n"]


def run(p: Pipeline, slurm: Slurm, cluster: LocalCluster, workdir: Path, data: Path, steps: int, kind: str,
        phase: str, cpu: int, spare: int | None) -> dict:
    chaos = Chaos(cluster)
    extra = ["gc_manual=false"] if (kind, phase) == ("gc-pressure", "before") else []
    if kind == "gc-pressure" and phase == "after":
        extra = ["gc_manual=true", f"gc_every={GC_EVERY}"]
    if kind == "page-cache" and phase == "after":
        extra = ["drop_page_cache=true"]
    job_id = submit(slurm, cluster, workdir, data, steps, cpu, extra)
    wait_for(lambda: steps_in_db(p, job_id) >= 5, timeout=240, interval=0.5, what=f"job {job_id} stepping")
    injected, moved, t_inject = [], None, time.time()
    if kind == "gc-pressure":  # node1's rank churns objects in both runs; only the GC mode differs
        injected.append(chaos.inject(kind, "node1", job_id=job_id, objects=40000))
    elif phase == "before":
        injected.append(chaos.inject(kind, "node1", job_id=job_id, workers=2, size_mb=256, period_s=HOG_PERIOD_S,
                                     percent=HOG_PERCENT) if kind == "cpu-hog" else
                        chaos.inject(kind, "node1", job_id=job_id, size_mb=256, period_s=1.0))
    elif kind == "cpu-hog" and spare is not None:  # the fix: the same hog, on a CPU no rank uses
        import subprocess

        moved = [subprocess.Popen([sys.executable, "-m", "sigma.chaos.noise", "cpu-hog", str(spare),
                                   str(HOG_PERCENT / 100), str(HOG_PERIOD_S)], start_new_session=True)
                 for _ in range(2)]
    try:
        wait_for(lambda: (j := slurm.job(job_id)) and j.state not in ("PENDING", "RUNNING", "CONFIGURING",
                                                                     "COMPLETING"),
                 timeout=600, interval=1.0, what=f"job {job_id} end")
        wait_for(lambda: steps_in_db(p, job_id) >= steps, timeout=30, interval=0.5, what="the last KPIs ingested")
    finally:
        for inj in injected:
            chaos.undo(inj.id)
        for proc in moved or []:
            proc.terminate()
            proc.wait()
    conn = open_db(p.db, readonly=True)
    try:
        noise = job_noise(conn, job_id, since=t_inject)
        rows = [dict(r) for r in conn.execute("SELECT step, tokens_per_s FROM kpis WHERE job_id = ? AND ts >= ? "
                                              "AND step IS NOT NULL", (job_id, t_inject))]
    finally:
        conn.close()
    return {"job": job_id, "stability": job_stability(rows), "causes": noise.causes(), "load1": os.getloadavg()[0],
            "node1": next((r.cause for r in noise.ranks if r.node == "node1"), None),
            "ranks": [(r.rank, r.node, r.cause, round(r.jitter, 3), r.explained) for r in noise.ranks]}


def fmt(s: dict | None) -> str:
    if not s:
        return "-"
    return (f"mean {s['mean']:7.1f} tok/s  std {s['std']:7.1f}  cv {s['cv']:.3f}  min/peak {s['min_over_peak']:.3f}  "
            f"mean/peak {s['mean_over_peak']:.3f}  ({s['steps']} steps)")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--kinds", nargs="+", choices=KINDS, default=list(KINDS))
    ap.add_argument("--steps", type=int, default=300, help="training steps per job")
    ap.add_argument("--state-dir", default=None)
    args = ap.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # stop the cluster and the daemons on the way out
    state = Path(args.state_dir or tempfile.mkdtemp(prefix="sigma-bench-noise-"))
    cpu, *others = sorted(os.sched_getaffinity(0))
    spare = others[0] if others else None
    from sigma.train.data import prepare

    data = state / "train-data"
    if not data.exists():
        prepare(data, max_mb=0.5, shard_tokens=100_000, vocab_size=512)
    cluster = LocalCluster(state)
    digest = int(hashlib.sha1(str(state).encode()).hexdigest()[:8], 16)
    cluster.up(ClusterSpec(nodes=4, port_base=30100 + (digest % 200) * 25))  # ports of its own, beside others
    slurm = Slurm(cluster.conf)
    os.environ.update(cluster.env)
    results = {}
    try:
        with Pipeline(cluster, state / "pipeline", sidecar_sets=[
                "collectors.host.interval_s=1", "collectors.procs.interval_s=2", "collectors.nvml.enabled=false",
                "collectors.infiniband.enabled=false", "push.interval_s=0.5"]) as p:
            for kind in args.kinds:
                for phase in ("before", "after"):
                    r = results[(kind, phase)] = run(p, slurm, cluster, state, data, args.steps, kind, phase, cpu,
                                                     spare)
                    print(f"{kind:12s} {phase:6s} job {r['job']}: {fmt(r['stability'])}; load {r['load1']:.1f}; "
                          f"ranks: {r['ranks']}", flush=True)
    finally:
        cluster.down(keep_munge=True)
    print(f"\nthroughput noise on the local cluster (1-rank debug job on {NODE}, the rank on CPU {cpu}, "
          f"hog moved to CPU {spare}; {args.steps} steps; figures over the steps after the injection):")
    correct = 0
    for kind in args.kinds:
        before, after = results[(kind, "before")], results[(kind, "after")]
        ok = before["node1"] == EXPECTED[kind]
        correct += ok
        b, a = before["stability"], after["stability"]
        ratio = f"{b['std'] / a['std']:.2f}x" if b and a and a["std"] else "-"
        print(f"  {kind:12s} named {before['node1']:15s} {'correct' if ok else 'WRONG'}")
        print(f"    before: {fmt(b)}  (load average {before['load1']:.1f})")
        print(f"    after : {fmt(a)}  (load average {after['load1']:.1f})  std before/after {ratio}; after named "
              f"{sorted(after['causes']) or 'steady'}")
    print(f"  causes attributed correctly / injected: {correct}/{len(args.kinds)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
