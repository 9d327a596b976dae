"""The ingest writer keeps the write-ahead log short: a reader holding an old snapshot puts the restart off (and
loses nothing), and once it has finished the next group starts the log over, cut back to its limit."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from sigma.controller.ingest.groupcommit import GroupCommit
from sigma.controller.ingest.wal import WalGuard
from sigma.store import connect


def _insert(conn, k):
    conn.executemany("INSERT INTO t VALUES (?, ?)", [(k, "x" * 1000)] * 50)  # ~50 KB a group
    return k


def _guarded_db(tmp_path: Path, guard: WalGuard) -> tuple[Path, sqlite3.Connection]:
    """A table in a fresh database whose writer connection the guard looks after."""
    db = tmp_path / "c.db"
    conn = connect(db)
    conn.execute("CREATE TABLE t (k INTEGER, pad TEXT)")
    conn.commit()
    guard.setup(conn)
    return db, conn


def _wal_bytes(db: Path) -> int:
    wal = Path(f"{db}-wal")
    return wal.stat().st_size if wal.exists() else 0


def test_a_reader_puts_the_restart_off_and_the_next_group_after_it_restarts_the_log(tmp_path):
    guard = WalGuard(restart_bytes=256 * 1024, wait_ms=50)
    db, conn = _guarded_db(tmp_path, guard)
    writer = GroupCommit(conn, _insert, after_commit=guard.after_commit)
    reader = connect(db, readonly=True)
    reader.execute("BEGIN")
    assert reader.execute("SELECT count(*) FROM t").fetchone()[0] == 0  # holds this snapshot from now on
    for k in range(40):
        writer.submit(k)
    grown = _wal_bytes(db)
    assert grown > 4 * guard.restart_bytes  # nothing could be copied past the reader's snapshot
    assert guard.counts["restart_busy"] > 0 and guard.counts["restart"] == 0
    assert reader.execute("SELECT count(*) FROM t").fetchone()[0] == 0  # its snapshot is intact
    reader.execute("COMMIT")
    for k in range(40, 43):
        writer.submit(k)
    writer.close()  # the last group's checkpoint done
    assert _wal_bytes(db) <= guard.restart_bytes  # copied whole, started over and cut back to the limit
    assert conn.execute("SELECT count(DISTINCT k), count(*) FROM t").fetchone()[:] == (43, 43 * 50)
    conn.close()
    check = sqlite3.connect(db)
    assert check.execute("SELECT count(*) FROM t").fetchone()[0] == 43 * 50  # every committed row on disk
    assert check.execute("PRAGMA integrity_check").fetchone()[0] == "ok"


def test_a_short_log_is_only_copied_never_waited_on(tmp_path):
    guard = WalGuard()  # 64 MiB: a few groups never reach it
    db, conn = _guarded_db(tmp_path, guard)
    writer = GroupCommit(conn, _insert, after_commit=guard.after_commit)
    reader = connect(db, readonly=True)
    reader.execute("BEGIN")
    reader.execute("SELECT count(*) FROM t").fetchone()
    for k in range(5):
        writer.submit(k)
    writer.close()
    assert guard.counts == {"passive": 5, "restart": 0, "restart_busy": 0}
    reader.execute("COMMIT")
    assert conn.execute("PRAGMA wal_autocheckpoint").fetchone()[0] == 0  # the writer checkpoints on its schedule


def test_a_restart_waits_for_a_reader_to_finish_its_statement_then_starts_the_log_over(tmp_path):
    import threading

    guard = WalGuard(restart_bytes=64 * 1024, wait_ms=5000)
    db, conn = _guarded_db(tmp_path, guard)
    reader = connect(db, readonly=True)
    reader.execute("BEGIN")
    reader.execute("SELECT count(*) FROM t").fetchone()
    for k in range(10):
        with conn:
            _insert(conn, k)
    threading.Timer(0.3, lambda: reader.execute("COMMIT")).start()  # the reader's statement ends meanwhile
    guard.after_commit(conn)
    assert guard.counts["restart"] == 1 and guard.counts["restart_busy"] == 0
    assert conn.execute("PRAGMA busy_timeout").fetchone()[0] == 30000  # the writer's own timeout is back
    with conn:
        _insert(conn, 10)
    assert _wal_bytes(db) <= guard.restart_bytes
    assert conn.execute("SELECT count(*) FROM t").fetchone()[0] == 11 * 50
