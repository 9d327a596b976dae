"""Job ids from slurmd's step sockets, or from slurmstepd processes (fake /proc tree) where the spool is unreadable."""

from __future__ import annotations

from sigma.telemetry.jobs import JobTracker, slurmstepd_jobs


def step(proc, pid: int, title: str, child_env: dict | None = None):
    d = proc / str(pid)
    (d / "task" / str(pid)).mkdir(parents=True)
    (d / "comm").write_text("slurmstepd\n")
    (d / "cmdline").write_bytes(title.encode() + b"\0")
    (d / "environ").write_bytes(b"SLURM_CONF=/etc/slurm/slurm.conf\0")
    children = ""
    if child_env is not None:
        child = proc / str(pid + 1)
        child.mkdir()
        (child / "comm").write_text("bash\n")
        (child / "environ").write_bytes(b"".join(f"{k}={v}".encode() + b"\0" for k, v in child_env.items()))
        children = f"{pid + 1} "
    (d / "task" / str(pid) / "children").write_text(children)


def test_steps_are_attributed_to_their_node(tmp_path):
    proc = tmp_path / "proc"
    step(proc, 100, "slurmstepd: [55.batch]", {"SLURM_JOB_ID": "55", "SLURMD_NODENAME": "node2"})
    step(proc, 110, "slurmstepd: [55.extern]")  # no tasks, no node name: the batch step tells
    step(proc, 120, "slurmstepd: [56.0]", {"SLURM_JOB_ID": "56", "SLURMD_NODENAME": "node1"})
    step(proc, 130, "slurmstepd: [57.extern]")  # a job whose steps name no node: a real node's own job
    (proc / "200").mkdir()
    (proc / "200" / "comm").write_text("python\n")
    assert slurmstepd_jobs("node2", str(proc)) == {55, 57}
    assert slurmstepd_jobs("node1", str(proc)) == {56, 57}
    assert slurmstepd_jobs("node3", str(proc), check_node=False) == {55, 56, 57}


def test_tracker_reads_this_nodes_step_sockets_from_the_spool(tmp_path):
    proc, spool = tmp_path / "proc", tmp_path / "spool"
    proc.mkdir()
    spool.mkdir()
    tracker = JobTracker("node2", ["proc", "kpi"], proc_root=str(proc), spool_dir=str(spool),
                         kpi_jobs=lambda within: {900}, proc_rescan_s=3600)
    assert tracker.refresh() == [900] and tracker.jobs_json == "[900]"
    # a step that has just started: no child carries a node name yet, but its socket says whose it is
    step(proc, 100, "slurmstepd: [55.batch]")
    (spool / "node2_55.4294967291").touch()
    (spool / "node1_56.0").touch()  # another node's step (a shared spool directory)
    (spool / "cred_state").touch()
    assert tracker.refresh() == [55, 900]
    (spool / "node2_55.4294967291").unlink()
    assert tracker.refresh() == [900]  # the step ended: its socket is gone


def test_tracker_scans_proc_when_the_spool_cannot_be_read(tmp_path):
    proc = tmp_path / "proc"
    proc.mkdir()
    step(proc, 100, "slurmstepd: [55.batch]", {"SLURMD_NODENAME": "node2"})
    tracker = JobTracker("node2", ["proc"], proc_root=str(proc), spool_dir=str(tmp_path / "missing"),
                         proc_rescan_s=3600)
    assert tracker.refresh() == [55]
    step(proc, 120, "slurmstepd: [56.0]", {"SLURMD_NODENAME": "node2"})
    assert tracker.refresh() == [55]  # cached until the next rescan
    tracker.proc_rescan_s = 0
    assert tracker.refresh() == [55, 56]
