"""Just-in-time checkpoints through the real pipeline: a 2-node expert-parallel training job on the local cluster,
real sidecars pushing to `sigma controller run`, faults injected at their source.

- Xid 79 in one node's kernel log: the controller drains that node, asks the other for a just-in-time checkpoint
  (ingest reply -> sidecar -> control file -> trainer), requeues once the answer is back, and the job resumes from
  the step it had reached: no step is lost, and the loss curve is the one a single uninterrupted process computes.
- NaN (`sigma chaos nan`): the ranks stop before applying the bad gradient and save the last healthy step; the
  controller requeues the failed job, which resumes from that step, never from a NaN state.
- Hang of one rank (`sigma chaos hang`, in-memory replicas on): the other rank, blocked in a collective, answers
  from its thread with the last finished step kept on the checkpoint filesystem (the hung rank's state from the
  replica it sent its peer); the requeued job resumes from it on other nodes, at most one step redone.
- Node death without warning (`sigma chaos node-death`, the node's ranks stopped as a powered-off machine's would
  be: no error reaches the peers, which block; its memory removed), replicas on: the controller drains the silent
  node (set DOWN once the job is requeued; still DOWN and drained when slurmd comes back) and asks the survivor,
  whose blocked rank keeps its state and the dead rank's peer replica on the checkpoint filesystem; the job resumes
  from that peer replica on whichever nodes SLURM gives it (node memory alone would not do: the restart may land
  on other nodes than the survivor).
"""

import contextlib
import os
import signal
import time

import pytest

from sigma.chaos.inject import Chaos
from sigma.train.kpi import read_kpis
from tests.conftest import wait_for
from tests.integration.pipeline import Pipeline
from tests.integration.test_train_requeue import losses, wait_end

pytestmark = pytest.mark.integration

STEPS = 60


def job_overrides(train_data, tmp_path, *extra):
    # no periodic checkpoint before the end: whatever the resume finds was saved for the fault
    return [f"data.path={train_data}", "data.prepare_if_missing=false", "data.seq_len=32", "data.global_batch=4",
            "threads=1", f"steps={STEPS}", "checkpoint.every=0", "optim.warmup_steps=3",
            "model_overrides.balance=aux_free", "model_overrides.bias_update_speed=0.01",
            f"checkpoint.dir={tmp_path / 'ckpt'}", "kpi.progress_every=5", *extra]


def submit(cluster, train_data, tmp_path, monkeypatch, *extra):
    from pathlib import Path

    from sigma.train.launch import submit as submit_job
    from sigma.train.train_config import load_train_config
    from tests.integration.test_train_requeue import DEBUG

    for key, value in cluster.env.items():
        monkeypatch.setenv(key, value)
    cfg = load_train_config(DEBUG, job_overrides(train_data, tmp_path, *extra) + [
        "launch.executor=slurm", "launch.nodes=2", "launch.gpus_per_node=1", "parallel.ep=2",
        "launch.timeout_min=10", f"launch.folder={tmp_path / 'submitit'}", "fault.step_delay_s=0.15"])
    submitted = time.time()
    job = submit_job(cfg)
    kpi_dir = Path(cluster.env["SIGMA_KPI_DIR"]) / f"job-{job.job_id}"
    rank0 = wait_for(lambda: next(iter(kpi_dir.glob("rank-0.*.jsonl")), None), timeout=120, what="rank 0 KPI file")
    return job, int(job.job_id), rank0, submitted


def records_since(rank0, submitted):
    """Rank 0's lines, on whichever node each run put it, oldest first. A fresh test cluster numbers jobs from 1
    again: lines an earlier cluster's job left in the files are ignored."""
    lines = [r for path in rank0.parent.glob("rank-0.*.jsonl") for r in read_kpis(path) if r["ts"] >= submitted]
    return sorted(lines, key=lambda r: r["ts"])


def assert_reference_curve(curve, train_data, tmp_path, monkeypatch):
    from sigma.train.train_config import load_train_config
    from sigma.train.trainer import train
    from tests.integration.test_train_requeue import DEBUG

    monkeypatch.setenv("SIGMA_KPI_DIR", str(tmp_path / "reference-kpi"))
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    reference = train(load_train_config(DEBUG, job_overrides(train_data, tmp_path / "reference")))
    assert sorted(curve) == list(range(1, STEPS + 1))
    for step in range(1, STEPS + 1):  # 2 EP ranks against 1 process: the same sums in another order
        assert curve[step] == pytest.approx(reference.losses[step], abs=1e-4), step


def test_xid_saves_a_just_in_time_checkpoint_and_loses_no_step(slurm, cluster, train_data, tmp_path, monkeypatch):
    with Pipeline(cluster, tmp_path / "pipeline") as p:
        job, job_id, rank0, submitted = submit(cluster, train_data, tmp_path, monkeypatch)
        wait_for(lambda: max(losses(records_since(rank0, submitted)), default=0) >= 12, timeout=120,
                 what="step 12")
        victim = slurm.job(job_id).nodes[-1]
        p.inject_xid79(victim)

        done = wait_end(slurm, job_id, timeout=300)
        assert done.state == "COMPLETED" and done.restarts == 1, done
        (req,) = p.query("SELECT node, ack_step, delivered_at FROM checkpoint_requests WHERE job_id = ?", (job_id,))
        assert req["node"] != victim and req["delivered_at"] is not None and req["ack_step"] >= 12
        (requeue,) = p.query("SELECT result FROM actions WHERE kind = 'requeue' AND target = ?", (str(job_id),))
        assert f"just-in-time checkpoint of step {req['ack_step']} saved" in requeue["result"]

        records = records_since(rank0, submitted)
        (resume,) = [r for r in records if r.get("event") == "resume"]
        assert resume["step"] == req["ack_step"] and resume["checkpoint_kind"] == "jit"
        before = max(r["step"] for r in records if "event" not in r and r["ts"] < resume["ts"])
        assert before - resume["step"] <= 1  # at most the step SLURM interrupted is redone

        (lost,) = wait_for(lambda: p.query("SELECT * FROM job_losses WHERE job_id = ?", (job_id,)), timeout=30,
                           what="steps lost recorded")
        assert lost["steps_lost"] <= 1 and lost["source"] == "jit" and lost["time_lost_s"] > 0
    # both ranks of the first run left at once instead of waiting for SIGKILL (KillWait): on the requeue's SIGTERM,
    # or, where its peer got that SIGTERM first and left, on seeing the peer gone after the saved checkpoint
    logs = [log.read_text() for log in sorted((tmp_path / "submitit").glob(f"{job_id}_*_log.err"))]
    assert len(logs) == 2 and any("SIGTERM from SLURM" in text for text in logs), logs
    assert all("SIGTERM from SLURM" in text or "the other ranks left after the just-in-time checkpoint" in text
               for text in logs), logs
    assert_reference_curve(losses(records), train_data, tmp_path, monkeypatch)


def test_nan_resumes_from_the_last_healthy_step(slurm, cluster, train_data, tmp_path, monkeypatch):
    with Pipeline(cluster, tmp_path / "pipeline") as p:
        job, job_id, rank0, submitted = submit(cluster, train_data, tmp_path, monkeypatch, "fault.nan_trigger=true")
        wait_for(lambda: max(losses(records_since(rank0, submitted)), default=0) >= 12, timeout=120,
                 what="step 12")
        Chaos(cluster).inject("nan", slurm.job(job_id).nodes[0], job_id=job_id)

        # the ranks exit on the NaN: SLURM may list the job FAILED for a moment before the controller requeues it
        done = wait_for(lambda: (j := slurm.job(job_id)) and j.restarts >= 1 and j.state not in (
            "PENDING", "RUNNING", "CONFIGURING", "COMPLETING", "REQUEUED") and j, timeout=300, interval=1.0,
                        what="the requeued job's end")
        assert done.state == "COMPLETED" and done.restarts == 1, done
        records = records_since(rank0, submitted)
        (nan,) = [r for r in records if r.get("event") == "nan_loss"]
        (rollback,) = [r for r in records if r.get("event") == "checkpoint" and r.get("kind") == "rollback"]
        (resume,) = [r for r in records if r.get("event") == "resume"]
        assert rollback["step"] == nan["step"] - 1 == resume["step"] and resume["checkpoint_kind"] == "rollback"
        (lost,) = wait_for(lambda: p.query("SELECT * FROM job_losses WHERE job_id = ?", (job_id,)), timeout=30,
                           what="steps lost recorded")
        assert lost["steps_lost"] == 0 and lost["source"] == "rollback"
        assert not p.query("SELECT 1 FROM checkpoint_requests WHERE job_id = ?", (job_id,))  # nothing to wait for
    # the poisoned step's batch is trained again, cleanly: the curve is the uninterrupted one
    assert_reference_curve(losses(records), train_data, tmp_path, monkeypatch)


def replica_overrides(tmp_path, *extra):
    return ["checkpoint.replica_every=1", f"checkpoint.replica_dir={tmp_path / 'shm'}", *extra]


def assert_resumed(p, job_id, rank0, submitted, kinds=("replica",)):
    records = records_since(rank0, submitted)
    (resume,) = [r for r in records if r.get("event") == "resume"]
    assert resume["checkpoint_kind"] in kinds, resume
    before = max(r["step"] for r in records if "event" not in r and r["ts"] < resume["ts"])
    assert before - resume["step"] <= 1  # at most the step the fault interrupted is redone
    (lost,) = wait_for(lambda: p.query("SELECT * FROM job_losses WHERE job_id = ?", (job_id,)), timeout=60,
                       what="steps lost recorded")
    assert lost["steps_lost"] <= 1 and lost["source"] == resume["checkpoint_kind"], lost
    # the old run's control file is still there; the new run, resumed from what answered it, does not answer it
    # again (a second save, then a hold until the request's deadline)
    again = [r for r in records if r.get("event") == "checkpoint" and r.get("request") and r["ts"] > resume["ts"]]
    assert not again, again
    return records, resume


def test_hang_of_one_rank_is_answered_by_the_blocked_ranks(slurm, cluster, train_data, tmp_path, monkeypatch):
    with Pipeline(cluster, tmp_path / "pipeline", controller={"watchdog": {"hang_timeout_s": 15}},
                  remediation={"playbooks": [{"name": "manual", "kind": "manual"}]}) as p:
        job, job_id, rank0, submitted = submit(cluster, train_data, tmp_path, monkeypatch,
                                               *replica_overrides(tmp_path))
        wait_for(lambda: max(losses(records_since(rank0, submitted)), default=0) >= 12, timeout=120,
                 what="step 12")
        victim = slurm.job(job_id).nodes[-1]
        chaos = Chaos(cluster)
        hang = chaos.inject("hang", victim, job_id=job_id)
        try:
            done = wait_end(slurm, job_id, timeout=400)
        finally:
            chaos.undo(hang.id)
        assert done.state == "COMPLETED" and done.restarts == 1, done
        assert victim not in done.nodes
        (answer,) = p.query("SELECT node, fields FROM events WHERE source = 'kpi' AND kind = 'checkpoint' AND"
                            " fields LIKE '%jit-blocked%'")
        assert answer["node"] != victim
        (requeue,) = p.query("SELECT result FROM actions WHERE kind = 'requeue' AND target = ?", (str(job_id),))
        # every rank's state of the kept step, or (the stopped rank's replica of it never sent) a named fallback
        assert "while the job was blocked by a hung rank" in requeue["result"], requeue
        # SLURM continues stopped processes (SIGCONT) before it terminates them on the requeue: the stopped rank
        # comes back for a moment and, the request still open, the ranks may save the next step together (`jit`).
        # A hang that SIGCONT does not end (a stuck GPU) leaves the set the blocked rank kept (`replica`).
        records, resume = assert_resumed(p, job_id, rank0, submitted, kinds=("replica", "jit"))
        if resume["checkpoint_kind"] == "replica":
            assert resume["holder"] == str(tmp_path / "ckpt" / "replicas"), resume
    assert_reference_curve(losses(records), train_data, tmp_path, monkeypatch)


def test_node_death_resumes_from_the_peer_replica(slurm, cluster, train_data, tmp_path, monkeypatch):
    import shutil

    with Pipeline(cluster, tmp_path / "pipeline") as p:
        job, job_id, rank0, submitted = submit(cluster, train_data, tmp_path, monkeypatch,
                                               *replica_overrides(tmp_path))
        wait_for(lambda: max(losses(records_since(rank0, submitted)), default=0) >= 12, timeout=120,
                 what="step 12")
        survivor, victim = slurm.job(job_id).nodes
        chaos = Chaos(cluster)
        death = chaos.inject("node-death", victim)
        frozen = chaos.inject("hang", victim, job_id=job_id)  # a powered-off node's ranks: silent, no error
        shutil.rmtree(tmp_path / "shm" / victim)  # and its memory is gone
        try:
            done = wait_end(slurm, job_id, timeout=400)
        finally:
            for pid in frozen.params["pids"]:  # SLURM cannot reach them: the node "died" with them
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            chaos.undo(death.id)
        assert done.state == "COMPLETED" and done.restarts == 1, done
        (req,) = p.query("SELECT node FROM checkpoint_requests WHERE job_id = ?", (job_id,))
        assert req["node"] == survivor
        (requeue,) = p.query("SELECT result FROM actions WHERE kind = 'requeue' AND target = ?", (str(job_id),))
        # every rank's state of the kept step, or (the stopped rank's replica of it never sent) a named fallback
        assert "while the job was blocked by a hung rank" in requeue["result"], requeue
        # set DOWN once the job was requeued (or found DOWN already, had SlurmdTimeout come first); with slurmd
        # back the node stays DOWN and drained with our reason, for remediation and validation
        (down,) = p.query("SELECT state, result FROM actions WHERE kind = 'set_down' AND target = ?", (victim,))
        assert down["state"] == "done", down
        back = wait_for(lambda: next((n for n in [slurm.node(victim)] if "NOT_RESPONDING" not in n.flags), None),
                        timeout=60, what=f"{victim}'s slurmd to register again")
        assert back.state == "down" and back.drained and back.drained_by_sigma, back
        # the dead node's ranks are never continued (its slurmd is gone): the set the blocked rank kept is used
        records, resume = assert_resumed(p, job_id, rank0, submitted)
        assert resume["holder"] == str(tmp_path / "ckpt" / "replicas"), resume
    assert_reference_curve(losses(records), train_data, tmp_path, monkeypatch)
