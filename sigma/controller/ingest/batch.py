"""Controller side of the push: verify the HMAC, validate the batch, store it once per (node, seq), ack.

`Ingest.handle(headers, body)` returns (http_status, reply dict); every rejection is a 4xx with a reason and is
logged, never an exception. One transaction per batch: the `batches` row and the data rows commit together, so a
controller killed mid-batch either has all of it or none, and the sidecar's retry fills the gap.
"""

from __future__ import annotations

import json
import logging
import math
import sqlite3
import threading
import time
from itertools import repeat
from pathlib import Path

from sigma.controller.db import open_db
from sigma.telemetry import wire

log = logging.getLogger("sigma.controller.ingest.batch")

SAMPLE_SQL = "INSERT INTO samples (node, ts, metric, value, labels, job_ids) VALUES (?, ?, ?, ?, ?, ?)"
EVENT_SQL = ("INSERT INTO events (node, ts, source, kind, severity, message, fields, job_ids) "
             "VALUES (?, ?, ?, ?, ?, ?, ?, ?)")
KPI_SQL = ("INSERT INTO kpis (node, ts, job_id, rank, step, loss, step_time_s, tokens_per_s, mfu, grad_norm, "
           "payload) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)")
BATCH_SQL = "INSERT INTO batches (node, seq, received_at, records) VALUES (?, ?, ?, ?)"
NUMBER = (int, float)
TEXT_TYPES = {str}
NUM_OR_NONE = {int, float, type(None)}


class Rejected(ValueError):
    def __init__(self, status: int, reason: str):
        self.status = status
        super().__init__(reason)


class Ingest:
    def __init__(self, db_path: str | Path, secret: bytes, *, max_clock_skew_s: float = wire.MAX_CLOCK_SKEW_S):
        self.db_path = Path(db_path)
        self.secret = secret
        self.max_clock_skew_s = max_clock_skew_s
        self.conn = open_db(self.db_path)
        self.conn.execute("PRAGMA cache_size = -65536")  # 64 MB: keeps the samples indexes' hot pages in memory
        self.lock = threading.Lock()
        self.stats = {"batches": 0, "duplicates": 0, "rejected": 0, "samples": 0, "events": 0, "kpis": 0}

    def close(self) -> None:
        with self.lock:
            self.conn.close()

    # ---------- entry point ----------
    def handle(self, headers, body: bytes, peer: str = "?") -> tuple[int, dict]:
        try:
            node = self._authenticate(headers, body)
            batch = self._parse(body, node)
            try:
                reply = self._store(node, batch)
            except OverflowError as exc:  # an integer SQLite cannot hold (rolled back)
                raise Rejected(400, f"number out of range: {exc}") from None
            return 200, reply
        except Rejected as exc:
            self.stats["rejected"] += 1
            log.warning("ingest rejected from %s (node %s): %d %s", peer, headers.get(wire.HEADER_NODE, "?"),
                        exc.status, exc)
            return exc.status, {"ok": False, "error": str(exc)}

    # ---------- steps ----------
    def _authenticate(self, headers, body: bytes) -> str:
        node = headers.get(wire.HEADER_NODE)
        timestamp = headers.get(wire.HEADER_TS)
        signature = headers.get(wire.HEADER_SIG)
        if not node or not timestamp or not signature:
            raise Rejected(401, f"missing authentication headers ({wire.HEADER_NODE}, {wire.HEADER_TS}, "
                                f"{wire.HEADER_SIG})")
        if not wire.verify(self.secret, node, timestamp, body, signature):
            raise Rejected(401, "bad signature: wrong secret or altered body")
        try:
            skew = abs(time.time() - float(timestamp))
        except ValueError:
            raise Rejected(401, f"bad {wire.HEADER_TS} {timestamp!r}") from None
        if skew > self.max_clock_skew_s:
            raise Rejected(401, f"timestamp {skew:.0f} s away from the controller clock (max "
                                f"{self.max_clock_skew_s:.0f} s): check NTP")
        return node

    def _parse(self, body: bytes, node: str) -> dict:
        if body.startswith(wire.BINARY_MAGIC):
            return self._parse_binary(body, node)
        try:
            batch = json.loads(body)
        except (ValueError, UnicodeDecodeError) as exc:
            raise Rejected(400, f"body is not JSON: {exc}") from None
        seq, series, events, kpis = _header(batch, node, wire.VERSION)
        samples = _field(batch, "samples", dict)
        cols = []
        for name in ("s", "ts", "v"):
            col = samples.get(name)
            if not isinstance(col, list):
                raise Rejected(400, f"samples.{name} must be a list")
            cols.append(col)
        s_col, ts_col, v_col = cols
        if not (len(s_col) == len(ts_col) == len(v_col)):
            raise Rejected(400, "samples.s, samples.ts and samples.v differ in length")
        if s_col:
            if not set(map(type, s_col)) <= {int} or min(s_col) < 0 or max(s_col) >= len(series):
                raise Rejected(400, "samples.s must hold indexes into series")
            if not set(map(type, ts_col)) <= {int, float}:
                raise Rejected(400, "samples.ts must hold numbers")
            if not set(map(type, v_col)) <= NUM_OR_NONE:
                raise Rejected(400, "samples.v must hold numbers or null")
        return {"seq": seq, "series": series, "s": s_col, "ts": ts_col, "v": v_col, "events": events, "kpis": kpis}

    def _parse_binary(self, body: bytes, node: str) -> dict:
        """Version 2: a JSON header line, then the sample columns as raw arrays (see sigma.telemetry.wire)."""
        start = len(wire.BINARY_MAGIC)
        end = body.find(b"\n", start)
        if end < 0:
            raise Rejected(400, "binary batch without a header line")
        try:
            batch = json.loads(body[start:end])
        except (ValueError, UnicodeDecodeError) as exc:
            raise Rejected(400, f"batch header is not JSON: {exc}") from None
        seq, series, events, kpis = _header(batch, node, wire.BINARY_VERSION)
        n = batch.get("n")
        if type(n) is not int or n < 0:
            raise Rejected(400, f"n must be a non-negative integer, got {n!r}")
        size = len(body) - end - 1
        if size != n * wire.SAMPLE_BYTES:
            raise Rejected(400, f"sample columns hold {size} bytes, {n} samples need {n * wire.SAMPLE_BYTES}")
        s_col, ts_col, v_col = wire.decode_columns(memoryview(body)[end + 1:], n)
        if n:
            if max(s_col) >= len(series):
                raise Rejected(400, "samples.s must hold indexes into series")
            if not math.isfinite(sum(ts_col)):
                raise Rejected(400, "samples.ts must hold finite numbers")
        return {"seq": seq, "series": series, "s": s_col, "ts": ts_col, "v": v_col, "events": events, "kpis": kpis}

    def _store(self, node: str, b: dict) -> dict:
        n = len(b["s"]) + len(b["events"]) + len(b["kpis"])
        series = b["series"]
        metrics = [s[0] for s in series]
        labels = [s[1] for s in series]
        jobs = [s[2] for s in series]
        s_col = b["s"]
        rows = zip(repeat(node), b["ts"], map(metrics.__getitem__, s_col), b["v"],
                   map(labels.__getitem__, s_col), map(jobs.__getitem__, s_col))
        with self.lock:
            conn = self.conn
            conn.execute("BEGIN")
            try:
                try:
                    conn.execute(BATCH_SQL, (node, b["seq"], time.time(), n))
                except sqlite3.IntegrityError:  # (node, seq) already stored: a retry after a lost ack
                    conn.rollback()
                    self.stats["duplicates"] += 1
                    return {"ok": True, "seq": b["seq"], "duplicate": True}
                conn.executemany(SAMPLE_SQL, rows)
                if b["events"]:
                    conn.executemany(EVENT_SQL, [(node, *e) for e in b["events"]])
                if b["kpis"]:
                    conn.executemany(KPI_SQL, [(node, *k) for k in b["kpis"]])
                conn.commit()
            except BaseException:
                if conn.in_transaction:
                    conn.rollback()
                raise
        self.stats["batches"] += 1
        self.stats["samples"] += len(s_col)
        self.stats["events"] += len(b["events"])
        self.stats["kpis"] += len(b["kpis"])
        return {"ok": True, "seq": b["seq"], "duplicate": False,
                "stored": {"samples": len(s_col), "events": len(b["events"]), "kpis": len(b["kpis"])}}


NUM_OR = (int, float, type(None))


def _header(batch, node: str, version: int) -> tuple:
    """What both versions share: version, node, seq, series, events, kpis."""
    if not isinstance(batch, dict):
        raise Rejected(400, "batch must be a JSON object")
    if batch.get("v") != version:
        raise Rejected(400, f"unsupported batch version {batch.get('v')!r} (this controller speaks "
                            f"{wire.VERSION} as JSON, {wire.BINARY_VERSION} with binary columns)")
    if batch.get("node") != node:
        raise Rejected(400, f"batch node {batch.get('node')!r} differs from the signed node {node!r}")
    seq = batch.get("seq")
    if type(seq) is not int or not 0 <= seq < 2**63:
        raise Rejected(400, f"seq must be a non-negative integer, got {seq!r}")
    series = _field(batch, "series", list)
    for i, s in enumerate(series):
        if not (isinstance(s, list) and len(s) == 3 and all(type(x) is str for x in s)):
            raise Rejected(400, f"series[{i}] must be [metric, labels JSON, job ids JSON] strings")
    events = _rows(batch, "events", wire.EVENT_FIELDS,
                   (NUMBER, str, str, str, str, str, str))
    kpis = _rows(batch, "kpis", wire.KPI_FIELDS,
                 (NUMBER, int, int, (int, type(None)), NUM_OR, NUM_OR, NUM_OR, NUM_OR, NUM_OR, str))
    return seq, series, events, kpis


def _field(batch: dict, name: str, kind: type):
    value = batch.get(name)
    if not isinstance(value, kind):
        raise Rejected(400, f"{name} must be a {'list' if kind is list else 'JSON object'}")
    return value


def _rows(batch: dict, name: str, fields: tuple, types: tuple) -> list:
    rows = batch.get(name, [])
    if not isinstance(rows, list):
        raise Rejected(400, f"{name} must be a list")
    width = len(fields)
    for i, row in enumerate(rows):
        if not isinstance(row, list) or len(row) != width:
            raise Rejected(400, f"{name}[{i}] must be a list of {width} values: {', '.join(fields)}")
        for field, value, tp in zip(fields, row, types):
            if not isinstance(value, tp) or (isinstance(value, bool)):
                raise Rejected(400, f"{name}[{i}].{field} has the wrong type ({type(value).__name__})")
    return rows
