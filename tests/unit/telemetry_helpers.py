"""Build one collector from a params dict, as the sidecar would, and run it."""

from __future__ import annotations

import json

from sigma.config import from_dict
from sigma.telemetry.base import Context, Output, load_collectors


def make(kind: str, params: dict | None = None, *, node: str = "node1", node_dir: str = "/nonexistent",
         host_root: str = "/", positions: dict | None = None):
    registry = load_collectors()
    cls = registry[kind]
    p = from_dict(cls.Params, params or {})
    return cls(kind, p, Context(node=node, node_dir=node_dir, host_root=host_root, positions=positions or {}))


def run(collector) -> Output:
    out = Output(ts=1000.0)
    collector.collect(out)
    return out


def samples(out: Output) -> dict:
    """{(metric, labels as sorted tuple): value}"""
    return {(m, tuple(sorted(json.loads(l).items()))): v for _, m, v, l in out.samples}


def saved_positions(out: Output) -> dict:
    return {k: json.loads(v) for k, v in out.positions.items()}
