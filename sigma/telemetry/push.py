"""Push client: send outbox batches to the controller in order, retry until acknowledged (at-least-once).

One batch in flight at a time, over one keep-alive HTTP connection. When caught up, the pusher asks the node
store's writer to cut the next batch in its next write transaction (at least interval_s later) and sleeps until
that batch is handed over: one commit a second for writing, cutting and recording the last acknowledgement, and
one wake-up of this thread per push. With a backlog, after a failure or on exit it cuts batches itself.
While the controller is unreachable the rows stay in the node store (bounded there) and the client backs off up to
max_backoff_s; once it answers, batches go back to back until the backlog is gone. A 4xx for the batch's content (400/413/422) cannot be fixed by retrying:
the batch is kept locally as 'rejected', reported as an event, and the stream moves on. Authentication failures
(401/403) are retried: an admin fixes the key and nothing is lost.

Requests carry signature version 2 (sigma.telemetry.wire): the node's own key signs the headers and a digest of
the body. The key file is re-read when it changes (checked before each push) or on reload(): a rotated key is
picked up without a restart while the controller still accepts the old one.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from urllib.parse import urlsplit

from sigma.security.keys import KeyFileError, NodeKey, read_node_key
from sigma.telemetry import http11, wire
from sigma.telemetry.store import NodeStore

log = logging.getLogger("sigma.telemetry.push")

CONTENT_REJECTIONS = (400, 413, 422)


class PushError(RuntimeError):
    pass


class Pusher:
    def __init__(self, store: NodeStore, node: str, url: str, key: NodeKey | bytes, *, key_file: str | None = None,
                 interval_s: float = 1.0, max_records: int = 20000, timeout_s: float = 10.0,
                 max_backoff_s: float = 10.0, report=None, on_requests=None, on_node_requests=None):
        self.store = store
        self.on_requests = on_requests  # callable(list[dict]): the controller's checkpoint requests riding on an ack
        self.on_node_requests = on_node_requests  # callable(list[dict]): what it asks of this node (log-ack)
        self.node = node
        self.url = url
        self.key = key if isinstance(key, NodeKey) else NodeKey(None, key)
        self.key_file = key_file  # re-read when it changes (rotation)
        self._key_stamp = self._stamp()
        self.interval_s = interval_s
        self.max_records = max_records
        self.timeout_s = timeout_s
        self.max_backoff_s = max_backoff_s
        self.report = report  # callable(kind, message, severity, fields): sidecar self-report events
        self.stop_event = threading.Event()
        self.wake = threading.Event()
        self._conn: http11.Connection | None = None
        self._thread: threading.Thread | None = None
        self.stats = {"batches": 0, "records": 0, "failures": 0, "duplicates": 0, "rejected": 0}
        self.connected = None  # last known reachability, for transition reports
        self._offered = None  # (seq, ranges) the store's writer cut for us
        self._full = False  # the last batch sent was full: more backlog, send the next one right away
        self._series_cache: dict = {}  # series key -> its JSON in the batch header
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"push.url must be http(s)://host:port/path, got {url!r}")
        self._parts = parts

    # ---------- lifecycle ----------
    def start(self) -> None:
        self.store.on_cut = self._offer
        self._thread = threading.Thread(target=self._run, name="push", daemon=True)
        self._thread.start()

    def stop(self, drain_s: float = 0.0) -> None:
        """Stop; with drain_s > 0 first keep sending while there is a backlog, for at most drain_s."""
        deadline = time.monotonic() + drain_s
        while drain_s > 0 and time.monotonic() < deadline and self._thread and self._thread.is_alive():
            if self.store_backlog() == 0:
                break
            self.wake.set()
            time.sleep(0.05)
        self.stop_event.set()
        self.wake.set()
        if self._thread:
            self._thread.join(timeout=self.timeout_s + 2)
        if self.store.on_cut == self._offer:
            self.store.on_cut = None
            self.store.request_cut(None)
        self._close()

    def store_backlog(self) -> int:
        return self.store.backlog()  # the store's connections are per thread: safe beside the push thread

    # ---------- loop ----------
    def _run(self) -> None:
        backoff = self.interval_s
        while not self.stop_event.is_set():
            try:
                sent = self.push_once()
            except Exception as exc:  # network, controller 5xx, auth: keep the rows, retry later
                self.stats["failures"] += 1
                self._transition(False, str(exc))
                self._close()
                self.wake.wait(backoff)
                self.wake.clear()
                backoff = min(max(backoff * 2, 0.2), self.max_backoff_s)
                continue
            backoff = self.interval_s
            self._transition(True, "")
            if sent and self._full:  # more backlog: the next batch right away
                continue
            # caught up: the store's writer cuts the next batch at least interval_s from now and hands it over
            # (_offer); the timeout only matters when nothing is written for a long while
            self.store.request_cut(self.max_records, time.monotonic() + self.interval_s * 0.9)
            if self._offered is None:
                self.wake.wait(max(5.0, 5 * self.interval_s))
            self.wake.clear()
        self.store.request_cut(None)
        self.flush_ack()
        self.store.close()

    def _offer(self, seq: int, ranges: dict) -> None:
        """Called by the store's writer (its thread) with a batch it cut for us."""
        self._offered = (seq, ranges)
        self.wake.set()

    def flush_ack(self) -> None:
        """Record acknowledgements not yet written (they ride along with the next write or cut otherwise)."""
        self.store.flush_acks()

    def push_once(self) -> bool:
        """Send the next batch; True if one was acknowledged (or rejected for its content)."""
        self.store.request_cut(None)
        batch, self._offered = self._offered, None
        if batch is None:
            batch = self.store.next_batch(self.max_records)
            if batch is not None and self._offered is not None and self._offered[0] == batch[0]:
                self._offered = None  # the writer cut it just before: it is the one we got
        if batch is None:
            return False
        seq, ranges = batch
        samples, events, kpis = self.store.recent_rows(ranges) or self.store.batch_rows(ranges)
        body = wire.encode_binary_batch(self.node, seq, time.time(), samples, events, kpis, self._series_cache)
        status, reply = self._post(body)
        n = len(samples) + len(events) + len(kpis)
        if status == 200 and reply.get("ok") and reply.get("seq") == seq:
            self.store.defer_ack(seq, ranges)  # written with the next write or cut; if we die first, re-sent once
            self._full = n >= self.max_records
            self.stats["batches"] += 1
            self.stats["records"] += n
            self.stats["duplicates"] += bool(reply.get("duplicate"))
            if self.on_requests and reply.get("checkpoint_requests"):
                self.on_requests(reply["checkpoint_requests"])
            if self.on_node_requests and reply.get("node_requests"):
                self.on_node_requests(reply["node_requests"])
            return True
        reason = reply.get("error") or f"HTTP {status}"
        if status in CONTENT_REJECTIONS:
            self.store.reject(seq, ranges, reason)
            self.stats["rejected"] += 1
            log.error("controller rejected batch %d (%d records): %s; kept in the node store's outbox", seq, n,
                      reason)
            if self.report:
                self.report("push_rejected", f"controller rejected batch {seq}: {reason}", "error",
                            {"seq": seq, "records": n, "status": status})
            return True
        raise PushError(f"controller answered {status}: {reason}")

    # ---------- key ----------
    def _stamp(self):
        if not self.key_file:
            return None
        try:
            st = os.stat(self.key_file)
        except OSError:
            return None
        return st.st_mtime_ns, st.st_size, st.st_ino

    def reload_key(self, force: bool = False) -> bool:
        """Re-read the key file if it changed (or force); keep the running key when the new file is unusable."""
        stamp = self._stamp()
        if not self.key_file or (stamp == self._key_stamp and not force):
            return False
        self._key_stamp = stamp
        try:
            key = read_node_key(self.key_file)
        except KeyFileError as exc:
            log.error("key file changed but cannot be used, still signing with key %s: %s",
                      self.key.key_id or "(shared)", exc)
            if self.report:
                self.report("key_error", f"new key not loaded: {exc}", "error", {"file": self.key_file})
            return False
        if key != self.key:
            log.info("signing with key %s from %s (was %s)", key.key_id or "(shared)", self.key_file,
                     self.key.key_id or "(shared)")
            self.key = key
        return True

    def _post(self, body: bytes) -> tuple[int, dict]:
        self.reload_key()
        key = self.key
        headers = {"Content-Type": "application/octet-stream",
                   **wire.auth_headers(key.key_id, key.secret, self.node, body)}
        path = self._parts.path or "/v1/ingest"
        for attempt in (0, 1):  # a kept-alive connection the server closed: reconnect once
            conn = self._connection()
            try:
                status, _, data = conn.post(path, headers, body)
            except (http11.Disconnected, BrokenPipeError, ConnectionResetError):
                self._close()
                if attempt:
                    raise
                continue
            try:
                reply = json.loads(data) if data else {}
            except ValueError:
                reply = {"error": data[:200].decode("utf-8", "replace")}
            return status, reply if isinstance(reply, dict) else {}
        raise PushError("unreachable")

    def _connection(self) -> http11.Connection:
        if self._conn is None:
            parts = self._parts
            tls = parts.scheme == "https"
            self._conn = http11.Connection(parts.hostname, parts.port or (443 if tls else 80),
                                           timeout=self.timeout_s, tls=tls)
        return self._conn

    def _close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def _transition(self, ok: bool, error: str) -> None:
        if ok == self.connected:
            return
        previous, self.connected = self.connected, ok
        if ok:
            if previous is False:
                log.info("controller reachable again at %s", self.url)
        else:
            log.warning("cannot push to %s: %s (buffering in the node store)", self.url, error)
            if self.report:
                self.report("push_failing", f"cannot push to {self.url}: {error}", "warning", {"url": self.url})
