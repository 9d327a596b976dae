"""Every job's recent KPI rows, kept in memory and fed each tick with the rows ingested since the last one.

The watchdog judges each running job every tick over the last `keep_s` of its ranks' steps (hang, throughput
against the job's own earlier throughput: about 15 minutes). At 32 jobs of 8 nodes stepping once a second that is
240,000 rows, which reading again every tick cost more than the rest of the tick. Rows reach `kpis` in rowid
order, a late batch too, so each tick reads only the rows after the last rowid it has seen (on PostgreSQL an
identity column of that name: sigma.pgstore).

Beside the rows, each job keeps the watchdog's long-window figures as running state (JobState): the highest step
of its run's window and when it was first reported, and the earlier throughput's sums. A row is added to them as
it arrives (a late one too) and taken off as the window's start passes it, so a tick's work follows the rows that
arrived since the last one, not the 15 minutes of history. The sums are exact (integers in units of the smallest
double): taking a row off gives back exactly what adding it gave, and the result equals watchdog.throughput()'s
fsum, so the verdicts are those of watchdog.RowsView on the same rows. A restarted controller rebuilds it all from
the window it reads on its first tick.
"""

from __future__ import annotations

import math
from bisect import bisect_left, bisect_right
from collections import Counter
from collections.abc import Iterable, Mapping
from operator import itemgetter

from sigma.controller.db import KPI_COLUMNS
from sigma.controller.detect.watchdog import JobProgress, progress, rate, throughput

_TS = itemgetter("ts")


class KpiWindow:
    def __init__(self, conn, keep_s: float):
        self.conn = conn
        self.keep_s = keep_s
        self.last_rowid: int | None = None
        self.rows: dict[int, list[dict]] = {}  # job id -> its rows of the last keep_s, ordered by ts
        self.state: dict[int, JobState] = {}  # job id -> the watchdog's running figures over those rows

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
        touched: dict[int, tuple[int, float]] = {}  # job -> (its rows before this tick, the oldest new ts)
        for r in rows:
            row = dict(r)
            del row["rowid_"]
            job = row["job_id"]
            kept = self.rows.setdefault(job, [])
            n, oldest = touched.get(job, (len(kept), row["ts"]))
            touched[job] = (n, min(oldest, row["ts"]))
            kept.append(row)
            if job in self.state:
                self.state[job].added(row)
        for job, (n, oldest) in touched.items():
            # only the tail from the oldest new row on can be out of order (late batches are the exception);
            # a stable sort of it keeps equal stamps in arrival order, as sorting the whole list would
            kept = self.rows[job]
            at = bisect_right(kept, oldest, hi=n, key=_TS)
            if at < n or any(kept[i]["ts"] > kept[i + 1]["ts"] for i in range(n, len(kept) - 1)):
                kept[at:] = sorted(kept[at:], key=_TS)
        cutoff = now - self.keep_s
        for job in list(self.rows):
            kept = self.rows[job]
            old = bisect_left(kept, cutoff, key=_TS)
            if old == len(kept):
                del self.rows[job]
                self.state.pop(job, None)
            elif old:
                if job in self.state:
                    self.state[job].removing(kept[:old])
                del kept[:old]

    def job_rows(self, job_id: int, since: float) -> list[dict]:
        """The job's rows with ts >= since (since at most keep_s ago), ordered by ts."""
        kept = self.rows.get(job_id, [])
        return kept[bisect_left(kept, since, key=_TS):]

    def view(self, job_id: int, start: float) -> KpiView:
        """The job's rows with ts >= start (at most keep_s ago) as the watchdog reads them (watchdog.judge)."""
        state = self.state.get(job_id)
        if state is None:
            state = self.state[job_id] = JobState(self.rows.setdefault(job_id, []))
        return KpiView(state, start)


_UNIT = 1074  # 2**-1074, the smallest double: every double is an integer multiple of it


def _exact(x: float) -> int:
    n, d = x.as_integer_ratio()
    return n << (_UNIT - d.bit_length() + 1)


def _value(total: int) -> float:
    return total / (1 << _UNIT)  # int / int is correctly rounded, as fsum is


class JobState:
    """Running figures over one job's ordered rows, each over a range of ts that moves as the watchdog asks:
    - progress, rows with ts >= head_from: how many rows report each step, the highest, when it was first reported;
    - earlier, rows with lo <= ts < hi: rows with a rate, exact sums of their seconds and of rate x seconds.
    Moving a range adds or takes off only the rows between its old and new bounds (found by bisection)."""

    def __init__(self, rows: list[dict]):
        self.rows = rows  # the KpiWindow's list for this job (ordered by ts), shared
        self.head_from: float | None = None
        self.steps: Counter = Counter()
        self.max_step: int | None = None
        self.progress_ts: float | None = None
        self.stale = False  # max_step / progress_ts to be looked up again from the counts
        self.span: tuple[float, float] | None = None
        self.points = self.nonfinite = 0
        self.seconds = self.work = 0

    # ----- rows arriving and leaving (KpiWindow.update) -----
    def added(self, row: Mapping) -> None:
        if self.head_from is not None and row["ts"] >= self.head_from:
            self._step_in(row)
        if self.span is not None and self.span[0] <= row["ts"] < self.span[1]:
            self._rate(row, 1)

    def removing(self, rows: list[Mapping]) -> None:
        """rows are about to leave the list (forgotten: older than the window)."""
        for row in rows:
            if self.span is not None and self.span[0] <= row["ts"] < self.span[1]:
                self._rate(row, -1)
        if self.head_from is not None:
            self._steps_out(r for r in rows if r["ts"] >= self.head_from)

    # ----- the highest step -----
    def head(self, start: float) -> tuple[int | None, float | None]:
        """(highest step, first ts of it) over the rows with ts >= start."""
        if self.head_from is None:
            self.head_from = start
            for row in self.rows[self._at(start):]:
                self._step_in(row)
        elif start < self.head_from:
            for row in self.rows[self._at(start):self._at(self.head_from)]:
                self._step_in(row)
            self.head_from = start
        elif start > self.head_from:
            gone = self.rows[self._at(self.head_from):self._at(start)]
            self.head_from = start
            self._steps_out(gone)
        if self.stale:  # rows of the highest step left: look it up again (a job stalled for its whole window)
            self.stale = False
            self.max_step = max(self.steps, default=None)
            self.progress_ts = None if self.max_step is None else min(
                r["ts"] for r in self.rows[self._at(self.head_from):] if r.get("step") == self.max_step)
        return self.max_step, self.progress_ts

    def _step_in(self, row: Mapping) -> None:
        step = row.get("step")
        if step is None:
            return
        self.steps[step] += 1
        if self.stale:
            return  # looked up again in head()
        if self.max_step is None or step > self.max_step:
            self.max_step, self.progress_ts = step, row["ts"]
        elif step == self.max_step and row["ts"] < self.progress_ts:
            self.progress_ts = row["ts"]

    def _steps_out(self, gone: Iterable[Mapping]) -> None:
        for row in gone:
            step = row.get("step")
            if step is None:
                continue
            self.steps[step] -= 1
            if not self.steps[step]:
                del self.steps[step]
            self.stale |= step == self.max_step

    # ----- the earlier throughput -----
    def earlier(self, lo: float, hi: float) -> tuple[int, float | None]:
        """(rows with a rate, their throughput) over the rows with lo <= ts < hi."""
        hi = max(lo, hi)
        if self.span is None or lo >= self.span[1] or hi <= self.span[0]:
            self.span, self.points, self.nonfinite, self.seconds, self.work = (lo, hi), 0, 0, 0, 0
            for row in self.rows[self._at(lo):self._at(hi)]:
                self._rate(row, 1)
        else:
            a, b = self.span
            for row in self.rows[self._at(min(a, lo)):self._at(max(a, lo))]:
                self._rate(row, 1 if lo < a else -1)
            for row in self.rows[self._at(min(b, hi)):self._at(max(b, hi))]:
                self._rate(row, 1 if hi > b else -1)
            self.span = (lo, hi)
        if self.nonfinite:  # no exact sum of an infinity: the reference's own computation
            return self.points, throughput(self.rows[self._at(lo):self._at(hi)])
        return self.points, (_value(self.work) / _value(self.seconds) if self.seconds > 0 else None)

    def _rate(self, row: Mapping, sign: int) -> None:
        point = rate(row)
        if point is None:
            return
        value, seconds = point
        self.points += sign
        if not (math.isfinite(value * seconds) and math.isfinite(seconds)):
            self.nonfinite += sign
            return
        self.seconds += sign * _exact(seconds)
        self.work += sign * _exact(value * seconds)

    def _at(self, ts: float) -> int:
        return bisect_left(self.rows, ts, key=_TS)


class KpiView:
    """watchdog.RowsView's questions answered from a job's JobState: the rows with ts >= start."""

    def __init__(self, state: JobState, start: float):
        self.state, self.start = state, start

    @property
    def rows(self) -> list[dict]:
        return self.since(self.start)

    def since(self, t: float) -> list[dict]:
        rows = self.state.rows
        return rows[bisect_left(rows, max(t, self.start), key=_TS):]

    def last(self, n: int) -> list[dict]:
        rows = self.state.rows
        return rows[max(len(rows) - n, bisect_left(rows, self.start, key=_TS)):]

    def head(self) -> tuple[int | None, float | None]:
        return self.state.head(self.start)

    def progress(self, job_id: int) -> JobProgress:
        return progress(job_id, self.rows)

    def earlier(self, lo: float, hi: float) -> tuple[int, float | None]:
        return self.state.earlier(max(lo, self.start), hi)

    def first_step_ts(self) -> float | None:
        rows = self.state.rows
        for i in range(bisect_left(rows, self.start, key=_TS), len(rows)):
            if rows[i].get("step") is not None:
                return rows[i]["ts"]
        return None
