"""The watchdog's running state (kpiwindow.JobState: the highest step, the earlier throughput's sums, fed with each
tick's new rows) gives the verdicts a from-scratch computation over the same rows gives (watchdog.check_job), through
late batches, judging times that go back, rows forgotten, a hang longer than the window, a requeue, and a restarted
controller that rebuilds the state from the database."""

from __future__ import annotations

import random
from collections import Counter

from sigma.controller.config import WatchdogConfig
from sigma.controller.db import KPI_COLUMNS, open_db
from sigma.controller.detect.kpiwindow import KpiWindow
from sigma.controller.detect.watchdog import JobInfo, RowsView, check_job, judge, throughput

from tests.unit.controller.helpers import make_controller

CFG = WatchdogConfig(hang_timeout_s=15.0, startup_grace_s=20.0, recent_window_s=10.0, baseline_window_s=60.0,
                     min_points=5, jitter_window_s=20.0)
LOOKBACK = max(2 * CFG.hang_timeout_s, CFG.recent_window_s + CFG.baseline_window_s)
NODES = {1: ("a1", "a2", "a3"), 2: ("b1", "b2", "b3"), 3: ("c1", "c2")}


def _fresh(conn, job: int, since: float) -> list[dict]:
    return [dict(r) for r in conn.execute(f"SELECT {KPI_COLUMNS} FROM kpis WHERE job_id = ? AND ts >= ?"
                                          " ORDER BY ts, rowid", (job, since))]


class Stream:
    """Three jobs' ranks stepping once a second: job 1 slows to half its throughput twice, job 2 stops
    stepping (one rank goes on reporting rows without a step, its ranks at different steps) for longer than the
    window and is then requeued, job 3 jitters and reports only step times; batches arrive late now and then."""

    def __init__(self, conn, seed: int):
        self.conn, self.rng = conn, random.Random(seed)
        self.step = Counter()
        self.start = {job: 0.0 for job in NODES}
        self.pending: list[tuple] = []

    def second(self, t: float) -> None:
        rng = self.rng
        for job, nodes in NODES.items():
            hung = job == 2 and 150 <= t < 260
            if job == 2 and t == 260:
                self.start[2] = t  # requeued: a new run
            if not hung:
                self.step[job] += 1
            for rank, node in enumerate(nodes):
                step = self.step[job] - (1 if hung and rank == 0 else 0)
                slow = 0.5 if job == 1 and (120 <= t < 200 or 330 <= t) else 1.0
                tps = 1000.0 * slow * (rng.uniform(0.5, 1.5) if job == 3 else rng.uniform(0.97, 1.03))
                if hung and rank != 2:
                    continue  # the stuck ranks say nothing
                row = (node, t + rng.random() * 0.5, job, rank, None if hung else step, 2.0,
                       1000.0 / tps, None if job == 3 else tps)
                # late: a batch held back a few seconds (a sidecar's retry), or a long way (a backlog)
                delay = rng.choice((0, 0, 0, 0, 0, 2, 6)) if rng.random() < 0.3 else 0
                self.pending.append((t + delay, row))
        due = [r for at, r in self.pending if at <= t]
        self.pending = [(at, r) for at, r in self.pending if at > t]
        rng.shuffle(due)
        with self.conn:
            self.conn.executemany("INSERT INTO kpis (node, ts, job_id, rank, step, loss, step_time_s, tokens_per_s,"
                                  " payload) VALUES (?,?,?,?,?,?,?,?,'{}')", due)


def test_running_state_gives_the_verdicts_of_a_fresh_computation_also_after_a_restart(tmp_path):
    conn = open_db(tmp_path / "c.db")
    stream = Stream(conn, seed=11)
    rng = random.Random(5)
    window = KpiWindow(conn, keep_s=LOOKBACK + CFG.hang_timeout_s)
    verdicts: Counter = Counter()
    for t in range(0, 420):
        stream.second(float(t))
        now = t + 1.0
        if t == 185:
            window = KpiWindow(conn, keep_s=LOOKBACK + CFG.hang_timeout_s)  # a restart: state read from the database
        window.update(now)
        for job, nodes in NODES.items():
            at = now - (rng.choice((0.0, 0.3, 1.0, 4.0)) if rng.random() < 0.9 else rng.uniform(5.0, 15.0))
            info = JobInfo(job, nodes, stream.start[job])
            since = max(info.start_time, at - LOOKBACK)
            view = window.view(job, since)
            fresh = _fresh(conn, job, since)
            reference = RowsView([k for k in fresh if k["ts"] >= info.start_time])
            assert view.rows == reference.rows
            assert view.head() == reference.head()
            lo, hi = at - CFG.recent_window_s - CFG.baseline_window_s, at - CFG.recent_window_s
            assert view.earlier(lo, hi) == reference.earlier(lo, hi)
            found = judge(info, view, at, CFG, ever_reported=True)
            assert found == check_job(info, fresh, at, CFG, ever_reported=True)
            verdicts.update((f.rule_id, t > 185) for f in found)
    # the run was not vacuous: each kind of verdict came up, before and after the restart
    for restarted in (False, True):
        assert verdicts["watchdog-throughput-drop", restarted] > 5 and verdicts["watchdog-hang", restarted] > 5
    assert verdicts["watchdog-throughput-jitter", False] + verdicts["watchdog-throughput-jitter", True] > 5


def test_forgotten_and_late_rows_keep_the_sums_exact(tmp_path):
    """Sums kept by adding and taking off rows equal the exact sum of the rows left (no drift over a long run)."""
    conn = open_db(tmp_path / "c.db")
    rng = random.Random(2)
    window = KpiWindow(conn, keep_s=50.0)
    for t in range(600):
        with conn:
            conn.executemany("INSERT INTO kpis (node, ts, job_id, rank, step, step_time_s, tokens_per_s) VALUES"
                             " (?,?,?,?,?,?,?)", [("n1", t - rng.random() * 8, 1, r, t, rng.uniform(0.1, 3.0),
                                                   rng.uniform(1e2, 1e7)) for r in range(3)])
        window.update(t + 1.0)
        view = window.view(1, t - 40.0)
        rows = window.rows[1]
        points, tp = view.earlier(t - 30.0, t - 5.0)
        inside = [r for r in rows if t - 30.0 <= r["ts"] < t - 5.0]
        assert (points, tp) == (len(inside), throughput(inside))


def _stream(ctl, nodes, job, t0, t1, tps):
    with ctl.conn:
        for t in range(int(t0), int(t1)):
            for rank, node in enumerate(nodes):
                ctl.conn.execute("INSERT INTO samples VALUES (?, ?, 'host.cpu.util_pct', 5.0, '{}', '[]')",
                                 (node, float(t)))
                ctl.conn.execute("INSERT INTO kpis (node, ts, job_id, rank, step, loss, step_time_s, tokens_per_s)"
                                 " VALUES (?, ?, ?, ?, ?, 2.0, ?, ?)", (node, float(t), job, rank, t, 1000.0 / tps,
                                                                       tps))


def test_a_restarted_controller_judges_as_the_running_one(tmp_path):
    """The loop's own path: a throughput drop judged from the running state, then by a controller started again on
    the same database (its state rebuilt on its first tick), and from scratch: the same finding."""
    ctl, slurm, clock = make_controller(tmp_path)
    ctl.cfg.isolation.enabled = False  # the watchdog's own verdict
    nodes = ("node1", "node2")
    start = clock() - 1000
    slurm.run_job(1, list(nodes), start=start)
    _stream(ctl, nodes, 1, clock() - 990, clock(), 1000.0)
    ctl.tick()
    for minute in range(10):  # a tick a minute: new rows arrive, the window's start passes old ones
        clock.advance(60)
        _stream(ctl, nodes, 1, clock() - 60, clock(), 500.0 if minute == 9 else 1000.0)
        found = [f for f in ctl.tick() if f.source == "watchdog"]
    assert [f.rule_id for f in found] == ["watchdog-throughput-drop"]
    again, _, _ = make_controller(tmp_path, slurm=slurm, clock=clock, conn=ctl.conn)
    again.cfg.isolation.enabled = False
    assert [f for f in again.tick() if f.source == "watchdog"] == found
    at = clock() - 1  # judged as of the nodes' newest sample
    lookback = max(2 * ctl.cfg.watchdog.hang_timeout_s,
                   ctl.cfg.watchdog.recent_window_s + ctl.cfg.watchdog.baseline_window_s)
    rows = _fresh(ctl.conn, 1, max(start, at - lookback))
    assert check_job(JobInfo(1, nodes, start), rows, at, ctl.cfg.watchdog, ever_reported=True) == found
