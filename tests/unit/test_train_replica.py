"""In-memory peer replicas on CPU over gloo (torchrun, 2 ranks, debug preset): a run killed between periodic
checkpoints resumes from the replicas of its last step, bit for bit; a corrupt replica or one from another config
is skipped with an event, and the newest complete set (or the disk checkpoint) is used instead."""

import os
import subprocess
import sys

import pytest

from sigma.train.kpi import read_kpis
from tests.unit.test_train_loop import DEBUG

NODE = os.uname().nodename


def args(train_data, tmp_path, *extra):
    return [f"data.path={train_data}", "data.prepare_if_missing=false", "data.seq_len=32", "data.global_batch=4",
            "threads=1", "kpi.progress_every=0", f"checkpoint.dir={tmp_path / 'ckpt'}", "steps=8",
            "checkpoint.every=3", "optim.warmup_steps=2", "model_overrides.router_jitter=0.3", "eval.every=0",
            f"checkpoint.replica_dir={tmp_path / 'shm'}", *extra]


def torchrun(tmp_path, argv, job=88):
    env = {**os.environ, "SIGMA_KPI_DIR": str(tmp_path / "kpi"), "SIGMA_JOB_ID": str(job), "OMP_NUM_THREADS": "1"}
    env.pop("SLURM_JOB_ID", None)
    return subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                           "-m", "sigma.train.trainer", "--config", str(DEBUG), *argv],
                          env=env, capture_output=True, text=True, timeout=300)


def curve(tmp_path, job=88, rank=0):
    path = tmp_path / "kpi" / f"job-{job}" / f"rank-{rank}.{NODE}.jsonl"
    records = read_kpis(path)
    return {r["step"]: r["loss"] for r in records if "event" not in r}, [r for r in records if "event" in r]


@pytest.fixture(scope="module")
def straight(train_data, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("straight")
    proc = torchrun(tmp, args(train_data, tmp))
    assert proc.returncode == 0, proc.stderr[-3000:]
    return curve(tmp)[0]


def kill_then_resume(train_data, tmp_path, damage=None):
    killed = torchrun(tmp_path, args(train_data, tmp_path, "checkpoint.replica_every=1", "fault.kill_at_step=6"))
    assert killed.returncode != 0
    held = tmp_path / "shm" / NODE
    (run,) = list(held.iterdir())
    assert sorted(p.name for p in run.glob("*.json")) == [f"rank-{r}.step-0000000{s}.json" for r in (0, 1)
                                                          for s in (4, 5)]
    if damage:
        damage(run)
    resumed = torchrun(tmp_path, args(train_data, tmp_path, "checkpoint.replica_every=1", "fault.kill_at_step=6"))
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert not run.exists()  # a finished run frees the node's memory
    return curve(tmp_path)


def test_resume_from_peer_replicas_is_bit_exact(train_data, tmp_path, straight):
    losses, events = kill_then_resume(train_data, tmp_path)
    resumes = [e for e in events if e["event"] == "resume"]
    assert [(e["step"], e["checkpoint_kind"]) for e in resumes] == [(5, "replica")]  # the disk one not read
    assert sorted(losses) == list(range(1, 9))
    for step in range(1, 9):  # model, AdamW, RNG (router jitter) and sampler all came back from the replica
        assert losses[step] == straight[step], step


def test_a_corrupt_replica_is_skipped_for_the_previous_complete_set(train_data, tmp_path, straight):
    def corrupt(run):
        payload = run / "rank-1.step-00000005.pt"
        data = bytearray(payload.read_bytes())
        data[len(data) // 2] ^= 0xFF
        payload.write_bytes(bytes(data))

    losses, events = kill_then_resume(train_data, tmp_path, corrupt)
    ignored = [e for e in events if e["event"] == "replica_ignored"]
    assert ignored and "rank-1.step-00000005" in ignored[0]["message"] and "corrupt" in ignored[0]["message"]
    assert [e["step"] for e in events if e["event"] == "resume"][-1] == 4
    for step in range(1, 9):
        assert losses[step] == straight[step], step


def test_replicas_of_another_run_config_or_layout_are_ignored(tmp_path):
    from types import SimpleNamespace

    from sigma.train.replica import PeerReplicas

    def DistContext(**kw):  # the layout the replicas were written under, no process group needed here
        return SimpleNamespace(distributed=False, **kw)

    events = []
    ctx = DistContext(rank=0, world_size=2, ep_size=1)
    mine = PeerReplicas(tmp_path, "n1", "run-a", "fp-a", ctx, 1, 1, event=lambda kind, msg, **f: events.append(msg))
    mine._write(0, 4, b"state of rank 0")
    mine._write(1, 4, b"state of rank 1")
    PeerReplicas(tmp_path, "n1", "run-a", "fp-b", ctx, 1, 1)._write(0, 5, b"other config")
    PeerReplicas(tmp_path, "n1", "run-a", "fp-a", DistContext(rank=0, world_size=4, ep_size=1), 1, 1)._write(1, 6, b"4")
    (tmp_path / "n1" / "run-a" / "rank-1.step-00000007.json").write_text('{"run": "run-a", "fin')  # half a manifest
    assert mine.held() == {0: [4], 1: [4]}
    assert len(events) == 3
    assert "rank-0.step-00000005" in events[0] and "another run or config" in events[0]
    assert "rank-1.step-00000006" in events[1] and "written by 4 ranks" in events[1]
    assert "rank-1.step-00000007" in events[2] and "unreadable" in events[2]


def _replicate_until_the_disk_fills(rank: int, root: str) -> dict:
    """Rank of a 2-rank gloo group: replicate step 1, then fill rank 1's disk (a file-size limit: writes fail with
    EFBIG, as ENOSPC would) and replicate a larger step 2."""
    import resource
    import signal
    from pathlib import Path
    from types import SimpleNamespace

    import torch

    from sigma.train.replica import PeerReplicas

    events = []
    ctx = SimpleNamespace(distributed=True, rank=rank, world_size=2, ep_size=1)
    replicas = PeerReplicas(root, f"n{rank}", "run-a", "fp-a", ctx, 1, 1,
                            event=lambda kind, msg, **f: events.append((kind, msg)))
    replicas.after_step(1, lambda: {"x": torch.zeros(100)})
    replicas.wait()
    if rank == 1:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (64 * 1024, 64 * 1024))
    replicas.after_step(2, lambda: {"x": torch.zeros(100_000)})  # 400 KB
    replicas.wait()  # rank 0 must not hang on a send rank 1 never made
    return {"held": replicas.held(), "events": events,
            "leftovers": sorted(p.name for p in Path(replicas.dir).iterdir() if ".tmp" in p.name)}


def test_a_full_disk_during_a_replica_keeps_the_older_one_and_the_peer_goes_on(tmp_path):
    from tests.unit.gloo_ranks import run_ranks

    out = run_ranks(_replicate_until_the_disk_fills, 2, str(tmp_path), timeout=180)
    assert out[0]["held"] == {0: [1, 2], 1: [1, 2]} and not out[0]["events"]  # the peer got rank 1's step 2
    assert out[1]["held"] == {0: [1], 1: [1]}  # step 1 untouched, nothing of step 2 half-written
    assert out[1]["leftovers"] == []
    (kind, message), = out[1]["events"]
    assert kind == "replica_failed" and "File too large" in message


def test_a_partial_replica_is_ignored_and_the_complete_older_one_used(tmp_path):
    from types import SimpleNamespace

    from sigma.train.replica import PeerReplicas

    events = []
    ctx = SimpleNamespace(distributed=False, rank=0, world_size=1, ep_size=1)
    replicas = PeerReplicas(tmp_path, "n1", "run-a", "fp-a", ctx, 1, 1, event=lambda kind, msg, **f: events.append(msg))
    replicas._write(0, 4, b"state of step 4")
    replicas._write(0, 5, b"state of step 5")
    payload = tmp_path / "n1" / "run-a" / "rank-0.step-00000005.pt"
    payload.write_bytes(payload.read_bytes()[:6])  # cut short, as a copy interrupted by a crash would be
    assert replicas.held() == {0: [4]}
    (message,) = events
    assert "rank-0.step-00000005" in message and "corrupt or partial (6 bytes" in message
