"""The watchdog's KPI rows come from memory, fed with the rows ingested since the last tick: the same rows, in the
same order, as reading the job's window again; and a job is judged as of its nodes' newest data, so ingest running
behind is not a hang."""

from __future__ import annotations

import random

from sigma.controller.db import open_db
from sigma.controller.detect.kpiwindow import KpiWindow

from tests.unit.controller.helpers import add_kpi, make_controller


def _query(conn, job, since):
    return [dict(r) for r in conn.execute("SELECT * FROM kpis WHERE job_id = ? AND ts >= ? ORDER BY ts, rowid",
                                          (job, since))]


def test_rows_match_a_fresh_read_through_late_batches_and_forgetting(tmp_path):
    conn = open_db(tmp_path / "c.db")
    rng = random.Random(3)
    window = KpiWindow(conn, keep_s=100.0)
    now = 1000.0
    for tick in range(40):
        for job in (1, 2, 3):
            for rank in range(2):
                ts = now - (rng.random() * 30 if tick % 7 == 3 else rng.random())  # now and then a late batch
                add_kpi(conn, f"n{job}", ts, job, rank, tick)
        window.update(now)
        for job in (1, 2, 3, 4):
            since = now - rng.choice((20.0, 60.0, 100.0))
            assert window.job_rows(job, since) == _query(conn, job, since)
        now += 5.0
    assert min(r["ts"] for rows in window.rows.values() for r in rows) >= now - 5.0 - 100.0  # older rows forgotten


def test_a_restarted_controller_reads_the_window_once(tmp_path):
    conn = open_db(tmp_path / "c.db")
    for i in range(50):
        add_kpi(conn, "n1", 900.0 + i, 7, 0, i)
    window = KpiWindow(conn, keep_s=30.0)
    window.update(950.0)
    assert window.job_rows(7, 0.0) == _query(conn, 7, 920.0)
    add_kpi(conn, "n1", 951.0, 7, 0, 51)
    window.update(951.0)
    assert [r["step"] for r in window.job_rows(7, 940.0)] == list(range(40, 50)) + [51]


def _stream(ctl, nodes, job, t0, t1, *, steps_until=None, samples_until=None):
    with ctl.conn:
        for t in range(int(t0), int(t1)):
            for rank, node in enumerate(nodes):
                if samples_until is None or t < samples_until:
                    ctl.conn.execute("INSERT INTO samples VALUES (?, ?, 'host.cpu.util_pct', 5.0, '{}', '[]')",
                                     (node, float(t)))
                if steps_until is None or t < steps_until:
                    ctl.conn.execute("INSERT INTO kpis (node, ts, job_id, rank, step, loss, step_time_s, "
                                     "tokens_per_s) VALUES (?, ?, ?, ?, ?, 2.0, 1.0, 1000.0)",
                                     (node, float(t), job, rank, t))


def test_ingest_running_behind_is_not_a_hang_but_a_stopped_job_still_is(tmp_path):
    ctl, slurm, clock = make_controller(tmp_path)
    ctl.cfg.isolation.enabled = False  # the watchdog's own verdict, before isolation looks for a culprit
    nodes = ["node1", "node2"]
    slurm.run_job(1, nodes, start=clock() - 1000)
    now = clock()
    _stream(ctl, nodes, 1, now - 900, now - 100)  # every node's data is 100 s behind (a backlog), steps included
    clock.advance(60)  # 160 s behind: more than hang_timeout_s (120 s), less than twice
    assert "watchdog-hang" not in [f.rule_id for f in ctl.tick()]
    behind = [e for e in ctl.log.recent if e["event"] == "ingest_behind"]
    assert len(behind) == 1 and behind[0]["lag_s"] == {"1": 161.0}  # said so
    # the backlog arrives: samples up to now, but the job stopped stepping 130 s ago
    _stream(ctl, nodes, 1, now - 100, clock() + 1, steps_until=clock() - 130)
    clock.advance(1)
    assert "watchdog-hang" in [f.rule_id for f in ctl.tick()]
