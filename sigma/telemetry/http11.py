"""A minimal keep-alive HTTP/1.1 client for the push: one request = one sendall, the reply parsed by hand.

http.client parses every reply's headers with the email package and sends headers and body in separate
writes; at one small request per second per node that overhead is most of the push's CPU. This client sends
`POST` with Content-Length and reads replies that carry a Content-Length (all the controller sends).
"""

from __future__ import annotations

import socket
import ssl


class Disconnected(ConnectionError):
    """The server closed the kept-alive connection before answering (retry on a fresh one)."""


class Connection:
    def __init__(self, host: str, port: int, *, timeout: float, tls: bool = False):
        self.host, self.port, self.timeout, self.tls = host, port, timeout, tls
        self.sock: socket.socket | None = None
        self._buf = b""

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None
        self._buf = b""

    def _connect(self) -> socket.socket:
        sock = socket.create_connection((self.host, self.port), timeout=self.timeout)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if self.tls:
            sock = ssl.create_default_context().wrap_socket(sock, server_hostname=self.host)
        return sock

    def post(self, path: str, headers: dict, body: bytes) -> tuple[int, dict, bytes]:
        """Returns (status, lower-cased headers, body)."""
        fresh = self.sock is None
        if fresh:
            self.sock = self._connect()
        head = [f"POST {path} HTTP/1.1", f"Host: {self.host}:{self.port}", f"Content-Length: {len(body)}"]
        head += [f"{k}: {v}" for k, v in headers.items() if k.lower() != "content-length"]
        self.sock.sendall(("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + body)
        status_line, reply_headers = self._read_head(fresh)
        parts = status_line.split(" ", 2)
        if len(parts) < 2 or not parts[0].startswith("HTTP/") or not parts[1].isdigit():
            raise ConnectionError(f"bad HTTP status line {status_line[:100]!r}")
        length = reply_headers.get("content-length")
        if length is None or not length.isdigit():
            raise ConnectionError("reply without a Content-Length")
        data = self._read_exact(int(length))
        if reply_headers.get("connection", "").lower() == "close":
            self.close()
        return int(parts[1]), reply_headers, data

    def _recv(self) -> bytes:
        chunk = self.sock.recv(65536)
        if not chunk:
            raise Disconnected("connection closed by the server")
        return chunk

    def _read_head(self, fresh: bool) -> tuple[str, dict]:
        while b"\r\n\r\n" not in self._buf:
            try:
                self._buf += self._recv()
            except Disconnected:
                if fresh or self._buf:
                    raise ConnectionError("connection closed while reading the reply") from None
                raise
            if len(self._buf) > 65536:
                raise ConnectionError("reply headers too long")
        head, _, self._buf = self._buf.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        headers = {}
        for line in lines[1:]:
            key, _, value = line.partition(":")
            headers[key.strip().lower()] = value.strip()
        return lines[0], headers

    def _read_exact(self, n: int) -> bytes:
        while len(self._buf) < n:
            try:
                self._buf += self._recv()
            except Disconnected:
                raise ConnectionError("connection closed while reading the reply body") from None
        data, self._buf = self._buf[:n], self._buf[n:]
        return data
