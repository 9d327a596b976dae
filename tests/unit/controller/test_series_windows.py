"""The metric rules' incremental windows give the same stats as reading the window's raw rows, with rows arriving
late and in several ticks, and leave out a node's evidence from before it returned."""

from __future__ import annotations

import math
import random

from sigma.controller.db import open_db
from sigma.controller.detect.series import BUCKET_S, SeriesWindows
from sigma.rules.matcher import SeriesStats

T0 = 1_800_000_000.0


def raw_stats(rows, lo, now, since):
    out = {}
    for node, ts, metric, value, labels in sorted(rows, key=lambda r: r[1]):
        bucket = math.floor(ts / BUCKET_S) * BUCKET_S
        if value is None or not (lo <= bucket <= now) or bucket <= since.get(node, -math.inf):
            continue
        st = out.get((node, labels))
        if st is None:
            out[(node, labels)] = SeriesStats.of(ts, value)
        else:
            st.add(ts, value)
    return out


def test_incremental_windows_match_the_raw_rows(tmp_path):
    rng = random.Random(7)
    conn = open_db(tmp_path / "c.db")
    sw = SeriesWindows(conn)
    rows = []

    def insert(batch):
        rows.extend(batch)
        with conn:
            conn.executemany("INSERT INTO samples (node, ts, metric, value, labels) VALUES (?,?,?,?,?)", batch)

    def sample(ts):
        return [(n, ts, "gpu.ecc", rng.choice([None, float(rng.randint(0, 9))]), f'{{"gpu":"{g}"}}')
                for n in ("n1", "n2", "n3") for g in range(2)]

    for s in range(300):  # history before the controller starts
        insert(sample(T0 + s) + [("n1", T0 + s, "other", 1.0, "{}")])
    since = {"n2": T0 + 700.0}
    for tick in range(1, 60):
        now = T0 + 300 + tick * 10
        batch = [r for s in range(10) for r in sample(now - 10 + s)]
        if tick % 7 == 0:  # a backlog arriving late, 200 s old
            batch += sample(now - 200.5)
        insert(batch)
        sw.update({"gpu.ecc": 600.0}, now)
        lo = math.floor((now - 600) / BUCKET_S) * BUCKET_S
        assert sw.window("gpu.ecc", 600.0, now, since) == raw_stats(
            [r for r in rows if r[2] == "gpu.ecc"], lo, now, since), tick
    assert sw.window("other", 600.0, now, {}) == {}  # not watched


def test_a_new_metric_rereads_the_windows(tmp_path):
    conn = open_db(tmp_path / "c.db")
    with conn:
        conn.executemany("INSERT INTO samples (node, ts, metric, value, labels) VALUES (?,?,?,?,?)",
                         [("n1", T0 + i, m, float(i), "{}") for i in range(100) for m in ("a", "b")])
    sw = SeriesWindows(conn)
    sw.update({"a": 600.0}, T0 + 100)
    sw.update({"a": 600.0, "b": 60.0}, T0 + 100)
    st = sw.window("b", 60.0, T0 + 100, {})[("n1", "{}")]
    assert (st.n, st.first, st.last) == (60, 40.0, 99.0)
