"""The push wire format and its authentication, shared by the sidecar and the controller's ingest.

A batch is one JSON object; samples travel columnar with their series dictionary-encoded so the controller can
insert them with one executemany without touching each value in Python:

    {"v": 1, "node": "node1", "seq": 1732230000123, "sent_at": 1732230001.5,
     "series": [["host.cpu.util", "{\"cpu\":\"0\"}", "[42]"], ...],       # metric, labels JSON, job ids JSON
     "samples": {"s": [0, 0, 1, ...], "ts": [...], "v": [...]},           # series index, unix ts, value
     "events": [[ts, source, kind, severity, message, fields JSON, job ids JSON], ...],
     "kpis": [[ts, job_id, rank, step, loss, step_time_s, tokens_per_s, mfu, grad_norm, payload JSON], ...]}

The sidecar sends version 2, the same object without "samples" but with "n" (the number of samples), on one line
after the magic b"SGB2\n", followed by the three sample columns as raw little-endian arrays: n uint32 series
indexes, n float64 timestamps, n float64 values (NaN = no value, stored as NULL). The controller turns them into
arrays with one copy each instead of parsing text numbers (the bulk of a batch). Version 1 is still accepted.

Authentication (signature version 2, what the sidecar sends): the body's SHA-256 travels in a header and the
HMAC-SHA256 covers the headers only, so the controller checks who is speaking before it reads a byte of the body:

    X-Sigma-Node: node1                  X-Sigma-Timestamp: 1732230001.500
    X-Sigma-Key: node1-5f0c3a9e          X-Sigma-Content-SHA256: <hex digest of the body>
    X-Sigma-Signature: hex HMAC(key, "sigma-v2\\n<timestamp>\\n<node>\\n<key id>\\n<Content-Length>\\n<digest>")

The key is the node's own key (sigma.security.keys); without X-Sigma-Key the shared secret is meant. Version 1 (no
digest header: HMAC over "<timestamp>\\n<node>\\n<body>" with the shared secret) is still accepted for bodies up
to a small limit, since the body must be read before it can be checked. The timestamp bounds replays; (node, seq)
makes a replayed or retried batch a no-op.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import stat
import sys
import time
from array import array
from pathlib import Path

VERSION = 1
BINARY_VERSION = 2
BINARY_MAGIC = b"SGB2\n"
INDEX_TYPE = "I" if array("I").itemsize == 4 else "L"  # uint32
SAMPLE_BYTES = 4 + 8 + 8  # series index, ts, value
NAN = float("nan")
EVENT_FIELDS = ("ts", "source", "kind", "severity", "message", "fields", "job_ids")
KPI_FIELDS = ("ts", "job_id", "rank", "step", "loss", "step_time_s", "tokens_per_s", "mfu", "grad_norm", "payload")
HEADER_NODE = "X-Sigma-Node"
HEADER_TS = "X-Sigma-Timestamp"
HEADER_SIG = "X-Sigma-Signature"
HEADER_KEY = "X-Sigma-Key"
HEADER_DIGEST = "X-Sigma-Content-SHA256"
MAX_CLOCK_SKEW_S = 300.0


class SecretError(ValueError):
    """The shared secret file is missing, empty or readable by others."""


def read_secret(path: str | Path, *, check_mode: bool = True) -> bytes:
    """The shared secret; the file must be a regular file of mode 0600 (or stricter) owned by this user."""
    path = Path(path)
    try:
        st = path.stat()
    except OSError as exc:
        raise SecretError(f"{path}: cannot read the ingest secret: {exc.strerror}") from None
    if check_mode:
        if not stat.S_ISREG(st.st_mode):
            raise SecretError(f"{path}: the ingest secret must be a regular file")
        if st.st_mode & 0o077:
            raise SecretError(f"{path}: the ingest secret has mode {stat.S_IMODE(st.st_mode):04o}; it must be 0600 "
                              f"(chmod 600 {path})")
        if st.st_uid != os.geteuid():
            raise SecretError(f"{path}: the ingest secret belongs to uid {st.st_uid}, not to this user "
                              f"(uid {os.geteuid()}); chown it")
    secret = path.read_bytes().strip()
    if len(secret) < 16:
        raise SecretError(f"{path}: the ingest secret is shorter than 16 bytes")
    return secret


def write_secret(path: str | Path) -> bytes:
    """Create a new random secret file with mode 0600 (for tests, benches and first-time setup)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    secret = os.urandom(32).hex().encode()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(secret + b"\n")
    os.chmod(path, 0o600)
    return secret


def sign(secret: bytes, node: str, timestamp: str, body: bytes) -> str:
    mac = hmac.new(secret, f"{timestamp}\n{node}\n".encode(), hashlib.sha256)
    mac.update(body)
    return mac.hexdigest()


def verify(secret: bytes, node: str, timestamp: str, body: bytes, signature: str) -> bool:
    return hmac.compare_digest(sign(secret, node, timestamp, body), signature)


def sign_v2(secret: bytes, node: str, timestamp: str, key_id: str | None, length: int, digest: str) -> str:
    message = f"sigma-v2\n{timestamp}\n{node}\n{key_id or ''}\n{int(length)}\n{digest}"
    return hmac.new(secret, message.encode(), hashlib.sha256).hexdigest()


def auth_headers(key_id: str | None, secret: bytes, node: str, body: bytes, timestamp: str | None = None) -> dict:
    """The version 2 authentication headers for one request (key_id None: the shared secret)."""
    timestamp = timestamp or f"{time.time():.3f}"
    digest = hashlib.sha256(body).hexdigest()
    headers = {HEADER_NODE: node, HEADER_TS: timestamp, HEADER_DIGEST: digest,
               HEADER_SIG: sign_v2(secret, node, timestamp, key_id, len(body), digest)}
    if key_id is not None:
        headers[HEADER_KEY] = key_id
    return headers


def encode_batch(node: str, seq: int, sent_at: float, samples, events, kpis) -> bytes:
    """samples: iterable of (ts, metric, value, labels_json, job_ids_json); events/kpis: row tuples."""
    series: list[list[str]] = []
    index: dict[tuple, int] = {}
    s_col, ts_col, v_col = [], [], []
    for ts, metric, value, labels, job_ids in samples:
        key = (metric, labels, job_ids)
        i = index.get(key)
        if i is None:
            i = index[key] = len(series)
            series.append([metric, labels, job_ids])
        s_col.append(i)
        ts_col.append(ts)
        v_col.append(value)
    body = {"v": VERSION, "node": node, "seq": seq, "sent_at": sent_at, "series": series,
            "samples": {"s": s_col, "ts": ts_col, "v": v_col},
            "events": [list(e) for e in events], "kpis": [list(k) for k in kpis]}
    return json.dumps(body, separators=(",", ":")).encode()


def _series_columns(samples):
    """Dictionary-encode (metric, labels, job ids) and split the rest into columns, in C-level loops."""
    index: dict[tuple, int] = {}
    # setdefault's default is the dict's size before the call: a new series gets the next index
    s_col = array(INDEX_TYPE, [index.setdefault((r[1], r[3], r[4]), len(index)) for r in samples])
    ts_col = array("d", [r[0] for r in samples])
    v_col = array("d", [NAN if r[2] is None else r[2] for r in samples])
    return list(index), s_col, ts_col, v_col


SERIES_CACHE_MAX = 100_000


def _series_json(keys, cache: dict | None) -> str:
    """The header's "series" list; with a cache, each series' JSON is built once (the same series recur in every
    batch a sidecar sends)."""
    if cache is None:
        return json.dumps([list(k) for k in keys], separators=(",", ":"))
    parts = []
    for key in keys:
        text = cache.get(key)
        if text is None:
            if len(cache) >= SERIES_CACHE_MAX:
                cache.clear()
            text = cache[key] = json.dumps(list(key), separators=(",", ":"))
        parts.append(text)
    return "[" + ",".join(parts) + "]"


def encode_binary_batch(node: str, seq: int, sent_at: float, samples, events, kpis,
                        series_cache: dict | None = None) -> bytes:
    """Version 2 (what the sidecar sends): JSON header line + binary sample columns, see the module docstring.
    series_cache: a dict kept by the caller across batches (series key -> its JSON)."""
    keys, s_col, ts_col, v_col = _series_columns(samples)
    dumps = json.dumps
    header = (f'{{"v":{BINARY_VERSION},"node":{dumps(node)},"seq":{int(seq)},"sent_at":{dumps(float(sent_at))},'
              f'"series":{_series_json(keys, series_cache)},"n":{len(s_col)},'
              f'"events":{dumps([list(e) for e in events], separators=(",", ":"))},'
              f'"kpis":{dumps([list(k) for k in kpis], separators=(",", ":"))}}}')
    if sys.byteorder == "big":
        for col in (s_col, ts_col, v_col):
            col.byteswap()
    return b"".join((BINARY_MAGIC, header.encode(), b"\n", s_col.tobytes(), ts_col.tobytes(), v_col.tobytes()))


def decode_columns(data, n: int) -> tuple[array, array, array]:
    """The three sample columns of a version 2 body (data = the bytes after the header line, exactly n samples)."""
    view = memoryview(data)
    s_col, ts_col, v_col = array(INDEX_TYPE), array("d"), array("d")
    s_col.frombytes(view[:4 * n])
    ts_col.frombytes(view[4 * n:12 * n])
    v_col.frombytes(view[12 * n:20 * n])
    if sys.byteorder == "big":
        for col in (s_col, ts_col, v_col):
            col.byteswap()
    return s_col, ts_col, v_col
