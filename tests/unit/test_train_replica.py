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
    """Killed at step 6 with no disk checkpoint before the end: what it resumes from is a replica. A round still
    in flight when the next one is due is skipped, so the newest two rounds are the ones held, whichever steps."""
    extra = ("checkpoint.replica_every=1", "fault.kill_at_step=6", "checkpoint.every=100")
    killed = torchrun(tmp_path, args(train_data, tmp_path, *extra))
    assert killed.returncode != 0
    held = tmp_path / "shm" / NODE
    (run,) = list(held.iterdir())
    names = sorted(p.name for p in run.glob("*.json"))
    steps = sorted({int(n.split(".step-")[1][:8]) for n in names})
    assert len(steps) == 2 and steps[-1] <= 5 and names == [f"rank-{r}.step-{s:08d}.json" for r in (0, 1)
                                                              for s in steps]
    if damage:
        damage(run, steps)
    resumed = torchrun(tmp_path, args(train_data, tmp_path, *extra))
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert not run.exists()  # a finished run frees the node's memory
    return steps, *curve(tmp_path)


def test_resume_from_peer_replicas_is_bit_exact(train_data, tmp_path, straight):
    steps, losses, events = kill_then_resume(train_data, tmp_path)
    resumes = [e for e in events if e["event"] == "resume"]
    assert [(e["step"], e["checkpoint_kind"]) for e in resumes] == [(steps[-1], "replica")]  # the disk one not read
    assert sorted(losses) == list(range(1, 9))
    for step in range(1, 9):  # model, AdamW, RNG (router jitter) and sampler all came back from the replica
        assert losses[step] == straight[step], step


def test_a_corrupt_replica_is_skipped_for_the_previous_complete_set(train_data, tmp_path, straight):
    def corrupt(run, steps):
        payload = run / f"rank-1.step-{steps[-1]:08d}.bin"
        data = bytearray(payload.read_bytes())
        data[len(data) // 2] ^= 0xFF
        payload.write_bytes(bytes(data))

    steps, losses, events = kill_then_resume(train_data, tmp_path, corrupt)
    ignored = [e for e in events if e["event"] == "replica_ignored"]
    assert ignored and f"rank-1.step-{steps[-1]:08d}" in ignored[0]["message"]
    assert "corrupt" in ignored[0]["message"]
    assert [e["step"] for e in events if e["event"] == "resume"][-1] == steps[0]
    for step in range(1, 9):
        assert losses[step] == straight[step], step


def test_the_kpi_lines_say_how_far_behind_the_replicas_are(train_data, tmp_path):
    proc = torchrun(tmp_path, args(train_data, tmp_path, "checkpoint.replica_every=2"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [r for r in read_kpis(tmp_path / "kpi" / "job-88" / f"rank-0.{NODE}.jsonl") if "event" not in r]
    assert [r["step"] for r in lines] == list(range(1, 9))
    # a round is due 2 steps after the last one started; one due while the previous is in flight is counted as
    # skipped and retried at the next step: the counts say which steps started a round
    started, last, skipped = [], 0, 0
    for r in lines:
        assert r["replica_skipped"] in (skipped, skipped + 1)
        if r["step"] - last >= 2:
            if r["replica_skipped"] == skipped:
                started.append(r["step"])
                last = r["step"]
        else:
            assert r["replica_skipped"] == skipped, r  # nothing due, nothing skipped
        skipped = r["replica_skipped"]
        assert r["replica_step"] in [0, *started] and r["replica_step"] <= r["step"]  # written rounds only
    assert started[0] == 2 and all(b - a >= 2 for a, b in zip(started, started[1:]))
    assert lines[-1]["replica_step"] >= 2


def test_replicas_of_another_run_config_or_layout_are_ignored(tmp_path):
    from types import SimpleNamespace

    from sigma.train.replica import PeerReplicas

    def DistContext(**kw):  # the layout the replicas were written under, no process group needed here
        return SimpleNamespace(distributed=False, **kw)

    events = []
    ctx = DistContext(rank=0, world_size=2, ep_size=1)
    mine = PeerReplicas(tmp_path, "n1", "run-a", "fp-a", ctx, 1, 1, event=lambda kind, msg, **f: events.append(msg))
    mine.write_bytes(0, 4, b"state of rank 0")
    mine.write_bytes(1, 4, b"state of rank 1")
    PeerReplicas(tmp_path, "n1", "run-a", "fp-b", ctx, 1, 1).write_bytes(0, 5, b"other config")
    four_ranks = DistContext(rank=0, world_size=4, ep_size=1)
    PeerReplicas(tmp_path, "n1", "run-a", "fp-a", four_ranks, 1, 1).write_bytes(1, 6, b"4")
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
    replicas.write_bytes(0, 4, b"state of step 4")
    replicas.write_bytes(0, 5, b"state of step 5")
    payload = tmp_path / "n1" / "run-a" / "rank-0.step-00000005.bin"
    payload.write_bytes(payload.read_bytes()[:6])  # cut short, as a copy interrupted by a crash would be
    assert replicas.held() == {0: [4]}
    (message,) = events
    assert "rank-0.step-00000005" in message and "corrupt or partial (6 bytes" in message


def test_a_round_is_copied_straight_into_node_memory_files_that_come_round_again(tmp_path):
    """No write after the copy: the payload files are mapped and taken again once their replica is pruned (3
    files for 2 kept replicas); what a killed run was filling is removed at the next start."""
    import json
    from pathlib import Path
    from types import SimpleNamespace

    import torch

    from sigma.train.replica import PeerReplicas, unpack

    ctx = SimpleNamespace(distributed=False, rank=0, world_size=1, ep_size=1)
    replicas = PeerReplicas(tmp_path, "n1", "run-a", "fp-a", ctx, 1, 1)
    inodes = []
    for step in range(1, 8):
        replicas.after_step(step, lambda: {"x": torch.full((1000,), float(step)), "step": step})
        replicas.wait()
        inodes.append((replicas.dir / f"rank-0.step-{step:08d}.bin").stat().st_ino)
    assert len(set(inodes)) == 3 and inodes[3:6] == inodes[0:3]
    assert replicas.held() == {0: [6, 7]}
    name = replicas.dir / "rank-0.step-00000007"
    state = unpack(json.loads(Path(f"{name}.json").read_text()), bytearray(Path(f"{name}.bin").read_bytes()))
    assert state["step"] == 7 and torch.equal(state["x"], torch.full((1000,), 7.0))
    assert f"{name}.bin" in Path("/proc/self/maps").read_text()  # the copy's destination was the file itself
    replicas.close()
    left = replicas.dir / ".rank-0.step-00000008.bin.tmp-0-12345"  # a run killed while copying step 8
    left.write_bytes(b"half")
    restarted = PeerReplicas(tmp_path, "n1", "run-a", "fp-a", ctx, 1, 1)
    assert restarted.restore(7, None, None, None) is None  # a disk checkpoint of step 7: nothing newer to load
    assert not left.exists()
