"""Time-window reads of the controller's samples go through the (node, metric, ts) index and return exactly what a
plain scan with the same filter returns, ordered by ts."""

from __future__ import annotations

import random

from sigma.controller.db import open_db
from sigma.controller.samples import BY_METRICS_SQL, BY_NODES_SQL, recent_for_metrics, recent_for_nodes


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


def test_only_the_node_metric_ts_index_is_left(tmp_path):
    conn = _db(tmp_path)
    indexes = conn.execute("SELECT name FROM sqlite_master WHERE tbl_name = 'samples' AND type = 'index'")
    assert {r[0] for r in indexes} == {"samples_node_metric_ts"}


def test_window_by_metrics_matches_a_scan(tmp_path):
    conn = _db(tmp_path)
    got = recent_for_metrics(conn, 40.0, ["c", "a", "missing"])
    assert sorted(tuple(r) for r in got) == _scan(conn, "ts >= 40 AND metric IN ('a', 'c', 'missing')", ())
    assert len(got) == 3 * 2 * 2 * 10 and [r["ts"] for r in got] == sorted(r["ts"] for r in got)
    assert recent_for_metrics(conn, 40.0, []) == [] and recent_for_metrics(conn, 1e12, ["a"]) == []


def test_window_by_nodes_matches_a_scan(tmp_path):
    conn = _db(tmp_path)
    got = recent_for_nodes(conn, 45.2, ["n3", "n1", "unknown"])
    assert sorted(tuple(r) for r in got) == _scan(conn, "ts >= 45.2 AND node IN ('n1', 'n3', 'unknown')", ())
    assert got and [r["ts"] for r in got] == sorted(r["ts"] for r in got)
    assert {r["node"] for r in got} == {"n1", "n3"} and recent_for_nodes(conn, 0.0, []) == []


def test_window_reads_search_the_index(tmp_path):
    conn = _db(tmp_path)
    for sql, args in ((BY_METRICS_SQL, ('["a"]', 1.0)), (BY_NODES_SQL, ('["n1"]', 1.0))):
        plan = " | ".join(r[3] for r in conn.execute("EXPLAIN QUERY PLAN " + sql, args))
        assert "(node=? AND metric=? AND ts>?)" in plan, plan
        assert "SCAN s " not in plan + " " and "SCAN samples" not in plan, plan
