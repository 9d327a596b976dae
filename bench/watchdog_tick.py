"""The watchdog's cost per tick as a job's KPI window fills: running state (kpiwindow.JobState) against the
from-scratch computation the loop did before (watchdog.check_job over the window's rows), side by side.

--jobs jobs of --job-nodes nodes each report one KPI row per node per second (tokens_per_s jittered, a wait_s in the
payload, now and then a batch a few seconds late) into a real SQLite controller database; every simulated second the
controller's KpiWindow reads the new rows and every job is judged with the shipped watchdog config, as the loop does.
At each --at second the same tick is also judged from scratch; the two verdicts must be equal (the bench stops if
not). Printed per checkpoint: the rows in the window, ms per tick of each way (the median of --repeat ticks), the
ratio. The running way's time includes reading the tick's new rows from the database (KpiWindow.update); the from-scratch
way's is the checks alone (the rows handed over in memory, as the loop kept them). No isolation, no other SQL.

    .venv/bin/python bench/watchdog_tick.py [--jobs 32] [--job-nodes 8] [--at 60,300,600,930,1200]
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from sigma.controller.config import WatchdogConfig  # noqa: E402
from sigma.controller.db import KPI_COLUMNS, open_db  # noqa: E402
from sigma.controller.detect.kpiwindow import KpiWindow  # noqa: E402
from sigma.controller.detect.watchdog import JobInfo, check_job, judge  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", type=int, default=32)
    ap.add_argument("--job-nodes", type=int, default=8)
    ap.add_argument("--at", default="60,300,600,930,1200", help="seconds into the run at which both ways are timed")
    ap.add_argument("--repeat", type=int, default=5, help="ticks timed at each checkpoint")
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    checkpoints = sorted(int(a) for a in args.at.split(","))
    cfg = WatchdogConfig()
    lookback = max(2 * cfg.hang_timeout_s, cfg.recent_window_s + cfg.baseline_window_s)
    rng = random.Random(args.seed)
    conn = open_db(Path(tempfile.mkdtemp(prefix="sigma-watchdog-tick-")) / "controller.db")
    jobs = [JobInfo(1000 + j, tuple(f"n{j:03d}-{i}" for i in range(args.job_nodes)), start_time=-60.0)
            for j in range(args.jobs)]
    window = KpiWindow(conn, keep_s=lookback + cfg.hang_timeout_s)
    late: list[tuple[float, tuple]] = []

    def second(t: int) -> None:
        nonlocal late
        rows = []
        for job in jobs:
            for rank, node in enumerate(job.nodes):
                tps = 8000.0 * rng.uniform(0.95, 1.05)
                row = (node, t + rng.random() * 0.3, job.job_id, rank, t, 2.0, 8000.0 / tps, tps,
                       f'{{"wait_s": {rng.uniform(0.3, 0.5):.3f}}}')
                if rng.random() < 0.02:
                    late.append((t + rng.choice((2, 5)), row))
                else:
                    rows.append(row)
        rows += [r for at, r in late if at <= t]
        late = [(at, r) for at, r in late if at > t]
        with conn:
            conn.executemany("INSERT INTO kpis (node, ts, job_id, rank, step, loss, step_time_s, tokens_per_s,"
                             " payload) VALUES (?,?,?,?,?,?,?,?,?)", rows)

    def running(now: float) -> list:
        window.update(now)
        return [judge(j, window.view(j.job_id, max(j.start_time, now - 0.5 - lookback)), now - 0.5, cfg,
                      ever_reported=True) for j in jobs]

    def scratch(now: float) -> list:
        found = []
        for j in jobs:
            since = max(j.start_time, now - 0.5 - lookback)
            rows = [dict(r) for r in conn.execute(f"SELECT {KPI_COLUMNS} FROM kpis WHERE job_id = ? AND ts >= ?"
                                                  " ORDER BY ts, rowid", (j.job_id, since))]
            t = time.perf_counter()
            found.append(check_job(j, rows, now - 0.5, cfg, ever_reported=True))
            scratch.spent += time.perf_counter() - t  # the arithmetic only, not the read
        return found

    print(f"{args.jobs} jobs x {args.job_nodes} nodes, one KPI row per node per second, lookback {lookback:.0f} s "
          f"(shipped watchdog config); ms per tick, median of {args.repeat}:")
    print(f"{'t s':>6} {'rows':>9} {'from scratch':>13} {'running':>9} {'ratio':>7}")
    t = 0
    for at in checkpoints:
        while t < at:
            second(t)
            t += 1
            running(float(t))
        run_ms, scratch_ms = [], []
        for _ in range(args.repeat):
            second(t)
            t += 1
            t0 = time.perf_counter()
            mine = running(float(t))
            run_ms.append((time.perf_counter() - t0) * 1000)
            scratch.spent = 0.0
            if scratch(float(t)) != mine:
                raise SystemExit(f"t={t}: the running state's verdicts differ from the from-scratch ones")
            scratch_ms.append(scratch.spent * 1000)
        rows = sum(len(r) for r in window.rows.values())
        a, b = statistics.median(scratch_ms), statistics.median(run_ms)
        print(f"{t:>6} {rows:>9,} {a:>13.1f} {b:>9.1f} {a / b:>6.1f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
