"""`sigma train calibrate` records a CPU peak once; the trainer reads it and never measures one itself."""

import json

import torch

from sigma.cli import main
from sigma.train.flops import cpu_model, peak_flops


def test_calibrate_records_the_best_run_with_the_cpu_model(tmp_path, monkeypatch, capsys):
    path = tmp_path / "peaks.json"
    monkeypatch.setenv("SIGMA_PEAK_FILE", str(path))
    monkeypatch.delenv("SIGMA_PEAK_FLOPS", raising=False)
    assert main(["train", "calibrate", "--threads", "1", "--dtypes", "float32", "--runs", "2", "--seconds",
                 "0.05"]) == 0
    out = capsys.readouterr().out
    assert "load average" in out and str(path) in out
    (entry,) = json.loads(path.read_text())["entries"]
    assert entry["cpu"] == cpu_model() and entry["threads"] == 1 and entry["dtype"] == "float32"
    assert len(entry["runs"]) == 2 and entry["flops"] == max(entry["runs"]) > 1e8
    monkeypatch.setattr(torch, "get_num_threads", lambda: 1)
    peak = peak_flops("cpu", torch.float32)
    assert peak.flops == entry["flops"] and "sigma train calibrate" in peak.source
    # a second calibration replaces the entry of the same CPU, threads and dtype and keeps the others
    assert main(["train", "calibrate", "--threads", "1", "--dtypes", "bfloat16", "--runs", "1", "--seconds",
                 "0.05"]) == 0
    assert {e["dtype"] for e in json.loads(path.read_text())["entries"]} == {"float32", "bfloat16"}


def test_calibrate_rejects_bad_arguments(capsys):
    assert main(["train", "calibrate", "--dtypes", "float64"]) != 0
    assert "--dtypes" in capsys.readouterr().err
