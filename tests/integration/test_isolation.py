"""Isolation at the shipped defaults on the real local cluster: a straggler on a 2-node training job is drained,
and load from another process on the host drains nothing.

The job is the real trainer (`sigma train`, 2 nodes, expert parallel); the straggler is `sigma chaos straggler
--percent 50` (its ranks on one node stopped half of every second); the noise is a process spinning on the CPU the
emulated nodes share. The controller runs with the dataclass defaults for every watchdog and isolation key.
"""

import re
import subprocess
import sys
import time

import pytest

from sigma.chaos.inject import Chaos
from tests.integration.pipeline import REPO, SIGMA, Pipeline, wait_for

pytestmark = pytest.mark.integration


def drains(p) -> list[str]:
    return [i["node"] for i in p.incidents() if i["action"].startswith("drain")]


def test_a_straggler_under_cpu_noise_is_isolated_to_its_node_and_nothing_else(slurm, cluster, train_data, tmp_path):
    with Pipeline(cluster, tmp_path, remediation={"playbooks": [{"name": "manual", "kind": "manual"}]}) as p:
        out = subprocess.run(
            [SIGMA, "train", "--config", "configs/train/debug.yaml", "--nodes", "2", "--no-wait", "name=straggler",
             "parallel.ep=2", "steps=1000000", "threads=1", f"data.path={train_data}", "data.prepare_if_missing=false",
             f"checkpoint.dir={tmp_path}/checkpoints", f"launch.folder={tmp_path}/submitit",
             "fault.step_delay_s=0.05", "kpi.progress_every=0"],
            env=p.env, cwd=REPO, capture_output=True, text=True, check=True).stdout
        job_id = int(re.search(r"job (\d+)", out).group(1))
        job = wait_for(lambda: (j := slurm.job(job_id)) and j.state == "RUNNING" and j, timeout=120,
                       what="training job running")
        hog = subprocess.Popen([sys.executable, "-c", "while True: pass"])
        chaos = Chaos(cluster)
        injection = None
        try:
            # a healthy throughput baseline (the watchdog compares the last 30 s with the 15 minutes before),
            # measured with the host already loaded: the noise alone drains nothing
            first = wait_for(lambda: p.query("SELECT min(ts) AS t FROM kpis WHERE job_id = ? AND step IS NOT NULL",
                                             (job_id,))[0]["t"], timeout=180, what="first training step")
            wait_for(lambda: p.steps_since(job_id, first + 75) >= 10, timeout=240, what="90 s of training")
            assert drains(p) == []
            victim = job.nodes[1]
            injection = chaos.inject("straggler", victim, job_id=job_id, percent=50)
            t0 = time.time()
            node = wait_for(lambda: (n := slurm.node(victim)).drained and n, timeout=180, what=f"{victim} isolated")
            print(f"straggler on {victim} isolated {time.time() - t0:.0f} s after injection (CPU hog running)")
            assert node.reason.startswith("sigma: straggler (isolation-outlier)")
            (inc,) = [i for i in p.incidents(node=victim) if i["action"].startswith("drain")]
            assert inc["source"] == "isolation" and inc["evidence"]["isolation"]["ranked"][0][0] == victim
            # the trainer reports where its time went: the node waited for is the one held off the CPU
            assert "wait for" in inc["evidence"]["isolation"]["reason"]
            assert "held off the CPU" in inc["evidence"]["isolation"]["reason"]
            assert drains(p) == [victim]
            assert not any(n.drained for n in slurm.nodes() if n.name != victim)
        finally:
            hog.kill()
            hog.wait()
            if injection is not None:
                chaos.undo(injection.id)
