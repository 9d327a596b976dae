"""The sidecar as a real process: a failing collector does not stop the others; SIGHUP with a bad config keeps
the running one (error names file:line [key]); SIGTERM pushes the backlog so the controller has every row."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from sigma.controller.db import open_db
from sigma.controller.ingest.batch import Ingest
from sigma.controller.ingest.server import ControllerServer
from sigma.store import connect
from sigma.telemetry import wire

from tests.conftest import wait_for

CONFIG = """
store: {{path: "{{node_dir}}/telemetry.db", prune_every_s: 1}}
push: {{url: "http://127.0.0.1:{port}/v1/ingest", secret_file: "{secret}", interval_s: 0.2}}
jobs: {{sources: [kpi], refresh_s: 0.5}}
collectors:
  host: {{interval_s: 0.3, percpu: false}}
  broken:
    type: command
    interval_s: 0.3
    commands: [{{metric: broken.value, argv: [/nonexistent/tool]}}]
  app_log:
    type: logtail
    interval_s: 0.2
    files: ["{{node_dir}}/app.log"]
    patterns: [{{name: {pattern}, regex: 'ERROR (?P<code>\\d+)'}}]
"""


def controller_rows(db_path, sql, args=()):
    conn = open_db(db_path, readonly=True)
    try:
        return conn.execute(sql, args).fetchall()
    finally:
        conn.close()


@pytest.fixture
def controller(tmp_path):
    secret_file = tmp_path / "secret"
    secret = wire.write_secret(secret_file)
    srv = ControllerServer(("127.0.0.1", 0), Ingest(tmp_path / "controller.db", secret))
    srv.start()
    yield srv, secret_file
    srv.stop()
    srv.ingest.close()


def test_sidecar_process_reload_failure_isolation_and_drain(tmp_path, controller):
    srv, secret_file = controller
    node_dir = tmp_path / "node"
    node_dir.mkdir()
    config = tmp_path / "telemetry.yaml"
    config.write_text(CONFIG.format(port=srv.port, secret=secret_file, pattern="app_error"))
    log_path = tmp_path / "sidecar.log"
    env = {**os.environ, "SIGMA_KPI_DIR": str(tmp_path / "kpi")}
    env.pop("SIGMA_CLUSTER_DIR", None)
    with open(log_path, "w") as log:
        proc = subprocess.Popen([sys.executable, "-m", "sigma.cli", "sidecar", "--config", str(config),
                                 "--node", "nodeA", "--node-dir", str(node_dir)], stdout=log, stderr=log, env=env)
    try:
        db = srv.ingest.db_path
        success = "SELECT value FROM samples WHERE metric = 'sidecar.collector.success' AND labels = ?"
        wait_for(lambda: controller_rows(db, success, ('{"collector":"host"}',)), what="host samples")
        broken = wait_for(lambda: controller_rows(db, success, ('{"collector":"broken"}',)), what="broken runs")
        assert {r[0] for r in broken} == {0.0}
        assert {r[0] for r in controller_rows(db, success, ('{"collector":"host"}',))} == {1.0}
        errors = controller_rows(db, "SELECT message FROM events WHERE kind = 'collector_error'")
        assert len(errors) == 1 and "broken" in errors[0][0]  # reported once, on the change to failing

        # a bad edit + SIGHUP: logged with file:line [key], the old config keeps running
        config.write_text(CONFIG.format(port=srv.port, secret=secret_file, pattern="app_error")
                          .replace("interval_s: 0.3, percpu", "interval_s: soon, percpu"))
        proc.send_signal(signal.SIGHUP)
        wait_for(lambda: "config reload failed" in log_path.read_text(), what="reload error")
        assert f"{config}:6 [collectors.host.interval_s]: expected a number" in log_path.read_text()
        with open(node_dir / "app.log", "a") as f:
            f.write("ERROR 17 disk on fire\n")
        wait_for(lambda: controller_rows(db, "SELECT 1 FROM events WHERE kind = 'app_error'"), what="old pattern")

        # a good edit + SIGHUP applies
        config.write_text(CONFIG.format(port=srv.port, secret=secret_file, pattern="app_failure"))
        proc.send_signal(signal.SIGHUP)
        wait_for(lambda: "config reloaded" in log_path.read_text(), what="reload")
        time.sleep(0.5)
        with open(node_dir / "app.log", "a") as f:
            f.write("ERROR 18 disk still on fire\n")
        rows = wait_for(lambda: controller_rows(db, "SELECT fields FROM events WHERE kind = 'app_failure'"),
                        what="new pattern")
        assert '"code":18' in rows[0][0]
        assert proc.poll() is None
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0, log_path.read_text()
    node = connect(node_dir / "telemetry.db", readonly=True)
    local = sorted(tuple(r) for r in node.execute("SELECT ts, metric, value, labels, job_ids FROM samples"))
    remote = sorted(tuple(r) for r in controller_rows(
        srv.ingest.db_path, "SELECT ts, metric, value, labels, job_ids FROM samples WHERE node = 'nodeA'"))
    assert local == remote and len(local) > 50
