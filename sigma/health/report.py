"""The health result file (contract: <node_dir>/health/<unix_ts_ms>-<suite>.json, written atomically) and the
loud log every hook keeps beside it (<node_dir>/health/health.log, plus stderr)."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path


def write_result(node_dir: Path, report: dict) -> Path:
    out_dir = node_dir / "health"
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{int(report['ts'] * 1000)}-{report['suite']}.json"
    tmp = out_dir / f".{path.name}.tmp{os.getpid()}"
    tmp.write_text(json.dumps(report, indent=1) + "\n")
    os.replace(tmp, path)  # the sidecar never sees a half-written file
    return path


def log(node_dir: Path | None, message: str) -> None:
    """One line to stderr and to health.log; logging must never break a hook."""
    line = f"{time.strftime('%Y-%m-%dT%H:%M:%S')} sigma-health[{os.getpid()}]: {message}"
    print(line, file=sys.stderr, flush=True)
    if node_dir is None:
        return
    try:
        (node_dir / "health").mkdir(parents=True, exist_ok=True)
        with open(node_dir / "health" / "health.log", "a") as f:
            f.write(line + "\n")
    except OSError:
        pass


def latest_results(node_dir: Path, suite: str | None = None) -> list[Path]:
    """Result files, oldest first."""
    pattern = f"*-{suite}.json" if suite else "*.json"
    return sorted((node_dir / "health").glob(pattern), key=lambda p: int(p.name.split("-", 1)[0]))
