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


def test_admin_drained_node_is_never_resumed(slurm, cluster, tmp_path):
    import subprocess

    subprocess.run(["scontrol", "update", "NodeName=node4", "State=DRAIN", "Reason=admin: bad fan"],
                   env={**os.environ, **slurm.env}, check=True)
    with Pipeline(cluster, tmp_path) as p:
        p.inject_xid79("node4")
        inc = wait_for(lambda: p.incidents(node="node4"), timeout=30, what="incident for node4")[0]
        assert inc["rule_id"] == "gpu-xid-79" and inc["status"] == "notified"
        time.sleep(5)  # several controller ticks
        node = slurm.node("node4")
        assert node.drained and node.reason == "admin: bad fan"
        assert p.query("SELECT * FROM actions WHERE target = 'node4'") == []
        assert p.lifecycle("node4") is None
        assert "left alone, taken out by admin (DRAIN: admin: bad fan)" in p.decisions()


def test_breaker_stops_a_rule_that_matches_every_node(slurm, cluster, tmp_path):
    rules = tmp_path / "rules.yaml"
    rules.write_text("""version: 1
rules:
  - id: test-broken-rule
    description: a broken rule that matches any kernel-log event
    severity: error
    action: drain
    category: broken
    log: {source: log, kinds: ["*"]}
""")
    with Pipeline(cluster, tmp_path, rules=str(rules),
                  controller={"breaker": {"max_nodes": 2, "max_fraction": 0.5, "window_s": 600}}) as p:
        for node in cluster.node_names():
            p.inject_line(node, f"{time.strftime('%b %d %H:%M:%S')} {node} kernel: INFO: task python:4242 blocked "
                                f"for more than 120 seconds.")  # the event's time is the line's own
        wait_for(lambda: len(p.incidents()) == 4, timeout=30, what="four incidents")
        time.sleep(3)
        drained = [n.name for n in slurm.nodes() if n.drained]
        assert len(drained) == 2 and all(slurm.node(n).drained_by_sigma for n in drained)
        statuses = sorted(i["status"] for i in p.incidents())
        assert statuses == ["acted", "acted", "escalated", "escalated"]
        assert p.decisions().count("BREAKER") == 2


def test_hang_on_one_node_is_detected_and_that_node_isolated(slurm, cluster, tmp_path):
    with Pipeline(cluster, tmp_path, controller={"watchdog": {"hang_timeout_s": 15}},
                  remediation={"playbooks": [{"name": "manual", "kind": "manual"}]}) as p:
        job_id = p.submit_kpi_job(slurm, nodes=3)
        job = wait_for(lambda: running_on(slurm, job_id), what="job running")
        victim = job.nodes[1]
        wait_for(lambda: p.steps_since(job_id, 0) >= 12, what="KPIs flowing")
        pids = wait_for(lambda: p.rank_pids(job_id, victim), what=f"rank processes on {victim}")
        for pid in pids:
            os.kill(pid, signal.SIGSTOP)
        try:
            node = wait_for(lambda: (n := slurm.node(victim)).drained and n, timeout=90, what=f"{victim} isolated")
            assert node.reason.startswith("sigma: watchdog-hang ")
            (inc,) = p.incidents(node=victim)
            assert inc["source"] == "isolation" and inc["job_id"] == job_id
            assert inc["evidence"]["isolation"]["ranked"][0][0] == victim
            assert inc["evidence"]["stalled_s"] >= 15
            assert [i["node"] for i in p.incidents() if i["action"].startswith("drain")] == [victim]
            job = wait_for(lambda: (j := running_on(slurm, job_id)) and j.restarts >= 1 and j, timeout=60,
                           what="job requeued onto healthy nodes")
            assert victim not in job.nodes
            wait_for(lambda: p.incidents(node=victim)[0]["status"] == "confirmed", timeout=60,
                     what="isolation confirmed by the job's recovery")
            assert p.incidents(rule_id="watchdog-crash-loop") == []  # one requeue is not a crash loop
        finally:
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGCONT)
                except ProcessLookupError:
                    pass
