"""`sigma train` without SLURM: submitit's local executor runs the ranks as local processes."""

import pickle

from sigma.paths import configs_dir
from sigma.train.kpi import read_kpis

DEBUG = configs_dir() / "train" / "debug.yaml"


def test_local_submission_runs_two_expert_parallel_ranks(train_data, tmp_path, monkeypatch, capsys):
    from sigma.cli import main

    monkeypatch.setenv("SIGMA_KPI_DIR", str(tmp_path / "kpi"))
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    code = main(["train", "--config", str(DEBUG), "--gpus-per-node", "2", "launch.executor=local", "parallel.ep=2",
                 "steps=3", f"data.path={train_data}", "data.prepare_if_missing=false", "data.seq_len=32",
                 "data.global_batch=4", "threads=1", f"checkpoint.dir={tmp_path / 'ckpt'}",
                 f"launch.folder={tmp_path / 'submitit'}"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "submitted debug as local job" in out and "finished at step 3" in out
    job_dir = next((tmp_path / "kpi").glob("job-*"))
    ranks = sorted(p.name.split(".")[0] for p in job_dir.glob("rank-*.jsonl"))
    assert ranks == ["rank-0", "rank-1"]
    for path in job_dir.glob("rank-*.jsonl"):
        assert read_kpis(path)[-1]["event"] == "stop"
    assert (tmp_path / "ckpt" / "step-00000003").is_dir()


def test_checkpoint_hook_resubmits_the_same_task():
    from sigma.train.launch import TrainTask
    from sigma.train.train_config import load_train_config

    task = TrainTask(load_train_config(DEBUG, ["steps=7"]).to_dict())
    delayed = pickle.loads(pickle.dumps(task.checkpoint()))
    assert isinstance(delayed.function, TrainTask) and delayed.function.config["steps"] == 7
