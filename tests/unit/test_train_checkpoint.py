"""Atomic checkpoints: complete ones are found, partial ones ignored, only the newest K kept."""

import json
import os

import pytest
import torch

from sigma.train.checkpoint import CheckpointManager, complete_checkpoints, latest_checkpoint


def state(value: float, step: int) -> dict:
    return {"model": {"w": torch.full((4, 3), value)}, "trainer": {"step": step, "sampler": {"seed": 0, "step": step}}}


def test_save_and_load_round_trip(tmp_path):
    mgr = CheckpointManager(tmp_path, keep=2)
    path = mgr.save(5, state(1.5, 5), {"world_size": 1})
    assert path.name == "step-00000005" and mgr.latest() == path
    target = state(0.0, 0)
    meta = mgr.load(path, target)
    assert torch.equal(target["model"]["w"], torch.full((4, 3), 1.5))
    assert target["trainer"] == {"step": 5, "sampler": {"seed": 0, "step": 5}}
    assert meta["step"] == 5 and meta["world_size"] == 1


def test_keep_last_k(tmp_path):
    mgr = CheckpointManager(tmp_path, keep=2)
    for step in (10, 20, 30, 40):
        mgr.save(step, state(step, step))
    assert [p.name for p in complete_checkpoints(tmp_path)] == ["step-00000030", "step-00000040"]
    assert sorted(os.listdir(tmp_path)) == ["step-00000030", "step-00000040"]


def test_partial_and_temporary_checkpoints_are_ignored(tmp_path):
    mgr = CheckpointManager(tmp_path, keep=3)
    mgr.save(10, state(1.0, 10))
    # a save killed before its rename: all shard files, but still under the temporary name
    mgr.save(20, state(2.0, 20))
    os.replace(tmp_path / "step-00000020", tmp_path / ".step-00000020.tmp")
    # a directory with the final name but no completion marker (e.g. copied by hand, half done)
    (tmp_path / "step-00000030").mkdir()
    # a marker that does not belong to this step
    (tmp_path / "step-00000040").mkdir()
    (tmp_path / "step-00000040" / "complete.json").write_text(json.dumps({"step": 39}))
    assert latest_checkpoint(tmp_path) == tmp_path / "step-00000010"
    with pytest.raises(ValueError, match="not a complete checkpoint"):
        mgr.load(tmp_path / "step-00000030", state(0.0, 0))
    # the next save clears what a killed save left behind
    mgr.save(50, state(5.0, 50))
    assert not (tmp_path / ".step-00000020.tmp").exists()
    assert mgr.latest() == tmp_path / "step-00000050"


def test_saving_a_step_again_replaces_it(tmp_path):
    mgr = CheckpointManager(tmp_path, keep=3)
    mgr.save(10, state(1.0, 10))
    mgr.save(10, state(7.0, 10))
    target = state(0.0, 0)
    mgr.load(mgr.latest(), target)
    assert float(target["model"]["w"][0, 0]) == 7.0


def test_missing_root_has_no_checkpoint(tmp_path):
    assert latest_checkpoint(tmp_path / "nowhere") is None
    with pytest.raises(ValueError, match="keep"):
        CheckpointManager(tmp_path, keep=0)


def test_background_save_copies_the_state_before_training_goes_on(tmp_path):
    mgr = CheckpointManager(tmp_path, keep=2)
    live = state(1.0, 7)
    done = []
    mgr.save(7, live, {"world_size": 1}, background=True, on_complete=lambda path, s: done.append(path.name))
    live["model"]["w"].fill_(99.0)  # the optimiser moves on while the save is written
    mgr.wait()
    assert done == ["step-00000007"] and mgr.latest().name == "step-00000007"
    target = state(0.0, 0)
    mgr.load(mgr.latest(), target)
    assert torch.equal(target["model"]["w"], torch.full((4, 3), 1.0))  # the values at save time


def test_background_saves_prune_and_a_killed_one_leaves_the_previous(tmp_path):
    mgr = CheckpointManager(tmp_path, keep=2)
    for step in (1, 2, 3):
        mgr.save(step, state(step, step), background=True)  # each waits for the one before
    mgr.wait()
    assert [p.name for p in complete_checkpoints(tmp_path)] == ["step-00000002", "step-00000003"]
    (tmp_path / ".step-00000004.tmp").mkdir()  # what a save killed mid-write leaves
    (tmp_path / ".step-00000004.tmp" / "__0_0.distcp").write_bytes(b"partial")
    assert latest_checkpoint(tmp_path).name == "step-00000003"


FULL_DISK_CHILD = """
import resource, signal, sys, torch
from sigma.train.checkpoint import CheckpointManager

mgr = CheckpointManager(sys.argv[1], keep=3)
mgr.save(1, {"model": {"w": torch.ones(10)}, "trainer": {"step": 1}}, {"world_size": 1}, background=True)
mgr.wait()
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG, as on a full disk
resource.setrlimit(resource.RLIMIT_FSIZE, (64 * 1024, 64 * 1024))
mgr.save(2, {"model": {"w": torch.ones(100_000)}, "trainer": {"step": 2}}, {"world_size": 1}, background=True)
try:
    mgr.wait()
except RuntimeError as exc:
    print(f"raised: {exc}")
"""


def test_a_disk_that_fills_during_a_background_save_keeps_the_older_checkpoint(tmp_path):
    """The writer thread's failure comes back to the training thread at wait(), loudly; the newest complete
    checkpoint stays the older one, its files as they were."""
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-c", FULL_DISK_CHILD, str(tmp_path)], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "raised: background checkpoint save of step 2 failed: " in proc.stdout  # the innermost error's first line
    assert "the newest complete checkpoint is still" in proc.stdout and "step-00000001" in proc.stdout
    assert [p.name for p in complete_checkpoints(tmp_path)] == ["step-00000001"]
    target = {"model": {"w": torch.zeros(10)}, "trainer": {"step": 0}}
    CheckpointManager(tmp_path).load(latest_checkpoint(tmp_path), target)
    assert torch.equal(target["model"]["w"], torch.ones(10)) and target["trainer"]["step"] == 1


def test_finish_in_flight_waits_for_a_synchronous_save_in_another_thread(tmp_path, monkeypatch):
    """What a rank that SLURM terminates finishes first: a just-in-time save the training thread is writing."""
    import threading

    import torch.distributed.checkpoint as dcp

    from tests.conftest import wait_for

    release, real_save = threading.Event(), dcp.save
    monkeypatch.setattr(dcp, "save", lambda *a, **k: (release.wait(60), real_save(*a, **k))[1])
    order = []

    class Written(threading.Event):  # says when a caller starts waiting for the save
        def wait(self, timeout=None):
            order.append("waiting")
            return super().wait(timeout)

    mgr = CheckpointManager(tmp_path, keep=2)
    mgr._written = Written()
    mgr._written.set()
    mgr.finish_in_flight()  # nothing in flight: returns at once
    order.clear()
    saving = threading.Thread(target=mgr.save, args=(5, state(5.0, 5)))
    saving.start()
    wait_for(lambda: not mgr._written.is_set(), timeout=60, what="the save under way")
    finishing = threading.Thread(target=lambda: (mgr.finish_in_flight(), order.append("finished")))
    finishing.start()
    wait_for(lambda: "waiting" in order, timeout=60, what="finish_in_flight waiting")
    order.append("released")  # the save is held in dcp.save until now: nothing to exit on before it
    release.set()
    finishing.join(60)
    assert order == ["waiting", "released", "finished"]
    assert mgr.latest().name == "step-00000005"  # complete, not half-written
    saving.join(60)


def test_a_sigterm_exit_waits_until_the_nan_rollback_checkpoint_is_recorded(tmp_path):
    """The controller requeues on the NaN event while every rank saves the rollback checkpoint: the rank's exit on
    SLURM's SIGTERM must not come between the save and its `checkpoint` event, which says where to resume from."""
    import threading
    from types import SimpleNamespace

    from sigma.train.jit import JitCheckpoints, save_rollback
    from tests.conftest import wait_for

    order, release = [], threading.Event()

    class Written(threading.Event):  # says when the exit starts waiting
        def wait(self, timeout=None):
            order.append("waiting")
            return super().wait(timeout)

    class Kpi:  # the event is written only once released
        def event(self, event, message, **fields):
            release.wait(60)
            order.append(f"{event} {fields.get('kind')}")

    ctx = SimpleNamespace(world_size=1, ep_size=1)
    jit = JitCheckpoints(tmp_path / "job", "node1", ctx)
    jit.begin_step({"seed": 0, "step": 6}, {})
    mgr = CheckpointManager(tmp_path / "ckpt", keep=2)
    mgr._written = Written()
    mgr._written.set()
    saving = threading.Thread(target=save_rollback, args=(jit, mgr, 7, state(6.0, 7), ctx, Kpi()))
    saving.start()
    wait_for(lambda: mgr.latest() is not None, timeout=60, what="the rollback checkpoint on disk")
    exiting = threading.Thread(target=lambda: (mgr.finish_in_flight(), order.append("exit")))
    exiting.start()
    wait_for(lambda: "waiting" in order, timeout=60, what="the exit waiting")
    order.append("released")
    release.set()
    exiting.join(60)
    saving.join(60)
    assert order == ["waiting", "released", "checkpoint rollback", "exit"]
    assert mgr.latest().name == "step-00000006"
