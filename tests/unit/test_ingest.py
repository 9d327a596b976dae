"""Controller ingest over real HTTP: stores a signed batch once; rejects bad payloads and secrets with a 4xx."""

from __future__ import annotations

import http.client
import json
import os
import time

import pytest

from sigma.controller.db import open_db
from sigma.controller.ingest.batch import Ingest
from sigma.controller.ingest.server import ControllerServer, json_response
from sigma.telemetry import wire

SECRET = b"0123456789abcdef0123456789abcdef"
T0 = float(int(time.time()) - 1000)  # row times must be recent: far past and future ones are dropped


@pytest.fixture
def server(tmp_path):
    srv = ControllerServer(("127.0.0.1", 0), Ingest(tmp_path / "c.db", SECRET))
    srv.start()
    yield srv
    srv.stop()
    srv.ingest.close()


def post(server, body: bytes, *, node="node1", secret=SECRET, ts=None, headers=None, path="/v1/ingest"):
    ts = ts or f"{time.time():.3f}"
    h = {wire.HEADER_NODE: node, wire.HEADER_TS: ts, wire.HEADER_SIG: wire.sign(secret, node, ts, body),
         "Content-Type": "application/json"}
    h.update(headers or {})
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
    conn.request("POST", path, body=body, headers=h)
    resp = conn.getresponse()
    reply = json.loads(resp.read() or b"{}")
    conn.close()
    return resp.status, reply


def batch(seq=1, node="node1", n=3) -> bytes:
    samples = [(T0 + 100.0 + i, "host.load1" if i % 2 else "gpu.temp_c", float(i), '{"gpu":"0"}' if i % 2 == 0 else "{}",
                "[42]") for i in range(n)]
    events = [(T0 + 101.0, "log", "xid", "error", "Xid 79", '{"xid":79}', "[42]")]
    kpis = [(T0 + 102.0, 42, 0, 7, 2.5, 0.4, 1000.0, None, 1.1, '{"expert_load":[1,2]}')]
    return wire.encode_batch(node, seq, time.time(), samples, events, kpis)


def counts(server) -> tuple:
    db = open_db(server.ingest.db_path, readonly=True)
    try:
        return tuple(db.execute(f"SELECT count(*) FROM {t}").fetchone()[0]
                     for t in ("batches", "samples", "events", "kpis"))
    finally:
        db.close()


def test_batch_is_stored_once_with_node_and_job_ids(server):
    status, reply = post(server, batch(seq=5))
    assert status == 200 and reply == {"ok": True, "seq": 5, "duplicate": False,
                                       "stored": {"samples": 3, "events": 1, "kpis": 1}}
    status, reply = post(server, batch(seq=5))  # a retry after a lost ack
    assert status == 200 and reply["duplicate"] is True
    assert counts(server) == (1, 3, 1, 1)
    db = open_db(server.ingest.db_path, readonly=True)
    rows = db.execute("SELECT node, ts, metric, value, labels, job_ids FROM samples ORDER BY ts").fetchall()
    assert [tuple(r) for r in rows] == [("node1", T0 + 100.0, "gpu.temp_c", 0.0, '{"gpu":"0"}', "[42]"),
                                        ("node1", T0 + 101.0, "host.load1", 1.0, "{}", "[42]"),
                                        ("node1", T0 + 102.0, "gpu.temp_c", 2.0, '{"gpu":"0"}', "[42]")]
    kpi = db.execute("SELECT node, job_id, rank, step, loss, payload FROM kpis").fetchone()
    assert tuple(kpi) == ("node1", 42, 0, 7, 2.5, '{"expert_load":[1,2]}')
    event = db.execute("SELECT node, source, kind, fields FROM events").fetchone()
    assert tuple(event) == ("node1", "log", "xid", '{"xid":79}')


def test_wrong_secret_missing_headers_and_stale_timestamp_get_401(server):
    assert post(server, batch(), secret=b"not-the-secret-at-all-000000000")[0] == 401
    status, reply = post(server, batch(), headers={wire.HEADER_SIG: ""})
    assert status == 401 and "missing authentication" in reply["error"]
    status, reply = post(server, batch(), ts=f"{time.time() - 3600:.3f}")
    assert status == 401 and "NTP" in reply["error"]
    body = batch()
    ts = f"{time.time():.3f}"
    tampered = body.replace(b'"Xid 79"', b'"Xid 13"')
    status, _ = post(server, tampered, ts=ts, headers={wire.HEADER_SIG: wire.sign(SECRET, "node1", ts, body)})
    assert status == 401
    assert counts(server) == (0, 0, 0, 0)


def _mutate(**changes) -> bytes:
    d = json.loads(batch())
    for key, value in changes.items():
        if "." in key:
            a, b = key.split(".")
            d[a][b] = value
        else:
            d[key] = value
    return json.dumps(d).encode()


@pytest.mark.parametrize("body, reason", [
    (b"{not json", "not JSON"),
    (b"[1, 2]", "JSON object"),
    (_mutate(v=99), "unsupported batch version"),
    (_mutate(node="node2"), "differs from the signed node"),
    (_mutate(seq="7"), "seq must be"),
    (_mutate(seq=-1), "seq must be"),
    (_mutate(seq=2**64), "seq must be"),
    (_mutate(series=[["m", "{}"]]), "series[0]"),
    (_mutate(**{"samples.s": [0, 0, 9]}), "indexes into series"),
    (_mutate(**{"samples.ts": [1.0, "x", 2.0]}), "samples.ts must hold numbers"),
    (_mutate(**{"samples.v": [1.0, 2.0]}), "differ in length"),
    (_mutate(events=[[1.0, "log", "xid"]]), "events[0] must be a list of 7"),
    (_mutate(kpis=[[1.0, "42", 0, 1, 2.5, None, None, None, None, "{}"]]), "kpis[0].job_id"),
    (_mutate(kpis=[[T0, 2**70, 0, 1, 2.5, None, None, None, None, "{}"]]), "number out of range"),
])
def test_malformed_batches_get_400_with_a_reason_and_nothing_is_stored(server, body, reason):
    status, reply = post(server, body)
    assert status == 400 and reason in reply["error"]
    assert counts(server) == (0, 0, 0, 0)
    assert post(server, batch(seq=2))[0] == 200  # still serving


def test_http_errors_and_extra_routes(server):
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
    conn.request("GET", "/healthz")
    resp = conn.getresponse()
    assert resp.status == 200 and json.loads(resp.read()) == {"ok": True}
    conn.request("GET", "/v1/ingest")
    resp = conn.getresponse()
    assert resp.status == 405 and b"POST" in resp.read()
    conn.request("GET", "/nope")
    resp = conn.getresponse()
    assert resp.status == 404 and resp.read()
    server.add_route("GET", "/metrics", lambda req: (200, {"Content-Type": "text/plain"}, b"sigma_up 1\n"))
    server.add_route("GET", "/boom", lambda req: 1 / 0)
    conn.request("GET", "/metrics")
    resp = conn.getresponse()
    assert resp.status == 200 and resp.read() == b"sigma_up 1\n"
    conn.request("GET", "/boom")
    resp = conn.getresponse()
    assert resp.status == 500 and resp.read()
    conn.request("GET", "/healthz")  # the same keep-alive connection still works
    assert conn.getresponse().status == 200
    conn.close()
    big = ControllerServer(("127.0.0.1", 0), server.ingest, max_body_bytes=100)
    big.start()
    try:
        assert post(big, batch(n=50))[0] == 413
    finally:
        big.server_close()
        big.shutdown()
    assert json_response(201, {"a": 1})[0] == 201


def test_secret_file_must_be_private(tmp_path):
    path = tmp_path / "secret"
    secret = wire.write_secret(path)
    assert oct(path.stat().st_mode & 0o777) == "0o600" and wire.read_secret(path) == secret
    os.chmod(path, 0o644)
    with pytest.raises(wire.SecretError, match="mode 0644; it must be 0600"):
        wire.read_secret(path)
    os.chmod(path, 0o600)
    path.write_text("short")
    with pytest.raises(wire.SecretError, match="shorter than 16"):
        wire.read_secret(path)
    with pytest.raises(wire.SecretError, match="cannot read"):
        wire.read_secret(tmp_path / "missing")


def binary_batch(seq=1, node="node1", n=3) -> bytes:
    samples = [(T0 + 100.0 + i, "host.load1" if i % 2 else "gpu.temp_c", None if i == 1 else float(i),
                '{"gpu":"0"}' if i % 2 == 0 else "{}", "[42]") for i in range(n)]
    events = [(T0 + 101.0, "log", "xid", "error", "Xid 79", '{"xid":79}', "[42]")]
    return wire.encode_binary_batch(node, seq, time.time(), samples, events, [])


def test_binary_batch_is_stored_once_and_nan_becomes_null(server):
    status, reply = post(server, binary_batch(seq=9))
    assert status == 200 and reply["stored"] == {"samples": 3, "events": 1, "kpis": 0}
    assert post(server, binary_batch(seq=9))[1]["duplicate"] is True
    db = open_db(server.ingest.db_path, readonly=True)
    rows = db.execute("SELECT node, ts, metric, value, labels, job_ids FROM samples ORDER BY ts").fetchall()
    assert [tuple(r) for r in rows] == [("node1", T0 + 100.0, "gpu.temp_c", 0.0, '{"gpu":"0"}', "[42]"),
                                        ("node1", T0 + 101.0, "host.load1", None, "{}", "[42]"),
                                        ("node1", T0 + 102.0, "gpu.temp_c", 2.0, '{"gpu":"0"}', "[42]")]
    db.close()
    assert counts(server) == (1, 3, 1, 0)


def _binary_mutate(header_changes=None, columns=None) -> bytes:
    body = binary_batch()
    start = len(wire.BINARY_MAGIC)
    end = body.index(b"\n", start)
    header = json.loads(body[start:end])
    header.update(header_changes or {})
    return wire.BINARY_MAGIC + json.dumps(header).encode() + b"\n" + (body[end + 1:] if columns is None else columns)


def _columns(s, ts, v) -> bytes:
    from array import array
    return array(wire.INDEX_TYPE, s).tobytes() + array("d", ts).tobytes() + array("d", v).tobytes()


@pytest.mark.parametrize("body, reason", [
    (wire.BINARY_MAGIC + b'{"v": 2}', "without a header line"),
    (wire.BINARY_MAGIC + b"{oops\n", "header is not JSON"),
    (_binary_mutate({"v": 1}), "unsupported batch version"),
    (_binary_mutate({"node": "node2"}), "differs from the signed node"),
    (_binary_mutate({"n": -1}), "n must be"),
    (_binary_mutate({"n": 4}), "sample columns hold 60 bytes, 4 samples need 80"),
    (_binary_mutate(columns=b"\0" * 59), "sample columns hold 59 bytes"),
    (_binary_mutate(columns=_columns([0, 1, 2], [1.0, 2.0, 3.0], [0.0, 0.0, 0.0])), "indexes into series"),
    (_binary_mutate({"events": [[1.0, "log"]]}), "events[0] must be a list of 7"),
])
def test_malformed_binary_batches_get_400_with_a_reason(server, body, reason):
    status, reply = post(server, body)
    assert status == 400 and reason in reply["error"], reply
    assert counts(server) == (0, 0, 0, 0)
    assert post(server, binary_batch(seq=2))[0] == 200


def test_unattributed_log_lines_sidecars_report_are_counted_for_metrics(server):
    """A sidecar's count of log lines it did not act on (writer not established) reaches /metrics by node and
    reason, summed over batches; a retried batch is not counted twice."""
    from prometheus_client import CollectorRegistry, generate_latest

    from sigma.controller.ingest.metrics import IngestCollector

    def unattributed(seq, n):
        samples = [(T0 + 100.0, "log.unattributed_lines", float(n), '{"reason":"program mallory","source":"kern.log"}',
                    "[]"), (T0 + 100.0, "host.load1", 0.5, "{}", "[]")]
        return wire.encode_batch("node1", seq, time.time(), samples, [], [])

    for seq, n in ((1, 2), (2, 3), (2, 3)):
        assert post(server, unattributed(seq, n))[0] == 200
    reg = CollectorRegistry()
    reg.register(IngestCollector(server))
    text = generate_latest(reg).decode()
    assert 'sigma_log_unattributed_lines_total{node="node1",reason="program mallory"} 5.0' in text
