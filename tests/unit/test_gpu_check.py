"""bench/gpu_check.py on a machine without a GPU: every part listed, each skipped with its reason, exit 0."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from tests.conftest import REPO

SCRIPT = REPO / "bench" / "gpu_check.py"


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA device is present: the check would run for real")
def test_without_a_gpu_every_part_is_skipped_with_its_reason(tmp_path):
    out = subprocess.run([sys.executable, str(SCRIPT), "--out", str(tmp_path)], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    report = json.loads((tmp_path / "gpu-check.json").read_text())
    listed = subprocess.run([sys.executable, str(SCRIPT), "--list"], capture_output=True, text=True, timeout=60)
    names = [line.split()[0] for line in listed.stdout.splitlines()]
    assert list(report["parts"]) == names and "trainer-moe-1b" in names and "numerics" in names
    device = report["parts"]["device"]
    assert device["status"] == "ok" and device["cuda"] is False and device["gpus"] == []
    assert device["torch"] == torch.__version__
    for name in names[1:]:
        part = report["parts"][name]
        assert part["status"] == "skipped", name
        assert part["summary"].startswith("skipped: no CUDA device"), part["summary"]
    assert report["failed"] == 0 and report["device_summary"].startswith("no CUDA device")
    text = (tmp_path / "gpu-check.txt").read_text().splitlines()
    assert text[0].startswith("sigma GPU check on ") and "no CUDA device" in text[0]
    assert [line.split()[0] for line in text[2:-1]] == names
    assert text[-1].startswith("total ") and "0 part(s) failed" in text[-1]


def test_unknown_part_is_a_usage_error(tmp_path):
    out = subprocess.run([sys.executable, str(SCRIPT), "--out", str(tmp_path), "--parts", "device,warp-drive"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2
    assert "unknown part(s) warp-drive" in out.stderr and "trainer-tiny" in out.stderr
