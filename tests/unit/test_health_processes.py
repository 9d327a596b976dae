"""Stray processes and the epilog's cleanup on real processes (found by their SLURM environment)."""

import os
import subprocess
import time

from sigma.health.checks import stray_processes
from sigma.health.hooks import kill_job_processes
from tests.unit.health_helpers import context


def spawn(job: int, node: str) -> subprocess.Popen:
    env = {**os.environ, "SLURM_JOB_ID": str(job), "SLURMD_NODENAME": node}
    env.pop("SLURM_SCRIPT_CONTEXT", None)
    return subprocess.Popen(["sleep", "60"], env=env, start_new_session=True)


def gone(p: subprocess.Popen, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if p.poll() is not None:
            return True
        time.sleep(0.05)
    return False


def test_stray_from_finished_job_is_killed_running_job_is_kept(tmp_path):
    node = f"unit{os.getpid()}"
    node_dir = tmp_path / "node"
    (node_dir / "spool").mkdir(parents=True)
    (node_dir / "spool" / f"{node}_4243.4294967291").touch()  # job 4243 still has a step here
    stray, running, elsewhere = spawn(4242, node), spawn(4243, node), spawn(4242, node + "x")
    try:
        ctx = context("/", node, node_dir, job_id=4244)
        r = stray_processes.run(ctx, {"kill": True, "grace_s": 1.0})
        assert r.status == "pass" and r.data["killed"] == [stray.pid], r.message
        assert gone(stray) and running.poll() is None and elsewhere.poll() is None
    finally:
        for p in (stray, running, elsewhere):
            p.kill()
            p.wait()


def test_stray_without_kill_fails(tmp_path):
    node = f"unit{os.getpid()}"
    node_dir = tmp_path / "node"
    (node_dir / "spool").mkdir(parents=True)
    stray = spawn(5151, node)
    try:
        r = stray_processes.run(context("/", node, node_dir), {"kill": False})
        assert r.status == "fail" and f"{stray.pid}:sleep(job 5151)" in r.message
    finally:
        stray.kill()
        stray.wait()


def test_epilog_kills_the_finished_jobs_leftovers_only(tmp_path):
    node = f"unit{os.getpid()}"
    mine, other = spawn(6161, node), spawn(6162, node)
    try:
        killed = kill_job_processes(context("/", node, tmp_path / "node"), 6161)
        assert killed == [mine.pid] and gone(mine) and other.poll() is None
    finally:
        for p in (mine, other):
            p.kill()
            p.wait()


def test_no_spool_dir_means_skip(tmp_path):
    r = stray_processes.run(context("/", "unitnode", tmp_path / "nowhere"), {})
    assert r.status == "skip" and "spool" in r.message
