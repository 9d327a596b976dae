"""Freed host memory kept for the next step: counted in the page faults a repeated large allocation takes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from sigma.train.host_malloc import _glibc

pytestmark = pytest.mark.skipif(_glibc() is None, reason="glibc's mallopt only")

# Run in a fresh process: a heap that earlier tests grew and freed can serve a buffer without faults by itself.
MEASURE = """
import json, resource, torch
from sigma.train.host_malloc import kept_freed_memory

BUFFER = 64 * 2**20  # over glibc's largest mmap threshold (32 MiB): mapped fresh by default


def steady_faults(steps=16, last=4):
    # minor page faults of each of the last steps that allocate, fill and free one large buffer (the pattern of a
    # training step; the heap takes a few steps to settle)
    faults = []
    for _ in range(steps):
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        torch.empty(BUFFER, dtype=torch.uint8).fill_(1)
        faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
    return faults[-last:]


out = {"pages": BUFFER // resource.getpagesize(), "default": steady_faults()}
with kept_freed_memory(False) as kept:
    out["disabled"], out["disabled_applied"] = steady_faults(), kept
with kept_freed_memory() as kept:
    out["kept"], out["kept_applied"] = steady_faults(), kept
print(json.dumps(out))
"""


def test_kept_memory_is_reused_without_faults():
    run = subprocess.run([sys.executable, "-c", MEASURE], capture_output=True, text=True, timeout=120,
                         cwd=Path(__file__).resolve().parents[2])
    assert run.returncode == 0, run.stderr
    out = json.loads(run.stdout)
    assert out["kept_applied"] and not out["disabled_applied"]
    assert max(out["kept"]) < out["pages"] // 100  # the freed buffer is reused in place
    assert min(out["default"]) > max(out["kept"])  # by default its pages fault in again (fewer with huge pages)
    assert min(out["disabled"]) > max(out["kept"])


def test_trainer_reports_it_in_the_start_event(train_data, tmp_path, monkeypatch):
    from sigma.paths import configs_dir
    from sigma.train.kpi import read_kpis
    from sigma.train.train_config import load_train_config
    from sigma.train.trainer import train

    monkeypatch.setenv("SIGMA_KPI_DIR", str(tmp_path / "kpi"))
    base = [f"data.path={train_data}", "data.prepare_if_missing=false", "steps=1", "device=cpu", "eval.every=0",
            f"checkpoint.dir={tmp_path / 'ckpt'}", "checkpoint.every=0", "kpi.heartbeat_s=0"]
    for value in (True, False):
        summary = train(load_train_config(configs_dir() / "train" / "debug.yaml", base + [f"keep_freed_host_memory={str(value).lower()}"]))
    starts = [r for r in read_kpis(summary.kpi_path) if r.get("event") == "start"]
    assert [s["host_memory_kept"] for s in starts] == [True, False]
