"""Sustained GEMM stability: repeat the same matmul for a while; every result must equal the first
(silent data corruption) and the median window's throughput must not sag (throttling) far below the best."""

from __future__ import annotations

import statistics
import time

from sigma.health.device import synchronize, torch_device
from sigma.health.checks.gemm import settings
from sigma.health.result import Result, failed, passed

CATEGORY = "performance"


def check_gemm_sustained(window_tflops: list[float], mismatches: int, max_drop: float | None) -> Result:
    if not window_tflops:
        return failed("no measurement window completed")
    best, worst = max(window_tflops), min(window_tflops)
    data = dict(windows=len(window_tflops), best_tflops=round(best, 4), worst_tflops=round(worst, 4),
                median_tflops=round(statistics.median(window_tflops), 4), mismatches=mismatches)
    if mismatches:
        return failed(f"{mismatches} matmul results differed from the first (silent data corruption)", "gpu",
                      **data)
    median = statistics.median(window_tflops)
    if max_drop is not None and median < best * (1 - max_drop):
        return failed(f"median throughput {median:.3g} TFLOP/s sagged from the best window {best:.3g} "
                      f"({1 - median / best:.0%} drop > {max_drop:.0%}): throttling or a noisy neighbour",
                      "performance", **data)
    return passed(f"{len(window_tflops)} windows, {worst:.3g}-{best:.3g} TFLOP/s, results identical", **data)


def run(ctx, args: dict) -> Result:
    torch, device, label = torch_device(ctx)
    n, dtype = settings(torch, device, args)
    duration, window = float(args.get("duration_s", 5.0)), float(args.get("window_s", 0.5))
    torch.manual_seed(0)
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    reference = torch.matmul(a, b)
    synchronize(torch, device)
    windows, mismatches = [], 0
    end = time.perf_counter() + duration
    while time.perf_counter() < end:
        t0, count = time.perf_counter(), 0
        while time.perf_counter() - t0 < window:
            out = torch.matmul(a, b)
            synchronize(torch, device)
            count += 1
            if count % 4 == 1 and not torch.equal(out, reference):
                mismatches += 1
        windows.append(2 * n ** 3 * count / (time.perf_counter() - t0) / 1e12)
    # A CPU shares its cores with the OS and other tenants: its sag says little about the node unless asked.
    key = "max_drop" if device.type != "cpu" else "max_drop_cpu"
    max_drop = args.get(key, 0.3 if key == "max_drop" else None)
    result = check_gemm_sustained(windows, mismatches, None if max_drop is None else float(max_drop))
    result.data.update(device=label, size=n)
    return result
