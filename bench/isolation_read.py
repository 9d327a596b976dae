"""What one isolation round reads from the controller database, for one job: its nodes' last hour of 1 Hz samples.

The controller reads them aggregated per (node, series, time bucket) by SQLite (`samples.bucket_stats`): the window
every round; the hour of history at most every HISTORY_REFRESH_S, and of each of its 12 buckets only a slice as
long as one window bucket. The baseline, side by side on the same database, walks the hour's rows in Python
(fetch + per-row JSON labels), as a per-row feature builder would.

usage: python bench/isolation_read.py [--nodes 8] [--metrics 200] [--hour 3600]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
import types
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from sigma.controller.db import open_db  # noqa: E402
from sigma.controller.detect.features import job_matrices  # noqa: E402
from sigma.controller.detect.healthy import NODES_PER_TICK, HealthyFeed  # noqa: E402
from sigma.controller.detect.isolation import score_nodes  # noqa: E402
from sigma.controller.loop import HISTORY_BUCKETS, HISTORY_REFRESH_S, WINDOW_BUCKETS  # noqa: E402
from sigma.controller.detect.samples import bucket_stats  # noqa: E402

WINDOW_S = 120.0


def fill(conn, nodes: list[str], metrics: int, seconds: int, now: float) -> int:
    rng = np.random.default_rng(3)
    rows = 0
    for node in nodes:
        for m in range(metrics):
            counter = m % 3 == 0  # a third are counters (CPU seconds, bytes), the rest gauges
            values = (np.cumsum(rng.uniform(0, 10, seconds)) if counter
                      else 50 + rng.normal(0, 1, seconds))
            labels = json.dumps({"gpu": str(m % 8)}, separators=(",", ":"))
            with conn:
                conn.executemany("INSERT INTO samples (node, ts, metric, value, labels) VALUES (?, ?, ?, ?, ?)",
                                 [(node, now - seconds + t, f"m{m // 8}", float(v), labels)
                                  for t, v in enumerate(values)])
            rows += seconds
    return rows


def python_walk(conn, nodes: list[str], since: float) -> int:
    """Baseline: every row into Python, labels parsed, summed per (node, series)."""
    sums: dict[tuple, float] = {}
    for node, ts, metric, value, labels in conn.execute(
            "SELECT node, ts, metric, value, labels FROM samples WHERE node IN (%s) AND ts >= ?"
            % ",".join("?" * len(nodes)), (*nodes, since)):
        key = (node, metric + json.dumps(json.loads(labels), sort_keys=True))
        sums[key] = sums.get(key, 0.0) + value
    return len(sums)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=8)
    ap.add_argument("--metrics", type=int, default=200, help="series per node")
    ap.add_argument("--hour", type=int, default=3600, help="seconds of 1 Hz history")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    nodes = [f"node{i}" for i in range(args.nodes)]
    now = time.time()
    with tempfile.TemporaryDirectory() as tmp:
        conn = open_db(Path(tmp) / "controller.db")
        t = time.perf_counter()
        rows = fill(conn, nodes, args.metrics, args.hour, now)
        print(f"{rows:,} samples ({args.nodes} nodes x {args.metrics} series x {args.hour} s) written in "
              f"{time.perf_counter() - t:.0f} s")
        history, window, rest, walk = [], [], [], []
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            hist = bucket_stats(conn, nodes, now - args.hour, now - WINDOW_S, HISTORY_BUCKETS,
                                sample_s=WINDOW_S / WINDOW_BUCKETS)
            t1 = time.perf_counter()
            cur = bucket_stats(conn, nodes, now - WINDOW_S, now + 1e-6, WINDOW_BUCKETS)
            t2 = time.perf_counter()
            names, current, hmat, jitter = job_matrices(nodes, now, WINDOW_S, [], cur, hist)
            score_nodes(nodes, current, hmat, jitter=jitter)
            t3 = time.perf_counter()
            python_walk(conn, nodes, now - args.hour)
            t4 = time.perf_counter()
            history.append(t1 - t0), window.append(t2 - t1), rest.append(t3 - t2), walk.append(t4 - t3)
        # the long healthy memory's feed (healthy.py): once per window, one slice of every job's nodes (jobs of 8)
        jobs = [types.SimpleNamespace(job_id=i, nodes=tuple(nodes[i:i + 8])) for i in range(0, len(nodes), 8)]
        feeds, ticks = [], []
        for r in range(args.repeat):
            feed = HealthyFeed(conn, WINDOW_S, time.time)
            while len(feed.next_at) < len(jobs):  # the slice before, job by job: counters told from gauges
                feed.update(now - WINDOW_S, jobs, [], lambda n: False)
            feed.next_at.clear()
            added, t = 0, []
            while len(feed.next_at) < len(jobs):  # tick by tick until every job was read
                t0 = time.perf_counter()
                added += feed.update(now, jobs, [], lambda n: False)
                t.append(time.perf_counter() - t0)
            feeds.append(sum(t)), ticks.append(max(t))
        print(f"healthy feed (every {WINDOW_S:.0f} s, {NODES_PER_TICK} nodes a tick at most): "
              f"{1000 * statistics.median(feeds):.0f} ms in all for {added:,} values over {len(t)} ticks, "
              f"at most {1000 * statistics.median(ticks):.0f} ms a tick "
              f"({len(feed.sketches):,} histograms, {feed.sketches.nbytes / 2 ** 20:.1f} MiB)")
        # of which the rule that keeps nodes far out in their own histograms from teaching: the same slices'
        # values added with it (teach) and without it (add), side by side, every job once
        series = sorted({s for n, s in feed.sketches.index})
        values = np.random.default_rng(5).normal(size=(8, len(series)))
        cost = {}
        for how in ("add", "teach", "add", "teach"):
            t0 = time.perf_counter()
            for j in jobs:
                getattr(feed.sketches, how)(list(j.nodes), series, values[:len(j.nodes)], np.ones(len(j.nodes), bool))
            cost[how] = time.perf_counter() - t0
        print(f"  of which the teaching rule: every job's slice added through it {1000 * cost['teach']:.0f} ms, "
              f"without it {1000 * cost['add']:.0f} ms")
    med = statistics.median
    round_s = med(window) + med(rest)
    print(f"isolation round (window read + matrices + scores): {1000 * round_s:.0f} ms "
          f"(window {1000 * med(window):.0f} ms, matrices and scores {1000 * med(rest):.0f} ms)")
    print(f"history read (every {HISTORY_REFRESH_S:.0f} s at most): {1000 * med(history):.0f} ms")
    print(f"baseline, the hour walked in Python: {1000 * med(walk):.0f} ms "
          f"= {med(walk) / (med(history) + round_s):.1f}x the aggregated read of history and window")
    return 0


if __name__ == "__main__":
    sys.exit(main())
