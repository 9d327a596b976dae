"""The real local SLURM cluster: bring-up, node actions, jobs, requeue, reboot, submitit."""

import subprocess
import time

import pytest

from sigma.controller.act.remediation import REBOOT_SETTLE_S
from sigma.slurm.command import SlurmError
from tests.conftest import wait_for

pytestmark = pytest.mark.integration




def test_four_idle_nodes_after_up(slurm):
    nodes = slurm.nodes()
    assert [n.name for n in nodes] == ["node1", "node2", "node3", "node4"]
    assert all(n.state == "idle" and n.available for n in nodes)


def test_slurmctld_openmetrics_where_slurm_has_them(slurm, cluster):
    """Slurm 25.11 and later serve OpenMetrics from slurmctld; the local cluster turns them on there."""
    import urllib.request

    from sigma.slurm.formats import parse_release

    url = cluster.metrics_url()
    if parse_release(slurm.version) < (25, 11, 0):
        assert url is None
        return
    text = urllib.request.urlopen(url + "nodes", timeout=10).read().decode()
    assert all(f'slurm_node_cpus{{node="node{k}"}} 2' in text for k in range(1, 5))


def test_up_again_reports_running(cluster):
    spec, already = cluster.up()
    assert already and spec.nodes == 4


def test_drain_shows_in_sinfo_reason_and_resume(slurm, cluster):
    slurm.drain(["node2"], "test-rule disk on fire")
    out = subprocess.run(["sinfo", "-R", "-h", "-o", "%N|%E"], env={**cluster.env, "PATH": "/usr/bin:/bin"},
                         capture_output=True, text=True, check=True).stdout
    assert "node2|sigma: test-rule disk on fire" in out.splitlines()
    assert slurm.node("node2").drained_by_sigma
    slurm.resume(["node2"])
    assert wait_for(lambda: slurm.node("node2").available, timeout=20, what="node2 back after resume")


def test_admin_drain_is_never_resumed(slurm):
    subprocess.run(["scontrol", "update", "NodeName=node4", "State=DRAIN", "Reason=admin: bad fan"],
                   env=slurm.env, check=True)
    with pytest.raises(SlurmError, match="not set by sigma"):
        slurm.resume(["node4"])
    assert slurm.node("node4").drained


def test_sbatch_job_completes_in_accounting(slurm, tmp_path):
    out = tmp_path / "out.txt"
    job_id = slurm.submit(None, "-N1", f"--output={out}", wrap="echo hello-from-$SLURMD_NODENAME")
    wait_for(lambda: not slurm.job(job_id) or slurm.job(job_id).state == "COMPLETED", what="job end")
    record = wait_for(lambda: next((r for r in slurm.accounting([job_id]) if r.state == "COMPLETED"), None),
                      what="sacct COMPLETED")
    assert record.return_code == 0
    assert out.read_text().startswith("hello-from-node")


def test_requeue_increments_restart_count_and_start_now(slurm):
    # Same nodes on purpose: a relaunch there in the second of the old credential's revocation would be killed.
    job_id = slurm.submit(None, "-N2", "-w", "node1,node2", wrap="sleep 300")
    wait_for(lambda: slurm.job(job_id).state == "RUNNING", what="job running")
    slurm.requeue(job_id)
    # at once, while the old run still ends (COMPLETING): start_now waits for the requeue to complete, else the
    # BeginTime SLURM sets then (121 s) would undo it
    assert slurm.job(job_id).state in ("COMPLETING", "PENDING")
    slurm.start_now(job_id)
    job = wait_for(lambda: (j := slurm.job(job_id)) and j.state == "RUNNING" and j, timeout=20,
                   what="requeued job running again without the BeginTime delay")
    assert job.restarts == 1
    time.sleep(2)
    assert slurm.job(job_id).state == "RUNNING", "the relaunched job must survive its launch"


def test_reboot_flow_returns_node_down_then_resumed(slurm, cluster):
    before = slurm.node("node3").slurmd_start_time
    slurm.reboot(["node3"], next_state="DOWN", reason="test reboot")
    node = wait_for(lambda: (n := slurm.node("node3")).state == "down" and n.slurmd_start_time > before and n,
                    timeout=60, what="node3 rebooted and DOWN")
    assert node.drained_by_sigma and "reboot complete" in node.reason
    assert "returned to service" in (cluster.state_dir / "log" / "slurmctld.log").read_text()
    # as the controller does: resumed within the second of its first registration, the emulated node (`slurmd -b`
    # counts its uptime from its start) can re-register as rebooted once more
    time.sleep(max(0.0, node.slurmd_start_time + REBOOT_SETTLE_S - time.time()))
    slurm.resume(["node3"])
    assert wait_for(lambda: slurm.node("node3").available, what="node3 resumed")


def test_maintenance_reservation_pins_a_job(slurm):
    slurm.create_reservation("sigma-test-maint", ["node1"], duration_min=5)
    assert "sigma-test-maint" in slurm.reservations()
    job_id = slurm.submit(None, "--reservation=sigma-test-maint", "-w", "node1", wrap="true")
    wait_for(lambda: any(r.state == "COMPLETED" for r in slurm.accounting([job_id])), what="job in reservation")
    slurm.delete_reservation("sigma-test-maint")
    assert "sigma-test-maint" not in slurm.reservations()


def test_submitit_job_returns_result(slurm, cluster, tmp_path, monkeypatch):
    import submitit

    for key, value in cluster.env.items():
        monkeypatch.setenv(key, value)
    executor = submitit.AutoExecutor(folder=tmp_path / "submitit", cluster="slurm")
    executor.update_parameters(timeout_min=5, slurm_partition="debug", nodes=1, tasks_per_node=1)
    job = executor.submit(pow, 2, 10)
    assert job.result() == 1024
    assert wait_for(lambda: job.state == "COMPLETED" and job.state, what="submitit state") == "COMPLETED"
