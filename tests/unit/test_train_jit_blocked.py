"""A request answered while a hung rank blocks the others in a collective (CPU, gloo, torchrun, 2 ranks, expert
parallel, router jitter on): rank 1 stops itself with SIGSTOP as `sigma chaos hang` would, rank 0 blocks in the
all-to-all of the next step, and its answering thread keeps the last finished step on the checkpoint filesystem,
its own state and rank 1's from the replica rank 1 sent it. The run is killed; the restart, with the nodes' memory
gone (another set of nodes), resumes from that step and its loss curve is the uninterrupted one, bit for bit."""

import contextlib
import json
import os
import shutil
import subprocess
import sys
import time

import psutil

from sigma.train.kpi import read_kpis
from tests.conftest import wait_for
from tests.unit.test_train_replica import NODE, args, curve, torchrun

EXTRA = ["parallel.ep=2", "checkpoint.every=0", "checkpoint.replica_every=1", "fault.hang_at_step=6",
         "fault.hang_rank=1"]


def launch(tmp_path, argv, job):
    from tests.unit.test_train_loop import DEBUG

    env = {**os.environ, "SIGMA_KPI_DIR": str(tmp_path / "kpi"), "SIGMA_JOB_ID": str(job), "OMP_NUM_THREADS": "1"}
    env.pop("SLURM_JOB_ID", None)
    return subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                             "-m", "sigma.train.trainer", "--config", str(DEBUG), *argv], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def events(tmp_path, job, rank):
    path = tmp_path / "kpi" / f"job-{job}" / f"rank-{rank}.{NODE}.jsonl"
    return [r for r in read_kpis(path) if "event" in r] if path.exists() else []


def test_hung_rank_the_others_answer_and_the_resume_is_bit_exact(train_data, tmp_path):
    job = 91
    straight = torchrun(tmp_path / "straight", args(train_data, tmp_path / "straight", "parallel.ep=2"), job=job)
    assert straight.returncode == 0, straight.stderr[-3000:]
    reference = curve(tmp_path / "straight", job=job)[0]

    argv = args(train_data, tmp_path, *EXTRA)
    proc = launch(tmp_path, argv, job)
    try:
        wait_for(lambda: any(e["event"] == "fault" for e in events(tmp_path, job, 1)), timeout=240,
                 what="rank 1 stopped")
        request = tmp_path / "kpi" / f"job-{job}" / f"checkpoint-request.{NODE}.json"
        request.write_text(json.dumps({"id": 3, "job_id": job, "deadline": time.time() + 120}))
        answer = wait_for(lambda: next((e for e in events(tmp_path, job, 0) if e["event"] == "checkpoint"
                                        and e.get("request") == 3), None), timeout=60, what="rank 0's answer")
    finally:  # the requeue: every process of the job, the stopped one included (torchrun's workers have
        # sessions of their own)
        for child in [*psutil.Process(proc.pid).children(recursive=True), psutil.Process(proc.pid)]:
            with contextlib.suppress(psutil.NoSuchProcess):
                child.kill()
        proc.wait()
    assert answer["kind"] == "jit-blocked" and answer["step"] == 5, answer  # rank 0 blocked inside step 6
    assert answer["ranks"] == [0, 1] and answer["missing"] == []
    assert not any(e["event"] == "checkpoint" for e in events(tmp_path, job, 1))  # the stopped rank said nothing

    shutil.rmtree(tmp_path / "shm")  # the restart runs on other nodes: only the checkpoint filesystem is left
    request.unlink()
    resumed = torchrun(tmp_path, args(train_data, tmp_path, "parallel.ep=2", "checkpoint.every=0",
                                      "checkpoint.replica_every=1"), job=job)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    losses, evs = curve(tmp_path, job=job)
    (resume,) = [e for e in evs if e["event"] == "resume"]
    assert resume["step"] == 5 and resume["checkpoint_kind"] == "replica", resume
    assert resume["holder"] == str(tmp_path / "ckpt" / "replicas")
    assert sorted(losses) == list(range(1, 9))
    for step in range(1, 9):  # model, AdamW, expert bias, RNG (router jitter), sampler: all from step 5
        assert losses[step] == reference[step], step


class Events:
    def __init__(self):
        self.seen = []

    def event(self, name, message, **fields):  # KpiWriter.event's signature
        self.seen.append({"event": name, "message": message, **fields})


def test_the_thread_answers_only_a_stuck_training_thread_and_names_what_is_missing(tmp_path):
    import torch
    from types import SimpleNamespace

    from sigma.train.jit import BLOCKED_AFTER_S, BlockedAnswer, JitCheckpoints
    from sigma.train.replica import PeerReplicas

    ctx = SimpleNamespace(distributed=False, rank=0, world_size=3, ep_size=1, device=torch.device("cpu"))
    jit = JitCheckpoints(tmp_path / "kpi", "n1", ctx)
    replicas = PeerReplicas(tmp_path / "shm", "n1", "run", "fp", ctx, 1, 1, shared=tmp_path / "ckpt" / "replicas")
    replicas.write_bytes(2, 7, b"rank 2's step 7, sent by its node's peer")  # held here; rank 1's is not
    kpi = Events()
    answer = BlockedAnswer(jit, replicas, lambda step, sampler, rng: {"step": step, "sampler": sampler}, kpi,
                           interval_s=3600)  # polled by hand below
    try:
        jit.settled(7, {"seed": 0, "step": 7}, {})
        (tmp_path / "kpi").mkdir()
        (tmp_path / "kpi" / "checkpoint-request.n1.json").write_text('{"id": 4, "job_id": 1, "deadline": 0}')
        t0 = time.monotonic()
        assert answer.poll(time.time(), t0) == 0  # just seen
        jit.settled(8, {"seed": 0, "step": 8}, {})  # the training thread finished a step: it answers itself
        assert answer.poll(time.time(), t0 + BLOCKED_AFTER_S + 1) == 0
        assert answer.poll(time.time(), time.monotonic() + BLOCKED_AFTER_S + 1) == 0  # a later request id only
        (tmp_path / "kpi" / "checkpoint-request.n1.json").write_text('{"id": 5, "job_id": 1, "deadline": 0}')
        t1 = time.monotonic()
        assert answer.poll(time.time(), t1) == 0
        assert answer.poll(time.time(), t1 + BLOCKED_AFTER_S + 0.1) == 8  # stuck since: the thread answers
        assert answer.poll(time.time(), t1 + BLOCKED_AFTER_S + 5) == 0  # once
    finally:
        answer.close()
    (said,) = kpi.seen
    assert said["kind"] == "jit-blocked" and said["request"] == 5 and said["step"] == 8
    assert said["ranks"] == [0] and said["missing"] == [1, 2]
    assert "rank(s) 1, 2 not held for step 8" in said["message"]
    kept = sorted(p.name for p in (tmp_path / "ckpt" / "replicas").glob("*.json"))
    assert kept == ["rank-0.step-00000008.json", "rank-2.step-00000007.json"]  # rank 2's older one kept as well


def test_a_training_thread_stuck_long_before_the_request_is_answered_at_once(tmp_path):
    """A job hung since long before the controller asked (its hang timeout) is answered at the first poll, not
    BLOCKED_AFTER_S after it: stuck is counted from the last finished step."""
    import torch
    from types import SimpleNamespace

    from sigma.train.jit import BLOCKED_AFTER_S, BlockedAnswer, JitCheckpoints
    from sigma.train.replica import PeerReplicas

    ctx = SimpleNamespace(distributed=False, rank=0, world_size=1, ep_size=1, device=torch.device("cpu"))
    jit = JitCheckpoints(tmp_path / "kpi", "n1", ctx)
    replicas = PeerReplicas(tmp_path / "shm", "n1", "run", "fp", ctx, 1, 1, shared=tmp_path / "ckpt" / "replicas")
    kpi = Events()
    answer = BlockedAnswer(jit, replicas, lambda step, sampler, rng: {"step": step}, kpi, interval_s=3600)
    try:
        jit.settled(5, {"seed": 0, "step": 5}, {})
        (tmp_path / "kpi").mkdir()
        (tmp_path / "kpi" / "checkpoint-request.n1.json").write_text('{"id": 2, "job_id": 1, "deadline": 0}')
        now = time.time()  # the polls' clocks are given: the steps' monotonic clock as of the last settled step
        assert answer.poll(now, jit.settled_at + BLOCKED_AFTER_S / 2) == 0  # not stuck long enough
        assert answer.poll(now, jit.settled_at + 120) == 5  # first poll of a job stuck for 2 minutes
    finally:
        answer.close()
    assert [e["kind"] for e in kpi.seen] == ["jit-blocked"]


def test_a_failed_keep_is_an_event_and_training_goes_on(tmp_path):
    import torch
    from types import SimpleNamespace

    from sigma.train.jit import BLOCKED_AFTER_S, BlockedAnswer, JitCheckpoints
    from sigma.train.replica import PeerReplicas

    ctx = SimpleNamespace(distributed=False, rank=0, world_size=1, ep_size=1, device=torch.device("cpu"))
    jit = JitCheckpoints(tmp_path / "kpi", "n1", ctx)
    (tmp_path / "ckpt").write_text("not a directory")  # the checkpoint filesystem refuses the write
    replicas = PeerReplicas(tmp_path / "shm", "n1", "run", "fp", ctx, 1, 1, shared=tmp_path / "ckpt" / "replicas")
    kpi = Events()
    jit.settled(3, {"seed": 0, "step": 3}, {})
    (tmp_path / "kpi").mkdir()
    (tmp_path / "kpi" / "checkpoint-request.n1.json").write_text('{"id": 2, "job_id": 1, "deadline": 0}')
    answer = BlockedAnswer(jit, replicas, lambda step, sampler, rng: {"step": step}, kpi, interval_s=0.05)
    try:
        wait_for(lambda: kpi.seen, timeout=BLOCKED_AFTER_S + 30, what="the failure event")
    finally:
        answer.close()
    (said,) = kpi.seen
    assert said["event"] == "checkpoint_failed" and "answer while blocked failed" in said["message"]
    assert (tmp_path / "ckpt").read_text() == "not a directory"
