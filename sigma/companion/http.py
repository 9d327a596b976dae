"""POST /v1/ask on the controller: the companion behind the same authentication as ingest (a key from the key
table, signed headers, the body's digest checked), and its client for `sigma ask --url`.

Request body: {"question": "...", "llm": true}; reply: the Answer as JSON. Any key holder may ask: the answer is
read-only by construction (sigma.companion.safe_sql), whoever asks. `sigma keys issue companion` gives an admin a key
of its own, so no node's key needs to leave its node.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request

from sigma.controller.ingest.server import json_response


def ask_route(db_path: str, ingest):
    """The handler for POST /v1/ask (its headers were authenticated before the body was read)."""
    from sigma.companion.ask import ask
    from sigma.companion.llm import LLMConfig, LLMTier
    from sigma.companion.safe_sql import open_readonly
    from sigma.companion.say import site_tz

    def handle(req):
        refused = ingest.verify(req.context, req.body, req.peer)
        if refused is not None:
            return json_response(*refused)
        try:
            data = json.loads(req.body or b"{}")
            question = data["question"]
            if not isinstance(question, str):
                raise TypeError
        except (ValueError, KeyError, TypeError):
            return json_response(400, {"ok": False, "error": 'body must be JSON {"question": "..."}'})
        cfg = LLMConfig.from_env() if data.get("llm", True) else None
        conn = open_readonly(db_path)
        try:
            answer = ask(conn, question, llm=LLMTier(cfg) if cfg else None, tz=site_tz())
        finally:
            conn.close()
        return json_response(200, {"ok": True, "asked_by": req.context.node, **answer.to_json()})

    return handle


def ask_remote(url: str, key_file: str, question: str, *, llm: bool = True, timeout_s: float = 60.0) -> dict:
    """Ask a controller over HTTP, signing with a key file from `sigma keys issue NAME` (NAME-xxxx <secret>)."""
    from sigma.cli import CommandError
    from sigma.security.keys import read_node_key
    from sigma.telemetry import wire

    key = read_node_key(key_file)
    if key.key_id is None:
        raise CommandError(f"{key_file}: a shared secret cannot ask; issue a key: sigma keys issue companion")
    name = key.key_id.rsplit("-", 1)[0]
    body = json.dumps({"question": question, "llm": llm}).encode()
    headers = {"Content-Type": "application/json", **wire.auth_headers(key.key_id, key.secret, name, body)}
    req = urllib.request.Request(url.rstrip("/") + "/v1/ask", data=body, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:
            return json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        detail = exc.read().decode(errors="replace")[:300]
        raise CommandError(f"{url}/v1/ask refused the question: HTTP {exc.code} {detail}") from None
    except (urllib.error.URLError, OSError) as exc:
        raise CommandError(f"cannot reach the controller at {url}: {exc}") from None
