"""`sigma chaos`: faults injected at their source on emulated nodes, journaled, and undone."""

import subprocess
import time
from pathlib import Path

import pytest

from sigma.chaos.inject import Chaos, job_pids
from tests.conftest import wait_for

pytestmark = pytest.mark.integration


def proc_state(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


def sigma_cli(cluster, *args) -> str:
    import sys

    return subprocess.run([sys.executable, "-m", "sigma.cli", *args, "--state-dir", str(cluster.state_dir)],
                          capture_output=True, text=True, check=True).stdout


def test_log_signature_appended_and_undone(cluster):
    import sys

    # no stack runs on the test cluster: nothing would notice the fault, so the command refuses unless --force
    refused = subprocess.run([sys.executable, "-m", "sigma.cli", "chaos", "log", "--node", "node3", "--xid", "79",
                              "--state-dir", str(cluster.state_dir)], capture_output=True, text=True)
    assert refused.returncode == 2 and "nothing would notice" in refused.stderr and "--force" in refused.stderr
    assert "Traceback" not in refused.stderr and "Xid" not in cluster.kernel_log("node3").read_text()
    out = sigma_cli(cluster, "chaos", "log", "--node", "node3", "--xid", "79", "--json", "--force")
    log = cluster.kernel_log("node3").read_text()
    assert "NVRM: Xid (PCI:0000:3b:00): 79," in log and " node3 kernel: NVRM" in log
    inj_id = __import__("json").loads(out)["id"]
    sigma_cli(cluster, "chaos", "undo", inj_id)
    assert "Xid" not in cluster.kernel_log("node3").read_text()
    assert Chaos(cluster).get(inj_id).undone_ts is not None


def test_hang_stops_only_that_nodes_job_processes(slurm, cluster):
    job_id = slurm.submit(None, "-N2", "-w", "node1,node2", wrap="srun sleep 300")
    pids = wait_for(lambda: job_pids(cluster, "node2", job_id), what="job processes on node2")
    other = job_pids(cluster, "node1", job_id)
    inj = Chaos(cluster).inject("hang", "node2", job_id=job_id)
    assert all(proc_state(p) == "T" for p in pids)
    assert all(proc_state(p) != "T" for p in other)
    Chaos(cluster).undo(inj.id)
    assert all(proc_state(p) != "T" for p in pids)


def test_straggler_duty_cycle_and_undo(slurm, cluster):
    job_id = slurm.submit(None, "-N1", "-w", "node2", wrap="python3 -c 'while True: pass'")

    def cmdline(pid: int) -> bytes:
        try:
            return Path(f"/proc/{pid}/cmdline").read_bytes()
        except FileNotFoundError:  # a short-lived process of the job step (its shell, srun) already gone
            return b""

    def spinner():
        return [p for p in job_pids(cluster, "node2", job_id) if b"while" in cmdline(p)]

    wait_for(spinner, what="the job's spinning process")
    inj = Chaos(cluster).inject("straggler", "node2", job_id=job_id, percent=60, period_s=0.5)
    # the spinner among the processes the injection cycles (taken from them: a process of the job step that was
    # starting or ending when spinner() looked may be gone by now)
    pid = next(p for p in inj.params["pids"] if b"while" in cmdline(p))
    seen = set()
    for _ in range(40):
        seen.add(proc_state(pid))
        time.sleep(0.05)
    assert "T" in seen and seen - {"T"}
    Chaos(cluster).undo(inj.id)
    time.sleep(0.3)
    assert proc_state(pid) != "T"


def test_node_death_kills_slurmd_and_undo_restarts_it(slurm, cluster):
    inj = Chaos(cluster).inject("node-death", "node4")
    pid = inj.params["slurmd_pid"]
    wait_for(lambda: not Path(f"/proc/{pid}").exists() or proc_state(pid) == "Z", timeout=10, what="slurmd dead")
    Chaos(cluster).undo(inj.id)
    assert wait_for(lambda: slurm.node("node4").available, timeout=30, what="node4 back")
