"""Just-in-time checkpoints on CPU (debug preset): a request in the control file saves the current step, a NaN saves
the last healthy one, and a resume from either continues the uninterrupted loss curve bit for bit."""

import json
import os

import pytest

from sigma.train.checkpoint import complete_checkpoints, read_meta
from sigma.train.jit import read_request
from sigma.train.kpi import read_kpis
from sigma.train.train_config import load_train_config
from tests.unit.test_train_loop import DEBUG, metrics_by_step, overrides, run_rank

NODE = os.uname().nodename
# router jitter draws random numbers every step: a resume without the exact RNG state would diverge
COMMON = ["steps=8", "checkpoint.every=0", "model_overrides.router_jitter=0.3", "eval.every=0"]


def write_request(kpi_dir, job_id, request_id, deadline=0.0):
    path = kpi_dir / f"job-{job_id}" / f"checkpoint-request.{NODE}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"id": request_id, "job_id": job_id, "deadline": deadline}))
    return path


@pytest.fixture
def straight(train_data, tmp_path, monkeypatch):
    from sigma.train.trainer import train

    monkeypatch.setenv("SIGMA_KPI_DIR", str(tmp_path / "kpi"))
    monkeypatch.setenv("SIGMA_JOB_ID", "1")
    return train(load_train_config(DEBUG, overrides(train_data, tmp_path / "a", *COMMON)))


def test_requested_checkpoint_then_kill_resumes_bit_exact(train_data, tmp_path, straight):
    kpi = tmp_path / "kpi"
    write_request(kpi, 5, 7)
    args = overrides(train_data, tmp_path / "b", *COMMON, "checkpoint.jit_poll_every=4", "fault.kill_at_step=6")
    assert run_rank(args, kpi, 5).returncode == -9
    (saved,) = complete_checkpoints(tmp_path / "b")  # no periodic checkpoint: only the requested one
    assert saved.name == "step-00000004"
    assert read_meta(saved)["kind"] == "jit" and read_meta(saved)["request"] == 7
    resumed = run_rank(args, kpi, 5)
    assert resumed.returncode == 0, resumed.stderr[-2000:]

    path = kpi / "job-5" / f"rank-0.{NODE}.jsonl"
    records = read_kpis(path)
    answers = [r for r in records if r.get("event") == "checkpoint" and r.get("request") == 7]
    assert len(answers) == 1 and answers[0]["step"] == 4  # answered once: the resumed run knows request 7
    resume = next(r for r in records if r.get("event") == "resume")
    assert resume["step"] == 4 and resume["checkpoint_kind"] == "jit" and resume["rng_restored"] is True
    losses = metrics_by_step(path)
    assert sorted(losses) == list(range(1, 9))
    for step in range(1, 9):
        assert losses[step] == straight.losses[step], step  # bit-exact: model, AdamW, RNG, sampler


def test_nan_saves_the_last_healthy_step_and_the_resume_is_bit_exact(train_data, tmp_path, straight,
                                                                      monkeypatch):
    from sigma.train.trainer import TrainingStopped, train

    monkeypatch.setenv("SIGMA_JOB_ID", "6")
    with pytest.raises(TrainingStopped, match="at step 5"):
        train(load_train_config(DEBUG, overrides(train_data, tmp_path / "c", *COMMON, "fault.nan_at_step=5")))
    (saved,) = complete_checkpoints(tmp_path / "c")
    assert saved.name == "step-00000004" and read_meta(saved)["kind"] == "rollback"
    resumed = train(load_train_config(DEBUG, overrides(train_data, tmp_path / "c", *COMMON)))
    assert resumed.start_step == 4
    for step in range(5, 9):
        assert resumed.losses[step] == straight.losses[step], step


def test_nan_right_after_a_checkpoint_saves_nothing_new(train_data, tmp_path, monkeypatch):
    from sigma.train.trainer import TrainingStopped, train

    monkeypatch.setenv("SIGMA_KPI_DIR", str(tmp_path / "kpi"))
    monkeypatch.setenv("SIGMA_JOB_ID", "8")
    args = overrides(train_data, tmp_path / "d", "steps=8", "checkpoint.every=2", "checkpoint.background=false",
                     "fault.nan_at_step=5")
    with pytest.raises(TrainingStopped):
        train(load_train_config(DEBUG, args))
    assert [p.name for p in complete_checkpoints(tmp_path / "d")] == ["step-00000002", "step-00000004"]
    assert read_meta(tmp_path / "d" / "step-00000004").get("kind") is None  # the periodic one, kept as it was


def test_control_file_reading(tmp_path):
    path = tmp_path / "checkpoint-request.n1.json"
    assert read_request(path, 100.0) == (0, 0.0)  # none
    path.write_text(json.dumps({"id": 3, "deadline": 200.0}))
    assert read_request(path, 100.0) == (3, 200.0)
    assert read_request(path, 250.0) == (0, 0.0)  # the controller has requeued by then
    path.write_text('{"id": 3, "dead')  # half a file
    assert read_request(path, 100.0) == (0, 0.0)
    path.write_text(json.dumps({"id": "x"}))
    assert read_request(path, 100.0) == (0, 0.0)


def test_a_request_written_before_the_run_started_is_an_earlier_runs(tmp_path):
    """A run resumed from the replica that answered a request finds the request's control file still there: it was
    written before this run's processes started, so it is not answered again (a second save and a hold until its
    deadline, long after the requeue it was for)."""
    path = tmp_path / "checkpoint-request.n1.json"
    path.write_text(json.dumps({"id": 3, "deadline": 200.0}))
    written = path.stat().st_mtime
    assert read_request(path, 100.0, since=written + 1) == (0, 0.0)  # the run started after: an earlier run's
    assert read_request(path, 100.0, since=written - 1) == (3, 200.0)  # written while this run ran: its own


def test_the_hold_after_an_answer_ends_when_another_rank_leaves(tmp_path):
    """A rank whose node's slurmd is gone gets no SIGTERM from the requeue: it stops holding when a rank that got
    one marks its leaving in the store, or when the store's server (rank 0's process) is gone."""
    import datetime
    import threading
    import time

    import torch.distributed as dist

    from sigma.train.jit import LEFT_KEY, hold

    server = dist.TCPStore("127.0.0.1", 0, 2, True, timeout=datetime.timedelta(seconds=30), wait_for_workers=False)
    client = dist.TCPStore("127.0.0.1", server.port, 2, False, timeout=datetime.timedelta(seconds=30))
    soon, later = time.time() + 0.3, time.time() + 60  # a hold that ends before `later` ended for its reason
    assert hold(soon, client, 7) == "deadline"  # nobody left: held to the deadline
    assert client.timeout == datetime.timedelta(seconds=30)  # the store's own timeout restored
    threading.Timer(0.3, lambda: server.set(LEFT_KEY.format(request=8), "1")).start()
    assert hold(later, client, 8) == "peer left"
    del server  # rank 0's process gone: its store with it
    assert hold(later, client, 9) == "store gone"
    alone = time.time() + 0.2
    assert hold(alone, None, 10) == "deadline"  # a single process: nothing to watch


def test_a_disk_that_fills_during_the_requested_save_keeps_the_older_checkpoint(train_data, tmp_path):
    """The file-size limit makes every checkpoint write fail with EFBIG, as a full disk would: the request is
    answered with a checkpoint_failed event, training goes on, and the older complete checkpoint stays as it was."""
    import resource
    import signal
    import subprocess
    import sys

    kpi = tmp_path / "kpi"
    first = overrides(train_data, tmp_path / "g", *COMMON, "checkpoint.every=3", "checkpoint.background=false",
                      "fault.kill_at_step=4")
    assert run_rank(first, kpi, 12).returncode == -9
    marker = (tmp_path / "g" / "step-00000003" / "complete.json").read_text()
    write_request(kpi, 12, 21)

    def small_files():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a failing write returns EFBIG instead of killing
        resource.setrlimit(resource.RLIMIT_FSIZE, (256 * 1024, 256 * 1024))  # the debug checkpoint is ~1.7 MB

    env = {**os.environ, "SIGMA_KPI_DIR": str(kpi), "SIGMA_JOB_ID": "12"}
    env.pop("SLURM_JOB_ID", None)
    second = subprocess.run([sys.executable, "-m", "sigma.train.trainer", "--config", str(DEBUG),
                             *overrides(train_data, tmp_path / "g", *COMMON, "checkpoint.every=0",
                                        "checkpoint.jit_poll_every=5")],
                            env=env, capture_output=True, text=True, timeout=240, preexec_fn=small_files)
    assert second.returncode != 0  # the final save cannot be written either: that one fails loudly
    records = read_kpis(kpi / "job-12" / f"rank-0.{NODE}.jsonl")
    (failed,) = [r for r in records if r.get("event") == "checkpoint_failed"]
    assert failed["step"] == 5 and failed["request"] == 21 and "step-00000003" in failed["message"]
    assert max(r["step"] for r in records if "event" not in r) == 8  # training went on after the failed save
    assert [p.name for p in complete_checkpoints(tmp_path / "g")] == ["step-00000003"]
    assert (tmp_path / "g" / "step-00000003" / "complete.json").read_text() == marker  # nothing overwritten
