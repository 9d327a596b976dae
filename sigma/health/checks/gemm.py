"""GEMM throughput (torch matmul; GPU when present, CPU otherwise) against the node type's baseline."""

from __future__ import annotations

import time

from sigma.health.baselines import compare
from sigma.health.device import synchronize, torch_device
from sigma.health.result import Result

CATEGORY = "performance"


def measure(torch, device, n: int, dtype, iters: int) -> float:
    """Best-of-iters TFLOP/s for an n x n x n matmul."""
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    torch.matmul(a, b)
    synchronize(torch, device)
    best = float("inf")
    for _ in range(iters):
        t0 = time.perf_counter()
        torch.matmul(a, b)
        synchronize(torch, device)
        best = min(best, time.perf_counter() - t0)
    return 2 * n ** 3 / best / 1e12


def settings(torch, device, args: dict):
    if device.type == "cuda":
        return int(args.get("gpu_size", 8192)), getattr(torch, args.get("gpu_dtype", "bfloat16"))
    return int(args.get("cpu_size", 512)), getattr(torch, args.get("cpu_dtype", "float32"))


def run(ctx, args: dict) -> Result:
    torch, device, label = torch_device(ctx)
    n, dtype = settings(torch, device, args)
    tflops = measure(torch, device, n, dtype, int(args.get("iters", 5)))
    result = compare(ctx, f"gemm_tflops:{label}", tflops, "TFLOP/s", float(args.get("tolerance", 0.2)))
    result.data.update(device=label, size=n, dtype=str(dtype).removeprefix("torch."))
    return result
