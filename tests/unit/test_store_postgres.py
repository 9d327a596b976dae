"""The controller's store on a real PostgreSQL server (started here, Debian's package): the same migrations, signed
ingest over real HTTP, the adapter's sqlite3 behaviour (upserts, new ids, integrity errors), retention, the
controller opened on a URL (its decisions: test_controller_postgres.py)."""

from __future__ import annotations

import http.client
import json
import math
import sqlite3
import time
import uuid

import pytest

from tests.unit.pgserver import pg, require_postgres  # noqa: F401 (pg: the server fixture)

psycopg = require_postgres()

from sigma.controller.config import ControllerConfig  # noqa: E402
from sigma.controller.db import MIGRATIONS, open_db  # noqa: E402
from sigma.controller.ingest.batch import Ingest  # noqa: E402
from sigma.controller.ingest.server import ControllerServer  # noqa: E402
from sigma.controller.loop import Controller  # noqa: E402
from sigma.controller.retention import Retention, RetentionConfig  # noqa: E402
from sigma.store import migrate  # noqa: E402
from sigma.pgstore import PgConnection  # noqa: E402
from sigma.telemetry import wire  # noqa: E402

from tests.unit.controller.fakes import FakeSlurm  # noqa: E402

SECRET = b"0123456789abcdef0123456789abcdef"


@pytest.fixture
def url(pg):
    return pg.create_db(f"t{uuid.uuid4().hex[:12]}")


def test_same_migrations_apply_once(url):
    conn = open_db(url)
    names = [r[0] for r in conn.execute("SELECT name FROM migrations ORDER BY name")]
    assert names == sorted(n for n, _ in MIGRATIONS)
    tables = {r[0] for r in conn.execute("SELECT table_name FROM information_schema.tables WHERE table_schema = "
                                         "current_schema()")}
    assert {"batches", "samples", "events", "kpis", "samples_rollup", "incidents", "actions", "node_lifecycle",
            "lifecycle_transitions", "node_snapshots", "detector_state"} <= tables
    conn.close()
    again = open_db(url)
    assert migrate(again, MIGRATIONS) == []
    again.close()


def test_failed_migration_leaves_nothing(url):
    conn = open_db(url)
    with pytest.raises(psycopg.Error):
        migrate(conn, [("9001_good", "CREATE TABLE a (x INTEGER);"),
                       ("9002_bad", "CREATE TABLE b (y INTEGER); SELECT nope FROM nowhere;")], owner=False)
    tables = {r[0] for r in conn.execute("SELECT table_name FROM information_schema.tables WHERE table_schema = "
                                         "current_schema()")}
    assert "a" in tables and "b" not in tables
    assert conn.execute("SELECT count(*) FROM migrations WHERE name = '9002_bad'").fetchone()[0] == 0


def test_adapter_speaks_like_sqlite3(url):
    conn = open_db(url)
    with conn:
        cur = conn.execute("INSERT INTO incidents (key, opened_at, updated_at, rule_id, source, scope, severity, action,"
                           " fault_ts, status) VALUES (?,?,?,?,?,?,?,?,?,?)",
                           ("r|n1|", 1.0, 1.0, "r", "rule", "node", "error", "drain", 0.5, "open"))
    first = cur.lastrowid
    assert first and conn.execute("SELECT rule_id FROM incidents WHERE id = ?", (first,)).fetchone()["rule_id"] == "r"
    for value in ("a", "b"):  # INSERT OR REPLACE: an upsert on the key
        with conn:
            conn.execute("INSERT OR REPLACE INTO detector_state (key, value, updated_at) VALUES (?,?,?)",
                         ("k", value, 2.0))
    assert [tuple(r) for r in conn.execute("SELECT key, value FROM detector_state")] == [("k", "b")]
    with conn:  # INSERT OR IGNORE: the second is a no-op
        for _ in range(2):
            conn.execute("INSERT OR IGNORE INTO actions (key, kind, target, state, created_at, updated_at) VALUES"
                         " (?,?,?,?,?,?)", ("x", "drain", "n1", "planned", 1.0, 1.0))
    assert conn.execute("SELECT count(*) FROM actions").fetchone()[0] == 1
    conn.execute("BEGIN")
    conn.execute("INSERT INTO batches (node, seq, received_at, records) VALUES (?,?,?,?)", ("n1", 1, 1.0, 0))
    with pytest.raises(sqlite3.IntegrityError):  # one exception for callers, whichever store
        conn.execute("INSERT INTO batches (node, seq, received_at, records) VALUES (?,?,?,?)", ("n1", 1, 1.0, 0))
    conn.rollback()
    assert not conn.in_transaction
    assert conn.execute("SELECT count(*) FROM batches").fetchone()[0] == 0
    assert conn.execute("SELECT 'a%b', ? || '?'", ("x",)).fetchone() == ("a%b", "x?")  # literals untouched
    with pytest.raises(ZeroDivisionError), conn:  # `with conn` rolls back on error
        conn.execute("INSERT INTO detector_state (key, value, updated_at) VALUES (?,?,?)", ("gone", "v", 1.0))
        raise ZeroDivisionError
    assert conn.execute("SELECT count(*) FROM detector_state WHERE key = 'gone'").fetchone()[0] == 0


def test_arrival_order_column_and_its_absence(url):
    conn = open_db(url)
    with conn:
        conn.executemany("INSERT INTO kpis (node, ts, job_id) VALUES (?,?,?)", [("n1", 9.0, 1), ("n1", 1.0, 1)])
    assert [tuple(r) for r in conn.execute("SELECT ts FROM kpis ORDER BY rowid")] == [(9.0,), (1.0,)]
    conn.close()
    raw = psycopg.connect(url, autocommit=True)
    raw.execute("ALTER TABLE kpis DROP COLUMN rowid")  # as a database made before the column existed
    raw.close()
    with pytest.raises(RuntimeError, match="kpis have no rowid column"):
        open_db(url)


def test_signed_ingest_stores_on_postgresql(url):
    server = ControllerServer(("127.0.0.1", 0), Ingest(url, SECRET))
    server.start()
    try:
        now = time.time()
        samples = [(now - 1, "gpu.temp_c", 61.0, '{"gpu":"0"}', "[42]"), (now - 1, "host.load1", math.nan, "{}", "[42]")]
        events = [(now - 1, "log", "xid", "error", "Xid 79", '{"xid":79}', "[42]")]
        kpis = [(now - 1, 42, 0, 7, 2.5, 0.4, 1000.0, None, 1.1, "{}")]
        body = wire.encode_binary_batch("node1", 5, now, samples, events, kpis)
        replies = []
        for _ in range(2):  # the retry after a lost ack is a no-op
            conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
            conn.request("POST", "/v1/ingest", body, wire.auth_headers(None, SECRET, "node1", body))
            resp = conn.getresponse()
            replies.append((resp.status, json.loads(resp.read())))
            conn.close()
    finally:
        server.stop()
        server.ingest.close()
    assert [r[0] for r in replies] == [200, 200]
    assert replies[0][1]["stored"] == {"samples": 2, "events": 1, "kpis": 1} and replies[1][1]["duplicate"]
    db = open_db(url, readonly=True)
    rows = db.execute("SELECT metric, value, job_ids FROM samples ORDER BY metric").fetchall()
    assert [tuple(r) for r in rows] == [("gpu.temp_c", 61.0, "[42]"), ("host.load1", None, "[42]")]  # NaN -> NULL
    assert db.execute("SELECT count(*) FROM batches").fetchone()[0] == 1
    with pytest.raises(psycopg.Error):  # readonly means read-only
        db.execute("DELETE FROM samples")


def test_retention_downsamples_on_postgresql(url):
    conn = open_db(url)
    now = 1_800_000_000.0
    old = [("n1", now - 7200 + i, "gpu.temp_c", float(i), '{"gpu":"0"}', "[]") for i in range(10)]
    new = [("n1", now - 10, "gpu.temp_c", 99.0, '{"gpu":"0"}', "[]")]
    with conn:
        conn.executemany("INSERT INTO samples (node, ts, metric, value, labels, job_ids) VALUES (?,?,?,?,?,?)", old + new)
    deleted = Retention(conn, RetentionConfig(samples_raw_s=3600, rollup_s=3600)).run(now)
    assert deleted["samples"] == 10
    assert conn.execute("SELECT count(*) FROM samples").fetchone()[0] == 1
    row = conn.execute("SELECT n, vmin, vmax, vsum FROM samples_rollup").fetchone()
    assert tuple(row) == (10, 0.0, 9.0, 45.0)


def test_controller_opens_a_postgresql_url_and_ticks(url, tmp_path):
    ctl = Controller(ControllerConfig(db=url, log_dir=str(tmp_path)), slurm=FakeSlurm(), rules=[])
    try:
        assert isinstance(ctl.conn, PgConnection)
        ctl.tick()
        assert ctl.ticks == 1
    finally:
        ctl.conn.close()
