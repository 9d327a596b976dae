"""Node store: batches with monotonic seq, ack/retry, bounds by age and size with drops counted."""

from __future__ import annotations

import pytest

from sigma.telemetry.base import Output
from sigma.telemetry.store import NodeStore


def fill(store: NodeStore, n: int, ts: float, metric: str = "m") -> None:
    out = Output(ts=ts)
    for i in range(n):
        out.sample(metric, float(i), {"i": i % 7})
    store.write([out], "[12]")


def test_batches_have_monotonic_seq_and_are_resent_until_acked(tmp_path):
    store = NodeStore(tmp_path / "n.db", "node1")
    fill(store, 25, 100.0)
    out = Output(ts=101.0)
    out.event("log", "xid", "boom", "error", {"xid": 79})
    store.write([out], "[]")
    seq1, ranges1 = store.next_batch(max_records=10)
    assert store.next_batch(max_records=10) == (seq1, ranges1)  # not acked: the same batch again
    samples, events, kpis = store.batch_rows(ranges1)
    assert len(events) == 1 and len(samples) == 9 and kpis == []  # events first, samples fill the budget
    assert samples[0]["job_ids"] == "[12]"
    store.ack(seq1, ranges1)
    seq2, ranges2 = store.next_batch(max_records=10)
    assert seq2 == seq1 + 1 and ranges2["samples"][0] == ranges1["samples"][1]
    store.ack(seq2, ranges2)
    seq3, ranges3 = store.next_batch(max_records=10)
    store.ack(seq3, ranges3)
    assert store.next_batch(max_records=10) is None
    assert store.backlog() == 0
    store.close()
    again = NodeStore(tmp_path / "n.db", "node1")  # seq survives restarts
    fill(again, 1, 102.0)
    assert again.next_batch(10)[0] == seq3 + 1


def test_seq_starts_at_creation_time_so_a_wiped_store_continues_above(tmp_path):
    a = NodeStore(tmp_path / "a.db", "node1")
    fill(a, 1, 1.0)
    first = a.next_batch(10)[0]
    (tmp_path / "a.db").unlink()
    b = NodeStore(tmp_path / "a.db", "node1")
    fill(b, 1, 1.0)
    assert b.next_batch(10)[0] > first


def test_store_refuses_another_nodes_database(tmp_path):
    NodeStore(tmp_path / "n.db", "node1")
    with pytest.raises(ValueError, match="belongs to node 'node1'"):
        NodeStore(tmp_path / "n.db", "node2")


def test_age_bound_counts_pushed_and_unpushed_drops(tmp_path):
    store = NodeStore(tmp_path / "n.db", "node1")
    fill(store, 30, ts=1000.0)
    seq, ranges = store.next_batch(max_records=10)
    store.ack(seq, ranges)  # 10 of the old rows reached the controller
    fill(store, 5, ts=5000.0)
    dropped = store.prune(max_age_s=100, max_bytes=1 << 30, now=5050.0)
    assert dropped == {"samples": 30, "events": 0, "kpis": 0, "unpushed": 20, "reason": "age"}
    assert store.conn.execute("SELECT count(*) FROM samples").fetchone()[0] == 5
    assert store.meta("dropped.unpushed") == "20" and store.meta("dropped.samples") == "30"
    assert store.prune(max_age_s=100, max_bytes=1 << 30, now=5050.0) is None  # nothing more: no report


def test_size_bound_deletes_oldest_first(tmp_path):
    store = NodeStore(tmp_path / "n.db", "node1")
    for k in range(10):
        fill(store, 2000, ts=1000.0 + k, metric=f"metric.with.a.long.name.{k}")
    before = store.size_bytes()
    dropped = store.prune(max_age_s=1e9, max_bytes=before // 2, now=2000.0)
    assert dropped["reason"] == "size" and dropped["unpushed"] == dropped["samples"] > 0
    assert store.size_bytes() <= before // 2
    oldest = store.conn.execute("SELECT min(ts), max(ts) FROM samples").fetchone()
    assert oldest[0] > 1000.0 and oldest[1] == 1009.0  # the newest rows are kept
    seq, ranges = store.next_batch(max_records=100000)  # the outbox skips what is gone
    samples, _, _ = store.batch_rows(ranges)
    assert len(samples) == store.conn.execute("SELECT count(*) FROM samples").fetchone()[0]


def test_recent_rows_are_the_rows_read_back_or_none(tmp_path, monkeypatch):
    store = NodeStore(tmp_path / "n.db", "node1")
    fill(store, 25, 100.0)
    out = Output(ts=101.0)
    out.event("log", "xid", "boom", "error", {"xid": 79})
    out.kpi(101.0, 7, 0, 3, 2.5, 0.4, 10.0, None, 1.0, {})
    store.write([out], "[3]")
    for max_records in (10, 10, 10, 10):
        seq, ranges = store.next_batch(max_records)
        from_db = [[tuple(r) for r in rows] for rows in store.batch_rows(ranges)]
        assert [[tuple(r) for r in rows] for rows in store.recent_rows(ranges)] == from_db
        store.ack(seq, ranges)
        if store.next_batch(max_records) is None:
            break
    assert store.backlog() == 0
    monkeypatch.setattr("sigma.telemetry.store.RECENT_MAX_ROWS", 5)
    fill(store, 8, 102.0)  # more than the memory keeps: the batch is read back from the database
    seq, ranges = store.next_batch(100)
    assert store.recent_rows(ranges) is None and len(store.batch_rows(ranges)[0]) == 8
    store.close()
    again = NodeStore(tmp_path / "n.db", "node1")  # after a restart nothing is in memory
    assert again.recent_rows(again.next_batch(100)[1]) is None


def test_the_writer_cuts_the_batch_an_idle_pusher_asked_for_and_records_its_ack(tmp_path):
    store = NodeStore(tmp_path / "n.db", "node1")
    offered = []
    store.on_cut = lambda seq, ranges: offered.append((seq, ranges))
    fill(store, 5, 100.0)
    assert offered == []  # nobody asked
    store.request_cut(100)
    fill(store, 3, 101.0)
    assert len(offered) == 1
    seq, ranges = offered[0]
    assert ranges["samples"] == (0, 8)  # everything not cut yet, in the write's own transaction
    assert store.next_batch(100) == (seq, ranges)  # the same pending batch for anyone who asks
    assert [tuple(r) for r in store.recent_rows(ranges)[0]] == [tuple(r) for r in store.batch_rows(ranges)[0]]
    store.defer_ack(seq, ranges)
    assert store.pushed("samples") == 0  # not yet recorded...
    fill(store, 2, 102.0)  # ...until the next write, which cuts nothing: no request
    assert store.pushed("samples") == 8 and len(offered) == 1
    store.request_cut(100, not_before=float("inf"))
    fill(store, 1, 103.0)
    assert len(offered) == 1  # not before its time
    store.request_cut(100)
    fill(store, 1, 104.0)
    assert offered[-1][1]["samples"] == (8, 12) and offered[-1][0] == seq + 1
    store.defer_ack(*offered[-1])
    store.flush_acks()
    assert store.backlog() == 0 and store.next_batch(100) is None
