"""Kernel log to controller, with real processes: a sidecar reading a real journald pushes a kernel Xid line to the
controller's ingest; a sidecar that can read no kernel log says so, and the controller shows that node's
detection as degraded (`sigma nodes`, /metrics)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from prometheus_client import generate_latest

from sigma.cli import main
from sigma.controller.db import open_db
from sigma.controller.ingest.batch import Ingest
from sigma.controller.ingest.server import ControllerServer
from sigma.controller.report.prometheus import registry
from sigma.telemetry import wire
from tests import journald
from tests.conftest import wait_for

CONFIG = """
store: {{path: "{{node_dir}}/telemetry.db"}}
push: {{url: "http://127.0.0.1:{port}/v1/ingest", secret_file: "{secret}", interval_s: 0.2}}
jobs: {{sources: [kpi], refresh_s: 0.5}}
collectors:
  kernel:
    type: logtail
    interval_s: 0.2
    source: auto
    journal_dir: "{journal}"
    kmsg_path: "{{node_dir}}/no-kmsg"
    files: ["{{node_dir}}/kern.log"]
    patterns: [{{name: xid, regex: 'NVRM: Xid \\((?:PCI:)?(?P<pci>[0-9a-fA-F:.]+)\\): (?P<xid>\\d+)', severity: error}}]
"""


def rows(db, sql, args=()):
    conn = open_db(db, readonly=True)
    try:
        return [tuple(r) for r in conn.execute(sql, args)]
    finally:
        conn.close()


def test_journal_node_and_blind_node_through_the_controller(tmp_path, capsys):
    why = journald.available()
    if why:
        pytest.skip(why)
    secret = tmp_path / "secret"
    srv = ControllerServer(("127.0.0.1", 0), Ingest(tmp_path / "controller.db", wire.write_secret(secret)))
    srv.start()
    procs = []
    env = {k: v for k, v in os.environ.items() if k != "SIGMA_CLUSTER_DIR"}
    try:
        with journald.Journald(tmp_path / "jd") as jd:
            jd.kernel("Linux version 6.1.0 (this boot)", level=5)
            jd.sync()
            for node, journal in (("gpu01", jd.directory), ("gpu02", tmp_path / "no-journal")):
                (tmp_path / node).mkdir()
                config = tmp_path / f"{node}.yaml"
                config.write_text(CONFIG.format(port=srv.port, secret=secret, journal=journal))
                procs.append(subprocess.Popen(
                    [sys.executable, "-m", "sigma.cli", "sidecar", "--config", str(config), "--node", node,
                     "--node-dir", str(tmp_path / node)], env=env,
                    stdout=open(tmp_path / f"{node}.log", "w"), stderr=subprocess.STDOUT))
            db = srv.ingest.db_path
            said = "SELECT node, kind, severity FROM events WHERE source = 'sidecar' AND kind LIKE 'kernel_log_%'"
            assert sorted(wait_for(lambda: len(rows(db, said)) == 2 and rows(db, said), what="kernel log reports")) == [
                ("gpu01", "kernel_log_source", "info"), ("gpu02", "kernel_log_unavailable", "error")]
            jd.kernel("NVRM: Xid (PCI:0000:3b:00): 79, pid=1, GPU has fallen off the bus.")
            xid = wait_for(lambda: rows(db, "SELECT node, fields FROM events WHERE kind = 'xid'"), what="the Xid")
            assert xid[0][0] == "gpu01" and json.loads(xid[0][1])["stream"] == "journal"
            assert json.loads(xid[0][1])["xid"] == 79
    finally:
        for p in procs:
            p.terminate()
            p.wait(30)
        srv.stop()
        srv.ingest.close()
    assert main(["nodes", "--db", str(db), "--json"]) == 0
    nodes = {n["node"]: n for n in json.loads(capsys.readouterr().out)["nodes"]}
    assert (nodes["gpu01"]["detection"], nodes["gpu02"]["detection"]) == ("ok", "degraded")
    assert "no journal files" in nodes["gpu02"]["kernel_log"]["detail"]
    assert main(["nodes", "--db", str(db)]) == 0
    out = capsys.readouterr().out
    assert "kernel-log fault detection is OFF on gpu02" in out and "ok: kernel log from journal" in out
    metrics = generate_latest(registry(str(db))).decode()
    assert 'sigma_node_kernel_log_ok{node="gpu02",source="none"} 0.0' in metrics
    assert 'sigma_node_kernel_log_ok{node="gpu01",source="journal"} 1.0' in metrics
