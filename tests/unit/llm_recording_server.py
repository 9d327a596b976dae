"""A local OpenAI-compatible HTTP server that answers chat completions with recorded responses, in order.

The protocol is real (the `openai` client talks to it over HTTP); the answers are recordings
(tests/fixtures/rules/llm-recording-*.json). Requests are kept so tests can check what was asked.
"""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path


class RecordedLLM:
    def __init__(self, recording: Path, delay_s: float = 0.0):
        self.responses = json.loads(Path(recording).read_text())["responses"]
        self.delay_s = delay_s
        self.requests: list[dict] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
                if self.path.rstrip("/") != "/v1/chat/completions":
                    return self._send(404, {"error": {"message": f"no route {self.path}", "type": "not_found"}})
                outer.requests.append(body)
                time.sleep(outer.delay_s)
                i = min(len(outer.requests), len(outer.responses)) - 1
                self._send(200, outer.responses[i])

            def _send(self, status, payload):
                data = json.dumps(payload).encode()
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):  # the client gave up (timeout tests)
                    pass

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.base_url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()
