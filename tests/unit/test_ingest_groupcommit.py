"""Group commit: batches that arrive together share one transaction, a batch that fails is refused alone, a failed
commit stores nothing of its group, and each push is answered only after the commit that holds it."""

from __future__ import annotations

import sqlite3
import threading
import time

import pytest

from sigma.controller.ingest.batch import Ingest
from sigma.controller.ingest.groupcommit import GroupCommit
from sigma.telemetry import wire


def _table(path):
    conn = sqlite3.connect(str(path), check_same_thread=False)
    conn.execute("CREATE TABLE t (k INTEGER NOT NULL)")
    conn.commit()
    return conn


def _insert(conn, k):
    conn.execute("INSERT INTO t VALUES (?)", (k,))
    if k == 7:
        raise OverflowError("7 is refused")  # after its row: the savepoint must take the row back
    return k * 10


def _submit_all(gc, items):
    """Submit items from threads while the writer is held on its lock, then let it go: everything queued behind
    the first group becomes the second."""
    results = {}

    def one(k):
        try:
            results[k] = gc.submit(k)
        except Exception as exc:  # noqa: BLE001 - what the submitter sees
            results[k] = exc

    with gc.lock:
        threads = [threading.Thread(target=one, args=(k,)) for k in items]
        threads[0].start()
        while gc._thread is None or gc._queue:  # the writer took the first item and waits for the lock
            time.sleep(0.01)
        for th in threads[1:]:
            th.start()
        while len(gc._queue) < len(items) - 1:
            time.sleep(0.01)
        assert not results  # nothing is answered before its commit
    for th in threads:
        th.join(10)
    return results


def test_batches_that_arrive_together_share_a_commit_and_a_bad_one_is_refused_alone(tmp_path):
    conn = _table(tmp_path / "g.db")
    gc = GroupCommit(conn, _insert)
    results = _submit_all(gc, list(range(1, 17)))
    assert isinstance(results.pop(7), OverflowError)
    assert results == {k: k * 10 for k in range(1, 17) if k != 7}
    assert sorted(r[0] for r in conn.execute("SELECT k FROM t")) == [k for k in range(1, 17) if k != 7]
    assert (gc.groups, gc.items) == (2, 16)
    gc.close()
    with pytest.raises(RuntimeError, match="closed"):
        gc.submit(1)


class _FailingCommit:
    """The real connection, whose commit fails as a full disk would make it."""

    def __init__(self, conn):
        self.raw = conn
        self.execute = conn.execute

    @property
    def in_transaction(self):
        return self.raw.in_transaction

    def commit(self):
        raise sqlite3.OperationalError("database or disk is full")

    def rollback(self):
        self.raw.rollback()


def test_a_failed_commit_stores_nothing_and_every_submitter_hears_it(tmp_path):
    conn = _table(tmp_path / "g.db")
    gc = GroupCommit(_FailingCommit(conn), _insert)
    results = _submit_all(gc, [1, 2, 3, 4])
    assert all(isinstance(r, sqlite3.OperationalError) for r in results.values()), results
    assert conn.execute("SELECT count(*) FROM t").fetchone()[0] == 0
    assert not conn.in_transaction and gc.groups == 0
    gc.close()


def _batch(node, seq, ts):
    body = wire.encode_binary_batch(node, seq, ts, [(ts, "gpu.temp_c", 50.0, '{"gpu":"0"}', "[7]")],
                                    [[ts, "log", "xid", "error", "Xid 79", "{}", "[7]"]], [])
    return {"body": body, "headers": wire.auth_headers(None, SECRET, node, body)}


SECRET = b"s" * 32


def test_a_retry_queued_beside_its_first_send_is_stored_once(tmp_path):
    ingest = Ingest(tmp_path / "c.db", SECRET)
    now = time.time()
    sent = [_batch("node1", 1, now), _batch("node1", 1, now), _batch("node2", 1, now)]
    replies = {}

    def one(i):
        caller = ingest.authenticate(sent[i]["headers"], len(sent[i]["body"]))
        replies[i] = ingest.receive(caller, sent[i]["body"])

    with ingest.lock:
        threads = [threading.Thread(target=one, args=(i,)) for i in range(3)]
        for th in threads:
            th.start()
        deadline = time.time() + 3  # the three queued (or the first taken), whichever way they arrive
        while len(ingest.writer._queue) < 2 and time.time() < deadline:
            time.sleep(0.01)
    for th in threads:
        th.join(10)
    assert all(status == 200 for status, _ in replies.values()), replies
    assert sorted(r["duplicate"] for _, r in replies.values()) == [False, False, True]
    conn = ingest.conn
    assert [tuple(r) for r in conn.execute("SELECT node, count(*) FROM samples GROUP BY node")] == [("node1", 1),
                                                                                                 ("node2", 1)]
    assert conn.execute("SELECT count(*) FROM events").fetchone()[0] == 2
    assert ingest.stats["duplicates"] == 1 and ingest.stats["batches"] == 2
    ingest.close()
