"""The newest time per key of an append-only audit table, read incrementally.

Every tick needs, per node, when it last came back into service and, per job, when it was last requeued: a
GROUP BY over tables that grow with every incident for as long as the controller runs (a year of a faulty cluster
made that the largest part of a tick). Those rows are never deleted and the columns read never change, so each read
takes only the rows at most `overlap_s` older than the newest one already seen (a row another writer, such as an
admin's command, committed a little late is still caught) and keeps the maximum per key.
"""

from __future__ import annotations

import sqlite3

OVERLAP_S = 3600.0


class NewestPerKey:
    def __init__(self, conn: sqlite3.Connection, sql: str, overlap_s: float = OVERLAP_S):
        """`sql` selects (key, MAX(ts)) ... WHERE ts >= ? GROUP BY key; its one parameter is the oldest ts to read."""
        self.conn, self.sql, self.overlap_s = conn, sql, overlap_s
        self.newest: dict = {}
        self.version = 0  # bumped when a key's newest time changes: what is built from `newest` is kept until then
        self._seen = float("-inf")

    def read(self) -> dict:
        """{key: newest ts} over every row so far (a view: do not change it)."""
        for key, ts in self.conn.execute(self.sql, (self._seen - self.overlap_s,)):
            if ts > self.newest.get(key, float("-inf")):
                self.newest[key] = ts
                self.version += 1
            self._seen = max(self._seen, ts)
        return self.newest
