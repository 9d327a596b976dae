"""The controller's detection loop on a real PostgreSQL server (tests/unit/pgserver.py): a known-fault log line and
a hung job's KPIs go through the same ticks on SQLite and on PostgreSQL and come out as the same decisions."""

from __future__ import annotations

import http.client
import json
import time
import uuid

import pytest

from tests.unit.pgserver import pg, require_postgres  # noqa: F401 (pg: the server fixture)

psycopg = require_postgres()

from sigma.cli import main  # noqa: E402
from sigma.controller.config import BreakerConfig, ControllerConfig  # noqa: E402
from sigma.controller.db import KPI_COLUMNS, open_db  # noqa: E402
from sigma.controller.ingest.batch import Ingest  # noqa: E402
from sigma.controller.ingest.server import ControllerServer  # noqa: E402
from sigma.controller.detect.samples import bucket_stats, recent_for_metrics  # noqa: E402
from sigma.controller.report.metrics import report  # noqa: E402
from sigma.controller.report.prometheus import ControllerCollector  # noqa: E402
from sigma.telemetry import wire  # noqa: E402

from tests.unit.controller.helpers import add_event, add_kpi, calibrated, make_controller  # noqa: E402
from tests.unit.controller.test_watchdog_isolation import kpi_rows  # noqa: E402


SECRET = b"0123456789abcdef0123456789abcdef"


def push_xid79(db: str, node: str, ts: float) -> None:
    """The sidecar's match of an Xid 79 kernel log line, pushed through signed ingest over real HTTP."""
    # the controller's test clock is in 1970: ingest keeps rows that old here
    server = ControllerServer(("127.0.0.1", 0), Ingest(db, SECRET, max_row_age_s=time.time()))
    server.start()
    try:
        event = (ts, "log", "xid", "error", "NVRM: Xid (PCI:0000:3b:00): 79, pid=0, GPU has fallen off the bus.",
                 json.dumps({"xid": 79}), "[]")
        body = wire.encode_binary_batch(node, 1, time.time(), [], [event], [])
        client = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
        client.request("POST", "/v1/ingest", body, wire.auth_headers(None, SECRET, node, body))
        resp = client.getresponse()
        assert resp.status == 200 and json.loads(resp.read())["stored"]["events"] == 1
        client.close()
    finally:
        server.stop()
        server.ingest.close()


def run_scenario(tmp_path, db: str, capsys) -> dict:
    """Xid 79 in node4's log (through ingest), and job 1 hung on node1-3 because node2 stopped: the ticks through
    node4's reboot and validation, and the report of the hour, as an operator sees them."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    cfg = ControllerConfig(db=db, log_dir=str(tmp_path / "log"), breaker=BreakerConfig(max_nodes=2, max_fraction=0.5))
    ctl, slurm, clock = make_controller(tmp_path, cfg=cfg, conn=open_db(db))
    calibrated(ctl)  # a cluster with a long healthy history: score verdicts may act
    ctl.cfg.isolation.rounds = 2
    nodes = ["node1", "node2", "node3"]
    slurm.run_job(1, nodes, start=clock() - 1000)
    now = clock()
    for r in kpi_rows(nodes, now - 300, now - 130, stop={"node2": now - 140}):
        add_kpi(ctl.conn, r["node"], r["ts"], 1, r["rank"], r["step"], r["tokens_per_s"], r["step_time_s"],
                payload={"model": "llama-8b"})
    for i, n in enumerate(["node1", "node3"]):
        add_kpi(ctl.conn, n, now - 139, 1, i * 2, 161)
        add_event(ctl.conn, n, now - 150, source="kpi", kind="heartbeat", job_ids=[1])
    push_xid79(db, "node4", now - 5)
    ctl.tick()
    clock.advance(1)
    ctl.tick()
    clock.advance(ctl.cfg.isolation.window_s - 1)
    ctl.tick()
    for i in range(5):  # node4's remediation: reboot, maintenance reservation, validation job
        clock.advance(60)
        if i == 2:
            slurm.finish_reboot("node4", clock())
        ctl.tick()
    incidents = sorted((i.rule_id, i.source, i.node, i.job_id, i.action, i.status, i.fault_ts, i.opened_at,
                        json.dumps(i.evidence, sort_keys=True)) for i in ctl.incidents.query())
    actions = sorted((r["kind"], r["target"], r["state"]) for r in ctl.conn.execute("SELECT * FROM actions"))
    with ctl.conn:  # what a rule in shadow mode would have done, for the report's shadow table
        ctl.conn.execute("INSERT INTO incidents (key, opened_at, updated_at, rule_id, source, scope, job_id, severity,"
                         " action, fault_ts, status) VALUES ('s|7', ?, ?, 'learned-x', 'rule', 'job', 7, 'warn',"
                         " 'requeue', ?, 'shadow')", (clock(), clock(), clock()))
    rep = report(ctl.conn, since=clock() - 3600, now=clock())
    transitions = [tuple(r) for r in ctl.conn.execute("SELECT node, from_state, to_state FROM lifecycle_transitions"
                                                        " ORDER BY id")]
    drained = sorted(n for n in ("node1", "node2", "node3", "node4") if slurm.node(n).drained)
    ctl.conn.close()
    cli = []  # what an operator's commands print, read from the same database
    for argv in (["incidents", "--db", db, "--json"], ["nodes", "--db", db], ["explain", "1", "--db", db],
                 ["report", "--db", db, "--json"]):
        assert main(argv) == 0, argv
        cli.append(capsys.readouterr().out)
    cli[-1] = sorted(json.loads(cli[-1]))  # the report's window ends at the wall clock: its sections only
    metrics = sorted(m.name for m in ControllerCollector(db).collect())  # GET /metrics reads the same way
    return {"cli": cli, "metrics": metrics, "incidents": incidents, "actions": actions, "drained": drained,
            "transitions": transitions, "requeues": slurm.count("requeue"), "report": json.dumps(rep, sort_keys=True, default=str)}


def test_a_tick_on_postgresql_decides_as_on_sqlite(pg, tmp_path, capsys):
    on_sqlite = run_scenario(tmp_path / "sqlite", str(tmp_path / "sqlite" / "c.db"), capsys)
    on_postgres = run_scenario(tmp_path / "pg", pg.create_db(f"t{uuid.uuid4().hex[:12]}"), capsys)
    assert on_postgres == on_sqlite
    assert '"targets": ["7"]' in on_sqlite["report"] and "sigma_incidents" in on_sqlite["metrics"]
    assert on_sqlite["drained"] == ["node2"] and on_sqlite["requeues"] == 1
    assert ("node4", "remediating", "validating") in on_sqlite["transitions"]
    assert ("reboot", "node4", "done") in on_sqlite["actions"]
    rules = {(i[0], i[2]) for i in on_sqlite["incidents"]}
    assert ("watchdog-hang", "node2") in rules and ("gpu-xid-79", "node4") in rules


def test_sample_windows_read_the_same_on_both(pg, tmp_path):
    rows = [(n, 100.0 + t, m, float(t) if n != "n3" else None, '{"gpu":"0"}' if m == "gpu.temp_c" else "{}", "[]")
            for n in ("n1", "n2", "n3") for t in range(0, 60, 7) for m in ("gpu.temp_c", "host.load1", "sidecar.cpu")]
    got = []
    for db in (str(tmp_path / "c.db"), pg.create_db(f"t{uuid.uuid4().hex[:12]}")):
        conn = open_db(db)
        with conn:
            conn.executemany("INSERT INTO samples (node, ts, metric, value, labels, job_ids) VALUES (?,?,?,?,?,?)",
                             rows)
        recent = [(r["node"], r["ts"], r["metric"]) for r in recent_for_metrics(conn, 130.0, ["gpu.temp_c", "x"])]
        first = sorted(tuple(r) for r in recent_for_metrics(conn, 0.0, ["host.load1", "gpu.temp_c"], upto_rowid=4))
        got.append((sorted(recent), sorted(bucket_stats(conn, ["n1", "n3", "n9"], 100.0, 160.0, 3)), first))
        conn.close()
    assert got[0] == got[1]
    assert len(got[0][2]) == 3  # the first 4 rows to arrive, sidecar.cpu not asked for
    assert got[0][0] and {r[0] for r in got[0][1]} == {"n1"}  # n3 has no values, n9 no rows, sidecar.* left out


def test_kpi_reads_name_every_column_but_the_arrival_order(pg, tmp_path):
    for db in (str(tmp_path / "c.db"), pg.create_db(f"t{uuid.uuid4().hex[:12]}")):
        conn = open_db(db)
        columns = [d[0] for d in conn.execute("SELECT * FROM kpis LIMIT 0").description]
        conn.close()
        assert [c for c in columns if c != "rowid"] == KPI_COLUMNS.split(", "), db
