"""A local OpenAI-compatible chat-completions server for tests. Its replies are scripted by the test (written for
it, not recorded from a model); the protocol is the real one, spoken by the real `openai` client."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class ScriptedLLM:
    def __init__(self, replies: list[str], delay_s: float = 0.0):
        self.replies = list(replies)
        self.requests: list[dict] = []
        self.delay_s = delay_s
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                owner.requests.append({"path": self.path, "body": body,
                                       "auth": self.headers.get("Authorization", "")})
                time.sleep(owner.delay_s)
                content = owner.replies.pop(0) if owner.replies else "I have nothing more to say."
                reply = json.dumps({
                    "id": f"chatcmpl-{len(owner.requests)}", "object": "chat.completion", "created": int(time.time()),
                    "model": body.get("model", ""), "choices": [{"index": 0, "finish_reason": "stop",
                                                                 "message": {"role": "assistant", "content": content}}],
                    "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()
