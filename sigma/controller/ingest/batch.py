"""Controller side of the push: authenticate the node, validate the batch, store it once per (node, seq), ack.

`Ingest.authenticate(headers, length)` checks the key and signature from the headers alone (signature version 2
covers a digest of the body), so the server reads a body only from a node that proved who it is;
`Ingest.receive(caller, body)` checks the digest, validates and stores. Both return (http_status, reply dict) for
a refusal: a 4xx with a reason, logged with the node and peer, counted by reason (/metrics), never an exception.
Rows with a non-finite or absurd timestamp (older than max_row_age_s, or further in the future than the clock skew
allows) are dropped and counted; the rest of their batch is stored. Batches that arrive together share one
transaction (group commit, groupcommit.py), each in a savepoint of its own: a batch's `batches` row and its data rows
commit together, so a controller killed mid-batch has all of it or none, and the sidecar's retry fills the gap; a
push is acknowledged only once its group has committed.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import math
import threading
import time
from collections import Counter
from dataclasses import dataclass
from itertools import chain, compress, repeat
from pathlib import Path

from sigma.controller.act import jit, noderequests
from sigma.controller.db import open_db
from sigma.controller.ingest.groupcommit import GroupCommit
from sigma.controller.ingest.ratelog import RateLimitedLog
from sigma.controller.ingest.wal import WalGuard
from sigma.security.keys import KeyRing
from sigma.store import is_url
from sigma.telemetry import wire

log = logging.getLogger("sigma.controller.ingest.batch")

SAMPLE_COLUMNS = ("node", "ts", "metric", "value", "labels", "job_ids")
SAMPLE_CHUNK = 200  # rows per INSERT statement (1,200 parameters: SQLite 3.32+ and PostgreSQL take 32,766+)


def _sample_sql(rows: int) -> str:
    one = "(" + ", ".join("?" * len(SAMPLE_COLUMNS)) + ")"
    return f"INSERT INTO samples ({', '.join(SAMPLE_COLUMNS)}) VALUES " + ", ".join([one] * rows)


SAMPLE_CHUNK_SQL = _sample_sql(SAMPLE_CHUNK)
EVENT_SQL = ("INSERT INTO events (node, ts, source, kind, severity, message, fields, job_ids) "
             "VALUES (?, ?, ?, ?, ?, ?, ?, ?)")
KPI_SQL = ("INSERT INTO kpis (node, ts, job_id, rank, step, loss, step_time_s, tokens_per_s, mfu, grad_norm, "
           "payload) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)")
BATCH_SQL = "INSERT OR IGNORE INTO batches (node, seq, received_at, records) VALUES (?, ?, ?, ?)"
NUMBER = (int, float)
TEXT_TYPES = {str}
NUM_OR_NONE = {int, float, type(None)}
WAKE_SEVERITIES = frozenset(("warning", "error", "critical"))  # events the loop looks at at once (an Xid line)
REFUSAL_EVENTS = ("kpi_refused", "key_error")  # what sidecars refused locally: counted per node for /metrics
UNATTRIBUTED_METRIC = "log.unattributed_lines"  # log lines sidecars did not act on (writer not established)
MAX_ROW_AGE_S = 30 * 86400.0  # rows older than this are dropped (the node store keeps 7 days by default)
MAX_UNVERIFIED_BYTES = 1 << 20  # version 1 requests: read at most this much before the signature is checked


class Rejected(ValueError):
    def __init__(self, status: int, message: str, reason: str = "bad_batch"):
        self.status = status
        self.reason = reason  # short label: the /metrics counter and the log line's tag
        super().__init__(message)


@dataclass(frozen=True)
class Caller:
    """Who a request says it is, checked from its headers alone (before its body is read)."""

    node: str
    key_id: str | None  # None: the shared secret
    secret: bytes
    timestamp: str
    signature: str
    digest: str | None  # signature version 2: the body must hash to this; None: version 1, signed body


class Ingest:
    def __init__(self, db_path: str | Path, keys: KeyRing | bytes, *,
                 max_clock_skew_s: float = wire.MAX_CLOCK_SKEW_S, max_row_age_s: float = MAX_ROW_AGE_S,
                 max_unverified_bytes: int = MAX_UNVERIFIED_BYTES):
        self.db_path = db_path if is_url(db_path) else Path(db_path)
        self.keys = keys if isinstance(keys, KeyRing) else KeyRing(shared_secret=keys)
        self.max_clock_skew_s = max_clock_skew_s
        self.max_row_age_s = max_row_age_s
        self.max_unverified_bytes = max_unverified_bytes
        self.conn = open_db(self.db_path)
        self.wal: WalGuard | None = None  # SQLite: the write-ahead log kept short between groups (wal.py)
        if not is_url(db_path):
            self.conn.execute("PRAGMA cache_size = -65536")  # 64 MB: keeps the samples indexes' hot pages in memory
            self.wal = WalGuard()
            self.wal.setup(self.conn)
        self.writer = GroupCommit(self.conn, self._write, after_commit=self.wal and self.wal.after_commit)
        # set once a stored batch carries an event of WAKE_SEVERITIES: the detection loop runs its next tick now
        # rather than at its next period (sigma.controller.daemon.wait_next)
        self.wake = threading.Event()
        self.lock = self.writer.lock  # the connection's user: the group being written
        self._stats_lock = threading.Lock()
        self.stats = {"batches": 0, "duplicates": 0, "rejected": 0, "samples": 0, "events": 0, "kpis": 0}
        self.rejections: Counter = Counter()  # reason -> requests refused
        self.dropped_rows: Counter = Counter()  # reason -> rows dropped from otherwise stored batches
        self.node_refusals: Counter = Counter()  # (node, event kind) -> refusals sidecars reported
        self.unattributed_lines: Counter = Counter()  # (node, reason) -> log lines not acted on, sidecars reported
        self.warn = RateLimitedLog(log)
        self._record_auth_mode()

    def close(self) -> None:
        self.writer.close()
        with self.lock:
            self.conn.close()

    # ---------- entry points ----------
    def authenticate(self, headers, length: int, peer: str = "?") -> Caller | tuple[int, dict]:
        """Check the headers before the body is read: a Caller, or (status, reply) for a refusal."""
        try:
            return self._authenticate(headers, length)
        except Rejected as exc:
            return self._refuse(exc, headers.get(wire.HEADER_NODE, "?"), peer)

    def receive(self, caller: Caller, body: bytes, peer: str = "?") -> tuple[int, dict]:
        try:
            self._verify_body(caller, body)
            batch = self._parse(body, caller.node)
            self._drop_absurd_times(batch, caller.node, peer)
            try:
                reply = self._store(caller.node, batch)
            except OverflowError as exc:  # an integer SQLite cannot hold (rolled back)
                raise Rejected(400, f"number out of range: {exc}", "bad_batch") from None
            return 200, reply
        except Rejected as exc:
            return self._refuse(exc, caller.node, peer)

    def verify(self, caller: Caller, body: bytes, peer: str = "?") -> tuple[int, dict] | None:
        """For routes other than ingest that share its authentication: None when the body is the signed one."""
        try:
            self._verify_body(caller, body)
            return None
        except Rejected as exc:
            return self._refuse(exc, caller.node, peer)

    def count(self, reason: str) -> None:
        """A refusal decided outside (the HTTP server: size, timeouts, connection limits)."""
        self.stats["rejected"] += 1
        self.rejections[reason] += 1

    def _refuse(self, exc: "Rejected", node: str, peer: str) -> tuple[int, dict]:
        self.count(exc.reason)
        self.warn.warning(exc.reason, "ingest rejected from %s (node %s): %d %s [%s]", peer, node, exc.status, exc,
                          exc.reason)
        return exc.status, {"ok": False, "error": str(exc)}

    def _record_auth_mode(self) -> None:
        """Remember how nodes authenticate, for `sigma report` (a shared key is flagged there)."""
        state = {"shared_key": self.keys.shared, "key_table": str(self.keys.table_path or ""),
                 "nodes_with_keys": len(self.keys.nodes())}
        with self.lock:
            self.conn.execute("INSERT OR REPLACE INTO detector_state (key, value, updated_at) VALUES (?, ?, ?)",
                              ("ingest.auth", json.dumps(state), time.time()))
            self.conn.commit()
        if self.keys.shared:
            log.warning("ingest accepts a shared secret: any node holding it can post as any other node; issue "
                        "per-node keys with `sigma keys issue` and drop ingest_secret_file")

    # ---------- steps ----------
    def _authenticate(self, headers, length: int) -> Caller:
        node = headers.get(wire.HEADER_NODE)
        timestamp = headers.get(wire.HEADER_TS)
        signature = headers.get(wire.HEADER_SIG)
        key_id = headers.get(wire.HEADER_KEY) or None
        digest = headers.get(wire.HEADER_DIGEST) or None
        if not node or not timestamp or not signature:
            raise Rejected(401, f"missing authentication headers ({wire.HEADER_NODE}, {wire.HEADER_TS}, "
                                f"{wire.HEADER_SIG})", "missing_headers")
        try:
            sent = float(timestamp)
        except ValueError:
            raise Rejected(401, f"bad {wire.HEADER_TS} {timestamp[:40]!r}", "bad_timestamp") from None
        if not math.isfinite(sent):
            raise Rejected(401, f"{wire.HEADER_TS} {timestamp[:40]!r} is not a finite time", "bad_timestamp")
        skew = abs(time.time() - sent)
        if skew > self.max_clock_skew_s:
            raise Rejected(401, f"timestamp {skew:.0f} s away from the controller clock (max "
                                f"{self.max_clock_skew_s:.0f} s): check NTP", "clock_skew")
        found = self.keys.lookup(key_id)
        if found is None:
            if key_id is None:
                raise Rejected(401, f"no {wire.HEADER_KEY} header and this controller accepts per-node keys only",
                               "shared_key_refused")
            old = self.keys.owner(key_id)
            if old is not None:
                raise Rejected(401, f"key {key_id} of node {old.node} has expired (rotated); install the node's "
                                    f"new key", "expired_key")
            raise Rejected(401, f"unknown key {key_id[:80]!r}", "unknown_key")
        owner, secret = found
        if digest is not None:
            if len(digest) != 64 or not all(c in "0123456789abcdef" for c in digest):
                raise Rejected(400, f"{wire.HEADER_DIGEST} must be 64 lower-case hex digits", "bad_digest")
            expected = wire.sign_v2(secret, node, timestamp, key_id, length, digest)
            if not hmac.compare_digest(expected, signature):
                raise Rejected(401, "bad signature: wrong key or altered headers", "bad_signature")
        elif length > self.max_unverified_bytes:  # version 1: the body must be read before it can be checked
            raise Rejected(413, f"a body signed without {wire.HEADER_DIGEST} may hold at most "
                                f"{self.max_unverified_bytes} bytes, not {length}", "unverified_too_large")
        if owner is not None and owner != node:
            raise Rejected(403, f"key {key_id} belongs to node {owner}, not to {node}", "wrong_node")
        return Caller(node, key_id, secret, timestamp, signature, digest)

    def _verify_body(self, caller: Caller, body: bytes) -> None:
        if caller.digest is not None:
            if not hmac.compare_digest(hashlib.sha256(body).hexdigest(), caller.digest):
                raise Rejected(400, f"body does not match {wire.HEADER_DIGEST}", "bad_digest")
        elif not wire.verify(caller.secret, caller.node, caller.timestamp, body, caller.signature):
            raise Rejected(401, "bad signature: wrong secret or altered body", "bad_signature")

    def _drop_absurd_times(self, b: dict, node: str, peer: str) -> None:
        """Drop rows whose time is not finite or out of [now - max_row_age_s, now + max_clock_skew_s]: a user's
        KPI line with ts 1e300 must not cost the node's other rows, and must not reach detection."""
        now = time.time()
        lo, hi = now - self.max_row_age_s, now + self.max_clock_skew_s
        ok = lambda t: lo <= t <= hi  # False for NaN too
        dropped = {}
        ts = b["ts"]
        if ts and not (math.isfinite(sum(ts)) and lo <= min(ts) and max(ts) <= hi):  # the common case: one pass
            keep = list(map(ok, ts))
            dropped["samples"] = len(keep) - sum(keep)
            b["s"], b["ts"], b["v"] = (list(compress(col, keep)) for col in (b["s"], b["ts"], b["v"]))
        for name in ("events", "kpis"):
            rows = b[name]
            kept = [r for r in rows if ok(r[0])]
            if len(kept) != len(rows):
                dropped[name] = len(rows) - len(kept)
                b[name] = kept
        dropped = {k: v for k, v in dropped.items() if v}
        if dropped:
            b["dropped"] = dropped
            for name, n in dropped.items():
                self.dropped_rows[f"{name}_bad_timestamp"] += n
            log.warning("ingest from %s (node %s): dropped %s with a non-finite or absurd timestamp (allowed "
                        "%.0f .. %.0f); stored the rest of batch %s", peer, node,
                        ", ".join(f"{n} {k}" for k, n in dropped.items()), lo, hi, b["seq"])

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
        return {"seq": seq, "series": series, "s": s_col, "ts": ts_col, "v": v_col, "events": events, "kpis": kpis}

    def _store(self, node: str, b: dict) -> dict:
        reply = self.writer.submit((node, b), len(b["s"]))
        with self._stats_lock:  # the handlers of a group wake together
            if reply.get("duplicate"):
                self.stats["duplicates"] += 1
                return reply
            self.stats["batches"] += 1
            self.stats["samples"] += len(b["s"])
            self.stats["events"] += len(b["events"])
            self.stats["kpis"] += len(b["kpis"])
            for e in b["events"]:
                if e[2] in REFUSAL_EVENTS:
                    self.node_refusals[(node, e[2])] += 1
            self._count_unattributed(node, b)
        if any(e[3] in WAKE_SEVERITIES for e in b["events"]):
            self.wake.set()
        if b.get("dropped"):
            reply["dropped"] = b["dropped"]
        return reply

    def _count_unattributed(self, node: str, b: dict) -> None:
        wanted = {i: _label(s[1], "reason") for i, s in enumerate(b["series"]) if s[0] == UNATTRIBUTED_METRIC}
        if wanted:  # rare: most batches carry no such series
            for i, v in zip(b["s"], b["v"]):
                if i in wanted:
                    self.unattributed_lines[(node, wanted[i])] += int(v)

    @staticmethod
    def _write(conn, item: tuple[str, dict]) -> dict:
        """One batch, inside the group's transaction (groupcommit.py); the reply its node gets once committed."""
        node, b = item
        now = time.time()
        n = len(b["s"]) + len(b["events"]) + len(b["kpis"])
        if conn.execute(BATCH_SQL, (node, b["seq"], now, n)).rowcount == 0:
            reply = {"ok": True, "seq": b["seq"], "duplicate": True}  # (node, seq) stored: a retry after a lost ack
        else:
            series = b["series"]
            metrics = [s[0] for s in series]
            labels = [s[1] for s in series]
            jobs = [s[2] for s in series]
            s_col = b["s"]
            _insert_samples(conn, zip(repeat(node), b["ts"], map(metrics.__getitem__, s_col), b["v"],
                                      map(labels.__getitem__, s_col), map(jobs.__getitem__, s_col)))
            if b["events"]:
                conn.executemany(EVENT_SQL, [(node, *e) for e in b["events"]])
            if b["kpis"]:
                conn.executemany(KPI_SQL, [(node, *k) for k in b["kpis"]])
            reply = {"ok": True, "seq": b["seq"], "duplicate": False,
                     "stored": {"samples": len(s_col), "events": len(b["events"]), "kpis": len(b["kpis"])}}
        # the node's open just-in-time checkpoint requests ride on the reply; its sidecar hands them to the
        # trainer (sigma/controller/act/jit.py)
        requests = jit.pending_for_node(conn, node, now)
        if requests:
            reply["checkpoint_requests"] = requests
        asked = noderequests.pending(conn, node, now)  # e.g. acknowledge the kernel log after a repair
        if asked:
            reply["node_requests"] = asked
        return reply


def _insert_samples(conn, rows) -> None:
    """Rows in statements of SAMPLE_CHUNK rows each, plus one for the rest: a statement per row costs a call into
    SQLite and a hand-back of the interpreter lock per row, which the detection loop's thread then has to wait for."""
    flat = list(chain.from_iterable(rows))
    width = len(SAMPLE_COLUMNS) * SAMPLE_CHUNK
    whole = len(flat) - len(flat) % width
    if whole:
        conn.executemany(SAMPLE_CHUNK_SQL, [flat[i:i + width] for i in range(0, whole, width)])
    if whole < len(flat):
        conn.execute(_sample_sql((len(flat) - whole) // len(SAMPLE_COLUMNS)), flat[whole:])


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


def _label(labels, key: str) -> str:
    try:
        return str((json.loads(labels) if isinstance(labels, str) else labels or {}).get(key, ""))
    except (ValueError, AttributeError):
        return ""
