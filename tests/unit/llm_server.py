"""A local OpenAI-compatible HTTP server for tests: chat completions answered in order from replies the tests
provide — a JSON file in the API's response format (tests/fixtures/rules/llm-recording-*.json) or plain message
texts. The protocol is real (the `openai` client talks to it over HTTP); the replies are written for the tests, not
captured from a model. Requests (and their headers) are kept so tests can check what was asked."""

from __future__ import annotations

import contextlib
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path


def completion(content: str, n: int = 1) -> dict:
    """One chat.completion response carrying `content`."""
    return {"id": f"chatcmpl-{n}", "object": "chat.completion", "created": int(time.time()), "model": "local",
            "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": content}}],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}


class LocalLLM:
    def __init__(self, recording: Path | None = None, delay_s: float = 0.0, *, replies: list[str] | None = None):
        if recording is not None:
            self.responses = json.loads(Path(recording).read_text())["responses"]
        else:
            self.responses = [completion(text, i + 1) for i, text in enumerate(replies or [])]
        self.delay_s = delay_s
        self.requests: list[dict] = []   # request bodies
        self.headers: list[dict] = []    # their headers, names lower-cased
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
                if self.path.rstrip("/") != "/v1/chat/completions":
                    return self._send(404, {"error": {"message": f"no route {self.path}", "type": "not_found"}})
                outer.requests.append(body)
                outer.headers.append({k.lower(): v for k, v in self.headers.items()})
                time.sleep(outer.delay_s)
                i = min(len(outer.requests), len(outer.responses)) - 1
                self._send(200, outer.responses[i])

            def _send(self, status, payload):
                data = json.dumps(payload).encode()
                with contextlib.suppress(BrokenPipeError, ConnectionResetError):  # the client gave up (timeouts)
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)

            def log_message(self, *args):
                """Requests are kept in `requests`, not logged."""

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
