"""Who may speak for a node, over real HTTP: per-node keys, rotation, auth before the body, limits and deadlines."""

from __future__ import annotations

import contextlib
import http.client
import json
import math
import socket
import time

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from sigma.controller.db import open_db
from sigma.controller.ingest.batch import Ingest
from sigma.controller.ingest.metrics import IngestCollector
from sigma.controller.ingest.server import ControllerServer
from sigma.security.keys import KeyRing, KeyTable, NodeKey, node_key_text, read_node_key, write_private
from sigma.telemetry import wire


@pytest.fixture
def keys(tmp_path):
    table = KeyTable(tmp_path / "keys.json")
    issued = {n: table.issue(n) for n in ("node1", "node2")}
    table.save()
    return table, {n: NodeKey(k.id, k.secret.encode()) for n, k in issued.items()}


def make_server(tmp_path, ring, **limits):
    srv = ControllerServer(("127.0.0.1", 0), Ingest(tmp_path / "c.db", ring), **limits)
    srv.start()
    return srv


@pytest.fixture
def server(tmp_path, keys):
    ring = KeyRing(keys[0].path)
    ring.RELOAD_CHECK_S = 0.0
    srv = make_server(tmp_path, ring, header_timeout_s=0.5, max_unauthenticated=4)
    yield srv
    srv.stop()
    srv.ingest.close()


def batch(node="node1", seq=1, ts=None) -> bytes:
    t = time.time() - 5 if ts is None else ts
    return wire.encode_binary_batch(node, seq, time.time(), [(t, "host.load1", 1.0, "{}", "[]")],
                                    [(t, "log", "xid", "error", "Xid 79", "{}", "[]")], [])


def post(srv, body: bytes, key: NodeKey, node="node1", headers=None, conn=None):
    h = {"Content-Type": "application/octet-stream", **wire.auth_headers(key.key_id, key.secret, node, body)}
    h.update(headers or {})
    c = conn or http.client.HTTPConnection("127.0.0.1", srv.port, timeout=10)
    c.request("POST", "/v1/ingest", body=body, headers=h)
    resp = c.getresponse()
    reply = json.loads(resp.read() or b"{}")
    if conn is None:
        c.close()
    return resp.status, reply


def stored(srv) -> list[tuple]:
    db = open_db(srv.ingest.db_path, readonly=True)
    try:
        return [tuple(r) for r in db.execute("SELECT node, seq FROM batches ORDER BY node, seq")]
    finally:
        db.close()


def metrics(srv) -> str:
    reg = CollectorRegistry()
    reg.register(IngestCollector(srv))
    return generate_latest(reg).decode()


def test_a_nodes_key_posts_only_as_that_node(server, keys):
    _, k = keys
    assert post(server, batch("node1"), k["node1"])[0] == 200
    status, reply = post(server, batch("node2", seq=2), k["node1"], node="node2")
    assert status == 403 and "belongs to node node1, not to node2" in reply["error"]
    assert post(server, batch("node2", seq=3), k["node2"], node="node2")[0] == 200
    assert stored(server) == [("node1", 1), ("node2", 3)]
    assert 'sigma_ingest_rejected_total{reason="wrong_node"} 1.0' in metrics(server)
    # a forged signature and an unknown key id are refused too
    forged = NodeKey(k["node2"].key_id, b"f" * 64)
    assert post(server, batch("node2", seq=4), forged, node="node2")[1]["error"].startswith("bad signature")
    assert "unknown key" in post(server, batch("node2", seq=5), NodeKey("node9-0", b"f" * 64), node="node2")[1]["error"]
    # the shared-secret style (no key id) is refused where only per-node keys are configured
    assert post(server, batch("node1", seq=6), NodeKey(None, k["node1"].secret))[0] == 401


def test_rotation_accepts_old_and_new_key_during_the_grace_period_then_only_the_new(server, keys):
    table, k = keys
    table.load()
    new = table.rotate("node1", grace_s=1.0)
    table.save()
    new_key = NodeKey(new.id, new.secret.encode())
    assert post(server, batch(seq=1), k["node1"])[0] == 200  # old key, in grace
    assert post(server, batch(seq=2), new_key)[0] == 200
    time.sleep(1.1)
    status, reply = post(server, batch(seq=3), k["node1"])
    assert status == 401 and "expired" in reply["error"]
    assert post(server, batch(seq=4), new_key)[0] == 200
    assert stored(server) == [("node1", 1), ("node1", 2), ("node1", 4)]


def test_refused_before_the_body_is_read(server, keys):
    """A request that claims 50 MB (under the size limit) and has a bad signature is answered without the server
    waiting for a byte of its body (the client sends none)."""
    _, k = keys
    forged = NodeKey(k["node1"].key_id, b"0" * 64)
    h = wire.auth_headers(forged.key_id, forged.secret, "node1", b"x")
    head = "".join(f"{a}: {b}\r\n" for a, b in h.items())
    with socket.create_connection(("127.0.0.1", server.port), timeout=5) as s:
        s.sendall(f"POST /v1/ingest HTTP/1.1\r\nHost: x\r\nContent-Length: 50000000\r\n{head}\r\n".encode())
        reply = s.recv(4096)
    assert reply.startswith(b"HTTP/1.0 401") or reply.startswith(b"HTTP/1.1 401")
    assert b"Connection: close" in reply
    # a body signed the old way (version 1) is read only up to a small limit
    big = b"x" * (2 << 20)
    v1 = {wire.HEADER_NODE: "node1", wire.HEADER_TS: f"{time.time():.3f}", wire.HEADER_SIG: "0" * 64,
          wire.HEADER_KEY: k["node1"].key_id}
    c = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
    with contextlib.suppress(BrokenPipeError, ConnectionResetError):  # closed before the client finished sending:
        c.request("POST", "/v1/ingest", body=big, headers=v1)     # also refused
        assert c.getresponse().status == 413
    c.close()
    text = metrics(server)
    assert 'reason="bad_signature"' in text and 'reason="unverified_too_large"' in text


@pytest.mark.parametrize("ts", ["nan", "inf", "-inf", "1e308", f"{time.time() - 3600:.3f}"])
def test_non_finite_and_far_off_request_times_are_refused(server, keys, ts):
    _, k = keys
    body = batch()
    h = wire.auth_headers(k["node1"].key_id, k["node1"].secret, "node1", body, timestamp=ts)
    status, reply = post(server, body, k["node1"], headers=h)
    assert status == 401 and ("finite" in reply["error"] or "NTP" in reply["error"])
    assert stored(server) == []


def test_rows_with_absurd_times_are_dropped_and_the_rest_stored(server, keys):
    _, k = keys
    now = time.time()
    samples = [(t, "host.load1", 1.0, "{}", "[]") for t in (now - 5, math.nan, math.inf, 1e12, 5.0)]
    events = [(now - 5, "log", "xid", "error", "ok", "{}", "[]"), (1e300, "log", "xid", "error", "bad", "{}", "[]")]
    body = wire.encode_binary_batch("node1", 1, now, samples, events, [])
    status, reply = post(server, body, k["node1"])
    assert status == 200 and reply["stored"] == {"samples": 1, "events": 1, "kpis": 0}
    assert reply["dropped"] == {"samples": 4, "events": 1}
    assert 'sigma_ingest_dropped_rows_total{reason="samples_bad_timestamp"} 4.0' in metrics(server)


def test_half_sent_request_is_dropped_while_a_valid_client_keeps_posting(server, keys):
    _, k = keys
    slow = socket.create_connection(("127.0.0.1", server.port), timeout=5)
    slow.sendall(b"POST /v1/ingest HTTP/1.1\r\nHost: x\r\n")  # and never the rest
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
    for seq in range(1, 4):
        assert post(server, batch(seq=seq), k["node1"], conn=conn)[0] == 200
    deadline = time.monotonic() + 5
    closed = False
    while time.monotonic() < deadline and not closed:  # trickle bytes: the deadline is for the whole request
        try:
            slow.sendall(b"X")
            slow.settimeout(0)
            closed = slow.recv(1) == b""
        except BlockingIOError:
            pass
        except OSError:
            closed = True
        time.sleep(0.1)
    slow.close()
    assert closed
    assert post(server, batch(seq=4), k["node1"], conn=conn)[0] == 200  # the authenticated keep-alive survives
    conn.close()
    assert 'sigma_ingest_rejected_total{reason="timeout"} 1.0' in metrics(server)


def test_unauthenticated_connections_are_bounded_and_cannot_evict_a_sidecar(tmp_path, keys):
    _, k = keys
    server = make_server(tmp_path, KeyRing(keys[0].path), max_unauthenticated=4)
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
    assert post(server, batch(seq=1), k["node1"], conn=conn)[0] == 200
    idle = [socket.create_connection(("127.0.0.1", server.port), timeout=5) for _ in range(6)]
    time.sleep(0.2)
    refused = 0
    for s in idle:
        s.settimeout(0)  # look, do not wait
        with contextlib.suppress(BlockingIOError):  # nothing to read: still open
            refused += s.recv(1) == b""
    assert refused == 2  # max_unauthenticated=4
    assert post(server, batch(seq=2), k["node1"], conn=conn)[0] == 200
    for s in idle:
        s.close()
    conn.close()
    assert 'sigma_ingest_rejected_total{reason="too_many_connections"} 2.0' in metrics(server)
    server.stop()
    server.ingest.close()


def test_oversized_head_gets_431(server):
    with socket.create_connection(("127.0.0.1", server.port), timeout=5) as s:
        s.sendall(b"GET /healthz HTTP/1.1\r\n" + b"X-Pad: " + b"a" * 40000 + b"\r\n\r\n")
        assert s.recv(100).split(b" ")[1] == b"431"


def test_shared_secret_is_accepted_only_when_configured_and_flagged(tmp_path):
    shared = b"s" * 32
    srv = make_server(tmp_path, KeyRing(None, shared))
    try:
        assert post(srv, batch(), NodeKey(None, shared))[0] == 200
        assert "sigma_ingest_shared_key 1.0" in metrics(srv)
        db = open_db(srv.ingest.db_path, readonly=True)
        auth = json.loads(db.execute("SELECT value FROM detector_state WHERE key = 'ingest.auth'").fetchone()[0])
        db.close()
        assert auth["shared_key"] is True
    finally:
        srv.stop()
        srv.ingest.close()


def test_key_files_are_private_and_parsed(tmp_path):
    path = tmp_path / "node1.key"
    write_private(path, b"node1-ab12 " + b"9" * 64 + b"\n")
    assert read_node_key(path) == NodeKey("node1-ab12", b"9" * 64)
    path.chmod(0o644)
    with pytest.raises(ValueError, match="mode 0644; it must be 0600"):
        read_node_key(path)
    path.chmod(0o600)
    path.write_bytes(b"a b c\n")
    with pytest.raises(ValueError, match="found 3 fields"):
        read_node_key(path)


def test_pusher_signs_with_a_rotated_key_file_once_it_changes(tmp_path, keys):
    from sigma.telemetry.push import Pusher
    from sigma.telemetry.store import NodeStore

    table, k = keys
    key_file = tmp_path / "node1.key"
    write_private(key_file, node_key_text(table.keys[0]))
    pusher = Pusher(NodeStore(tmp_path / "n.db", "node1"), "node1", "http://127.0.0.1:1/v1/ingest",
                    read_node_key(key_file), key_file=str(key_file))
    assert pusher.key.key_id == k["node1"].key_id
    new = table.rotate("node1", 60)
    write_private(key_file, node_key_text(new))
    assert pusher.reload_key() and pusher.key.key_id == new.id
    key_file.chmod(0o644)  # a broken new file: the running key stays
    assert not pusher.reload_key(force=True) and pusher.key.key_id == new.id


def test_sigma_report_flags_a_shared_secret_and_keys_cli_round_trip(tmp_path, capsys):
    from sigma.cli import main

    Ingest(tmp_path / "shared.db", b"s" * 32).close()
    assert main(["report", "--db", str(tmp_path / "shared.db")]) == 0
    assert "shared secret is accepted" in capsys.readouterr().out
    Ingest(tmp_path / "keyed.db", KeyRing(None, None)).close()
    assert main(["report", "--db", str(tmp_path / "keyed.db")]) == 0
    assert "shared secret" not in capsys.readouterr().out

    table, out = tmp_path / "keys.json", tmp_path / "keys"
    assert main(["keys", "issue", "node1", "node2", "--table", str(table), "--out", str(out)]) == 0
    assert oct(table.stat().st_mode & 0o777) == "0o600" and oct((out / "node1.key").stat().st_mode & 0o777) == "0o600"
    first = read_node_key(out / "node1.key")
    assert main(["keys", "rotate", "node1", "--table", str(table), "--out", str(out), "--grace", "60"]) == 0
    second = read_node_key(out / "node1.key")
    ring = KeyRing(table)
    assert ring.lookup(first.key_id)[0] == "node1" and ring.lookup(second.key_id)[0] == "node1"
    assert main(["keys", "revoke", "node2", "--table", str(table)]) == 0
    capsys.readouterr()
    assert main(["keys", "list", "--table", str(table)]) == 0
    listed = capsys.readouterr().out
    assert first.key_id in listed and second.key_id in listed and "node2" not in listed
    assert first.secret.decode() not in listed
    assert main(["keys", "issue", "node1", "--table", str(table), "--out", str(out)]) == 2  # already has one
