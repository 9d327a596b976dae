"""Guard rails on the real local cluster: nodes an admin took out of service are never touched.

The fault is injected at its source (an Xid 79 line in the node's kernel log, read by its real sidecar); the admin's
action is a real `scontrol update`; the controller is the real daemon.
"""

import os
import subprocess
import time

import pytest

from tests.integration.pipeline import Pipeline, wait_for

pytestmark = pytest.mark.integration


def scontrol(slurm, *args):
    subprocess.run(["scontrol", "update", *args], env={**os.environ, **slurm.env}, check=True)


def test_nodes_an_admin_set_down_or_fail_are_never_drained_rebooted_or_resumed(slurm, cluster, tmp_path):
    # DOWN (no DRAIN flag): before the fix the controller drained over it, replaced the reason with its own and
    # rebooted the node. FAIL: SLURM's "expected to fail soon, keep jobs off it".
    scontrol(slurm, "NodeName=node4", "State=DOWN", "Reason=admin: PSU swap")
    scontrol(slurm, "NodeName=node3", "State=FAIL", "Reason=admin: RMA 1234")
    try:
        check_left_alone(slurm, cluster, tmp_path, {n: slurm.node(n) for n in ("node3", "node4")})
    finally:  # the admin's part: back to service (a FAIL node alone is not one the cluster reset recognises)
        scontrol(slurm, "NodeName=node3,node4", "State=RESUME")


def check_left_alone(slurm, cluster, tmp_path, before):
    with Pipeline(cluster, tmp_path) as p:
        p.inject_xid79("node4")
        p.inject_xid79("node3")
        incs = wait_for(lambda: len(p.incidents(rule_id="gpu-xid-79")) == 2 and p.incidents(rule_id="gpu-xid-79"),
                        timeout=30, what="incidents for node3 and node4")
        assert {i["status"] for i in incs} == {"notified"}
        time.sleep(6)  # several controller ticks
        for name in ("node3", "node4"):
            node = slurm.node(name)
            assert node.reason == before[name].reason and node.state == before[name].state
            assert set(node.flags) - {"NOT_RESPONDING"} == set(before[name].flags) - {"NOT_RESPONDING"}
            assert "REBOOT_REQUESTED" not in node.flags and node.slurmd_start_time == before[name].slurmd_start_time
            assert p.lifecycle(name) is None
        assert p.query("SELECT kind, target FROM actions WHERE target IN ('node3', 'node4')") == []
        log = p.decisions()
        assert "NOTIFY node4 (gpu-xid-79): Xid 79 GPU fell off the bus; left alone, taken out by admin (DOWN" in log
        assert "NOTIFY node3 (gpu-xid-79): Xid 79 GPU fell off the bus; left alone, taken out by admin (FAIL: admin: " \
               "RMA 1234)" in log
        assert 'sigma_controller_guard_total{guard="admin_hold"} 2.0' in p.metrics()
