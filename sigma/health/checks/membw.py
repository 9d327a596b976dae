"""Host memory bandwidth (large array copies with numpy) against the node type's baseline."""

from __future__ import annotations

import time

from sigma.health.baselines import compare
from sigma.health.result import Result

CATEGORY = "performance"
METRIC = "membw_gbps:host"


def measure(size_mb: int = 128, repeats: int = 5) -> float:
    """Best copy bandwidth in GB/s, counting read + write bytes like STREAM's copy."""
    import numpy as np

    src = np.ones(size_mb * (1 << 20) // 8)
    dst = np.empty_like(src)
    np.copyto(dst, src)  # touch pages before timing
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        np.copyto(dst, src)
        best = min(best, time.perf_counter() - t0)
    return 2 * src.nbytes / best / 1e9


def run(ctx, args: dict) -> Result:
    value = measure(int(args.get("size_mb", 128)), int(args.get("repeats", 5)))
    return compare(ctx, METRIC, value, "GB/s", float(args.get("tolerance", 0.25)))
