"""The metric rules' windows, kept up to date from the samples that arrived since the last tick.

Re-reading every metric rule's whole window each tick costs the window's samples: at 256 nodes x 8 GPUs and a
600 s window that is over a million rows a tick for one rule (profiled: 24 s of a tick). Instead each watched
metric keeps, per series (node, labels) and per BUCKET_S of sample time, the mergeable stats every aggregate needs
(count, first, last, min, max, sum) in numpy arrays with one ring slot per bucket. They are fed by the rows ingest
appended since the last tick, read in arrival order (`rowid > last`): a batch that arrives late is still counted
in its own bucket. A rule's window merges its buckets in a few array reductions.

The window starts at the bucket boundary at or before `now - window_s` (at most BUCKET_S longer than the rule
says); a node's evidence from before it returned to service is left out bucket-wise (a bucket that began at or
before the return no longer counts).
"""

from __future__ import annotations

import math

import numpy as np

from sigma.controller.detect.samples import recent_for_metrics
from sigma.rules.matcher import SeriesStats

BUCKET_S = 5.0


class _Metric:
    """One metric's series x ring slots of bucket stats."""

    def __init__(self, window_s: float):
        self.slots = int(math.ceil(window_s / BUCKET_S)) + 2
        self.index: dict[tuple[str, str], int] = {}
        self.keys: list[tuple[str, str]] = []
        self.start = np.full(self.slots, -np.inf)  # bucket start each slot holds
        shape = (0, self.slots)
        self.n = np.zeros(shape)
        self.first_ts, self.first, self.last_ts, self.last = (np.zeros(shape) for _ in range(4))
        self.vmin, self.vmax, self.vsum = np.zeros(shape), np.zeros(shape), np.zeros(shape)

    def _row(self, key: tuple[str, str]) -> int:
        i = self.index.get(key)
        if i is None:
            i = self.index[key] = len(self.keys)
            self.keys.append(key)
            if i >= self.n.shape[0]:  # grow by doubling
                grow = max(64, self.n.shape[0])
                for name in ("n", "first_ts", "first", "last_ts", "last", "vmin", "vmax", "vsum"):
                    a = getattr(self, name)
                    setattr(self, name, np.vstack([a, np.zeros((grow, self.slots))]))
        return i

    def add(self, node: str, labels: str, ts: float, value: float) -> None:
        bucket = math.floor(ts / BUCKET_S) * BUCKET_S
        slot = int(bucket / BUCKET_S) % self.slots
        if self.start[slot] != bucket:
            if bucket < self.start[slot]:
                return  # older than the longest window: no rule reads it
            self.start[slot] = bucket  # a new bucket takes the slot of one past every window
            self.n[:, slot] = 0
        i = self._row((node, labels))
        if self.n[i, slot] == 0:
            self.n[i, slot] = 1
            self.first_ts[i, slot] = self.last_ts[i, slot] = ts
            self.first[i, slot] = self.last[i, slot] = self.vmin[i, slot] = self.vmax[i, slot] = value
            self.vsum[i, slot] = value
            return
        self.n[i, slot] += 1
        self.vsum[i, slot] += value
        if value < self.vmin[i, slot]:
            self.vmin[i, slot] = value
        if value > self.vmax[i, slot]:
            self.vmax[i, slot] = value
        if ts < self.first_ts[i, slot]:
            self.first_ts[i, slot], self.first[i, slot] = ts, value
        if ts >= self.last_ts[i, slot]:
            self.last_ts[i, slot], self.last[i, slot] = ts, value

    def window(self, lo: float, now: float, since: dict[str, float]) -> dict[tuple[str, str], SeriesStats]:
        rows = len(self.keys)
        if not rows:
            return {}
        floor = np.array([since.get(node, -np.inf) for node, _ in self.keys])
        start = self.start[None, :]
        mask = (start >= lo) & (start <= now) & (start > floor[:, None]) & (self.n[:rows] > 0)
        n = np.where(mask, self.n[:rows], 0).sum(axis=1)
        vmin = np.where(mask, self.vmin[:rows], np.inf).min(axis=1)
        vmax = np.where(mask, self.vmax[:rows], -np.inf).max(axis=1)
        vsum = np.where(mask, self.vsum[:rows], 0).sum(axis=1)
        fi = np.where(mask, self.first_ts[:rows], np.inf).argmin(axis=1)
        li = np.where(mask, self.last_ts[:rows], -np.inf).argmax(axis=1)
        r = np.arange(rows)
        first_ts, first = self.first_ts[r, fi], self.first[r, fi]
        last_ts, last = self.last_ts[r, li], self.last[r, li]
        return {self.keys[i]: SeriesStats(int(n[i]), float(first_ts[i]), float(first[i]), float(last_ts[i]),
                                          float(last[i]), float(vmin[i]), float(vmax[i]), float(vsum[i]))
                for i in np.flatnonzero(n)}


class SeriesWindows:
    def __init__(self, conn):
        self.conn = conn
        self.windows: dict[str, float] = {}  # watched metric -> longest window over the rules that use it
        self.metrics: dict[str, _Metric] = {}
        self.last_rowid: int | None = None

    def update(self, windows: dict[str, float], now: float) -> None:
        """Bring the buckets of `windows` (metric -> longest window in seconds) up to the newest samples."""
        if windows != self.windows:
            self.last_rowid = None  # other metrics or windows (a reload): read the windows again
            self.windows = dict(windows)
        if not windows:
            self.metrics = {}
            return
        names = sorted(windows)
        if self.last_rowid is None:
            self.metrics = {m: _Metric(w) for m, w in windows.items()}
            self.conn.execute("BEGIN")  # one snapshot: the rows read now and the rowid the next reads start after
            try:
                top = self.conn.execute("SELECT COALESCE(MAX(rowid), 0) FROM samples").fetchone()[0]
                rows = recent_for_metrics(self.conn, now - max(windows.values()) - BUCKET_S, names, top)
            finally:
                self.conn.execute("COMMIT")
            self._add((r["node"], r["metric"], r["labels"], r["ts"], r["value"]) for r in rows)
            self.last_rowid = top
        marks = ",".join("?" * len(names))
        rows = self.conn.execute(f"SELECT rowid, node, metric, labels, ts, value FROM samples WHERE rowid > ? AND"
                                 f" metric IN ({marks}) ORDER BY rowid", (self.last_rowid, *names)).fetchall()
        if rows:
            self.last_rowid = rows[-1][0]
            self._add(tuple(r)[1:] for r in rows)

    def _add(self, rows) -> None:
        metrics = self.metrics
        for node, metric, labels, ts, value in rows:
            if value is not None:
                metrics[metric].add(node, labels, ts, float(value))

    def window(self, metric: str, window_s: float, now: float,
               since: dict[str, float]) -> dict[tuple[str, str], SeriesStats]:
        """{(node, labels JSON): stats} of `metric` over [bucket at now - window_s, now], without a node's
        buckets that began at or before its `since`."""
        m = self.metrics.get(metric)
        if m is None:
            return {}
        return m.window(math.floor((now - window_s) / BUCKET_S) * BUCKET_S, now, since)
