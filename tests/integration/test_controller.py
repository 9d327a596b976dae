"""The controller on the real local cluster, fed by real sidecars tailing each node's kernel log and KPI files.

Faults are injected at their source: a kernel-log line, a SIGSTOPped rank. The controller runs as the daemon
(`sigma controller run`), is killed with SIGKILL mid-flow and restarted.
"""

import os
import signal
import time

import pytest

from tests.integration.pipeline import Pipeline, wait_for

pytestmark = pytest.mark.integration


def running_on(slurm, job_id):
    job = slurm.job(job_id)
    return job if job is not None and job.state == "RUNNING" else None


def test_xid79_drains_requeues_reboots_validates_and_resumes(slurm, cluster, tmp_path):
    with Pipeline(cluster, tmp_path) as p:
        job_id = p.submit_kpi_job(slurm, nodes=3)
        job = wait_for(lambda: running_on(slurm, job_id), what="job running")
        victim = job.nodes[-1]
        wait_for(lambda: p.steps_since(job_id, 0) >= 6, what="KPIs flowing")
        fault = p.inject_xid79(victim)

        node = wait_for(lambda: (n := slurm.node(victim)).drained and n, timeout=30, what=f"{victim} drained")
        assert node.reason.startswith("sigma: gpu-xid-79 ")
        (inc,) = p.incidents(node=victim)
        assert inc["rule_id"] == "gpu-xid-79" and inc["evidence"]["events"][0]["fields"]["xid"] == 79

        # kill -9 right after the decision; the restarted controller must neither lose nor repeat anything
        p.kill_controller()
        p.start_controller()
        job = wait_for(lambda: (j := running_on(slurm, job_id)) and j.restarts >= 1 and j, timeout=60,
                       what="job requeued and running again")
        assert victim not in job.nodes and job.restarts == 1
        resumed_at = wait_for(lambda: p.steps_since(job_id, fault + 1) and time.time(), timeout=60,
                              what="training steps after the resume")

        wait_for(lambda: (lc := p.lifecycle(victim)) and lc["state"] in ("validating", "resumed"), timeout=150,
                 what=f"{victim} rebooted")
        wait_for(lambda: (lc := p.lifecycle(victim)) and lc["state"] == "resumed", timeout=240,
                 what=f"{victim} validated and resumed")
        assert slurm.node(victim).available and slurm.reservations() == []
        actions = p.query("SELECT kind, state FROM actions WHERE incident_id = ? ORDER BY id", (inc["id"],))
        kinds = [a["kind"] for a in actions]
        assert kinds.count("drain") == 1 and kinds.count("requeue") == 1 and kinds.count("reboot") == 1
        assert kinds.count("submit_validation") == 1
        assert all(a["state"] in ("done", "skipped") for a in actions)
        validation = p.query("SELECT result FROM actions WHERE kind = 'submit_validation'")[0]["result"]
        assert any(r.state == "COMPLETED" and r.return_code == 0
                   for r in slurm.accounting([int(__import__("json").loads(validation)["job_id"])]))
        assert p.incidents(node=victim)[0]["status"] == "resolved"
        states = [r["to_state"] for r in p.query("SELECT to_state FROM lifecycle_transitions WHERE node = ?"
                                                 " ORDER BY id", (victim,))]
        assert states == ["drained", "waiting_jobs", "remediating", "validating", "resumed"]
        assert f"DRAIN {victim} (gpu-xid-79)" in p.decisions()
        assert 'sigma_incidents_total{rule="gpu-xid-79",status="resolved"} 1.0' in p.metrics()
        assert resumed_at > fault
