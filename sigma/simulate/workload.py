"""The simulated workload: synchronous multi-node training jobs, from a CSV or the stated default.

CSV columns: `name,nodes,count,hours,checkpoint_min,restart_min,submit_h` (hours empty: the job trains until the
simulation ends; submit_h: hours after the start it is submitted). The default fills 7/8 of the cluster with
8-node jobs (64 accelerators each at 8 per node) that train for the whole period, checkpoint every 30 minutes and
take 10 minutes from a (re)start to their first step; the other nodes are the spares requeued jobs move to.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

from sigma.simulate.trace import TraceError

COLUMNS = ("name", "nodes", "count", "hours", "checkpoint_min", "restart_min", "submit_h")


@dataclass(frozen=True)
class JobSpec:
    name: str
    nodes: int
    hours: float | None
    checkpoint_min: float
    restart_min: float
    submit_h: float = 0.0
    origin: str = "default workload"


def default(nodes: int, job_nodes: int = 8) -> list[JobSpec]:
    size = min(job_nodes, nodes)
    count = max(1, (nodes * 7 // 8) // size)
    return [JobSpec(f"train-{i + 1:03d}", size, None, 30.0, 10.0) for i in range(count)]


def read(path: str | Path, cluster_nodes: int) -> list[JobSpec]:
    path = Path(path)
    out: list[JobSpec] = []
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        missing = {"name", "nodes"} - set(reader.fieldnames or ())
        if missing:
            raise TraceError(f"{path}:1: missing columns {sorted(missing)}; a workload has {','.join(COLUMNS)}")
        unknown = set(reader.fieldnames or ()) - set(COLUMNS)
        if unknown:
            raise TraceError(f"{path}:1: unknown columns {sorted(unknown)}; valid: {','.join(COLUMNS)}")
        for line, row in enumerate(reader, start=2):
            where = f"{path}:{line}"
            nodes = _number(row, "nodes", where, int, 1)
            if nodes > cluster_nodes:
                raise TraceError(f"{where}: job {row['name']!r} needs {nodes} nodes; the cluster has {cluster_nodes}")
            count = _number(row, "count", where, int, 1, default=1)
            hours = _number(row, "hours", where, float, 1e-9, default=None)
            ckpt = _number(row, "checkpoint_min", where, float, 1e-9, default=30.0)
            restart = _number(row, "restart_min", where, float, 0.0, default=10.0)
            submit = _number(row, "submit_h", where, float, 0.0, default=0.0)
            for i in range(count):
                name = row["name"] if count == 1 else f"{row['name']}-{i + 1}"
                out.append(JobSpec(name, nodes, hours, ckpt, restart, submit, where))
    if not out:
        raise TraceError(f"{path}: no jobs")
    return out


def _number(row: dict, key: str, where: str, kind, minimum, default=...):
    text = (row.get(key) or "").strip()
    if not text:
        if default is ...:
            raise TraceError(f"{where}: missing {key}")
        return default
    try:
        value = kind(text)
    except ValueError:
        raise TraceError(f"{where}: {key} {text!r} is not a{'n integer' if kind is int else ' number'}") from None
    if not value >= minimum or value != value or value in (float("inf"),):
        raise TraceError(f"{where}: {key} must be at least {minimum} and finite, got {text}")
    return value
