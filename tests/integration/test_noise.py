"""Noise attribution end to end: GC pressure injected with `sigma chaos` into a running training job on the local
cluster travels through the KPI lines, the sidecar and the controller, and `sigma noise` names it."""

import json
import subprocess
import sys
import time

import pytest

from tests.conftest import REPO, wait_for
from tests.integration.pipeline import Pipeline

pytestmark = pytest.mark.integration


def test_gc_pressure_in_a_running_job_is_named_by_sigma_noise(slurm, cluster, train_data, tmp_path):
    with Pipeline(cluster, tmp_path / "pipeline", sidecar_sets=[
            "collectors.host.interval_s=1", "collectors.nvml.enabled=false", "collectors.infiniband.enabled=false",
            "push.interval_s=0.5"]) as p:
        args = [f"data.path={train_data}", "data.prepare_if_missing=false", "data.seq_len=32",
                "data.global_batch=4", "threads=1", "steps=1000000", "checkpoint.every=0", "eval.every=0",
                "kpi.progress_every=0", f"checkpoint.dir={tmp_path / 'ckpt'}", "fault.gc_trigger=true",
                "gc_manual=false"]  # Python's automatic GC: the pauses land wherever the churn triggers them
        job_id = slurm.submit(None, "-N1", "-w", "node2", f"--output={tmp_path}/job-%j.out",
                              f"--export=ALL,SIGMA_KPI_DIR={cluster.env['SIGMA_KPI_DIR']}",
                              wrap=f"srun {sys.executable} -m sigma.train.trainer --config "
                                   f"{REPO}/configs/train/debug.yaml {' '.join(args)}")
        steps = lambda: p.query("SELECT COUNT(*) AS n FROM kpis WHERE job_id = ? AND step IS NOT NULL",
                                (job_id,))[0]["n"]
        wait_for(lambda: steps() >= 5, timeout=180, what="the job's first steps at the controller")
        cli = [sys.executable, "-m", "sigma.cli"]
        injected = subprocess.run([*cli, "chaos", "gc-pressure", "--node", "node2", "--objects", "40000", "--force",
                                   "--json", "--state-dir", str(cluster.state_dir)],
                                  capture_output=True, text=True, check=True)
        since = time.time()
        inj = json.loads(injected.stdout)
        assert inj["kind"] == "gc-pressure" and inj["job_id"] == job_id
        # the job trains until cancelled: enough steps under pressure whatever this machine's speed
        since_steps = lambda: p.query("SELECT COUNT(*) AS n FROM kpis WHERE job_id = ? AND step IS NOT NULL "
                                      "AND ts >= ?", (job_id, since))[0]["n"]
        wait_for(lambda: since_steps() >= 100, timeout=300, what="100 steps under GC pressure at the controller")
        slurm.cancel(job_id)
        wait_for(lambda: (j := slurm.job(job_id)) and j.state not in ("PENDING", "RUNNING", "CONFIGURING",
                                                                     "COMPLETING"), timeout=120, what="job end")
        subprocess.run([*cli, "chaos", "undo", inj["id"], "--state-dir", str(cluster.state_dir)], check=True,
                       capture_output=True)
        out = subprocess.run([*cli, "noise", "--job", str(job_id), "--config", str(p.config), "--since",
                              f"{since:.3f}", "--json"],
                             capture_output=True, text=True)
        assert out.returncode == 0, out.stderr
    noise = json.loads(out.stdout)
    assert noise["causes"] == {"gc": [0]}, noise["ranks"]
    assert noise["ranks"][0]["node"] == "node2" and noise["ranks"][0]["explained"]["gc"] > 0
