"""KPI lines count only for a job SLURM runs on this node, from a file of that job's user (real files, real uids)."""

from __future__ import annotations

import json
import os

import pytest

from tests.unit.telemetry_helpers import make, run

OTHER_UID = 65534  # nobody


def line(**kw) -> str:
    return json.dumps(kw) + "\n"


def collector(kpi_dir, running: dict[int, int]):
    """running: job id -> uid, what SLURM says runs on node1 now."""
    c = make("kpi", {"dir": str(kpi_dir), "node_name": "node1"})
    c.ctx.job_owner = running.get
    return c


def nan_line(job, ts=1_700_000_000.0):
    return line(ts=ts, job_id=job, rank=0, event="nan_loss", message="loss is nan")


needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="giving a file to another uid needs root")


@needs_root
def test_another_users_file_is_refused_and_reported_once(tmp_path):
    (tmp_path / "job-42").mkdir()
    forged = tmp_path / "job-42" / "rank-9.node1.jsonl"
    forged.write_text(nan_line(42))
    os.chown(forged, OTHER_UID, OTHER_UID)
    c = collector(tmp_path, {42: os.geteuid()})
    out = run(c)
    assert out.events and [e[2] for e in out.events] == ["kpi_refused"]
    assert f"belongs to uid {OTHER_UID}, but job 42 runs as uid {os.geteuid()}" in out.events[0][4]
    assert run(c).events == []  # reported once, still refused
    assert c.active_jobs(60) == set()


def test_the_jobs_own_file_is_read_and_a_job_id_of_another_job_is_malformed(tmp_path):
    (tmp_path / "job-42").mkdir()
    mine = tmp_path / "job-42" / "rank-0.node1.jsonl"
    mine.write_text(nan_line(42) + nan_line(43))
    out = run(collector(tmp_path, {42: os.geteuid()}))
    # the refusal is tagged with its file's job, for `sigma jobs`
    assert [(e[2], e[6]) for e in out.events] == [("nan_loss", "[42]"), ("kpi_malformed", "[42]")]
    assert "'job_id' 43 in a file of job 42" in out.events[1][4]


def test_a_file_waits_unread_until_its_job_runs_here(tmp_path):
    (tmp_path / "job-42").mkdir()
    (tmp_path / "job-42" / "rank-0.node1.jsonl").write_text(nan_line(42))
    running: dict[int, int] = {}
    c = collector(tmp_path, running)
    assert run(c).events == [] and ("sidecar.kpi.pending_files", 1.0) in [(s[1], s[2]) for s in run(c).samples]
    running[42] = os.geteuid()  # SLURM now runs job 42 here: nothing written before was lost
    assert [e[2] for e in run(c).events] == ["nan_loss"]


def test_world_writable_file_is_refused(tmp_path):
    (tmp_path / "job-42").mkdir()
    f = tmp_path / "job-42" / "rank-0.node1.jsonl"
    f.write_text(nan_line(42))
    f.chmod(0o666)
    out = run(collector(tmp_path, {42: os.geteuid()}))
    assert [e[2] for e in out.events] == ["kpi_refused"] and "writable by every user" in out.events[0][4]


def test_a_symlink_is_refused_even_to_a_file_of_the_jobs_user(tmp_path):
    (tmp_path / "job-42").mkdir()
    target = tmp_path / "elsewhere.jsonl"
    target.write_text(nan_line(42))
    (tmp_path / "job-42" / "rank-0.node1.jsonl").symlink_to(target)
    out = run(collector(tmp_path, {42: os.geteuid()}))
    assert [e[2] for e in out.events] == ["kpi_refused"] and "not a regular file" in out.events[0][4]


@pytest.mark.parametrize("ts", ["NaN", "Infinity", "-1", "1e18"])
def test_implausible_line_times_are_malformed(tmp_path, ts):
    (tmp_path / "job-42").mkdir()
    (tmp_path / "job-42" / "rank-0.node1.jsonl").write_text(
        f'{{"ts": {ts}, "job_id": 42, "rank": 0, "event": "nan_loss"}}\n')
    out = run(collector(tmp_path, {42: os.geteuid()}))
    assert [e[2] for e in out.events] == ["kpi_malformed"] and "plausible unix time" in out.events[0][4]


def test_owner_comes_from_slurm_only_for_jobs_slurm_runs_here():
    from sigma.telemetry.jobs import JobTracker

    calls = []
    tracker = JobTracker("node1", ["kpi"], kpi_jobs=lambda s: {7}, owner_lookup=lambda j: calls.append(j) or 1000)
    tracker.refresh()
    assert tracker.jobs == [7] and tracker.owner(7) is None and calls == []  # a KPI file is no evidence
    tracker.slurm_jobs = {7}
    assert tracker.owner(7) == 1000 and tracker.owner(7) == 1000 and calls == [7]  # looked up once


def test_a_new_job_in_slurmds_spool_is_seen_before_the_next_refresh(tmp_path):
    from sigma.telemetry.jobs import JobTracker

    spool = tmp_path / "spool"
    spool.mkdir()
    tracker = JobTracker("node1", ["proc"], spool_dir=str(spool), owner_lookup=lambda j: 1000)
    tracker.refresh()
    assert tracker.owner(8) is None
    (spool / "node1_8.0").touch()  # slurmd starts a step of job 8 here
    tracker._recheck_at = 0.0
    assert tracker.owner(8) == 1000
