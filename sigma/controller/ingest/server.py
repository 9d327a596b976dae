"""The controller's HTTP server: POST /v1/ingest and GET /healthz, plus routes the controller adds.

    server = ControllerServer(("0.0.0.0", 8470), ingest)
    server.add_route("GET", "/metrics", lambda req: (200, {"Content-Type": "text/plain"}, text.encode()))
    server.start()          # serves in a background thread; the caller runs its detection loop
    ...
    server.stop()

A handler gets a `Request` (method, path, query, headers, body, peer) and returns (status, headers, body bytes).
Threaded, HTTP/1.1 keep-alive (one connection per sidecar). A handler that raises becomes a logged 500; the
server keeps serving.

Limits, so that clients that never authenticate cannot hold memory or threads (docs/security.md):
- POST /v1/ingest is authenticated from its headers before the body is read (a route's `before_body`);
- a request head (request line + headers) may hold at most MAX_HEAD_BYTES, a body at most max_body_bytes;
- a connection that has not yet sent an authenticated request must send a whole request within header_timeout_s
  (idle or trickling alike: the deadline is for the whole request, not per read); an authenticated keep-alive
  connection may stay idle for idle_timeout_s; a body must arrive within body_timeout_s;
- at most max_unauthenticated connections that have not authenticated, and max_connections in all; more are
  closed at once.
Each refusal is logged with the peer and the reason (at most one line per reason a second under a flood) and
counted by reason (`rejections`, served on /metrics as sigma_ingest_rejected_total).

Standalone (tests, benches): `python -m sigma.controller.ingest.server --db PATH --keys-file PATH --port N`
(or --secret-file PATH for a shared secret).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import signal
import socket
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

from sigma.controller.ingest.ratelog import RateLimitedLog

log = logging.getLogger("sigma.controller.ingest.server")

MAX_BODY_BYTES = 64 * 1024 * 1024  # a full sidecar batch (20,000 records) is well under 1 MB
MAX_HEAD_BYTES = 32 * 1024
MAX_CONNECTIONS = 4096
MAX_UNAUTHENTICATED = 64
HEADER_TIMEOUT_S = 10.0
IDLE_TIMEOUT_S = 75.0
BODY_TIMEOUT_S = 30.0


@dataclass
class Request:
    method: str
    path: str
    query: dict
    headers: object  # http.client.HTTPMessage: case-insensitive .get()
    body: bytes
    peer: str
    context: object = None  # what the route's before_body returned


Response = tuple[int, dict, bytes]
Handler = Callable[[Request], Response]
# before_body(headers, content_length, peer) -> a Response (a tuple) to refuse the request before its body is read,
# or anything else to read the body and hand it to the handler as Request.context
BeforeBody = Callable[[object, int, str], object]


class HeadTooLarge(Exception):
    """The request head exceeds its limit (answered 431 and closed)."""


class _BoundedReader:
    """The connection's read side, with a byte budget for readline (the request head) and read passed through."""

    def __init__(self, raw):
        self.raw = raw
        self.budget = MAX_HEAD_BYTES

    def readline(self, size: int = -1) -> bytes:
        if self.budget <= 0:
            raise HeadTooLarge()
        line = self.raw.readline(self.budget if size < 0 else min(size, self.budget))
        self.budget -= len(line)
        if self.budget <= 0 and not line.endswith(b"\n"):
            raise HeadTooLarge()
        return line

    def read(self, size: int = -1) -> bytes:
        return self.raw.read(size)

    def close(self) -> None:
        self.raw.close()

    @property
    def closed(self) -> bool:
        return self.raw.closed


@dataclass
class _Conn:
    sock: socket.socket
    peer: str
    deadline: float  # monotonic; the reaper closes the connection after it unless busy
    authenticated: bool = False
    busy: bool = False  # a handler is running: its own time is not the client's
    answered: int = 0  # requests answered on it: past the first, an expired deadline is a keep-alive ending


def json_response(status: int, data) -> Response:
    return status, {"Content-Type": "application/json"}, json.dumps(data).encode()


class ControllerServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 128

    def __init__(self, address: tuple[str, int], ingest=None, *, max_body_bytes: int = MAX_BODY_BYTES,
                 max_connections: int = MAX_CONNECTIONS, max_unauthenticated: int = MAX_UNAUTHENTICATED,
                 header_timeout_s: float = HEADER_TIMEOUT_S, idle_timeout_s: float = IDLE_TIMEOUT_S,
                 body_timeout_s: float = BODY_TIMEOUT_S):
        self.routes: dict[tuple[str, str], tuple[Handler, BeforeBody | None]] = {}
        self.max_body_bytes = max_body_bytes
        self.max_connections = max_connections
        self.max_unauthenticated = max_unauthenticated
        self.header_timeout_s = header_timeout_s
        self.idle_timeout_s = idle_timeout_s
        self.body_timeout_s = body_timeout_s
        self.ingest = ingest
        self.rejections: Counter = Counter()  # reason -> refused requests or connections (HTTP level)
        self.warn = RateLimitedLog(log)
        self._conns: dict[socket.socket, _Conn] = {}
        self._conns_lock = threading.Lock()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._reaper: threading.Thread | None = None
        super().__init__(address, _RequestHandler)
        self.add_route("GET", "/healthz", lambda req: json_response(200, {"ok": True}))
        if ingest is not None:
            self.add_route("POST", "/v1/ingest", self._ingest, before_body=self._authenticate)

    @property
    def port(self) -> int:
        return self.server_address[1]

    def add_route(self, method: str, path: str, handler: Handler, before_body: BeforeBody | None = None) -> None:
        self.routes[(method.upper(), path)] = (handler, before_body)

    def start(self) -> threading.Thread:
        self._thread = threading.Thread(target=self.serve_forever, kwargs={"poll_interval": 0.1},
                                        name="controller-http", daemon=True)
        self._thread.start()
        return self._thread

    def serve_forever(self, poll_interval: float = 0.5) -> None:
        self._reaper = threading.Thread(target=self._reap, name="controller-http-reaper", daemon=True)
        self._reaper.start()
        super().serve_forever(poll_interval)

    def stop(self) -> None:
        self.shutdown()
        self.server_close()
        if self._thread:
            self._thread.join(timeout=5)

    def server_close(self) -> None:
        self._stopping.set()
        super().server_close()

    # ---------- connection limits and deadlines ----------
    def refuse(self, reason: str, peer: str, detail: str) -> None:
        self.rejections[reason] += 1
        self.warn.warning(reason, "HTTP from %s refused: %s [%s]", peer, detail, reason)

    def process_request(self, request, client_address):
        peer = f"{client_address[0]}:{client_address[1]}"
        with self._conns_lock:
            unauthenticated = sum(not c.authenticated for c in self._conns.values())
            if len(self._conns) >= self.max_connections:
                full = f"{len(self._conns)} connections open (max_connections {self.max_connections})"
            elif unauthenticated >= self.max_unauthenticated:
                full = (f"{unauthenticated} connections have not authenticated yet (max_unauthenticated "
                        f"{self.max_unauthenticated})")
            else:
                full = ""
                self._conns[request] = _Conn(request, peer, time.monotonic() + self.header_timeout_s)
        if full:
            self.refuse("too_many_connections", peer, full)
            self.shutdown_request(request)
            return
        super().process_request(request, client_address)

    def shutdown_request(self, request):
        with self._conns_lock:
            self._conns.pop(request, None)
        super().shutdown_request(request)

    def connection_counts(self) -> tuple[int, int]:
        """(authenticated, not yet authenticated) open connections."""
        with self._conns_lock:
            authenticated = sum(c.authenticated for c in self._conns.values())
            return authenticated, len(self._conns) - authenticated

    def conn(self, request) -> _Conn | None:
        return self._conns.get(request)

    def _reap(self) -> None:
        """Close connections past their deadline: a half-sent request does not hold a thread for ever."""
        while not self._stopping.wait(0.25):
            now = time.monotonic()
            with self._conns_lock:
                late = [c for c in self._conns.values() if not c.busy and now > c.deadline]
                for c in late:
                    c.deadline = float("inf")  # once
            for c in late:
                if not c.answered:  # a scrape's or sidecar's idle keep-alive ending is no refusal
                    self.refuse("timeout", c.peer, "no complete request in time (idle or half-sent); closed")
                with contextlib.suppress(OSError):  # already closed by the peer
                    c.sock.shutdown(socket.SHUT_RDWR)  # wakes the handler thread blocked in recv

    # ---------- ingest ----------
    def _authenticate(self, headers, length: int, peer: str):
        caller = self.ingest.authenticate(headers, length, peer)
        if isinstance(caller, tuple):
            return json_response(*caller)
        return caller

    def _ingest(self, req: Request) -> Response:
        caller = req.context
        status, reply = self.ingest.receive(caller, req.body, peer=req.peer)
        return json_response(status, reply)


class _RequestHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # the reply is one small write; Nagle + delayed ACK would hold it ~40 ms
    server: ControllerServer

    def setup(self):
        self.timeout = self.server.body_timeout_s  # per read; the reaper holds the whole-request deadline
        super().setup()
        self.rfile = _BoundedReader(self.rfile)
        self.state = self.server.conn(self.request)
        self.peer = f"{self.client_address[0]}:{self.client_address[1]}"

    def handle_one_request(self):
        self.rfile.budget = MAX_HEAD_BYTES
        try:
            super().handle_one_request()
        except HeadTooLarge:
            self.server.refuse("head_too_large", self.peer, f"request line and headers exceed {MAX_HEAD_BYTES} bytes")
            self.close_connection = True
            self.requestline = getattr(self, "requestline", "-")
            self.request_version = getattr(self, "request_version", "HTTP/1.1")
            self._send_json(431, {"ok": False, "error": f"request head exceeds {MAX_HEAD_BYTES} bytes"}, close=True)
        except OSError:  # reset or shut down by the reaper mid-request
            self.close_connection = True

    def do_GET(self):
        self._dispatch("GET")

    def do_POST(self):
        self._dispatch("POST")

    def do_PUT(self):
        self._dispatch("PUT")

    def do_DELETE(self):
        self._dispatch("DELETE")

    def _dispatch(self, method: str) -> None:
        url = urlsplit(self.path)
        peer = self.peer
        route = self.server.routes.get((method, url.path))
        if route is None:
            known = [m for (m, p) in self.server.routes if p == url.path]
            if method in ("POST", "PUT"):
                self.close_connection = True  # its body is never read
            if known:
                return self._reply_error(405, f"{method} not allowed on {url.path}; use {', '.join(known)}", peer,
                                         close=method in ("POST", "PUT"))
            return self._reply_error(404, f"no route {method} {url.path}", peer, close=method in ("POST", "PUT"))
        handler, before_body = route
        body, context = b"", None
        if method in ("POST", "PUT"):
            length_header = self.headers.get("Content-Length")
            try:
                length = int(length_header) if length_header is not None else -1
            except ValueError:
                length = -1
            if length < 0 or self.headers.get("Transfer-Encoding"):
                self.server.rejections["no_length"] += 1
                return self._reply_error(411, "a Content-Length header is required", peer, close=True)
            if length > self.server.max_body_bytes:
                self.server.rejections["body_too_large"] += 1
                return self._reply_error(413, f"body of {length} bytes exceeds {self.server.max_body_bytes}",
                                         peer, close=True)
            if before_body is not None:
                context = before_body(self.headers, length, peer)
                if isinstance(context, tuple):  # refused before a byte of the body was read
                    return self._send(*context, close=True)
            if self.state is not None:
                self.state.authenticated |= before_body is not None  # it proved who it is: keep-alive allowed
                self.state.deadline = time.monotonic() + self.server.body_timeout_s
            body = self.rfile.read(length)
            if len(body) != length:
                self.server.rejections["short_body"] += 1
                return self._reply_error(400, "body shorter than Content-Length", peer, close=True)
        req = Request(method, url.path, parse_qs(url.query), self.headers, body, peer, context)
        if self.state is not None:
            self.state.busy = True
        try:
            status, headers, payload = handler(req)
        except Exception:  # a broken handler must not take the server down
            log.exception("handler for %s %s failed", method, url.path)
            status, headers, payload = json_response(500, {"ok": False, "error": "internal error (see the log)"})
        self._send(status, headers, payload)

    def _reply_error(self, status: int, reason: str, peer: str, close: bool = False) -> None:
        log.warning("%s %s from %s: %d %s", self.command, self.path, peer, status, reason)
        self._send_json(status, {"ok": False, "error": reason}, close=close)

    def _send_json(self, status: int, data, close: bool = False) -> None:
        self._send(*json_response(status, data), close=close)

    def _send(self, status: int, headers: dict, payload: bytes, close: bool = False) -> None:
        if close:
            headers = {**headers, "Connection": "close"}
            self.close_connection = True
        self.send_response(status)
        for k, v in headers.items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(payload)))
        self._headers_buffer += [b"\r\n", payload]  # end of headers and the body: one write, one segment
        self.flush_headers()
        state = self.state
        if state is not None:  # the next request must come within the idle (authenticated) or header timeout
            state.busy = False
            state.answered += 1
            state.deadline = time.monotonic() + (self.server.idle_timeout_s if state.authenticated
                                                 else self.server.header_timeout_s)

    def log_message(self, format, *args):  # access log only at debug: sidecars post every second
        log.debug("%s - %s", self.address_string(), format % args)


def main(argv: list[str] | None = None) -> int:
    from sigma.controller.ingest.batch import Ingest
    from sigma.security.keys import KeyFileError, KeyRing, read_node_key

    parser = argparse.ArgumentParser(prog="python -m sigma.controller.ingest.server",
                                     description="Serve POST /v1/ingest, GET /healthz and GET /metrics (ingest "
                                                 "counters) into a controller DB.")
    parser.add_argument("--db", required=True, help="controller SQLite database (created if missing)")
    parser.add_argument("--keys-file", default=None, help="per-node key table (mode 0600; `sigma keys issue`)")
    parser.add_argument("--secret-file", default=None, help="shared HMAC secret (mode 0600); flagged as shared")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8470)
    parser.add_argument("--log-level", default="INFO")
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if not args.keys_file and not args.secret_file:
        parser.error("give --keys-file, --secret-file or both")
    try:
        shared = read_node_key(args.secret_file).secret if args.secret_file else None
        keys = KeyRing(args.keys_file, shared)
    except KeyFileError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    server = ControllerServer((args.host, args.port), Ingest(args.db, keys))
    from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

    from sigma.controller.ingest.metrics import IngestCollector

    registry = CollectorRegistry()
    registry.register(IngestCollector(server))
    server.add_route("GET", "/metrics", lambda req: (200, {"Content-Type": CONTENT_TYPE_LATEST},
                                                     generate_latest(registry)))
    signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=server.shutdown).start())
    log.info("serving ingest on %s:%d into %s", args.host, server.port, args.db)
    with contextlib.suppress(KeyboardInterrupt):
        server.serve_forever()
    server.server_close()
    server.ingest.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
