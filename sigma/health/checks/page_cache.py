"""Page-cache size: stale cache from earlier jobs is host noise that slows synchronous training."""

from __future__ import annotations

from sigma.health import facts
from sigma.health.result import Result, failed, passed

CATEGORY = "host-noise"


def page_cache_kb(meminfo: dict[str, int]) -> int:
    """Droppable file cache: Cached without shared memory (tmpfs/shm cannot be dropped)."""
    return max(0, meminfo.get("Cached", 0) - meminfo.get("Shmem", 0)) + meminfo.get("Buffers", 0)


def check_page_cache(meminfo: dict[str, int], max_fraction: float = 0.5) -> Result:
    total = meminfo.get("MemTotal") or 0
    if not total:
        return failed("meminfo lacks MemTotal")
    cache = page_cache_kb(meminfo)
    frac = cache / total
    data = dict(page_cache_gb=round(cache / (1 << 20), 3), page_cache_fraction=round(frac, 4))
    if frac > max_fraction:
        return failed(f"page cache holds {cache / (1 << 20):.1f} GiB ({frac:.0%} of memory) > {max_fraction:.0%}",
                      **data)
    return passed(f"page cache {cache / (1 << 20):.2f} GiB ({frac:.0%} of memory)", **data)


def run(ctx, args: dict) -> Result:
    return check_page_cache(facts.meminfo(ctx), float(args.get("max_fraction", 0.5)))
