"""Retention and downsampling: keep the controller database bounded for months.

Raw samples older than `samples_raw_s` are folded into `samples_rollup` (one row per node, metric, labels and
`rollup_s` bucket: count, min, max, sum) and deleted; rollups, events, KPIs, the batch ledger and node snapshots
are deleted past their own ages. Incidents, actions and the remediation history are the audit trail: never pruned.

Work goes in short transactions (`chunk_rows` rows of the arrival order at a time on SQLite), so ingest and the
detection loop wait at most one chunk for the write lock. A row that arrives late (a node's backlog after a
partition) is folded into the bucket it belongs to: the rollup is an upsert, nothing valid is lost.

    pruner = RetentionThread(db_url, cfg.retention); pruner.start() ... pruner.stop()
"""

from __future__ import annotations

import logging
import sqlite3
import threading
import time
from dataclasses import dataclass

log = logging.getLogger("sigma.controller.retention")

DAY = 86400.0
BATCH_NODES = 64  # nodes whose old ledger rows one transaction deletes


@dataclass
class RetentionConfig:
    enabled: bool = True  # prune and downsample the controller database in the controller process
    every_s: float = 300.0  # how often a pruning pass runs
    samples_raw_s: float = 6 * 3600.0  # raw samples kept this long (detection reads up to isolation.history_s)
    rollup_s: float = 3600.0  # older samples are folded into buckets of this many seconds ...
    rollup_keep_s: float = 400 * DAY  # ... kept this long
    events_keep_s: float = 90 * DAY  # log / health / KPI events
    kpis_keep_s: float = 90 * DAY  # job KPI rows
    batches_keep_s: float = 2 * DAY  # the ingest ledger of (node, seq): retries arrive within minutes
    snapshots_keep_s: float = 400 * DAY  # SLURM node states (utilisation over the months)
    chunk_rows: int = 200_000  # rows per transaction (bounds how long ingest waits for the write lock)

    def __post_init__(self):
        for name in ("every_s", "samples_raw_s", "rollup_s", "rollup_keep_s", "events_keep_s", "kpis_keep_s",
                     "batches_keep_s", "snapshots_keep_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"retention.{name} must be > 0, got {getattr(self, name)!r}")
        if self.chunk_rows < 1000:
            raise ValueError(f"retention.chunk_rows must be >= 1000, got {self.chunk_rows!r}")


def bound_bytes(raw_bytes_per_h: float, cfg: RetentionConfig, samples_per_series_per_s: float = 1.0,
                rollup_row_ratio: float = 2.0) -> float:
    """The database size the retention holds raw samples growing at raw_bytes_per_h at: the raw window plus the
    rollups (one row per series per bucket, about rollup_row_ratio times a raw row)."""
    raw = raw_bytes_per_h * cfg.samples_raw_s / 3600
    rollup_per_h = raw_bytes_per_h * rollup_row_ratio / (cfg.rollup_s * samples_per_series_per_s)
    return raw + rollup_per_h * cfg.rollup_keep_s / 3600


ROLLUP_SELECT = """
    SELECT node, metric, labels, CAST(ts / {r} AS INTEGER) * {r} AS bucket, {r}, COUNT(value), MIN(value),
           MAX(value), SUM(value)
    FROM samples WHERE {where} GROUP BY node, metric, labels, bucket"""
ROLLUP_UPSERT = """
    INSERT INTO samples_rollup (node, metric, labels, bucket, span_s, n, vmin, vmax, vsum) {select}
    ON CONFLICT (node, metric, labels, bucket) DO UPDATE SET
        n = samples_rollup.n + excluded.n,
        vmin = CASE WHEN excluded.vmin < samples_rollup.vmin OR samples_rollup.vmin IS NULL THEN excluded.vmin
                    ELSE samples_rollup.vmin END,
        vmax = CASE WHEN excluded.vmax > samples_rollup.vmax OR samples_rollup.vmax IS NULL THEN excluded.vmax
                    ELSE samples_rollup.vmax END,
        vsum = COALESCE(samples_rollup.vsum, 0) + COALESCE(excluded.vsum, 0)"""


class Retention:
    """One pruning pass at a time over an open connection (sqlite3, or the PostgreSQL adapter of sigma.store)."""

    def __init__(self, conn, cfg: RetentionConfig, clock=time.time, floor_s: float = 0.0):
        """floor_s: what detection reads back (the longest rule window, isolation's history): raw samples are
        kept at least this long whatever samples_raw_s says."""
        self.conn = conn
        self.cfg = cfg
        self.floor_s = floor_s
        self.clock = clock
        self.sqlite = isinstance(conn, sqlite3.Connection)

    def run(self, now: float | None = None) -> dict[str, int]:
        """Downsample and prune once; returns rows deleted per table (and rolled up into samples_rollup)."""
        now = self.clock() if now is None else now
        c = self.cfg
        out = {"samples": self._downsample(now - max(c.samples_raw_s, self.floor_s))}
        out["samples_rollup"] = self._delete("samples_rollup", "bucket", now - c.rollup_keep_s)
        out["events"] = self._delete("events", "ts", now - c.events_keep_s)
        out["kpis"] = self._delete("kpis", "ts", now - c.kpis_keep_s)
        out["node_snapshots"] = self._delete("node_snapshots", "ts", now - c.snapshots_keep_s)
        out["batches"] = self._delete_batches(now - c.batches_keep_s)
        return out

    # SQLite: walk the arrival order (rowid) in chunks, oldest first, until a chunk holds nothing old enough;
    # PostgreSQL: one statement per table (its MVCC does not block the writers meanwhile).
    def _chunks(self, table: str):
        lo = self.conn.execute(f"SELECT MIN(rowid) FROM {table}").fetchone()[0]
        top = self.conn.execute(f"SELECT MAX(rowid) FROM {table}").fetchone()[0]
        while lo is not None and lo <= top:
            yield f"rowid >= {int(lo)} AND rowid < {int(lo) + self.cfg.chunk_rows}"
            lo += self.cfg.chunk_rows

    def _downsample(self, cutoff: float) -> int:
        r = float(self.cfg.rollup_s)
        where = "ts < ?"
        if not self.sqlite:
            with self.conn:
                self.conn.execute(ROLLUP_UPSERT.format(select=ROLLUP_SELECT.format(r=r, where=where)), (cutoff,))
                return self.conn.execute(f"DELETE FROM samples WHERE {where}", (cutoff,)).rowcount
        total = 0
        for chunk in self._chunks("samples"):
            cond = f"{chunk} AND {where}"
            with self.conn:
                self.conn.execute(ROLLUP_UPSERT.format(select=ROLLUP_SELECT.format(r=r, where=cond)), (cutoff,))
                n = self.conn.execute(f"DELETE FROM samples WHERE {cond}", (cutoff,)).rowcount
            total += n
            if n == 0:
                break
        return total

    def _delete(self, table: str, column: str, cutoff: float) -> int:
        if not self.sqlite or table == "samples_rollup":  # samples_rollup: keyed by bucket order within a series
            with self.conn:
                return self.conn.execute(f"DELETE FROM {table} WHERE {column} < ?", (cutoff,)).rowcount
        total = 0
        for chunk in self._chunks(table):
            with self.conn:
                n = self.conn.execute(f"DELETE FROM {table} WHERE {chunk} AND {column} < ?", (cutoff,)).rowcount
            total += n
            if n == 0:
                break
        return total

    def _delete_batches(self, cutoff: float) -> int:
        """The ledger has no rowid: found per node (its primary key prefix) by reads, which never wait for the
        write lock, then deleted BATCH_NODES nodes per transaction. A write per node, old rows or not, took the
        lock 256 times a pass at 256 nodes, each time waiting for a gap between two ingest groups."""
        if not self.sqlite:
            with self.conn:
                return self.conn.execute("DELETE FROM batches WHERE received_at < ?", (cutoff,)).rowcount
        nodes = [node for (node,) in self.conn.execute("SELECT DISTINCT node FROM batches").fetchall()
                 if self.conn.execute("SELECT 1 FROM batches WHERE node = ? AND received_at < ? LIMIT 1",
                                      (node, cutoff)).fetchone()]
        total = 0
        for i in range(0, len(nodes), BATCH_NODES):
            some = nodes[i:i + BATCH_NODES]
            with self.conn:
                total += self.conn.execute(f"DELETE FROM batches WHERE node IN ({', '.join('?' * len(some))}) AND "
                                           f"received_at < ?", (*some, cutoff)).rowcount
        return total


class RetentionThread:
    """Runs a pass every cfg.every_s on its own connection, beside ingest and the detection loop."""

    def __init__(self, db: str, cfg: RetentionConfig, on_pass=None, floor_s: float = 0.0):
        self.db = db
        self.cfg = cfg
        self.floor_s = floor_s
        self.on_pass = on_pass  # called with (rows deleted per table, seconds taken)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if not self.cfg.enabled:
            return
        self._thread = threading.Thread(target=self._run, name="sigma-retention", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)

    def _run(self) -> None:
        from sigma.controller.db import open_db

        conn = open_db(self.db)
        try:
            while not self._stop.wait(self.cfg.every_s):
                t0 = time.monotonic()
                try:
                    deleted = Retention(conn, self.cfg, floor_s=self.floor_s).run()
                except Exception:  # a failed pass is retried next time; ingest and detection go on
                    log.exception("retention pass failed")
                    continue
                if self.on_pass is not None:
                    self.on_pass(deleted, time.monotonic() - t0)
        finally:
            conn.close()
