"""Retention: old raw samples are folded into per-bucket rollups (nothing valid lost), other tables age out, the
audit trail stays, detection's own window is never cut; the policy is validated by key."""

from __future__ import annotations

import json

import pytest

from sigma.config import ConfigError
from sigma.controller.config import load_controller_config
from sigma.controller.db import open_db
from sigma.controller.retention import Retention, RetentionConfig, bound_bytes

NOW = 1_800_000_000.0
HOUR = 3600.0


def add_samples(conn, rows):
    with conn:
        conn.executemany("INSERT INTO samples (node, ts, metric, value, labels, job_ids) VALUES (?,?,?,?,?,?)", rows)


def rollups(conn):
    return {(r[0], r[1], r[2], r[3]): tuple(r[4:]) for r in conn.execute(
        "SELECT node, metric, labels, bucket, n, vmin, vmax, vsum FROM samples_rollup")}


def test_old_samples_fold_into_hourly_rollups_and_recent_ones_stay(tmp_path):
    conn = open_db(tmp_path / "c.db")
    old = [("n1", NOW - 3 * HOUR + i * 60, "gpu.temp_c", float(i), '{"gpu":"0"}', "[7]") for i in range(90)]
    nulls = [("n1", NOW - 3 * HOUR + 5, "gpu.temp_c", None, '{"gpu":"0"}', "[7]")]
    recent = [("n1", NOW - 60 + i, "gpu.temp_c", 50.0, '{"gpu":"0"}', "[7]") for i in range(30)]
    add_samples(conn, old + nulls + recent)
    cfg = RetentionConfig(samples_raw_s=HOUR, rollup_s=HOUR, chunk_rows=1000)
    deleted = Retention(conn, cfg).run(NOW)
    assert deleted["samples"] == 91
    assert conn.execute("SELECT count(*) FROM samples").fetchone()[0] == 30
    bucket0 = (NOW - 3 * HOUR) // HOUR * HOUR
    got = rollups(conn)
    expected: dict = {}
    for node, ts, metric, value, labels, _ in old:
        b = ts // HOUR * HOUR
        n, lo, hi, s = expected.get(b, (0, float("inf"), float("-inf"), 0.0))
        expected[b] = (n + 1, min(lo, value), max(hi, value), s + value)
    assert got == {("n1", "gpu.temp_c", '{"gpu":"0"}', b): v for b, v in expected.items()}
    assert min(b for *_, b in got) == bucket0
    # a node's backlog arriving late lands in the bucket it belongs to
    add_samples(conn, [("n1", NOW - 3 * HOUR + 1, "gpu.temp_c", -5.0, '{"gpu":"0"}', "[7]")])
    Retention(conn, cfg).run(NOW)
    n, vmin, vmax, vsum = rollups(conn)[("n1", "gpu.temp_c", '{"gpu":"0"}', bucket0)]
    assert (n, vmin, vsum) == (expected[bucket0][0] + 1, -5.0, expected[bucket0][3] - 5.0)


def test_many_chunks_are_all_folded(tmp_path):
    conn = open_db(tmp_path / "c.db")
    add_samples(conn, [(f"n{i % 7}", NOW - 2 * HOUR + i * 0.1, "m", 1.0, "{}", "[]") for i in range(5500)])
    Retention(conn, RetentionConfig(samples_raw_s=HOUR, chunk_rows=1000)).run(NOW)
    assert conn.execute("SELECT count(*) FROM samples").fetchone()[0] == 0
    assert conn.execute("SELECT sum(n) FROM samples_rollup").fetchone()[0] == 5500


def test_detection_window_is_kept_whatever_the_policy(tmp_path):
    conn = open_db(tmp_path / "c.db")
    add_samples(conn, [("n1", NOW - 1800, "m", 1.0, "{}", "[]"), ("n1", NOW - 2 * HOUR, "m", 1.0, "{}", "[]")])
    Retention(conn, RetentionConfig(samples_raw_s=60), floor_s=HOUR).run(NOW)
    assert [r[0] for r in conn.execute("SELECT ts FROM samples")] == [NOW - 1800]


def test_tables_age_out_and_the_audit_trail_stays(tmp_path):
    conn = open_db(tmp_path / "c.db")
    day = 86400.0
    with conn:
        for age in (100 * day, day):
            conn.execute("INSERT INTO events (node, ts, source, kind) VALUES (?,?,?,?)", ("n1", NOW - age, "log", "x"))
            conn.execute("INSERT INTO kpis (node, ts, job_id) VALUES (?,?,?)", ("n1", NOW - age, 1))
            conn.execute("INSERT INTO node_snapshots (ts, node, state) VALUES (?,?,?)", (NOW - age * 5, "n1", "idle"))
            conn.execute("INSERT INTO batches (node, seq, received_at, records) VALUES (?,?,?,?)",
                         ("n1", int(age), NOW - age / 30, 0))
            conn.execute("INSERT INTO samples_rollup (node, metric, labels, bucket, span_s, n) VALUES (?,?,?,?,?,?)",
                         ("n1", "m", "{}", NOW - age * 5, 3600, 1))
            conn.execute("INSERT INTO incidents (key, opened_at, updated_at, rule_id, source, scope, severity, action,"
                         " fault_ts, status) VALUES (?,?,?,?,?,?,?,?,?,?)",
                         (f"k{age}", NOW - age * 10, NOW - age * 10, "r", "rule", "node", "error", "drain", 0, "closed"))
    deleted = Retention(conn, RetentionConfig()).run(NOW)
    assert {k: v for k, v in deleted.items() if k != "samples"} == {
        "samples_rollup": 1, "events": 1, "kpis": 1, "node_snapshots": 1, "batches": 1}
    for table in ("events", "kpis", "node_snapshots", "batches", "samples_rollup"):
        assert conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0] == 1, table
    assert conn.execute("SELECT count(*) FROM incidents").fetchone()[0] == 2


def test_bad_policy_is_named_by_key(tmp_path):
    with pytest.raises(ValueError, match="retention.rollup_s must be > 0"):
        RetentionConfig(rollup_s=0)
    path = tmp_path / "controller.yaml"
    path.write_text("retention:\n  samples_raw_s: -5\n")
    with pytest.raises(ConfigError, match="samples_raw_s"):
        load_controller_config(path)
    path.write_text("retention:\n  raw_days: 5\n")
    with pytest.raises(ConfigError, match="raw_days"):
        load_controller_config(path)
    assert load_controller_config(_write(tmp_path, {"retention": {"samples_raw_s": 7200}})).retention.samples_raw_s \
        == 7200


def _write(tmp_path, data) -> str:
    path = tmp_path / "ok.yaml"
    path.write_text(json.dumps(data))
    return str(path)


def test_bound_is_the_raw_window_plus_the_rollups():
    cfg = RetentionConfig(samples_raw_s=2 * HOUR, rollup_s=3600, rollup_keep_s=100 * HOUR)
    # 1 GB/h raw: 2 GB of raw window + 100 h of rollups at 2/3600 of the raw rate
    assert bound_bytes(1e9, cfg) == pytest.approx(2e9 + 100 * 1e9 * 2 / 3600)


def test_the_thread_prunes_on_its_own_connection(tmp_path):
    import threading
    import time

    from sigma.controller.retention import RetentionThread

    db = tmp_path / "c.db"
    conn = open_db(db)
    add_samples(conn, [("n1", time.time() - 2 * HOUR, "m", 1.0, "{}", "[]")])
    passes = []
    done = threading.Event()
    pruner = RetentionThread(str(db), RetentionConfig(every_s=0.05, samples_raw_s=60),
                             on_pass=lambda deleted, took: (passes.append(deleted), done.set()))
    pruner.start()
    try:
        assert done.wait(30)
    finally:
        pruner.stop()
    assert passes[0]["samples"] == 1
    assert conn.execute("SELECT count(*) FROM samples").fetchone()[0] == 0
