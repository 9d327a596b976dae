"""The KPI JSON-lines tailer: partial lines, rotation, truncation, malformed lines, restarts, node filtering."""

from __future__ import annotations

import json
import os

from tests.unit.telemetry_helpers import make, run, saved_positions


def line(**kw) -> str:
    return json.dumps(kw) + "\n"


def kpi_collector(kpi_dir, positions=None, node="node1"):
    return make("kpi", {"dir": str(kpi_dir), "node_name": node}, node=node, positions=positions)


def test_metrics_events_partial_lines_and_other_nodes(tmp_path):
    job = tmp_path / "job-42"
    job.mkdir()
    mine, theirs = job / "rank-0.node1.jsonl", job / "rank-1.node2.jsonl"
    theirs.write_text(line(ts=1.0, job_id=42, rank=1, step=1, loss=9.0))
    c = kpi_collector(tmp_path)
    with mine.open("w") as f:
        f.write(line(ts=10.0, job_id=42, rank=0, event="start", message="resumed from step 0"))
        f.write(line(ts=11.0, job_id=42, rank=0, step=1, loss=2.5, step_time_s=0.5, tokens_per_s=1000.0,
                     mfu=0.4, grad_norm=1.5, expert_load=[0.5, 0.5]))
        f.write('{"ts": 12.0, "job_id": 42, "rank": 0, "st')  # a writer caught mid-line
    out = run(c)
    assert out.kpis == [(11.0, 42, 0, 1, 2.5, 0.5, 1000.0, 0.4, 1.5, '{"expert_load":[0.5,0.5]}')]
    assert [(e[1], e[2], e[4], e[6]) for e in out.events] == [("kpi", "start", "resumed from step 0", "[42]")]
    with mine.open("a") as f:
        f.write('ep": 2, "loss": 2.4}\n')
    out = run(c)
    assert [(k[3], k[4]) for k in out.kpis] == [(2, 2.4)]  # completed line read once, whole
    assert c.active_jobs(60) == {42}


def test_malformed_lines_are_counted_and_reported_never_fatal(tmp_path):
    job = tmp_path / "job-7"
    job.mkdir()
    path = job / "rank-0.node1.jsonl"
    path.write_text("not json\n" + line(ts=1.0, job_id="7", rank=0, step=1) + line(ts=2.0, job_id=7, rank=0)
                    + "[1, 2]\n" + line(ts=3.0, job_id=7, rank=0, step=1, loss="high")
                    + line(ts=4.0, job_id=7, rank=0, step=3, loss=float("nan")) + "\n")
    c = kpi_collector(tmp_path)
    out = run(c)
    bad = [e for e in out.events if e[2] == "kpi_malformed"]
    assert len(bad) == 5
    assert "job_id" in bad[1][4] and "'step'" in bad[2][4] and "'loss'" in bad[4][4]
    assert [(k[3], k[4], json.loads(k[9])) for k in out.kpis] == [(3, None, {"nonfinite": {"loss": "nan"}})]
    counts = {m: v for _, m, v, _ in out.samples}
    assert counts["sidecar.kpi.malformed_lines_total"] == 5


def test_rotation_truncation_and_restart(tmp_path):
    job = tmp_path / "job-9"
    job.mkdir()
    path = job / "rank-3.node1.jsonl"
    path.write_text(line(ts=1.0, job_id=9, rank=3, step=1))
    c = kpi_collector(tmp_path)
    assert [k[3] for k in run(c).kpis] == [1]
    with path.open("a") as f:
        f.write(line(ts=2.0, job_id=9, rank=3, step=2))
    os.rename(path, job / "rank-3.node1.jsonl.1")  # rotated: the unread step 2 is still read
    path.write_text(line(ts=3.0, job_id=9, rank=3, step=3))
    out = run(c)
    assert [k[3] for k in out.kpis] == [2, 3]
    path.write_text(line(ts=4.0, job_id=9, rank=3, step=4))  # truncated and rewritten
    out = run(c)
    assert [k[3] for k in out.kpis] == [4]
    with path.open("a") as f:
        f.write(line(ts=5.0, job_id=9, rank=3, step=5))
    restarted = kpi_collector(tmp_path, positions=saved_positions(out))
    assert [k[3] for k in run(restarted).kpis] == [5]


def test_mistakes_a_hand_written_trainer_makes_are_named(tmp_path):
    """Milliseconds, a file name without the node, several ranks in one file, steps going back: each said once,
    with the fix, and tagged with the job (sigma jobs lists them)."""
    import time

    job = tmp_path / "job-5"
    job.mkdir()
    now = time.time()
    (job / "rank-0.node1.jsonl").write_text(
        line(ts=now * 1000, job_id=5, rank=0, step=1) + line(ts=now, job_id=5, rank=0, step=4)
        + line(ts=now, job_id=5, rank=1, step=4) + line(ts=now, job_id=5, rank=0, step=2)
        + line(ts=now, job_id=5, rank=0, step=3))
    (job / "rank-0.jsonl").write_text(line(ts=now, job_id=5, rank=0, step=1))
    (job / "rank-1.node2.jsonl").write_text("")  # another node's file on a shared directory: fine
    c = kpi_collector(tmp_path)
    out = run(c)
    events = {e[2]: (e[4], json.loads(e[5]), e[6]) for e in out.events}
    assert set(events) == {"kpi_malformed", "kpi_misnamed", "kpi_ranks_mixed", "kpi_out_of_order"}
    assert "looks like milliseconds: write unix seconds" in events["kpi_malformed"][0]
    assert events["kpi_malformed"][1]["reason"] == "ts-units"
    assert "must be named rank-<RANK>.<NODE>.jsonl, here rank-<RANK>.node1.jsonl" in events["kpi_misnamed"][0]
    assert "ranks [0, 1]" in events["kpi_ranks_mixed"][0] and "step 2 after step 4" in events["kpi_out_of_order"][0]
    assert {e[2] for e in events.values()} == {"[5]"}
    assert [k[3] for k in out.kpis] == [4, 4, 2, 3]  # kept
    assert not run(c).events  # said once


def test_one_warning_line_reaches_the_jobs_output(tmp_path):
    import subprocess
    import sys

    from sigma.telemetry.joboutput import tell_job

    output = tmp_path / "slurm-991177.out"
    with output.open("w") as f:
        proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"], stdout=f,
                                env={**os.environ, "SLURM_JOB_ID": "991177", "SLURMD_NODENAME": "node7"})
    try:
        assert not tell_job(991177, "node8", "not this node's")
        assert tell_job(991177, "node7", "sigma sidecar on node7: KPI lines of this job are refused")
    finally:
        proc.kill()
        proc.wait()
    assert output.read_text() == "sigma sidecar on node7: KPI lines of this job are refused\n"
