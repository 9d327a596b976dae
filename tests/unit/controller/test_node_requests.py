"""After a repair the node acknowledges its own kernel log: the controller asks the node's sidecar through the
ingest reply and validates only once it answered; a node that never answers fails the repair."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from sigma.controller.act import noderequests
from sigma.controller.act.noderequests import NodeRequests
from sigma.controller.config import Playbook, RemediationConfig, ValidationConfig
from sigma.controller.db import open_db
from sigma.controller.ingest.batch import Ingest
from sigma.controller.ingest.server import ControllerServer
from sigma.security.keys import KeyRing, KeyTable, node_key_text, write_private

from tests.conftest import wait_for
from tests.unit.controller.helpers import add_event, make_controller, xid79
from tests.unit.controller.test_decisions import run_until

XID_LINE = "Nov 23 19:59:51 gpu003 kernel: NVRM: Xid (PCI:0000:3b:00): 79, pid=4242, GPU has fallen off the bus.\n"


def remediation(tmp_path, **kw):
    script = tmp_path / "v.sbatch"
    script.write_text("#!/bin/sh\n")
    return RemediationConfig(validation=ValidationConfig(script=str(script)),
                             playbooks=[Playbook(name="reboot", kind="reboot", categories=["gpu-reset"]),
                                        Playbook(name="manual", kind="manual")], **kw)


def rebooted(ctl, slurm, clock):
    xid79(ctl.conn, "node3", clock() - 1)
    assert run_until(ctl, clock, lambda: slurm.count("reboot") == 1)
    slurm.finish_reboot("node3", clock())
    assert run_until(ctl, clock, lambda: ctl.remediator.get("node3").state == "validating")


def test_validation_waits_for_the_nodes_acknowledgment(tmp_path):
    ctl, slurm, clock = make_controller(tmp_path, remediation=remediation(tmp_path))
    rebooted(ctl, slurm, clock)
    run_until(ctl, clock, lambda: False, ticks=3)
    assert slurm.count("submit") == 0  # not validated before the node said its log is acknowledged
    asked = noderequests.pending(ctl.conn, "node3", clock())
    assert [r["kind"] for r in asked] == ["log-ack"] and noderequests.pending(ctl.conn, "node1", clock()) == []
    add_event(ctl.conn, "node3", clock(), source="sidecar", kind="node_request",
              fields={"request": asked[0]["id"], "kind": "log-ack", "ok": True, "output": "acknowledged 1"})
    assert run_until(ctl, clock, lambda: slurm.count("submit") == 1)
    assert noderequests.pending(ctl.conn, "node3", clock()) == []  # answered: no longer handed out


def test_a_node_that_never_answers_fails_the_repair(tmp_path):
    ctl, slurm, clock = make_controller(tmp_path, remediation=remediation(tmp_path, ack_timeout_s=60))
    rebooted(ctl, slurm, clock)
    assert run_until(ctl, clock, lambda: ctl.remediator.get("node3").failures == 1, ticks=30)
    assert slurm.count("submit") == 0
    note = ctl.conn.execute("SELECT note FROM lifecycle_transitions WHERE node = 'node3' ORDER BY ts DESC"
                            " LIMIT 1").fetchone()[0]
    assert "no answer from node3's sidecar within 60 s" in note and "never delivered" in note


def test_a_real_sidecar_acknowledges_its_nodes_kernel_log(tmp_path):
    """The sidecar process gets the request on its ingest reply and runs `sigma health log-ack` on its node."""
    node_dir = tmp_path / "node"
    (node_dir / "health").mkdir(parents=True)
    (node_dir / "kern.log").write_text(XID_LINE)
    health = tmp_path / "health.yaml"
    health.write_text("suites: {prolog: [kernel_log], epilog: [kernel_log], comprehensive: [kernel_log]}\n"
                      "defaults: {kernel_log: '{node_dir}/kern.log'}\n")
    env = {**os.environ, "SIGMA_HEALTH_CONFIG": str(health), "SIGMA_NODE_DIR": str(node_dir),
           "SIGMA_KPI_DIR": str(tmp_path / "kpi")}
    env.pop("SIGMA_CLUSTER_DIR", None)
    judge = [sys.executable, "-m", "sigma.cli", "health", "run", "--check", "kernel_log", "--node", "gpu003",
             "--no-record"]
    assert subprocess.run(judge, env=env, capture_output=True).returncode == 1  # the Xid fails the node

    table = KeyTable(tmp_path / "keys.json")
    key = table.issue("gpu003")
    table.save()
    write_private(tmp_path / "gpu003.key", node_key_text(key))
    db = tmp_path / "controller.db"
    srv = ControllerServer(("127.0.0.1", 0), Ingest(db, KeyRing(tmp_path / "keys.json")))
    srv.start()
    conn = open_db(db)
    config = tmp_path / "telemetry.yaml"
    config.write_text(f"push: {{url: 'http://127.0.0.1:{srv.port}/v1/ingest', secret_file: '{tmp_path}/gpu003.key',"
                      f" interval_s: 0.2}}\njobs: {{sources: [kpi]}}\ncollectors: {{host: {{interval_s: 1}}}}\n")
    asker = NodeRequests(conn)
    try:
        assert _ask(asker) is None  # asked: waits for the node
        with open(tmp_path / "sidecar.log", "w") as log:
            proc = subprocess.Popen([sys.executable, "-m", "sigma.cli", "sidecar", "--config", str(config),
                                     "--node", "gpu003"], stdout=log, stderr=log, env=env)
        try:
            answer = wait_for(lambda: _ask(asker), what="the sidecar's answer")
        finally:
            proc.terminate()
            proc.wait(timeout=30)
    finally:
        srv.stop()
        srv.ingest.close()
    assert answer["ok"] and "acknowledged 1 fatal kernel-log line" in answer["output"], answer
    assert subprocess.run(judge, env=env, capture_output=True).returncode == 0  # only newer lines are judged now


def _ask(asker: NodeRequests) -> dict | None:
    from sigma.controller.act.journal import NotYet

    try:
        return json.loads(asker.ask("gpu003", "log-ack", "ack_kernel_log:gpu003:c1:f0", timeout_s=120))
    except NotYet:
        return None
