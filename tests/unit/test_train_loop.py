"""The training loop on CPU (debug preset): exact resume after a kill, NaN stop, KPI content."""

import os
import subprocess
import sys

import pytest

from sigma.paths import configs_dir
from sigma.train.kpi import read_kpis
from sigma.train.train_config import load_train_config

DEBUG = configs_dir() / "train" / "debug.yaml"


def overrides(train_data, ckpt_dir, *extra):
    return [f"data.path={train_data}", "data.prepare_if_missing=false", "data.seq_len=32", "data.global_batch=4",
            "threads=1", "kpi.progress_every=0", f"checkpoint.dir={ckpt_dir}", "optim.warmup_steps=3", *extra]


def run_rank(args, kpi_dir, job_id):
    env = {**os.environ, "SIGMA_KPI_DIR": str(kpi_dir), "SIGMA_JOB_ID": str(job_id)}
    env.pop("SLURM_JOB_ID", None)
    return subprocess.run([sys.executable, "-m", "sigma.train.trainer", "--config", str(DEBUG), *args],
                          env=env, capture_output=True, text=True, timeout=240)


def metrics_by_step(path):
    """Last logged loss per step (a resumed run logs the steps after its checkpoint again)."""
    return {r["step"]: r["loss"] for r in read_kpis(path) if "event" not in r}


def test_twenty_steps_equal_ten_then_kill_then_resume(train_data, tmp_path, monkeypatch):
    from sigma.train.trainer import train

    monkeypatch.setenv("SIGMA_KPI_DIR", str(tmp_path / "kpi"))
    monkeypatch.setenv("SIGMA_JOB_ID", "1")
    straight = train(load_train_config(DEBUG, overrides(train_data, tmp_path / "a", "steps=20")))
    assert sorted(straight.losses) == list(range(1, 21))

    args = overrides(train_data, tmp_path / "b", "steps=20", "checkpoint.every=5", "fault.kill_at_step=13")
    killed = run_rank(args, tmp_path / "kpi", 2)
    assert killed.returncode == -9, killed.stderr[-2000:]
    assert sorted(p.name for p in (tmp_path / "b").iterdir()) == ["step-00000005", "step-00000010"]
    resumed = run_rank(args, tmp_path / "kpi", 2)
    assert resumed.returncode == 0, resumed.stderr[-2000:]

    records = read_kpis(tmp_path / "kpi" / "job-2" / f"rank-0.{os.uname().nodename}.jsonl")
    events = [r["event"] for r in records if "event" in r]
    assert events.count("start") == 2 and "fault" in events and events.count("stop") == 1
    resume = next(r for r in records if r.get("event") == "resume")
    assert resume["step"] == 10
    losses = metrics_by_step(tmp_path / "kpi" / "job-2" / f"rank-0.{os.uname().nodename}.jsonl")
    assert sorted(losses) == list(range(1, 21))
    for step in range(1, 21):
        assert losses[step] == pytest.approx(straight.losses[step], abs=1e-5), step
    assert losses[20] < losses[1] - 0.5, "the debug model must learn in 20 steps"


def test_metrics_lines_carry_the_kpis(train_data, tmp_path, monkeypatch):
    from sigma.train.trainer import train

    monkeypatch.setenv("SIGMA_KPI_DIR", str(tmp_path / "kpi"))
    monkeypatch.setenv("SIGMA_JOB_ID", "5")
    summary = train(load_train_config(DEBUG, overrides(train_data, tmp_path / "c", "steps=4", "kpi.param_norm_every=2",
                                                       "model_overrides.balance=aux_free", "peak_flops=1e11")))
    records = read_kpis(summary.kpi_path)
    metrics = [r for r in records if "event" not in r]
    assert [m["step"] for m in metrics] == [1, 2, 3, 4]
    for m in metrics:
        assert {"ts", "job_id", "rank", "loss", "grad_norm", "step_time_s", "tokens_per_s", "mfu", "lr"} <= set(m)
        assert m["job_id"] == 5 and m["tokens_per_s"] > 0 and 0 < m["mfu"] < 1
        assert len(m["expert_load"]) == 1 and sum(m["expert_load"][0]) == 4 * 32 * 2  # tokens x top_k
    assert [("moe_param_norm" in m) for m in metrics] == [False, True, False, True]
    assert [r["event"] for r in records if "event" in r] == ["start", "eval", "checkpoint", "stop"]
    assert "eval_loss" in metrics[-1] and "eval_loss" not in metrics[0]  # the last step is evaluated
    (evaluated,) = [r for r in records if r.get("event") == "eval"]
    assert 0 < evaluated["eval_s"] == metrics[-1]["eval_s"]  # its own time, outside step_time_s
    assert 0 < metrics[-1]["hfu"] == pytest.approx(metrics[-1]["mfu"])  # no recomputation: HFU = MFU


def test_nan_loss_stops_with_an_event(train_data, tmp_path, monkeypatch, capsys):
    from sigma.train.trainer import TrainingStopped, main, train

    monkeypatch.setenv("SIGMA_KPI_DIR", str(tmp_path / "kpi"))
    monkeypatch.setenv("SIGMA_JOB_ID", "9")
    cfg = load_train_config(DEBUG, overrides(train_data, tmp_path / "d", "steps=10", "fault.nan_at_step=3"))
    with pytest.raises(TrainingStopped, match="non-finite loss nan .* at step 3"):
        train(cfg)
    records = read_kpis(tmp_path / "kpi" / "job-9" / f"rank-0.{os.uname().nodename}.jsonl")
    assert [r["step"] for r in records if "event" not in r] == [1, 2]
    event = next(r for r in records if r.get("event") == "nan_loss")
    assert event["step"] == 3 and "non-finite loss" in event["message"]
    # the rank's entry point exits non-zero, so SLURM records a failed job instead of a finished one
    assert main(["--config", str(DEBUG), *overrides(train_data, tmp_path / "e", "steps=4", "fault.nan_at_step=2")]) == 3


def test_nan_trigger_file_poisons_the_running_job(train_data, tmp_path, monkeypatch):
    from sigma.train.trainer import TrainingStopped, train

    monkeypatch.setenv("SIGMA_KPI_DIR", str(tmp_path / "kpi"))
    monkeypatch.setenv("SIGMA_JOB_ID", "11")
    (tmp_path / "kpi" / "job-11").mkdir(parents=True)
    (tmp_path / "kpi" / "job-11" / "inject-nan").write_text("now\n")
    cfg = load_train_config(DEBUG, overrides(train_data, tmp_path / "d", "steps=5", "fault.nan_trigger=true"))
    with pytest.raises(TrainingStopped, match="at step 1"):
        train(cfg)
    # one shot: the run restarted from its checkpoint does not hit the same fault again
    assert not (tmp_path / "kpi" / "job-11" / "inject-nan").exists()


def test_garbage_collection_is_manual_during_the_run(train_data, tmp_path, monkeypatch):
    import gc

    from sigma.train.trainer import train

    monkeypatch.setenv("SIGMA_KPI_DIR", str(tmp_path / "kpi"))
    collections = []

    def record(phase, info):
        if phase == "start":
            collections.append(info["generation"])

    cfg = load_train_config(DEBUG, overrides(train_data, tmp_path / "f", "steps=4", "gc_every=2",
                                             "checkpoint.every=0"))
    gc.callbacks.append(record)
    try:
        train(cfg)
    finally:
        gc.callbacks.remove(record)
    # automatic collections are mostly young-generation ones; manual gc.collect() is always a full one
    assert collections and all(g == 2 for g in collections), collections
    assert len(collections) >= 4  # start, steps 2 and 4, after the final checkpoint
    assert gc.isenabled()


def test_exact_resume_with_router_jitter_restores_the_rng(train_data, tmp_path, monkeypatch):
    from sigma.train.trainer import train

    monkeypatch.setenv("SIGMA_KPI_DIR", str(tmp_path / "kpi"))
    monkeypatch.setenv("SIGMA_JOB_ID", "3")
    jitter = ["steps=8", "checkpoint.every=4", "model_overrides.router_jitter=0.3", "eval.every=0"]
    straight = train(load_train_config(DEBUG, overrides(train_data, tmp_path / "a", *jitter)))
    args = overrides(train_data, tmp_path / "b", *jitter, "fault.kill_at_step=6")
    assert run_rank(args, tmp_path / "kpi", 4).returncode == -9
    resumed = run_rank(args, tmp_path / "kpi", 4)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    path = tmp_path / "kpi" / "job-4" / f"rank-0.{os.uname().nodename}.jsonl"
    assert next(r for r in read_kpis(path) if r.get("event") == "resume")["rng_restored"] is True
    losses = metrics_by_step(path)
    for step in range(1, 9):  # the jitter noise after the resume is the noise the straight run drew
        assert losses[step] == straight.losses[step], step


def test_gradient_accumulation_equals_the_whole_batch(train_data, tmp_path, monkeypatch):
    from sigma.train.trainer import train

    monkeypatch.setenv("SIGMA_KPI_DIR", str(tmp_path / "kpi"))
    common = ["steps=4", "model_overrides.balance=aux_free", "eval.every=2"]
    whole = train(load_train_config(DEBUG, overrides(train_data, tmp_path / "a", *common)))
    micro = train(load_train_config(DEBUG, overrides(train_data, tmp_path / "b", *common, "data.micro_batch=1")))
    # the same split named by its count: the key the pipeline schedules read
    counted = train(load_train_config(DEBUG, overrides(train_data, tmp_path / "c", *common,
                                                       "parallel.microbatches=4", "eval.every=0")))
    starts = [r for r in read_kpis(micro.kpi_path) if r.get("event") == "start"]  # the runs share the file
    assert [s["micro_batches"] for s in starts] == [1, 4, 4]
    for step in range(1, 5):
        assert micro.losses[step] == pytest.approx(whole.losses[step], abs=2e-5), step
        assert counted.losses[step] == micro.losses[step], step
    assert sorted(micro.eval_losses) == [2, 4]
    assert micro.eval_losses[4] == pytest.approx(whole.eval_losses[4], abs=2e-5)
    assert micro.eval_losses[4] < micro.eval_losses[2]  # held-out loss falls as it learns
