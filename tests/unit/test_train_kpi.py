"""KPI JSON lines: the protocol the sidecar ingests."""

import json

from sigma.train.kpi import REQUIRED_FIELDS, KpiWriter, job_id_from_env, kpi_path, read_kpis


def test_lines_are_json_with_required_fields(tmp_path):
    writer = KpiWriter(rank=1, kpi_dir=tmp_path, job_id=42, node="node2")
    writer.metrics(3, loss=2.5, grad_norm=1.0, step_time_s=0.1, tokens_per_s=1000.0, mfu=0.1,
                   expert_load=[[1, 2], [3, 0]])
    writer.event("nan_loss", "non-finite loss", step=4, loss=float("nan"))
    writer.close()
    path = tmp_path / "job-42" / "rank-1.node2.jsonl"
    assert writer.path == path == kpi_path(tmp_path, 42, 1, "node2")
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert len(lines) == 2
    for line in lines:
        assert all(field in line for field in REQUIRED_FIELDS)
        assert isinstance(line["ts"], float) and line["job_id"] == 42 and line["rank"] == 1
    assert lines[0]["step"] == 3 and lines[0]["expert_load"] == [[1, 2], [3, 0]]
    assert lines[1]["event"] == "nan_loss" and lines[1]["loss"] == "nan"  # strict JSON: no NaN literal


def test_appends_across_writers_like_a_requeued_job(tmp_path):
    for step in (1, 2):
        writer = KpiWriter(rank=0, kpi_dir=tmp_path, job_id=7, node="n")
        writer.metrics(step, loss=1.0)
        writer.close()
    assert [r["step"] for r in read_kpis(tmp_path / "job-7" / "rank-0.n.jsonl")] == [1, 2]


def test_job_id_from_environment():
    assert job_id_from_env({"SLURM_JOB_ID": "123"}) == 123
    assert job_id_from_env({"SLURM_ARRAY_JOB_ID": "9", "SLURM_JOB_ID": "123"}) == 9
    assert job_id_from_env({"SUBMITIT_LOCAL_JOB_ID": "55"}) == 55
    assert job_id_from_env({}) == 0


def test_torn_last_line_is_skipped(tmp_path):
    path = tmp_path / "k.jsonl"
    path.write_text('{"ts": 1.0, "job_id": 1, "rank": 0, "step": 1}\n{"ts": 2.0, "job')
    assert len(read_kpis(path)) == 1
