"""Keep the controller's SQLite write-ahead log short while the detection loop reads all the time.

SQLite's own checkpoint after a commit (PASSIVE, at 1,000 pages) copies the log into the database only up to
the oldest snapshot a reader still holds, and the log starts over from its beginning only once a checkpoint
copied all of it. With the detection loop reading back-to-back (a tick longer than its period at 256 nodes), some
reader always held an older snapshot: the log grew from 10 MiB to 384 MiB in two minutes of bench/scale.py, and
every page lookup (a search of the log's index, which grows with it) and so every insert and every detection read
got slower, which made the ticks longer still.

The ingest writer calls `after_commit()` between two groups (it holds the write lock then, so nothing is appended
meanwhile): a PASSIVE checkpoint, and when that could not copy everything and the log holds more than
`restart_bytes`, a RESTART checkpoint, which waits at most `wait_ms` for the readers of older snapshots to finish
their current statement (statements, not ticks: each read is a transaction of its own) so that the next commit
writes from the start of the log. A checkpoint that still finds a reader is tried again after the next group;
nothing is lost either way, a checkpoint only moves committed pages from the log into the database file.
"""

from __future__ import annotations

import sqlite3
import time
from dataclasses import dataclass, field

RESTART_BYTES = 64 * 1024 * 1024  # a log longer than this is restarted (and truncated to it: journal_size_limit)
WAIT_MS = 250  # how long a RESTART waits for readers before it gives up until the next group


@dataclass
class WalGuard:
    restart_bytes: int = RESTART_BYTES
    wait_ms: int = WAIT_MS
    counts: dict = field(default_factory=lambda: {"passive": 0, "restart": 0, "restart_busy": 0})
    seconds: float = 0.0  # spent checkpointing, in the writer thread

    def setup(self, conn: sqlite3.Connection) -> None:
        """The writer's connection checkpoints on our schedule; the log file is cut back to restart_bytes."""
        conn.execute("PRAGMA wal_autocheckpoint = 0")
        conn.execute(f"PRAGMA journal_size_limit = {int(self.restart_bytes)}")
        self.page_size = conn.execute("PRAGMA page_size").fetchone()[0]

    def after_commit(self, conn: sqlite3.Connection) -> None:
        t0 = time.perf_counter()
        try:
            busy, log, done = conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
            self.counts["passive"] += 1
            if done < log and log * self.page_size > self.restart_bytes:
                timeout = conn.execute("PRAGMA busy_timeout").fetchone()[0]
                conn.execute(f"PRAGMA busy_timeout = {int(self.wait_ms)}")
                try:
                    busy = conn.execute("PRAGMA wal_checkpoint(RESTART)").fetchone()[0]
                finally:
                    conn.execute(f"PRAGMA busy_timeout = {int(timeout)}")
                self.counts["restart_busy" if busy else "restart"] += 1
        finally:
            self.seconds += time.perf_counter() - t0
