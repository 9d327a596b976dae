"""The prolog/epilog on the real local cluster: healthy nodes run jobs; a fatal Xid in node2's kernel log drains
node2 at the next job's prolog and the job runs elsewhere; a hanging check is abandoned within the budget."""

import json
import os
import time
from pathlib import Path

import pytest

from sigma.health.config import load_health_config
from tests.conftest import wait_for

pytestmark = pytest.mark.integration

XID79 = ("Nov 21 12:00:00 {node} kernel: [ 4000.000000] NVRM: Xid (PCI:0000:3b:00): 79, pid='<unknown>', "
         "name=<unknown>, GPU has fallen off the bus.\n")




def results(cluster, node, suite, job_id=None):
    out = []
    for path in sorted((cluster.node_dir(node) / "health").glob(f"*-{suite}.json")):
        data = json.loads(path.read_text())
        if job_id is None or data.get("job_id") == job_id:
            out.append(data)
    return out


def finished(slurm, job_id):
    job = slurm.job(job_id)
    return job is not None and job.state in ("COMPLETED", "FAILED", "CANCELLED") and job


def test_prolog_and_epilog_are_wired_into_slurm_conf(cluster):
    conf = cluster.conf.read_text()
    repo = Path(__file__).resolve().parents[2]
    assert f"Prolog={repo}/prolog/sigma-prolog" in conf and f"Epilog={repo}/epilog/sigma-epilog" in conf


def test_healthy_nodes_run_jobs_and_leave_results(slurm, cluster, tmp_path):
    jobs = {node: slurm.submit(None, "-w", node, f"--output={tmp_path}/%j.out", wrap="echo ok")
            for node in cluster.node_names()}
    for node, job_id in jobs.items():
        job = wait_for(lambda: finished(slurm, job_id), what=f"job on {node}")
        assert job.state == "COMPLETED" and job.nodes == (node,)
        (prolog,) = results(cluster, node, "prolog", job_id)
        assert prolog["verdict"] == "accept" and prolog["node"] == node
        assert {c["name"] for c in prolog["checks"]} == set(load_health_config().suites["prolog"])
        epilog = wait_for(lambda: results(cluster, node, "epilog", job_id), timeout=30, what="epilog result")
        assert epilog[0]["verdict"] == "accept"
    assert all(n.available for n in slurm.nodes())


def test_fatal_xid_drains_node2_and_job_runs_elsewhere(slurm, cluster, tmp_path):
    blockers = {n: slurm.submit(None, "-w", n, "--exclusive", wrap="sleep 300") for n in ("node1", "node3", "node4")}
    for n, b in blockers.items():
        wait_for(lambda: slurm.job(b).state == "RUNNING", what=f"blocker on {n}")
    with cluster.kernel_log("node2").open("a") as f:
        f.write(XID79.format(node="node2"))
    job_id = slurm.submit(None, "-N1", f"--output={tmp_path}/%j.out", wrap="echo ran-on-$SLURMD_NODENAME")

    node2 = wait_for(lambda: (n := slurm.node("node2")).drained and n, timeout=60, what="node2 drained")
    assert node2.reason == "Prolog error"
    (rejected,) = results(cluster, "node2", "prolog", job_id)
    assert rejected["verdict"] == "reject"
    issue = next(i for i in rejected["issues"] if i["check"] == "kernel_log")
    assert issue["category"] == "gpu" and issue["message"].startswith("xid-79 GPU has fallen off the bus")

    job = wait_for(lambda: (j := slurm.job(job_id)) and j.state == "PENDING" and j.restarts >= 1 and j,
                   what="job requeued")
    assert "Held" not in job.reason and job.reason != "JobHeldAdmin"  # nohold_on_prolog_fail
    slurm.cancel(blockers["node1"])
    wait_for(lambda: slurm.node("node1").state == "idle", timeout=60, what="node1 idle")
    slurm.start_now(job_id)
    job = wait_for(lambda: finished(slurm, job_id), timeout=60, what="job finished elsewhere")
    assert job.state == "COMPLETED" and job.nodes == ("node1",)
    assert (tmp_path / f"{job_id}.out").read_text().strip() == "ran-on-node1"
    assert slurm.node("node2").drained  # stays out until repaired and resumed


def test_hanging_check_is_abandoned_within_budget_and_node_stays_up(slurm, cluster, tmp_path):
    log = cluster.kernel_log("node3")
    log.unlink()
    os.mkfifo(log)  # opening it blocks forever, like a read from a hung filesystem
    try:
        job_id = slurm.submit(None, "-w", "node3", f"--output={tmp_path}/%j.out", wrap="echo ok")
        job = wait_for(lambda: finished(slurm, job_id), timeout=60, what="job on node3")
        assert job.state == "COMPLETED"
        (prolog,) = results(cluster, "node3", "prolog", job_id)
        budget = load_health_config().prolog.budget_s
        check = next(c for c in prolog["checks"] if c["name"] == "kernel_log")
        assert check["status"] == "timeout" and "abandoned" in check["message"]
        assert prolog["verdict"] == "accept"  # tool_failure: ignore
        assert prolog["duration_s"] < budget
        assert "kernel_log timeout" in (cluster.node_dir("node3") / "health" / "health.log").read_text()
        assert slurm.node("node3").available
    finally:
        log.unlink()
        log.touch()


def test_epilog_kills_a_daemonised_leftover(slurm, cluster, tmp_path):
    pidfile = tmp_path / "leftover.pid"
    job_id = slurm.submit(None, "-w", "node4", f"--output={tmp_path}/%j.out",
                          wrap=f"setsid sleep 600 >/dev/null 2>&1 < /dev/null & echo $! > {pidfile}")
    wait_for(lambda: finished(slurm, job_id), what="job on node4")
    epilog = wait_for(lambda: results(cluster, "node4", "epilog", job_id), timeout=30, what="epilog result")
    pid = int(pidfile.read_text())
    assert pid in epilog[0]["killed_job_processes"]
    assert not Path(f"/proc/{pid}").exists() or "Z" in Path(f"/proc/{pid}/stat").read_text().split(")")[-1][:3]


def test_validate_node_job_exit_code_matches_its_verdict(slurm, cluster, tmp_path):
    repo = Path(__file__).resolve().parents[2]
    job_id = slurm.submit(repo / "sbatch" / "validate-node.sbatch", "-w", "node1",
                          f"--output={tmp_path}/%j.out", "--chdir", str(repo))
    wait_for(lambda: finished(slurm, job_id), timeout=300, interval=1.0, what="validation job")
    (result,) = results(cluster, "node1", "comprehensive", job_id)
    record = wait_for(lambda: next((r for r in slurm.accounting([job_id]) if r.state in ("COMPLETED", "FAILED")),
                                   None), what="sacct record")
    assert {c["name"] for c in result["checks"]} == set(load_health_config().suites["comprehensive"])
    assert (record.return_code == 0) == (result["verdict"] == "accept"), (tmp_path / f"{job_id}.out").read_text()
