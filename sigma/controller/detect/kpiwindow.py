"""Every job's recent KPI rows, kept in memory and fed each tick with the rows ingested since the last one.

The watchdog judges each running job every tick over the last `keep_s` of its ranks' steps (hang, throughput
against the job's own earlier throughput: about 15 minutes). At 32 jobs of 8 nodes stepping once a second that is
240,000 rows, which reading again every tick cost more than the rest of the tick. Rows reach `kpis` in rowid
order, a late batch too, so each tick reads only the rows after the last rowid it has seen (on PostgreSQL an
identity column of that name: sigma.pgstore).
"""

from __future__ import annotations

from bisect import bisect_left
from operator import itemgetter

from sigma.controller.db import KPI_COLUMNS

_TS = itemgetter("ts")


class KpiWindow:
    def __init__(self, conn, keep_s: float):
        self.conn = conn
        self.keep_s = keep_s
        self.last_rowid: int | None = None
        self.rows: dict[int, list[dict]] = {}  # job id -> its rows of the last keep_s, ordered by ts

    def update(self, now: float) -> None:
        """Add the rows ingested since the last update; forget those older than now - keep_s."""
        if self.last_rowid is None:  # the first tick: the window, read once
            self.conn.execute("BEGIN")  # one snapshot: the rows read now and the rowid the next reads start after
            try:
                top = self.conn.execute("SELECT COALESCE(MAX(rowid), 0) FROM kpis").fetchone()[0]
                rows = self.conn.execute(f"SELECT rowid AS rowid_, {KPI_COLUMNS} FROM kpis WHERE ts >= ?"
                                         " AND rowid <= ?",
                                         (now - self.keep_s, top)).fetchall()
            finally:
                self.conn.execute("COMMIT")
            self.last_rowid = top
        else:
            rows = self.conn.execute(f"SELECT rowid AS rowid_, {KPI_COLUMNS} FROM kpis WHERE rowid > ?"
                                     " ORDER BY rowid",
                                     (self.last_rowid,)).fetchall()
            if rows:
                self.last_rowid = rows[-1]["rowid_"]
        touched = set()
        for r in rows:
            row = dict(r)
            del row["rowid_"]
            self.rows.setdefault(row["job_id"], []).append(row)
            touched.add(row["job_id"])
        for job in touched:
            self.rows[job].sort(key=_TS)  # stable, and nearly sorted already: a late batch is the exception
        cutoff = now - self.keep_s
        for job in list(self.rows):
            kept = self.rows[job]
            old = bisect_left(kept, cutoff, key=_TS)
            if old == len(kept):
                del self.rows[job]
            elif old:
                del kept[:old]

    def job_rows(self, job_id: int, since: float) -> list[dict]:
        """The job's rows with ts >= since (since at most keep_s ago), ordered by ts."""
        kept = self.rows.get(job_id, [])
        return kept[bisect_left(kept, since, key=_TS):]
