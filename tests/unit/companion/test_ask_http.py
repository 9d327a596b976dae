"""POST /v1/ask: the companion behind the controller's ingest authentication, over real HTTP."""

from __future__ import annotations

import http.client
import json

import pytest

from sigma.companion.evaluate import load_dump
from sigma.companion.http import ask_remote, ask_route
from sigma.controller.ingest.batch import Ingest
from sigma.controller.ingest.server import ControllerServer
from sigma.security.keys import KeyRing, KeyTable, node_key_text, write_private
from sigma.telemetry import wire
from tests.conftest import FIXTURES


@pytest.fixture
def controller(tmp_path):
    db = tmp_path / "controller.db"
    load_dump(FIXTURES / "companion" / "soak.sql", db).close()
    table = KeyTable(tmp_path / "keys.json")
    key = table.issue("companion")
    table.save()
    write_private(tmp_path / "companion.key", node_key_text(key))
    srv = ControllerServer(("127.0.0.1", 0), Ingest(tmp_path / "ingest.db", KeyRing(table.path)))
    srv.add_route("POST", "/v1/ask", ask_route(str(db), srv.ingest), before_body=srv._authenticate)
    srv.start()
    yield srv, tmp_path / "companion.key", key
    srv.stop()
    srv.ingest.close()


def test_a_signed_question_gets_the_answer(controller, monkeypatch):
    srv, key_file, _ = controller
    monkeypatch.delenv("SIGMA_LLM_BASE_URL", raising=False)
    reply = ask_remote(f"http://127.0.0.1:{srv.port}", str(key_file),
                       "which nodes were drained for xid errors?")
    assert reply["ok"] and reply["asked_by"] == "companion" and reply["intent"] == "drains" and reply["status"] == "fact"
    drained = load_dump(FIXTURES / "companion" / "soak.sql").execute(
        "SELECT DISTINCT a.target FROM actions a JOIN incidents i ON i.id = a.incident_id WHERE a.kind = 'drain' "
        "AND a.state = 'done' AND i.rule_id LIKE 'gpu-xid-%' ORDER BY 1")
    assert [r[0] for r in reply["rows"]] == [r[0] for r in drained] and reply["sql"].startswith("WITH")


def post(srv, body: bytes, headers: dict) -> tuple[int, dict]:
    c = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=10)
    c.request("POST", "/v1/ask", body=body, headers={"Content-Type": "application/json", **headers})
    resp = c.getresponse()
    out = resp.status, json.loads(resp.read() or b"{}")
    c.close()
    return out


def test_unsigned_forged_and_malformed_questions_are_refused(controller):
    srv, _, key = controller
    body = json.dumps({"question": "which rules fired?"}).encode()
    assert post(srv, body, {})[0] == 401
    signed = wire.auth_headers(key.id, key.secret.encode(), "companion", body)
    other = json.dumps({"question": "which nodes are down right now?"}).encode()
    status, reply = post(srv, other.ljust(len(body))[:len(body)], signed)  # same length, other bytes
    assert status == 400 and "does not match" in reply["error"]
    bad = b'{"q": 1}'
    assert post(srv, bad, wire.auth_headers(key.id, key.secret.encode(), "companion", bad))[0] == 400
