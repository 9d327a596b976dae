"""Group commit: the batches that arrive together are stored in one transaction.

Each HTTP handler queues its batch and waits; one writer thread takes every batch queued so far, writes them (each
in a savepoint of its own, so a batch that fails is refused alone), commits once and wakes their handlers. A push
is still acknowledged only after the commit that holds it. Handlers never queue on the write lock: with a few
hundred connections and a busy machine, handing a lock from thread to thread took longer than the writing.
At 256 nodes pushing once a second, a commit per push was the write path's limit: every commit wrote each page it
had dirtied and the pushes took the lock one after the other; a group shares one commit among the pushes that
arrived while the previous one ran, so the commits follow the write path's speed, not the number of nodes.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

log = logging.getLogger("sigma.controller.ingest.groupcommit")

MAX_GROUP_ROWS = 500_000  # a group stops growing here: one transaction holds the write lock for about a second
TIMINGS_KEPT = 10_000  # the newest groups' timings (bench/scale.py reads them)


@dataclass
class _Pending:
    item: object
    rows: int
    result: object = None
    error: BaseException | None = None
    done: threading.Event = field(default_factory=threading.Event)


class GroupCommit:
    def __init__(self, conn, write: Callable, *, max_rows: int = MAX_GROUP_ROWS,
                 after_commit: Callable | None = None):
        self.conn = conn
        self.write = write  # write(conn, item) -> result, inside the group's transaction
        self.after_commit = after_commit  # after_commit(conn): between two groups, once the handlers are woken
        self.max_rows = max_rows
        self.lock = threading.Lock()  # the connection: the writer holds it while it writes a group
        self._queue: deque[_Pending] = deque()
        self._wake = threading.Condition()
        self._thread: threading.Thread | None = None
        self._closed = False
        self.groups = 0  # transactions committed
        self.items = 0  # items stored in them (items / groups = the mean group size)
        # per committed group: (wall time it started, items, rows, seconds writing, seconds committing)
        self.timings: deque[tuple[float, int, int, float, float]] = deque(maxlen=TIMINGS_KEPT)

    def submit(self, item, rows: int = 1):
        """Store item in the next group; its result once committed, or its error raised."""
        p = _Pending(item, rows)
        with self._wake:
            if self._closed:
                raise RuntimeError("the controller database is closed; the batch was not stored")
            self._queue.append(p)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="ingest-writer", daemon=True)
                self._thread.start()
            self._wake.notify()
        p.done.wait()
        if p.error is not None:
            raise p.error
        return p.result

    def close(self) -> None:
        """Write what is queued, then stop the writer."""
        with self._wake:
            self._closed = True
            self._wake.notify()
        if self._thread is not None:
            self._thread.join()

    def _run(self) -> None:
        while True:
            with self._wake:
                while not self._queue and not self._closed:
                    self._wake.wait()
                if not self._queue:
                    return
                group, rows = [], 0
                while self._queue and (not group or rows + self._queue[0].rows <= self.max_rows):
                    group.append(self._queue.popleft())
                    rows += group[-1].rows
            with self.lock:
                try:
                    self._write_group(group)  # records any error on each item: its handler answers 500
                finally:
                    for p in group:
                        p.done.set()
                if self.after_commit is not None:
                    try:
                        self.after_commit(self.conn)
                    except Exception:  # housekeeping (a WAL checkpoint): the group is stored, the next one tries
                        log.exception("after-commit step failed")

    def _write_group(self, group: list[_Pending]) -> None:
        conn = self.conn
        start, t0 = time.time(), time.perf_counter()
        try:
            conn.execute("BEGIN")
            for p in group:
                conn.execute("SAVEPOINT item")
                try:
                    p.result = self.write(conn, p.item)
                except Exception as exc:  # this item's data (a number SQLite cannot hold): refused alone
                    p.error = exc
                    conn.execute("ROLLBACK TO item")
                conn.execute("RELEASE item")
            t1 = time.perf_counter()
            conn.commit()
            self.groups += 1
            self.items += len(group)
            self.timings.append((start, len(group), sum(p.rows for p in group), t1 - t0, time.perf_counter() - t1))
        except BaseException as exc:  # the transaction itself failed (disk full, I/O): nothing of it is stored
            if conn.in_transaction:
                conn.rollback()
            for p in group:
                p.result, p.error = None, p.error or exc
