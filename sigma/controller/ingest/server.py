"""The controller's HTTP server: POST /v1/ingest and GET /healthz, plus routes the controller adds.

    server = ControllerServer(("0.0.0.0", 8470), ingest)
    server.add_route("GET", "/metrics", lambda req: (200, {"Content-Type": "text/plain"}, text.encode()))
    server.start()          # serves in a background thread; the caller runs its detection loop
    ...
    server.stop()

A handler gets a `Request` (method, path, query, headers, body, peer) and returns (status, headers, body bytes).
Threaded, HTTP/1.1 keep-alive (one connection per sidecar). A handler that raises becomes a logged 500; the
server keeps serving.

Standalone (tests, benches): `python -m sigma.controller.ingest.server --db PATH --secret-file PATH --port N`.
"""

from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

log = logging.getLogger("sigma.controller.ingest.server")

MAX_BODY_BYTES = 256 * 1024 * 1024


@dataclass
class Request:
    method: str
    path: str
    query: dict
    headers: object  # http.client.HTTPMessage: case-insensitive .get()
    body: bytes
    peer: str


Response = tuple[int, dict, bytes]
Handler = Callable[[Request], Response]


def json_response(status: int, data) -> Response:
    return status, {"Content-Type": "application/json"}, json.dumps(data).encode()


class ControllerServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], ingest=None, *, max_body_bytes: int = MAX_BODY_BYTES):
        self.routes: dict[tuple[str, str], Handler] = {}
        self.max_body_bytes = max_body_bytes
        self.ingest = ingest
        self._thread: threading.Thread | None = None
        super().__init__(address, _RequestHandler)
        self.add_route("GET", "/healthz", lambda req: json_response(200, {"ok": True}))
        if ingest is not None:
            self.add_route("POST", "/v1/ingest", self._ingest)

    @property
    def port(self) -> int:
        return self.server_address[1]

    def add_route(self, method: str, path: str, handler: Handler) -> None:
        self.routes[(method.upper(), path)] = handler

    def start(self) -> threading.Thread:
        self._thread = threading.Thread(target=self.serve_forever, kwargs={"poll_interval": 0.1},
                                        name="controller-http", daemon=True)
        self._thread.start()
        return self._thread

    def stop(self) -> None:
        self.shutdown()
        self.server_close()
        if self._thread:
            self._thread.join(timeout=5)

    def _ingest(self, req: Request) -> Response:
        status, reply = self.ingest.handle(req.headers, req.body, peer=req.peer)
        return json_response(status, reply)


class _RequestHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # the reply is one small write; Nagle + delayed ACK would hold it ~40 ms
    server: ControllerServer

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
        peer = f"{self.client_address[0]}:{self.client_address[1]}"
        body = b""
        length_header = self.headers.get("Content-Length")
        if method in ("POST", "PUT"):
            try:
                length = int(length_header) if length_header is not None else -1
            except ValueError:
                length = -1
            if length < 0:
                return self._reply_error(411, "a Content-Length header is required", peer, close=True)
            if length > self.server.max_body_bytes:
                return self._reply_error(413, f"body of {length} bytes exceeds {self.server.max_body_bytes}",
                                         peer, close=True)
            body = self.rfile.read(length)
            if len(body) != length:
                return self._reply_error(400, "body shorter than Content-Length", peer, close=True)
        handler = self.server.routes.get((method, url.path))
        if handler is None:
            known = [m for (m, p) in self.server.routes if p == url.path]
            if known:
                return self._reply_error(405, f"{method} not allowed on {url.path}; use {', '.join(known)}", peer)
            return self._reply_error(404, f"no route {method} {url.path}", peer)
        req = Request(method, url.path, parse_qs(url.query), self.headers, body, peer)
        try:
            status, headers, payload = handler(req)
        except Exception:  # a broken handler must not take the server down
            log.exception("handler for %s %s failed", method, url.path)
            status, headers, payload = json_response(500, {"ok": False, "error": "internal error (see the log)"})
        self._send(status, headers, payload)

    def _reply_error(self, status: int, reason: str, peer: str, close: bool = False) -> None:
        log.warning("%s %s from %s: %d %s", self.command, self.path, peer, status, reason)
        status, headers, payload = json_response(status, {"ok": False, "error": reason})
        if close:
            headers["Connection"] = "close"
            self.close_connection = True
        self._send(status, headers, payload)

    def _send(self, status: int, headers: dict, payload: bytes) -> None:
        self.send_response(status)
        for k, v in headers.items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(payload)))
        self._headers_buffer += [b"\r\n", payload]  # end of headers and the body: one write, one segment
        self.flush_headers()

    def log_message(self, format, *args):  # access log only at debug: sidecars post every second
        log.debug("%s - %s", self.address_string(), format % args)


def main(argv: list[str] | None = None) -> int:
    from sigma.controller.ingest.batch import Ingest
    from sigma.telemetry.wire import SecretError, read_secret

    parser = argparse.ArgumentParser(prog="python -m sigma.controller.ingest.server",
                                     description="Serve POST /v1/ingest and GET /healthz into a controller DB.")
    parser.add_argument("--db", required=True, help="controller SQLite database (created if missing)")
    parser.add_argument("--secret-file", required=True, help="shared HMAC secret (mode 0600)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8470)
    parser.add_argument("--log-level", default="INFO")
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        secret = read_secret(args.secret_file)
    except SecretError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    server = ControllerServer((args.host, args.port), Ingest(args.db, secret))
    signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=server.shutdown).start())
    log.info("serving ingest on %s:%d into %s", args.host, server.port, args.db)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    server.server_close()
    server.ingest.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
