"""A 2-node expert-parallel training job on the local SLURM cluster survives `scontrol requeue`.

SLURM restarts the original submitit submission under the same job id; the trainer finds its newest complete
checkpoint by itself and continues the same loss curve (checked against a one-process run of the same config).
"""

import os
import subprocess
import time
from pathlib import Path

import pytest

from sigma.paths import configs_dir
from sigma.train.kpi import read_kpis
from sigma.train.train_config import load_train_config
from tests.conftest import wait_for

pytestmark = pytest.mark.integration

DEBUG = configs_dir() / "train" / "debug.yaml"
STEPS = 60




def run_overrides(train_data, tmp_path):
    # aux-free balancing makes 2 EP ranks and 1 rank compute the same thing (the Switch aux loss is per rank)
    return [f"data.path={train_data}", "data.prepare_if_missing=false", "data.seq_len=32", "data.global_batch=4",
            "threads=1", f"steps={STEPS}", "checkpoint.every=5", "optim.warmup_steps=3",
            "model_overrides.balance=aux_free", "model_overrides.bias_update_speed=0.01",
            f"checkpoint.dir={tmp_path / 'ckpt'}", "kpi.progress_every=5"]


def losses(records):
    return {r["step"]: r["loss"] for r in records if "event" not in r}


def test_requeued_job_resumes_from_its_checkpoint(slurm, cluster, train_data, tmp_path, monkeypatch):
    job, job_id, rank0, submitted = submit_ep_job(cluster, train_data, tmp_path, monkeypatch)
    assert rank0.name == "rank-0.node1.jsonl"  # the node name in the file name picks the emulated node
    wait_for(lambda: max(losses(read_kpis(rank0)), default=0) >= 12, timeout=120, what="step 12")

    slurm.requeue(job_id)  # what the controller does when a node under the job fails
    wait_for(lambda: (j := slurm.job(job_id)) and j.state == "PENDING", what="job pending after requeue")
    slurm.start_now(job_id)
    done = wait_end(slurm, job_id)
    log = Path(job.paths.stderr).read_text() if Path(job.paths.stderr).exists() else ""
    assert done.state == "COMPLETED" and done.restarts == 1, (done, log[-3000:])

    # a fresh test cluster numbers jobs from 1 again: ignore lines an earlier cluster's job left in the file
    records = [r for r in read_kpis(rank0) if r["ts"] >= submitted]
    events = [r for r in records if "event" in r]
    resume = [e for e in events if e["event"] == "resume"]
    assert len(resume) == 1 and 10 <= resume[0]["step"] < STEPS and resume[0]["step"] % 5 == 0
    assert [e["event"] for e in events].count("start") == 2 and events[-1]["event"] == "stop"
    # steps run twice (after the checkpoint, before SLURM's SIGKILL) logged the same losses both times
    seen: dict[int, list[float]] = {}
    for r in records:
        if "event" not in r:
            seen.setdefault(r["step"], []).append(r["loss"])
    repeated = [s for s, v in seen.items() if len(v) > 1]
    assert all(s > resume[0]["step"] for s in repeated)
    for step in repeated:
        assert seen[step][0] == pytest.approx(seen[step][1], abs=1e-6), step
    assert (rank0.parent / "rank-1.node2.jsonl").exists()

    # ... and the whole curve is the one a single uninterrupted process computes
    assert_reference_curve(records, train_data, tmp_path, monkeypatch)


def assert_reference_curve(records, train_data, tmp_path, monkeypatch):
    from sigma.train.trainer import train

    monkeypatch.setenv("SIGMA_KPI_DIR", str(tmp_path / "reference-kpi"))
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    reference = train(load_train_config(DEBUG, run_overrides(train_data, tmp_path / "reference")))
    curve = losses(records)
    assert sorted(curve) == list(range(1, STEPS + 1))
    for step in range(1, STEPS + 1):
        assert curve[step] == pytest.approx(reference.losses[step], abs=1e-4), step


def submit_ep_job(cluster, train_data, tmp_path, monkeypatch):
    from sigma.train.launch import submit

    for key, value in cluster.env.items():
        monkeypatch.setenv(key, value)
    cfg = load_train_config(DEBUG, run_overrides(train_data, tmp_path) + [
        "launch.executor=slurm", "launch.nodes=2", "launch.gpus_per_node=1", "parallel.ep=2",
        "launch.timeout_min=10", f"launch.folder={tmp_path / 'submitit'}", "fault.step_delay_s=0.15"])
    submitted = time.time()
    job = submit(cfg)
    rank0 = wait_for(lambda: next(iter((Path(cluster.env["SIGMA_KPI_DIR"]) / f"job-{job.job_id}")
                                       .glob("rank-0.*.jsonl")), None), timeout=120, what="rank 0 KPI file")
    return job, int(job.job_id), rank0, submitted


def wait_end(slurm, job_id, timeout=240):
    return wait_for(lambda: (j := slurm.job(job_id)) and j.state not in ("PENDING", "RUNNING", "CONFIGURING",
                                                                         "COMPLETING") and j,
                    timeout=timeout, interval=1.0, what="job end")


def test_preemption_signal_goes_through_the_submitit_checkpoint_hook(slurm, cluster, train_data, tmp_path,
                                                                    monkeypatch):
    """USR2 is what SLURM sends before a timeout or preemption (submitit's --signal=USR2@90)."""
    job, job_id, rank0, submitted = submit_ep_job(cluster, train_data, tmp_path, monkeypatch)
    wait_for(lambda: max(losses(read_kpis(rank0)), default=0) >= 12, timeout=120, what="step 12")
    subprocess.run(["scancel", "--signal=USR2", str(job_id)], env={**os.environ, **cluster.env}, check=True)
    wait_for(lambda: (j := slurm.job(job_id)) and j.state == "PENDING", what="job requeued by submitit")
    slurm.start_now(job_id)
    done = wait_end(slurm, job_id)
    log = Path(job.paths.stdout).read_text()
    assert done.state == "COMPLETED" and done.restarts == 1, log[-3000:]
    assert "Caught signal SIGUSR2" in log and "Requeued job" in log  # submitit's hook, not a node failure
    records = [r for r in read_kpis(rank0) if r["ts"] >= submitted]
    assert [r["event"] for r in records if "event" in r].count("resume") == 1
    assert_reference_curve(records, train_data, tmp_path, monkeypatch)


def test_sbatch_script_runs_an_expert_parallel_job(slurm, cluster, train_data, tmp_path):
    import os
    import subprocess
    import sys

    from sigma.paths import project_root

    out = tmp_path / "train.out"
    env = {**os.environ, **cluster.env, "SIGMA_PYTHON": sys.executable}
    argv = ["sbatch", "--parsable", "-N2", "--ntasks-per-node=1", f"--chdir={project_root()}", f"--output={out}",
            "sbatch/train.sbatch", str(DEBUG), "steps=6", "parallel.ep=2", "checkpoint.every=3",
            f"checkpoint.dir={tmp_path / 'ckpt'}", f"data.path={train_data}", "data.prepare_if_missing=false",
            "data.seq_len=32", "data.global_batch=4", "threads=1"]
    job_id = int(subprocess.run(argv, env=env, capture_output=True, text=True, check=True).stdout.split(";")[0])
    job = wait_for(lambda: (j := slurm.job(job_id)) and j.state not in ("PENDING", "RUNNING", "CONFIGURING",
                                                                        "COMPLETING") and j,
                   timeout=180, interval=1.0, what="sbatch job end")
    log = out.read_text()
    assert job.state == "COMPLETED", log[-3000:]
    assert "2 rank(s) ep=2" in log and "step      6/6" in log
    kpi = Path(cluster.env["SIGMA_KPI_DIR"]) / f"job-{job_id}"
    for name in ("rank-0.node1.jsonl", "rank-1.node2.jsonl"):
        records = [r for r in read_kpis(kpi / name) if r["ts"] >= job.submit_time]
        assert records[-1]["event"] == "stop" and records[-1]["step"] == 6
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == ["step-00000003", "step-00000006"]
