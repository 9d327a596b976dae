"""The collapse warning through the real pipeline: a training job on the local cluster whose learning rate ramps far
past what the model tolerates (bench/collapse.py's `ramp 200 to lr 1.2, no clip`); `sigma collapse check --job J
--emit`, run as cron would run it, judges the job's KPIs; the node's sidecar forwards the `collapse_warning` event
and the controller's job-scope rule `kpi-collapse-warning` notifies, with the evidence."""

import os
import subprocess
from pathlib import Path

import pytest

from sigma.train.kpi import read_kpis
from tests.conftest import wait_for
from tests.integration.pipeline import SIGMA, Pipeline
from tests.integration.test_train_requeue import DEBUG

pytestmark = pytest.mark.integration


def test_a_rate_past_what_the_model_tolerates_warns_through_the_controller(slurm, cluster, train_data, tmp_path,
                                                                            monkeypatch):
    from sigma.train.launch import submit
    from sigma.train.train_config import load_train_config

    for key, value in cluster.env.items():
        monkeypatch.setenv(key, value)
    cfg = load_train_config(DEBUG, [
        f"data.path={train_data}", "data.prepare_if_missing=false", "threads=1", "steps=300", "checkpoint.every=0",
        f"checkpoint.dir={tmp_path / 'ckpt'}", "eval.every=0", "kpi.param_norm_every=5", "kpi.progress_every=0",
        "model_overrides.n_layers=6", "optim.lr=1.2", "optim.min_lr=0.6", "optim.warmup_steps=200",
        "optim.grad_clip=0", "fault.step_delay_s=0.2", "launch.executor=slurm", "launch.nodes=1",
        "launch.gpus_per_node=1", "launch.timeout_min=10", f"launch.folder={tmp_path / 'submitit'}"])
    with Pipeline(cluster, tmp_path / "pipeline") as p:
        job = submit(cfg)
        job_id = int(job.job_id)
        kpi_dir = Path(cluster.env["SIGMA_KPI_DIR"])
        rank0 = wait_for(lambda: next(iter((kpi_dir / f"job-{job_id}").glob("rank-0.*.jsonl")), None), timeout=120,
                         what="rank 0 KPI file")
        wait_for(lambda: max((r.get("step", 0) for r in read_kpis(rank0)), default=0) >= 60, timeout=180,
                 what="step 60")
        check = subprocess.run([SIGMA, "collapse", "check", "--job", str(job_id),
                                "--kpi-dir", str(kpi_dir), "--emit"], capture_output=True, text=True,
                               env={**os.environ, **cluster.env}, timeout=60)
        assert check.returncode == 1, check.stdout + check.stderr  # warning: the loss has not diverged yet
        assert "attn_logits" in check.stdout or "router_collapse" in check.stdout, check.stdout

        (incident,) = wait_for(lambda: p.incidents(job_id=job_id, rule_id="kpi-collapse-warning"), timeout=60,
                               what="the kpi-collapse-warning incident")
        assert incident["action"] == "notify" and incident["scope"] == "job"
        assert "warning:" in str(incident["evidence"])
        subprocess.run(["scancel", str(job_id)], env={**os.environ, **cluster.env}, check=True)
        wait_for(lambda: (j := slurm.job(job_id)) and j.state not in ("PENDING", "RUNNING", "CONFIGURING",
                                                                       "COMPLETING"), timeout=60, what="job end")
