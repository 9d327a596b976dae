"""The ingest ledger (batches) ages out without a write transaction per node: old rows are found by reads and
deleted a few dozen nodes per transaction; a pass with nothing old writes nothing."""

from __future__ import annotations

from sigma.controller.db import open_db
from sigma.controller.retention import BATCH_NODES, Retention, RetentionConfig

NOW = 1_800_000_000.0
DAY = 86400.0


def _deletes(conn, cfg):
    statements = []
    conn.set_trace_callback(statements.append)
    try:
        deleted = Retention(conn, cfg).run(NOW)
    finally:
        conn.set_trace_callback(None)
    return deleted["batches"], [s for s in statements if s.startswith("DELETE FROM batches")]


def test_old_ledger_rows_go_in_few_transactions_and_recent_ones_stay(tmp_path):
    conn = open_db(tmp_path / "c.db")
    nodes = [f"n{i:03d}" for i in range(2 * BATCH_NODES + 5)]
    with conn:
        conn.executemany("INSERT INTO batches (node, seq, received_at, records) VALUES (?, ?, ?, 1)",
                         [(n, seq, NOW - 3 * DAY if seq < 3 else NOW - 60, ) for n in nodes for seq in range(5)])
        conn.executemany("INSERT INTO batches (node, seq, received_at, records) VALUES (?, 0, ?, 1)",
                         [(f"quiet{i}", NOW - 60) for i in range(10)])  # nodes with nothing old
    cfg = RetentionConfig(batches_keep_s=2 * DAY)
    n, deletes = _deletes(conn, cfg)
    assert n == 3 * len(nodes)
    assert len(deletes) == 3  # 133 nodes with old rows, 64 a transaction
    assert conn.execute("SELECT count(*) FROM batches WHERE received_at < ?", (NOW - 2 * DAY,)).fetchone()[0] == 0
    assert conn.execute("SELECT count(*) FROM batches").fetchone()[0] == 2 * len(nodes) + 10
    n, deletes = _deletes(conn, cfg)  # the next pass: nothing old, no write
    assert n == 0 and deletes == []
