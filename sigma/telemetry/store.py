"""The node-local SQLite store: full-resolution rows, the push outbox, tail positions, bounded by age and size.

Row ids are AUTOINCREMENT, so they only grow: "pushed" is a per-table id cursor, and a batch is a range of ids.
A batch gets its sequence number when it is cut (outbox row) and keeps it across retries and restarts, so the
controller can drop a re-sent batch by (node, seq). Sequence numbers start at the store's creation time in
milliseconds, so a node whose store was wiped still continues above what the controller has seen.

Bounds: rows older than max_age_s and, while the database is larger than max_bytes, the oldest rows are deleted.
Every pruning pass that deletes anything is reported as an event (kind 'store_pruned'; kind 'dropped', severity
warning, when rows that never reached the controller were deleted) and counted in meta (dropped.*).
"""

from __future__ import annotations

import json
import sqlite3
from collections import deque
import threading
import time
from pathlib import Path

from sigma.store import Migration, connect, migrate

TABLES = ("samples", "events", "kpis")

MIGRATIONS: list[Migration] = [
    ("0001_node_store", """
        CREATE TABLE samples (id INTEGER PRIMARY KEY AUTOINCREMENT, ts REAL NOT NULL, metric TEXT NOT NULL,
            value REAL, labels TEXT NOT NULL DEFAULT '{}', job_ids TEXT NOT NULL DEFAULT '[]');
        CREATE TABLE events (id INTEGER PRIMARY KEY AUTOINCREMENT, ts REAL NOT NULL, source TEXT NOT NULL,
            kind TEXT NOT NULL, severity TEXT NOT NULL DEFAULT 'info', message TEXT NOT NULL DEFAULT '',
            fields TEXT NOT NULL DEFAULT '{}', job_ids TEXT NOT NULL DEFAULT '[]');
        CREATE TABLE kpis (id INTEGER PRIMARY KEY AUTOINCREMENT, ts REAL NOT NULL, job_id INTEGER NOT NULL,
            rank INTEGER NOT NULL DEFAULT 0, step INTEGER, loss REAL, step_time_s REAL, tokens_per_s REAL,
            mfu REAL, grad_norm REAL, payload TEXT NOT NULL DEFAULT '{}');
        -- key/value state: node name, next seq, pushed cursors, drop counters
        CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
        -- tail positions (file inode+offset, kmsg seq, journal cursor, processed health files)
        CREATE TABLE positions (key TEXT PRIMARY KEY, value TEXT NOT NULL);
        -- batches cut but not yet acknowledged: id ranges (lo, hi] per table
        CREATE TABLE outbox (seq INTEGER PRIMARY KEY, created_at REAL NOT NULL,
            samples_lo INTEGER NOT NULL, samples_hi INTEGER NOT NULL, events_lo INTEGER NOT NULL,
            events_hi INTEGER NOT NULL, kpis_lo INTEGER NOT NULL, kpis_hi INTEGER NOT NULL,
            status TEXT NOT NULL DEFAULT 'pending', error TEXT NOT NULL DEFAULT '');
    """),
]

SAMPLE_INSERT = "INSERT INTO samples (ts, metric, value, labels, job_ids) VALUES (?, ?, ?, ?, ?)"
EVENT_INSERT = ("INSERT INTO events (ts, source, kind, severity, message, fields, job_ids) "
                "VALUES (?, ?, ?, ?, ?, ?, ?)")
KPI_INSERT = ("INSERT INTO kpis (ts, job_id, rank, step, loss, step_time_s, tokens_per_s, mfu, grad_norm, payload) "
              "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)")
SAMPLE_CHUNK = 64  # rows per multi-row INSERT (see _insert_samples)
PRUNE_CHUNK = 5000
RECENT_MAX_ROWS = 50_000  # per table: rows kept in memory for the pusher (a backlog is read back)


class NodeStore:
    """One connection per thread that uses it (the agent writes, the pusher reads and acks)."""

    def __init__(self, path: str | Path, node: str):
        self.path = Path(path)
        self.node = node
        self._local = threading.local()
        self._recent = {t: deque() for t in TABLES}  # (lo, hi, rows) written lately, for the pusher
        self._recent_rows = dict.fromkeys(TABLES, 0)
        self._recent_lock = threading.Lock()
        # batch cutting: one cut at a time (the writer and the pusher read the same cursors)
        self._cut_lock = threading.Lock()
        self._acks: list[tuple] = []  # (seq, ranges) acknowledged, recorded with the next write or cut
        self._cut_request: tuple | None = None  # (max_records, not_before monotonic) from an idle pusher
        self.on_cut = None  # callable(seq, ranges): a batch the writer cut in its own transaction
        conn = self.conn
        if not self.path.exists() or conn.execute("SELECT count(*) FROM sqlite_master").fetchone()[0] == 0:
            conn.execute("PRAGMA auto_vacuum = INCREMENTAL")  # must precede the first table
        migrate(conn, MIGRATIONS, where=f"node store {self.path}")
        with conn:
            conn.execute("INSERT OR IGNORE INTO meta VALUES ('next_seq', ?)", (str(int(time.time() * 1000)),))
            stored = self.meta("node")
            if stored is None:
                conn.execute("INSERT INTO meta VALUES ('node', ?)", (node,))
            elif stored != node:
                raise ValueError(f"{self.path} belongs to node {stored!r}, not {node!r}: give each node its own store")

    @property
    def conn(self) -> sqlite3.Connection:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = self._local.conn = connect(self.path)
        return conn

    def close(self) -> None:
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            conn.close()
            self._local.conn = None

    # ---------- meta ----------
    def meta(self, key: str, default=None):
        row = self.conn.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return default if row is None else row[0]

    def _set_meta(self, key: str, value) -> None:
        self.conn.execute("INSERT OR REPLACE INTO meta VALUES (?, ?)", (key, str(value)))

    def positions(self) -> dict:
        return {k: json.loads(v) for k, v in self.conn.execute("SELECT key, value FROM positions")}

    # ---------- writing ----------
    def write(self, outputs, job_ids_json: str) -> int:
        """Store collector outputs (samples get the current job ids) and their positions in one transaction.

        The rows just written are also kept in memory with their id ranges (see recent_rows), so the pusher
        usually sends them without reading them back."""
        samples, events, kpis, positions = [], [], [], []
        for out in outputs:
            if out.samples:
                samples += [(ts, m, v, l, job_ids_json) for ts, m, v, l in out.samples]
            if out.events:
                events += [(*e[:6], job_ids_json if e[6] is None else e[6]) for e in out.events]
            kpis += out.kpis
            if out.positions:
                positions += out.positions.items()
        conn = self.conn
        chunks = []
        cut = None
        with self._cut_lock:
            acks = self._take_acks()
            try:
                with conn:
                    for table, sql, rows in (("samples", SAMPLE_INSERT, samples), ("events", EVENT_INSERT, events),
                                             ("kpis", KPI_INSERT, kpis)):
                        if rows:
                            # AUTOINCREMENT ids of one writer's transaction are contiguous, after the table's
                            # sequence
                            last = conn.execute("SELECT seq FROM sqlite_sequence WHERE name = ?",
                                                (table,)).fetchone()
                            lo = last[0] if last else 0
                            if table == "samples":
                                _insert_samples(conn, rows)
                            else:
                                conn.executemany(sql, rows)
                            chunks.append((table, lo, lo + len(rows), rows))
                    if positions:
                        conn.executemany("INSERT OR REPLACE INTO positions VALUES (?, ?)", positions)
                    for seq, ranges in acks:
                        self._ack(seq, ranges)
                    request = self._cut_request
                    if request is not None and chunks and time.monotonic() >= request[1]:
                        # an idle pusher asked for the next batch: cut it in this transaction (one commit a
                        # second for writing and cutting instead of two)
                        cut = self._pending(conn) or self._cut(conn, request[0])
            except BaseException:
                self._acks[:0] = acks  # recorded with a later write
                raise
            self._remember(chunks)
            if cut is not None:
                self._cut_request = None
                if self.on_cut is not None:  # under the lock: a cut the pusher makes next sees this one offered
                    self.on_cut(*cut)
        return len(samples) + len(events) + len(kpis)

    def _remember(self, chunks) -> None:
        with self._recent_lock:
            for table, lo, hi, rows in chunks:
                recent = self._recent[table]
                recent.append((lo, hi, rows))
                self._recent_rows[table] += hi - lo
                while self._recent_rows[table] > RECENT_MAX_ROWS:
                    old_lo, old_hi, _ = recent.popleft()
                    self._recent_rows[table] -= old_hi - old_lo

    def recent_rows(self, ranges: dict):
        """batch_rows(ranges) from the rows kept in memory since they were written, or None where they are not
        all there any more (a backlog, a restart): then read them from the database."""
        result = []
        with self._recent_lock:
            for table in ("samples", "events", "kpis"):
                lo, hi = ranges[table]
                recent = self._recent[table]
                while recent and recent[0][1] <= lo:  # sent before the oldest unacknowledged batch
                    old_lo, old_hi, _ = recent.popleft()
                    self._recent_rows[table] -= old_hi - old_lo
                rows = []
                at = lo
                for c_lo, c_hi, c_rows in recent:
                    if at >= hi:
                        break
                    if c_lo > at:
                        return None  # a gap: not in memory
                    rows += c_rows[at - c_lo:min(hi, c_hi) - c_lo]
                    at = min(hi, c_hi)
                if at < hi:
                    return None
                result.append(rows)
        return tuple(result)

    # ---------- push side ----------
    def pushed(self, table: str) -> int:
        return int(self.meta(f"pushed.{table}", 0))

    def next_batch(self, max_records: int, acked: tuple | None = None):
        """The oldest unacknowledged batch, cutting a new one from unpushed rows if none is pending.

        acked: (seq, ranges) of a batch the controller acknowledged since, recorded in the same transaction (one
        commit per push instead of two). Returns (seq, ranges dict table -> (lo, hi)) or None when there is
        nothing to send."""
        conn = self.conn
        with self._cut_lock:
            acks = self._take_acks() + ([acked] if acked is not None else [])
            try:
                return self._next_batch(conn, max_records, acks)
            except BaseException:
                if conn.in_transaction:
                    conn.rollback()
                self._acks[:0] = acks
                raise

    # ---------- batches cut by the writer ----------
    def defer_ack(self, seq: int, ranges: dict) -> None:
        """Record this acknowledgement with the next write or cut (no transaction of its own; if the process dies
        first, the batch is sent once more and the controller drops it as a duplicate)."""
        self._acks.append((seq, ranges))

    def _take_acks(self) -> list:
        acks, self._acks = self._acks, []
        return acks

    def flush_acks(self) -> None:
        with self._cut_lock:
            acks = self._take_acks()
            if not acks:
                return
            try:
                with self.conn:
                    for seq, ranges in acks:
                        self._ack(seq, ranges)
            except BaseException:
                self._acks[:0] = acks
                raise

    def request_cut(self, max_records: int | None, not_before: float = 0.0) -> None:
        """An idle pusher asks the writer to cut the next batch (up to max_records) in its next write, once
        time.monotonic() >= not_before, and hand it over through on_cut; None withdraws the request."""
        self._cut_request = None if max_records is None else (max_records, not_before)

    def _next_batch(self, conn, max_records: int, acks: list):
        if acks:
            conn.execute("BEGIN")
            for seq, ranges in acks:
                self._ack(seq, ranges)
        pending = self._pending(conn)
        if pending is not None:
            if conn.in_transaction:
                conn.commit()
            return pending
        if not conn.in_transaction:
            conn.execute("BEGIN")
        try:
            cut = self._cut(conn, max_records)
        except BaseException:
            conn.rollback()
            raise
        conn.commit()
        return cut

    def _pending(self, conn):
        row = conn.execute("SELECT * FROM outbox WHERE status = 'pending' ORDER BY seq LIMIT 1").fetchone()
        return None if row is None else (row["seq"], {t: (row[f"{t}_lo"], row[f"{t}_hi"]) for t in TABLES})

    def _cut(self, conn, max_records: int):
        """Inside the caller's transaction: a new outbox batch from the rows not cut yet, (seq, ranges) or None.
        The caller holds _cut_lock and has made sure no batch is pending (_pending)."""
        meta = dict(conn.execute("SELECT key, value FROM meta"))  # a dozen rows: one read instead of many
        # AUTOINCREMENT: one writer, ids contiguous up to the table's sequence (pruning only leaves gaps, which
        # make a batch smaller than max_records, never larger)
        tops = dict(conn.execute("SELECT name, seq FROM sqlite_sequence"))
        ranges = {}
        budget = max_records
        for table in ("events", "kpis", "samples"):  # rare, small kinds first; samples fill the rest
            lo = int(meta.get(f"cut.{table}", 0))
            hi = min(max(lo, tops.get(table) or 0), lo + max(budget, 0))
            budget -= hi - lo
            ranges[table] = (lo, hi)
        if all(lo == hi for lo, hi in ranges.values()):
            return None
        seq = int(meta["next_seq"])
        conn.execute("INSERT INTO outbox (seq, created_at, samples_lo, samples_hi, events_lo, events_hi, "
                     "kpis_lo, kpis_hi) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                     (seq, time.time(), *ranges["samples"], *ranges["events"], *ranges["kpis"]))
        conn.executemany("INSERT OR REPLACE INTO meta VALUES (?, ?)",
                         [("next_seq", str(seq + 1))] + [(f"cut.{t}", str(hi)) for t, (lo, hi) in ranges.items()])
        return seq, ranges

    def batch_rows(self, ranges: dict):
        conn = self.conn
        lo, hi = ranges["samples"]
        samples = conn.execute("SELECT ts, metric, value, labels, job_ids FROM samples WHERE id > ? AND id <= ? "
                               "ORDER BY id", (lo, hi)).fetchall()
        lo, hi = ranges["events"]
        events = conn.execute("SELECT ts, source, kind, severity, message, fields, job_ids FROM events "
                              "WHERE id > ? AND id <= ? ORDER BY id", (lo, hi)).fetchall()
        lo, hi = ranges["kpis"]
        kpis = conn.execute("SELECT ts, job_id, rank, step, loss, step_time_s, tokens_per_s, mfu, grad_norm, payload "
                            "FROM kpis WHERE id > ? AND id <= ? ORDER BY id", (lo, hi)).fetchall()
        return samples, events, kpis

    def ack(self, seq: int, ranges: dict) -> None:
        with self.conn:
            self._ack(seq, ranges)

    def _ack(self, seq: int, ranges: dict) -> None:
        conn = self.conn
        pushed = dict(conn.execute("SELECT key, value FROM meta WHERE key LIKE 'pushed.%'"))
        conn.execute("DELETE FROM outbox WHERE seq = ?", (seq,))
        conn.executemany("INSERT OR REPLACE INTO meta VALUES (?, ?)",
                         [(f"pushed.{t}", str(max(hi, int(pushed.get(f"pushed.{t}", 0)))))
                          for t, (lo, hi) in ranges.items()])

    def reject(self, seq: int, ranges: dict, error: str) -> None:
        """The controller refused the batch for its content (not auth): keep it here, move on, report it."""
        with self.conn:
            self.conn.execute("UPDATE outbox SET status = 'rejected', error = ? WHERE seq = ?", (error[:500], seq))
            for table, (lo, hi) in ranges.items():
                self._set_meta(f"pushed.{table}", max(hi, self.pushed(table)))

    def backlog(self) -> int:
        """Rows not yet acknowledged by the controller."""
        total = 0
        for table in TABLES:
            total += self.conn.execute(f"SELECT count(*) FROM {table} WHERE id > ?",
                                       (self.pushed(table),)).fetchone()[0]
        return total

    # ---------- bounds ----------
    def size_bytes(self) -> int:
        conn = self.conn
        pages = conn.execute("PRAGMA page_count").fetchone()[0] - conn.execute("PRAGMA freelist_count").fetchone()[0]
        return pages * conn.execute("PRAGMA page_size").fetchone()[0]

    def prune(self, max_age_s: float, max_bytes: int, now: float | None = None) -> dict | None:
        """Enforce the bounds; returns what was deleted {table: n, 'unpushed': n, 'reason': ...} or None."""
        now = time.time() if now is None else now
        deleted = {t: 0 for t in TABLES}
        unpushed = 0
        reasons = []
        conn = self.conn
        cutoff = now - max_age_s
        for table in TABLES:  # by age: oldest ids first, while their ts is past the cutoff
            while True:
                first = conn.execute(f"SELECT min(id) FROM {table}").fetchone()[0]
                if first is None:
                    break
                with conn:
                    n, u = self._delete(table, "id < ? AND ts < ?", (first + PRUNE_CHUNK, cutoff))
                deleted[table] += n
                unpushed += u
                if n == 0:
                    break
        if any(deleted.values()):
            reasons.append("age")
        size_before = self.size_bytes()
        if size_before > max_bytes:
            reasons.append("size")
            while self.size_bytes() > max_bytes:
                table = max(TABLES, key=lambda t: conn.execute(f"SELECT count(*) FROM {t}").fetchone()[0])
                first = conn.execute(f"SELECT min(id) FROM {table}").fetchone()[0]
                if first is None:
                    break
                with conn:
                    n, u = self._delete(table, "id < ?", (first + PRUNE_CHUNK,))
                deleted[table] += n
                unpushed += u
        if not any(deleted.values()):
            return None
        conn.execute("PRAGMA incremental_vacuum")
        with conn:
            for table, n in deleted.items():
                self._set_meta(f"dropped.{table}", int(self.meta(f"dropped.{table}", 0)) + n)
            self._set_meta("dropped.unpushed", int(self.meta("dropped.unpushed", 0)) + unpushed)
        return {**deleted, "unpushed": unpushed, "reason": "+".join(reasons)}

    def _delete(self, table: str, where: str, args: tuple) -> tuple[int, int]:
        pushed = self.pushed(table)
        u = self.conn.execute(f"SELECT count(*) FROM {table} WHERE {where} AND id > ?", (*args, pushed)).fetchone()[0]
        n = self.conn.execute(f"DELETE FROM {table} WHERE {where}", args).rowcount
        return n, u


def _multi_insert(rows: int) -> str:
    return SAMPLE_INSERT.replace("VALUES (?, ?, ?, ?, ?)", "VALUES " + ",".join(["(?,?,?,?,?)"] * rows))


SAMPLE_INSERT_CHUNK = _multi_insert(SAMPLE_CHUNK)


def _insert_samples(conn: sqlite3.Connection, rows: list) -> None:
    """Rows in statements of SAMPLE_CHUNK rows each, plus one for the rest: an AUTOINCREMENT table reads and
    updates its sqlite_sequence entry once per statement, so this costs about half of one statement per row. The
    rest's statement (one per row count) stays in the connection's statement cache: a node's count barely varies."""
    whole = len(rows) - len(rows) % SAMPLE_CHUNK
    if whole:
        flat = [x for row in rows[:whole] for x in row]
        width = 5 * SAMPLE_CHUNK
        conn.executemany(SAMPLE_INSERT_CHUNK, [flat[i:i + width] for i in range(0, len(flat), width)])
    if whole < len(rows):
        rest = rows[whole:]
        conn.execute(_multi_insert(len(rest)), [x for row in rest for x in row])
