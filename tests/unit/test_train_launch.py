"""`sigma train` without SLURM: submitit's local executor runs the ranks as local processes."""

import pickle

import pytest

from sigma.paths import configs_dir
from sigma.train.kpi import read_kpis

DEBUG = configs_dir() / "train" / "debug.yaml"


def test_local_submission_runs_two_expert_parallel_ranks(train_data, tmp_path, monkeypatch, capsys):
    from sigma.cli import main

    monkeypatch.setenv("SIGMA_KPI_DIR", str(tmp_path / "kpi"))
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    args = ["--config", str(DEBUG), "--gpus-per-node", "2", "launch.executor=local", "parallel.ep=2",
            "steps=3", f"data.path={train_data}", "data.prepare_if_missing=false", "data.seq_len=32",
            "data.global_batch=4", "threads=1", f"checkpoint.dir={tmp_path}/runs/{{name}}/ckpt",
            f"launch.folder={tmp_path}/runs/{{name}}/submitit"]
    code = main(["train", *args])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "submitted new run debug as local job" in out and "run debug finished at step 3" in out
    job_dir = next((tmp_path / "kpi").glob("job-*"))
    ranks = sorted(p.name.split(".")[0] for p in job_dir.glob("rank-*.jsonl"))
    assert ranks == ["rank-0", "rank-1"]
    for path in job_dir.glob("rank-*.jsonl"):
        assert read_kpis(path)[-1]["event"] == "stop"
    assert (tmp_path / "runs" / "debug" / "ckpt" / "step-00000003").is_dir()

    # the same command again trains a new run; the finished one says so, and how to extend it
    from sigma.train.launch import name_new_run
    from sigma.train.train_config import load_train_config

    assert name_new_run(load_train_config(DEBUG, args[4:]))[0].name == "debug-2"
    assert main(["train", *args, "--resume", "debug"]) == 2
    err = capsys.readouterr().err
    assert "run 'debug' is finished: it reached step 3 of steps=3" in err and "--resume debug steps=6" in err
    assert main(["train", *args, "--resume", "nosuch"]) == 2
    err = capsys.readouterr().err
    assert "no run 'nosuch'" in err and "runs: debug" in err


def test_fixed_checkpoint_dir_continues_its_run_until_finished(tmp_path):
    from sigma.train.checkpoint import step_dir_name, write_json_atomic
    from sigma.train.launch import LaunchError, name_new_run
    from sigma.train.train_config import load_train_config

    cfg = load_train_config(DEBUG, [f"checkpoint.dir={tmp_path / 'ckpt'}", "steps=80"])
    assert name_new_run(cfg) == (cfg, "")  # nothing there yet
    done = tmp_path / "ckpt" / step_dir_name(50)
    done.mkdir(parents=True)
    write_json_atomic(done / "complete.json", {"step": 50})
    same, note = name_new_run(cfg)
    assert same is cfg and "continuing the run in" in note and "from step 50" in note
    with pytest.raises(LaunchError, match="run 'debug' is finished: it reached step 50 of steps=50"):
        name_new_run(load_train_config(DEBUG, [f"checkpoint.dir={tmp_path / 'ckpt'}"]))


def test_bad_override_is_a_command_line_error(capsys):
    from sigma.cli import main

    assert main(["train", "--config", str(DEBUG), "steps=abc"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("sigma: error: command line `steps=abc`:") and "debug.yaml" not in err


def test_checkpoint_hook_resubmits_the_same_task():
    from sigma.train.launch import TrainTask
    from sigma.train.train_config import load_train_config

    task = TrainTask(load_train_config(DEBUG, ["steps=7"]).to_dict())
    delayed = pickle.loads(pickle.dumps(task.checkpoint()))
    assert isinstance(delayed.function, TrainTask) and delayed.function.config["steps"] == 7
