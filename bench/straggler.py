"""Where the time goes from a straggler's injection to its node's drain, on the real local cluster at the shipped
watchdog and isolation defaults, under background CPU noise (the scenario of tests/integration/test_isolation.py).

Setup: a 4-node local SLURM cluster, a sidecar per node pushing to `sigma controller run` (a fresh database per run,
every watchdog and isolation key at its dataclass default); a 2-node training job (`sigma train`, debug preset,
expert parallel); a process spinning on the CPU the emulated nodes share (started before the job's baseline, so
the noise is part of it); after `--baseline-s` of training, `sigma chaos straggler --percent P` on the job's second
node (its ranks stopped P % of every second); `--percent 0` injects nothing and watches the CPU noise alone for
`--timeout` seconds (every drain is a false one).

Printed per run, in seconds after the injection (the chaos journal's time):
  kpi      the first step of the victim's ranks at least twice the healthy median step time (trainer clock), and
           when the bench first saw it in the controller database (trainer -> sidecar -> ingest)
  watchdog the throughput-drop incident opened (the watchdog's finding; negative: the CPU noise had opened it before
           the injection and it was still open)
  verdict  the drain finding's incident opened (isolation named the node, `rounds` rounds in a row)
  drain    SLURM lists the node drained (polled every 0.5 s)
then the node drained (and whether it is the victim), false drains (any other node, before or after), throughput
drop notifications opened before the injection (`early`: the CPU noise alone, a notification, never a drain), the
isolation's reason, the controller's slowest tick (its /metrics gauge, sampled), and the 1-minute load average
(the machine is shared: its other work is noise in every figure). A run without a drain within `--timeout` says so.
With --trace, each run is followed by what the watchdog saw every 10 s from 60 s before the injection (read back
from the run's controller database): the throughput of the last 30 s over the job's earlier throughput (the drop
ratio), and per node the share of the ranks' time waiting in collectives and held off the CPU outside them, and the
share of the time some task on the node was stalled on the disk (PSI io, which the isolation takes off the held
share).
With --replay, no cluster: the KPIs recorded by earlier runs (their state directories) go through today's rules.

With --io-noise, also a process writing and fsyncing a file on the disk the emulated nodes share (from before the
baseline, like the CPU hog): with `--percent 0`, whether time the ranks spend blocked on a busy disk is taken for a
straggler.

usage: python bench/straggler.py [--runs 3] [--percent 50 30] [--baseline-s 90] [--timeout 180] [--no-noise]
                                 [--io-noise] [--state-dir DIR] [--trace]
       python bench/straggler.py --replay STATE_DIR... [--timeout 180] [--trace]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from sigma.chaos.inject import Chaos  # noqa: E402
from sigma.slurm.client import Slurm  # noqa: E402
from sigma.slurm.cluster import ClusterSpec, LocalCluster  # noqa: E402
from tests.conftest import reset_cluster  # noqa: E402
from tests.integration.pipeline import SIGMA, Pipeline, wait_for  # noqa: E402

SLOW = 2.0  # a step at least this many times the healthy median is a slow one


def trace(db: Path, job_id: int, t0: float, until: float) -> None:
    """Every 10 s from 60 s before the injection: the watchdog's drop ratio and each node's wait / held shares."""
    import sqlite3

    from sigma.controller.config import WatchdogConfig
    from sigma.controller.detect.laggard import IO_STALL, WINDOW_S, held_shares, wait_shares
    from sigma.controller.detect.watchdog import throughput

    w = WatchdogConfig()
    conn = sqlite3.connect(db)
    conn.row_factory = sqlite3.Row
    rows = [dict(r) for r in conn.execute("SELECT * FROM kpis WHERE job_id = ? AND step IS NOT NULL ORDER BY ts",
                                          (job_id,))]
    psi = [dict(r) for r in conn.execute("SELECT node, ts, value FROM samples WHERE metric = ? AND ts >= ? ORDER BY ts",
                                         (IO_STALL, t0 - 60 - WINDOW_S))]
    conn.close()

    def stalled(since: float, until: float) -> dict[str, float]:  # share of the time some task waited on the disk
        out = {}
        for node in sorted({r["node"] for r in psi}):
            pts = [r for r in psi if r["node"] == node and since <= r["ts"] < until]
            if len(pts) >= 2 and pts[-1]["ts"] > pts[0]["ts"]:
                out[node] = (pts[-1]["value"] - pts[0]["value"]) * 1e-6 / (pts[-1]["ts"] - pts[0]["ts"])
        return out
    for now in range(int(t0) - 60, int(min(until, rows[-1]["ts"] if rows else t0)) + 1, 10):
        recent = [r for r in rows if now - w.recent_window_s <= r["ts"] < now]
        start = now - w.recent_window_s - w.baseline_window_s
        earlier = [r for r in rows if start <= r["ts"] < now - w.recent_window_s]
        a, b = throughput(recent), throughput(earlier)
        lag = [r for r in rows if now - WINDOW_S <= r["ts"] < now]
        waits, held = wait_shares(lag), held_shares(lag)
        print(f"       {now - t0:+5.0f} s  drop ratio {fmt(a / b if a and b else None, '.2f'):>5}  waiting "
              + " ".join(f"{n} {v:.2f}" for n, v in sorted(waits.items())) + "  held "
              + " ".join(f"{n} {v:.2f}" for n, v in sorted(held.items())) + "  disk stalled "
              + (" ".join(f"{n} {v:.2f}" for n, v in stalled(now - WINDOW_S, now).items() if n in waits) or "-"),
              flush=True)


def submit(p: Pipeline, data: Path, workdir: Path) -> int:
    out = subprocess.run(
        [SIGMA, "train", "--config", "configs/train/debug.yaml", "--nodes", "2", "--no-wait", "name=straggler",
         "parallel.ep=2", "steps=1000000", "threads=1", f"data.path={data}", "data.prepare_if_missing=false",
         f"checkpoint.dir={workdir}/checkpoints", f"launch.folder={workdir}/submitit", "fault.step_delay_s=0.05",
         "kpi.progress_every=0"], env=p.env, cwd=REPO, capture_output=True, text=True, check=True).stdout
    return int(re.search(r"job (\d+)", out).group(1))


def replay(state: Path, after_s: float = 180.0, show: bool = False) -> None:
    """Earlier runs' recorded KPIs (each run's controller database under `state`, the injections from its chaos
    journal) through today's watchdog and laggard rules, one round a second on the trainer's clock, `rounds` rounds
    in a row to act: when the victim would be named, and any node named before the injection."""
    import sqlite3

    from sigma.controller.config import IsolationConfig, WatchdogConfig
    from sigma.controller.detect.laggard import steady_window, waited_for_node
    from sigma.controller.detect.watchdog import JobInfo, check_job

    injections = {}
    for line in (state / "chaos.jsonl").read_text().splitlines():
        r = json.loads(line)
        if r["kind"] == "straggler":
            injections.setdefault(r["job_id"], r)
    for db in sorted(state.glob("run-*/controller.db")):
        conn = sqlite3.connect(db)
        conn.row_factory = sqlite3.Row
        rows = [dict(r) for r in conn.execute("SELECT * FROM kpis ORDER BY ts")]
        conn.close()
        if not rows or rows[0]["job_id"] not in injections:
            continue
        inj = injections[rows[0]["job_id"]]
        t0, victim = inj["ts"], inj["node"]
        start = rows[0]["ts"]
        nodes = tuple(sorted({r["node"] for r in rows if r["ts"] < t0}))
        named_before, streak, last, acted = [], 0, None, None
        now = start + 1
        while now < min(rows[-1]["ts"], t0 + after_s) and acted is None:
            current = [r for r in rows if now - 930 <= r["ts"] <= now and r["node"] in nodes]
            found = check_job(JobInfo(inj["job_id"], nodes, start), current, now, WatchdogConfig(), ever_reported=True)
            node = None
            if any(f.rule_id in ("watchdog-throughput-drop", "watchdog-straggler") for f in found):
                node = waited_for_node(list(nodes), steady_window(current, now))[0]
            streak, last = (streak + 1 if node == last else 1) if node else 0, node
            if node and now < t0:
                named_before.append(node)
            if streak >= IsolationConfig().rounds and now >= t0:
                acted = (now - t0, node)
            now += 1.0
        print(f"  {db.parent.name:>9} {inj['params']['percent']:>4.0f} %  victim {victim}: "
              + (f"named {acted[1]} {acted[0]:.0f} s after the injection" if acted else
                 f"not named within {after_s:.0f} s")
              + f"; rounds naming a node before it: {len(named_before)}", flush=True)
        if show:
            trace(db, inj["job_id"], t0, t0 + after_s)


def tick_seconds(p: Pipeline) -> float | None:
    try:
        m = re.search(r"^sigma_controller_tick_seconds\S* (\S+)$", p.metrics(), re.M)
    except OSError:
        return None
    return float(m.group(1)) if m else None


# another process's disk I/O: 4 MiB written and fsynced at a time, in a file rewritten from its start every 256 MiB
IO_HOG = ("import os, sys\nfd = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT)\nblock = os.urandom(4 << 20)\n"
          "while True:\n    for _ in range(64):\n        os.write(fd, block)\n        os.fsync(fd)\n"
          "    os.lseek(fd, 0, 0)\n")


def one_run(cluster: LocalCluster, slurm: Slurm, workdir: Path, data: Path, percent: float, noise: bool,
            baseline_s: float, timeout: float, io_noise: bool = False) -> dict:
    res: dict = {"percent": percent}
    with Pipeline(cluster, workdir, remediation={"playbooks": [{"name": "manual", "kind": "manual"}]}) as p:
        job_id = submit(p, data, workdir)
        job = wait_for(lambda: (j := slurm.job(job_id)) and j.state == "RUNNING" and j, timeout=180,
                       what="training job running")
        hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"])] if noise else []
        if io_noise:
            hogs.append(subprocess.Popen([sys.executable, "-c", IO_HOG, str(workdir / "io-noise.bin")]))
        chaos, injection = Chaos(cluster), None
        try:
            first = wait_for(lambda: p.query("SELECT min(ts) AS t FROM kpis WHERE job_id = ? AND step IS NOT NULL",
                                             (job_id,))[0]["t"], timeout=240, what="first training step")
            wait_for(lambda: p.steps_since(job_id, first + baseline_s - 15) >= 10, timeout=baseline_s + 240,
                     what="the baseline's training")
            victim = job.nodes[1]
            healthy = [r["step_time_s"] for r in p.query(
                "SELECT step_time_s FROM kpis WHERE job_id = ? AND node = ? AND step_time_s IS NOT NULL", (job_id,
                                                                                                        victim))]
            median = statistics.median(healthy)
            res.update(victim=victim, healthy_step_s=round(median, 3))
            early = [i["node"] for i in p.incidents() if i["action"].startswith("drain")]
            if percent > 0:
                injection = chaos.inject("straggler", victim, job_id=job_id, percent=percent)
                t0 = injection.ts
            else:  # the CPU noise alone for --timeout seconds: every drain is a false one
                victim, t0 = None, time.time()
                res.update(victim=None, t0=t0)
            seen_slow, ticks, loads, drained = None, [], [], None
            deadline = time.time() + timeout
            while time.time() < deadline:
                loads.append(os.getloadavg()[0])
                if (t := tick_seconds(p)) is not None:
                    ticks.append(t)
                if victim is not None and seen_slow is None and p.query(
                        "SELECT 1 FROM kpis WHERE job_id = ? AND node = ? AND ts >= ? AND step_time_s >= ? LIMIT 1",
                        (job_id, victim, t0, SLOW * median)):
                    seen_slow = time.time()
                drained = [n.name for n in slurm.nodes() if n.drained]
                if drained:
                    res["drain"] = time.time() - t0
                    break
                time.sleep(0.5)
            time.sleep(2)  # a second drain in the same wave would show now
            slow = p.query("SELECT min(ts) AS t FROM kpis WHERE job_id = ? AND node = ? AND ts >= ? AND "
                           "step_time_s >= ?", (job_id, victim, t0, SLOW * median))[0]["t"]
            incidents = p.incidents()
            # the drop incident open at or after the injection (noise may have opened it before: then < 0)
            drop = [i for i in incidents if i["rule_id"] == "watchdog-throughput-drop" and i["updated_at"] >= t0]
            res["early_drops"] = sum(i["rule_id"] == "watchdog-throughput-drop" and i["opened_at"] < t0
                                     for i in incidents)
            drains = [i for i in incidents if i["action"].startswith("drain")]
            slow = None if victim is None else slow
            res.update(
                kpi=None if slow is None else slow - t0, kpi_seen=None if seen_slow is None else seen_slow - t0,
                watchdog=drop[0]["opened_at"] - t0 if drop else None,
                verdict=drains[0]["opened_at"] - t0 if drains else None,
                node=drains[0]["node"] if drains else None,
                reason=(drains[0]["evidence"].get("isolation") or {}).get("reason", drains[0]["rule_id"])
                if drains else None,
                false_drains=early + [i["node"] for i in drains if i["node"] != victim],
                nodes_drained=sorted(n.name for n in slurm.nodes() if n.drained),
                tick_max=max(ticks) if ticks else None, load=statistics.mean(loads) if loads else os.getloadavg()[0])
        finally:
            for hog in hogs:
                hog.kill()
                hog.wait()
            (workdir / "io-noise.bin").unlink(missing_ok=True)
            if injection is not None:
                chaos.undo(injection.id)
            reset_cluster(slurm, cluster)
    res.update(job_id=job_id, t0=injection.ts if injection else res.get("t0"), db=str(workdir / "controller.db"))
    return res


def fmt(v, spec=".0f") -> str:
    return "-" if v is None else format(v, spec)


def bring_up(state: Path, nodes: int = 4) -> tuple[Path, LocalCluster, Slurm]:
    """(the training data, a local cluster of `nodes` nodes up under `state` on its own ports, its SLURM client)."""
    from sigma.train.data import prepare

    data = state / "train-data"
    if not data.exists():
        prepare(data, max_mb=0.5, shard_tokens=100_000, vocab_size=512)
    cluster = LocalCluster(state)
    digest = int(hashlib.sha1(str(state).encode()).hexdigest()[:8], 16)
    cluster.up(ClusterSpec(nodes=nodes, port_base=30100 + (digest % 200) * 25))
    slurm = Slurm(cluster.conf)
    slurm.env["SBATCH_OUTPUT"] = str(state / "slurm-%j.out")
    return data, cluster, slurm


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=3, help="runs per percent")
    ap.add_argument("--percent", type=float, nargs="+", default=[50.0])
    ap.add_argument("--baseline-s", type=float, default=90.0, help="training before the injection")
    ap.add_argument("--timeout", type=float, default=180.0, help="seconds to wait for a drain after the injection")
    ap.add_argument("--no-noise", action="store_true", help="no CPU hog")
    ap.add_argument("--io-noise", action="store_true",
                    help="also a process writing and fsyncing a file on the disk the nodes share (from before the "
                         "baseline)")
    ap.add_argument("--state-dir", default=None)
    ap.add_argument("--trace", action="store_true", help="per run, the drop ratio and wait / held shares every 10 s")
    ap.add_argument("--replay", type=Path, nargs="+", default=None, metavar="STATE_DIR",
                    help="no cluster: earlier runs' recorded KPIs (their --state-dir) through today's rules")
    args = ap.parse_args()
    if args.replay:
        for state in args.replay:
            print(f"{state}: recorded KPIs through today's watchdog and laggard rules, one round a second")
            replay(state, args.timeout, args.trace)
        return 0
    state = Path(args.state_dir or tempfile.mkdtemp(prefix="sigma-bench-straggler-"))
    data, cluster, slurm = bring_up(state)
    print(f"{os.cpu_count()} CPUs; CPU hog: {'no' if args.no_noise else 'yes'}; disk I/O hog: "
          f"{'yes' if args.io_noise else 'no'}; baseline {args.baseline_s:.0f} s; "
          f"shipped watchdog/isolation defaults", flush=True)
    print(f"{'run':>4} {'pct':>4} {'kpi':>5} {'seen':>5} {'wdog':>5} {'verdict':>7} {'drain':>6} {'node':>6} "
          f"{'right':>5} {'false':>5} {'early':>5} {'tick_max':>8} {'load1':>5}  reason", flush=True)
    results = []
    try:
        for percent in args.percent:
            for i in range(args.runs):
                r = one_run(cluster, slurm, state / f"run-{int(percent)}-{i}", data, percent, not args.no_noise,
                            args.baseline_s, args.timeout, args.io_noise)
                results.append(r)
                right = "-" if not r["node"] else "yes" if r["node"] == r["victim"] else "NO"
                print(f"{i + 1:>4} {percent:>4.0f} {fmt(r['kpi'], '.1f'):>5} {fmt(r['kpi_seen'], '.1f'):>5} "
                      f"{fmt(r['watchdog']):>5} {fmt(r['verdict']):>7} {fmt(r.get('drain')):>6} "
                      f"{r['node'] or '-':>6} {right:>5} {len(r['false_drains']):>5} {r['early_drops']:>5} "
                      f"{fmt(r['tick_max'], '.2f'):>8} {r['load']:>5.1f}  "
                      f"{(r['reason'] or 'no drain within ' + str(int(args.timeout)) + ' s')[:160]}", flush=True)
                if args.trace and r["t0"] is not None:
                    trace(Path(r["db"]), r["job_id"], r["t0"], r["t0"] + (r.get("drain") or args.timeout))
    finally:
        cluster.down(keep_munge=True)
    for percent in args.percent:
        rs = [r for r in results if r["percent"] == percent]
        if percent == 0:
            print(f"{'CPU and disk' if args.io_noise else 'CPU'} noise alone: "
                  f"{sum(len(r['false_drains']) for r in rs)} false drains in {len(rs)} runs of "
                  f"{args.timeout:.0f} s after the baseline")
            continue
        got = [r["drain"] for r in rs if r.get("drain") is not None and r["node"] == r["victim"]]
        print(f"{percent:.0f} %: drained the right node in {len(got)}/{len(rs)} runs; injection -> drain "
              f"{', '.join(f'{x:.0f}' for x in got) or '-'} s (max {fmt(max(got) if got else None)}); false drains "
              f"{sum(len(r['false_drains']) for r in rs)}")
    (state / "straggler.json").write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
