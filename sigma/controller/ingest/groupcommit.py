"""Group commit: the batches that arrive together are stored in one transaction.

Each HTTP handler queues its batch and takes the write lock; whoever holds it writes every batch queued so far
(each in a savepoint of its own, so a batch that fails is refused alone) and commits once; the handlers that wait
behind it then find their batch stored. A push is still acknowledged only after the commit that holds it.
At 256 nodes pushing once a second, a commit per push was the write path's limit: every commit wrote each page it
had dirtied and the pushes took the lock one after the other; a group shares one commit among the pushes that
arrived while the previous one ran, so the commits follow the write path's speed, not the number of nodes.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

MAX_GROUP_ROWS = 500_000  # a group stops growing here: one transaction holds the write lock for about a second


@dataclass
class _Pending:
    item: object
    rows: int
    result: object = None
    error: BaseException | None = None
    done: bool = False


class GroupCommit:
    def __init__(self, conn, write: Callable, *, max_rows: int = MAX_GROUP_ROWS):
        self.conn = conn
        self.write = write  # write(conn, item) -> result, inside the group's transaction
        self.max_rows = max_rows
        self.lock = threading.Lock()  # the connection: whoever holds it writes the queue
        self._queue: deque[_Pending] = deque()
        self._queue_lock = threading.Lock()
        self.groups = 0  # transactions committed
        self.items = 0  # items stored in them (items / groups = the mean group size)

    def submit(self, item, rows: int = 1):
        """Store item (in this thread or another's group); its result once committed, or its error raised."""
        p = _Pending(item, rows)
        with self._queue_lock:
            self._queue.append(p)
        while not p.done:
            with self.lock:
                if not p.done:
                    self._write_group(self._take())
        if p.error is not None:
            raise p.error
        return p.result

    def _take(self) -> list[_Pending]:
        group, rows = [], 0
        with self._queue_lock:
            while self._queue and (not group or rows + self._queue[0].rows <= self.max_rows):
                p = self._queue.popleft()
                group.append(p)
                rows += p.rows
        return group

    def _write_group(self, group: list[_Pending]) -> None:
        conn = self.conn
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
            conn.commit()
            self.groups += 1
            self.items += len(group)
        except BaseException as exc:  # the transaction itself failed (disk full, I/O): nothing of it is stored
            if conn.in_transaction:
                conn.rollback()
            for p in group:
                p.result, p.error = None, p.error or exc
            raise
        finally:
            for p in group:
                p.done = True
