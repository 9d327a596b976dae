"""Disk free and writable for the node's configured paths (scratch, spool, checkpoint dirs)."""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass

from sigma.health.result import Result, failed, passed, skipped

CATEGORY = "storage"


@dataclass
class PathFacts:
    path: str
    exists: bool
    free_gb: float = 0.0
    write_error: str = ""  # empty when the probe write worked (or was not asked for)
    min_free_gb: float = 0.0


def gather(host_path, min_free_gb: float, writable: bool) -> PathFacts:
    if not host_path.is_dir():
        return PathFacts(str(host_path), False, min_free_gb=min_free_gb)
    free = shutil.disk_usage(host_path).free / (1 << 30)
    error = ""
    if writable:
        probe = host_path / f".sigma-health-probe-{os.getpid()}"
        try:
            fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            try:
                os.write(fd, b"sigma health probe\n")
                os.fsync(fd)
            finally:
                os.close(fd)
            os.unlink(probe)
        except OSError as exc:
            error = exc.strerror or str(exc)
    return PathFacts(str(host_path), True, round(free, 2), error, min_free_gb)


def check_disk(paths: list[PathFacts]) -> Result:
    if not paths:
        return skipped("no disk paths configured for this node")
    problems = []
    for p in paths:
        if not p.exists:
            problems.append(f"{p.path} missing")
        elif p.write_error:
            problems.append(f"{p.path} not writable ({p.write_error})")
        elif p.free_gb < p.min_free_gb:
            problems.append(f"{p.path} has {p.free_gb:.1f} GiB free < {p.min_free_gb} GiB")
    data = {"free_gb": {p.path: p.free_gb for p in paths}}
    if problems:
        return failed("; ".join(problems), **data)
    return passed(", ".join(f"{p.path} {p.free_gb:.0f} GiB free" for p in paths), **data)


def run(ctx, args: dict) -> Result:
    return check_disk([gather(ctx.host(ctx.template(d.path)), d.min_free_gb, d.writable)
                       for d in ctx.profile.disk_paths or []])
