"""`sigma train`'s loop under a pipeline layout on the local SLURM cluster: 4 ranks on 2 nodes, pp2 x dp2 with
interleaved 1F1B (vpp2) and ZeRO-1, trains the same loss curve as one process and reports its pipeline KPIs."""

from pathlib import Path

import pytest

from sigma.paths import configs_dir
from sigma.train.kpi import read_kpis
from sigma.train.train_config import load_train_config
from tests.conftest import wait_for

pytestmark = pytest.mark.integration

DEBUG = configs_dir() / "train" / "debug.yaml"
STEPS = 6


def overrides(train_data, ckpt):
    return [f"data.path={train_data}", "data.prepare_if_missing=false", "data.seq_len=32", "data.global_batch=8",
            "threads=1", f"steps={STEPS}", "checkpoint.every=3", "optim.warmup_steps=2", "eval.every=0",
            "model_overrides.n_layers=4", "model_overrides.balance=aux_free", "model_overrides.bias_update_speed=0.01",
            f"checkpoint.dir={ckpt}", "kpi.progress_every=1"]


def test_pipeline_layout_job_matches_one_process(slurm, cluster, train_data, tmp_path, monkeypatch):
    from sigma.train.launch import submit
    from sigma.train.trainer import train

    for key, value in cluster.env.items():
        monkeypatch.setenv(key, value)
    cfg = load_train_config(DEBUG, overrides(train_data, tmp_path / "ckpt") + [
        "launch.executor=slurm", "launch.nodes=2", "launch.gpus_per_node=2", "launch.timeout_min=10",
        f"launch.folder={tmp_path / 'submitit'}", "parallel.pp=2", "parallel.vpp=2", "parallel.microbatches=2",
        "parallel.shard_optimizer=true"])
    job = submit(cfg)
    done = wait_for(lambda: (j := slurm.job(int(job.job_id))) and j.state not in (
        "PENDING", "RUNNING", "CONFIGURING", "COMPLETING") and j, timeout=300, interval=1.0, what="job end")
    log = Path(job.paths.stdout).read_text() if Path(job.paths.stdout).exists() else ""
    assert done.state == "COMPLETED", log[-3000:]
    assert "4 rank(s) ep=1 (dp2 tp1 pp2 ep1 vpp2 interleaved_1f1b mb2 layers[1, 1, 1, 1])" in log

    kpi = Path(cluster.env["SIGMA_KPI_DIR"]) / f"job-{job.job_id}"
    names = sorted(p.name for p in kpi.glob("rank-*.jsonl"))
    assert names == ["rank-0.node1.jsonl", "rank-1.node1.jsonl", "rank-2.node2.jsonl", "rank-3.node2.jsonl"]
    ranks = [{r["step"]: r for r in read_kpis(kpi / n) if "event" not in r} for n in names]
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == ["step-00000003", "step-00000006"]

    monkeypatch.setenv("SIGMA_KPI_DIR", str(tmp_path / "reference-kpi"))
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    reference = train(load_train_config(DEBUG, overrides(train_data, tmp_path / "reference")))
    for step in range(1, STEPS + 1):
        for rank in ranks:
            assert rank[step]["loss"] == pytest.approx(reference.losses[step], abs=2e-5), step
            assert 0.0 <= rank[step]["bubble"] < 1.0 and rank[step]["stage_busy_s"] > 0
