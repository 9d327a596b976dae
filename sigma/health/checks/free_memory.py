"""Free host memory: MemAvailable must leave room for the job."""

from __future__ import annotations

from sigma.health import facts
from sigma.health.result import Result, failed, passed

CATEGORY = "host-memory"


def check_free_memory(meminfo: dict[str, int], min_available_fraction: float = 0.05,
                      min_available_gb: float = 0.0) -> Result:
    total, avail = meminfo.get("MemTotal"), meminfo.get("MemAvailable")
    if not total or avail is None:
        return failed("meminfo lacks MemTotal/MemAvailable")
    frac, gb = avail / total, avail / (1 << 20)
    data = dict(available_gb=round(gb, 2), total_gb=round(total / (1 << 20), 2), available_fraction=round(frac, 4))
    if frac < min_available_fraction or gb < min_available_gb:
        return failed(f"only {gb:.1f} GiB ({frac:.1%}) of memory available; need {min_available_fraction:.0%} "
                      f"and {min_available_gb} GiB", **data)
    return passed(f"{gb:.1f} GiB ({frac:.0%}) available", **data)


def run(ctx, args: dict) -> Result:
    return check_free_memory(facts.meminfo(ctx), float(args.get("min_available_fraction", 0.05)),
                             float(args.get("min_available_gb", 0.0)))
