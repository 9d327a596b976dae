"""A rollout an admin can trust, on the real local cluster: the platform comes up in observe mode (a bad --set is
refused before anything is written), a node with a fatal kernel line runs a job (its prolog warns, exits 0, SLURM
drains nothing) while the controller records what it would do; then the rule is enabled by `--set` on the running
platform, which reloads, and the fault it only observed, still current, is decided again and acted on."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sigma.controller.db import open_db
from sigma.stack import Stack
from tests.conftest import wait_for

pytestmark = pytest.mark.integration


def test_observe_then_one_rule_acts(slurm, cluster, tmp_path):
    bin_dir = Path(sys.executable).parent
    env = {k: v for k, v in os.environ.items() if k not in ("SLURM_CONF", "SIGMA_CONTROLLER_CONFIG")}
    env["SIGMA_CLUSTER_DIR"] = str(cluster.state_dir)

    def sigma(*args):
        return subprocess.run([str(bin_dir / "sigma"), *args], env=env, capture_output=True, text=True, timeout=300)

    stack = Stack(cluster)
    stack.down()
    for f in stack.db.parent.glob(stack.db.name + "*"):  # this test's decisions only
        f.unlink()
    stack.controller_config.unlink(missing_ok=True)
    bad = sigma("stack", "up", "--set", "watchdog.hang_timeout_s=soon")
    assert bad.returncode == 2 and "[watchdog.hang_timeout_s]: expected a number, got str 'soon'" in bad.stderr
    assert not stack.controller_config.exists() and not stack.status()["controller"]

    up = sigma("stack", "up", "--set", "mode=observe")
    assert up.returncode == 0, up.stderr
    decisions = cluster.state_dir / "log" / "decisions.log"
    try:
        wait_for(lambda: "START controller in OBSERVE mode" in decisions.read_text(), what="the start line")
        nodes = sigma("nodes")
        assert "controller in OBSERVE mode" in nodes.stdout, nodes.stdout

        # a fatal line in node2's kernel log: the prolog of a job there would drain it; in observe mode it warns
        assert sigma("chaos", "log", "--xid", "79", "--node", "node2").returncode == 0
        job = slurm.submit(None, "-w", "node2", "-o", str(tmp_path / "job.out"), wrap="true")
        wait_for(lambda: (j := slurm.job(job)) and j.state == "COMPLETED", timeout=120, what="the job to complete")
        assert not slurm.node("node2").drained
        health = sorted((cluster.node_dir("node2") / "health").glob("*-prolog.json"))[-1]
        result = json.loads(health.read_text())
        assert result["verdict"] == "reject" and result["mode"] == "observe"
        assert "OBSERVE mode: node node2 would be REJECTED" in (health.parent / "health.log").read_text()
        wait_for(lambda: "SHADOW node2 (gpu-xid-79): would drain" in decisions.read_text(), what="the observed Xid")

        # the rule enabled on the running platform: it reloads, and what it observed and is still current is acted on
        bad = sigma("stack", "up", "--set", "watchdog.hang_timeout_s=soon")
        assert bad.returncode == 2 and stack.status()["controller"]
        assert "soon" not in stack.controller_config.read_text()
        on = sigma("stack", "up", "--set", "act_rules=[gpu-xid-79]")
        assert on.returncode == 0 and "RELOAD applied" in on.stdout and "acting rules: gpu-xid-79" in on.stdout, \
            on.stdout + on.stderr
        wait_for(lambda: slurm.node("node2").reason.startswith("sigma: gpu-xid-79"), timeout=60,
                 what="node2 drained by the enabled rule")
        assert "REDECIDE node2 (gpu-xid-79): observed as incident" in decisions.read_text()
        conn = open_db(stack.db, readonly=True)
        try:
            states = [tuple(r) for r in conn.execute(
                "SELECT a.kind, a.state FROM actions a JOIN incidents i ON i.id = a.incident_id WHERE a.target ="
                " 'node2' AND a.kind = 'drain' AND i.rule_id = 'gpu-xid-79' ORDER BY a.id")]
        finally:
            conn.close()
        assert states == [("drain", "shadow"), ("drain", "done")]  # what observe mode recorded stays recorded
    finally:
        sigma("stack", "down")
        (cluster.state_dir / "etc" / "health.yaml").unlink(missing_ok=True)
        for f in stack.db.parent.glob(stack.db.name + "*"):  # its observed incidents are no later test's
            f.unlink()
        stack.controller_config.unlink(missing_ok=True)
