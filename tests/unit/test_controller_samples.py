"""Time-window reads of the controller's samples go through the (node, ts) index and return exactly what a
plain scan with the same filter returns, ordered by ts."""

from __future__ import annotations

import random

from sigma.controller.db import open_db
from sigma.controller.detect.samples import BUCKETS_SQL, BY_METRICS_SQL, bucket_stats, recent_for_metrics


def _db(tmp_path):
    conn = open_db(tmp_path / "c.db")
    rng = random.Random(7)
    rows = [(node, float(t) + rng.random() / 2, metric, rng.random(), labels, "[]")
            for node in ("n1", "n2", "n3") for metric in ("a", "b", "c") for t in range(50)
            for labels in ("{}", '{"gpu":"0"}')]
    rng.shuffle(rows)
    with conn:
        conn.executemany("INSERT INTO samples VALUES (?, ?, ?, ?, ?, ?)", rows)
    return conn


def _scan(conn, where, args):
    return sorted(tuple(r) for r in conn.execute(f"SELECT * FROM samples NOT INDEXED WHERE {where}", args))


def test_only_the_node_ts_index_is_left(tmp_path):
    conn = _db(tmp_path)
    indexes = conn.execute("SELECT name FROM sqlite_master WHERE tbl_name = 'samples' AND type = 'index'")
    assert {r[0] for r in indexes} == {"samples_node_ts"}


def test_window_by_metrics_matches_a_scan(tmp_path):
    conn = _db(tmp_path)
    got = recent_for_metrics(conn, 40.0, ["c", "a", "missing"])
    assert sorted(tuple(r) for r in got) == _scan(conn, "ts >= 40 AND metric IN ('a', 'c', 'missing')", ())
    assert len(got) == 3 * 2 * 2 * 10 and [r["ts"] for r in got] == sorted(r["ts"] for r in got)
    assert recent_for_metrics(conn, 40.0, []) == [] and recent_for_metrics(conn, 1e12, ["a"]) == []


def test_buckets_by_nodes_match_a_scan(tmp_path):
    conn = _db(tmp_path)
    with conn:
        conn.execute("INSERT INTO samples VALUES ('n1', 46.0, 'sidecar.collector.cpu_s', 1.0, '{}', '[]')")
    got = bucket_stats(conn, ["n3", "n1", "unknown"], 20.0, 45.0, 5)
    want = {}
    for node, ts, metric, value, labels in conn.execute(
            "SELECT node, ts, metric, value, labels FROM samples NOT INDEXED WHERE ts >= 20 AND ts < 45 AND "
            "node IN ('n1', 'n3')"):
        want.setdefault((node, metric + ("" if labels == "{}" else labels), int((ts - 20.0) / 5.0)), []).append(
            (value, ts))
    assert {g[:3] for g in got} == set(want)
    for node, series, bucket, n, mean, mean_sq, vmin, vmax, tmin, tmax in got:
        values, stamps = zip(*want[(node, series, bucket)])
        assert n == len(values) and abs(mean - sum(values) / n) < 1e-9 and vmin == min(values)
        assert abs(mean_sq - sum(v * v for v in values) / n) < 1e-9 and (tmin, tmax) == (min(stamps), max(stamps))
    assert not any(g[1].startswith("sidecar.") for g in bucket_stats(conn, ["n1"], 0.0, 100.0, 1))
    assert bucket_stats(conn, [], 0.0, 1.0, 2) == []
    sampled = bucket_stats(conn, ["n2"], 0.0, 50.0, 5, sample_s=2.0)  # a long history: the first 2 s of each 10 s
    assert {g[2] for g in sampled} == {0, 1, 2, 3, 4}
    assert all(10.0 * g[2] <= g[8] <= g[9] < 10.0 * g[2] + 2.0 for g in sampled)


def test_window_reads_search_the_index(tmp_path):
    conn = _db(tmp_path)
    for sql, args in ((BY_METRICS_SQL.format(upto=" AND s.rowid <= ?", marks="?"), (1.0, 9, "a")),
                      (BY_METRICS_SQL.format(upto="", marks="?"), (1.0, "a")),
                      (BUCKETS_SQL.format(slices="(0, ?), (1, ?)", nodes="(?)"), (1.0, 2.0, "n1", 1.0))):
        plan = " | ".join(r[3] for r in conn.execute("EXPLAIN QUERY PLAN " + sql, args))
        assert "USING INDEX samples_node_ts (node=? AND ts>?" in plan, plan
        assert "SCAN s " not in plan + " " and "SCAN samples" not in plan, plan
