"""Performance baselines per node type, built from known-good nodes (as SuperBench's baseline generation does).

File (JSON): {"types": {TYPE: {METRIC: {"value": median over nodes, "unit": "...", "nodes": {NODE: value},
"updated": ts}}}}. `sigma health baseline record` measures this node and merges it in; checks compare a
measurement with the value: it must not fall below value * (1 - tolerance).
"""

from __future__ import annotations

import fcntl
import json
import os
import statistics
import time
from pathlib import Path

from sigma.health.result import Result, failed, passed, skipped


def baseline_path(ctx) -> Path:
    return Path(ctx.template(ctx.config.baseline_file))


def load(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return {"types": {}}
    except ValueError as exc:
        raise ValueError(f"{path}: not valid JSON ({exc})") from None
    if not isinstance(data, dict) or not isinstance(data.get("types"), dict):
        raise ValueError(f"{path}: expected an object with a 'types' mapping")
    return data


def lookup(data: dict, node_type: str, metric: str) -> dict | None:
    return data["types"].get(node_type, {}).get(metric)


def check_against(value: float, baseline: dict | None, metric: str, unit: str, tolerance: float,
                  node_type: str) -> Result:
    data = {metric: round(value, 4)}
    if baseline is None:
        return skipped(f"no baseline for {metric} on node type {node_type!r} (measured {value:.3g} {unit}); "
                       f"record one with `sigma health baseline record` on known-good nodes", **data)
    floor = baseline["value"] * (1 - tolerance)
    data.update(baseline=baseline["value"], floor=round(floor, 4))
    ratio = value / baseline["value"] if baseline["value"] else float("inf")
    if value < floor:
        return failed(f"{metric} {value:.3g} {unit} is {ratio:.0%} of baseline {baseline['value']:.3g} "
                      f"(floor {floor:.3g}, tolerance {tolerance:.0%})", "performance", **data)
    return passed(f"{metric} {value:.3g} {unit} ({ratio:.0%} of baseline)", **data)


def compare(ctx, metric: str, value: float, unit: str, tolerance: float) -> Result:
    data = ctx.fact("baselines", lambda: load(baseline_path(ctx)))
    node_type = ctx.profile.type or "default"
    result = check_against(value, lookup(data, node_type, metric), metric, unit, tolerance, node_type)
    result.data["unit"] = unit
    return result


def record(path: Path, node_type: str, node: str, metrics: dict[str, tuple[float, str]]) -> dict:
    """Merge this node's measurements {metric: (value, unit)}; the baseline is the median over nodes."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_suffix(path.suffix + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # nodes record concurrently into a shared file
        data = load(path)
        entries = data["types"].setdefault(node_type, {})
        for metric, (value, unit) in metrics.items():
            entry = entries.setdefault(metric, {"nodes": {}})
            entry["nodes"][node] = round(value, 4)
            entry["unit"] = unit
            entry["value"] = round(statistics.median(entry["nodes"].values()), 4)
            entry["updated"] = int(time.time())
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        tmp.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
        os.replace(tmp, path)
    return data
