"""Host <-> device copy bandwidth (pinned memory) against the node type's baseline; needs an accelerator."""

from __future__ import annotations

import time

from sigma.health.baselines import compare
from sigma.health.device import synchronize, torch_device
from sigma.health.result import Result, failed, skipped

CATEGORY = "performance"


def measure(torch, device, size_mb: int, iters: int) -> tuple[float, float]:
    """(host->device, device->host) GB/s, best of iters."""
    host = torch.empty(size_mb << 20, dtype=torch.uint8).pin_memory()
    dev = torch.empty(size_mb << 20, dtype=torch.uint8, device=device)
    rates = []
    for dst, src in ((dev, host), (host, dev)):
        dst.copy_(src, non_blocking=True)
        synchronize(torch, device)
        best = float("inf")
        for _ in range(iters):
            t0 = time.perf_counter()
            dst.copy_(src, non_blocking=True)
            synchronize(torch, device)
            best = min(best, time.perf_counter() - t0)
        rates.append(host.numel() / best / 1e9)
    return rates[0], rates[1]


def run(ctx, args: dict) -> Result:
    torch, device, label = torch_device(ctx)
    if device.type != "cuda":
        if ctx.profile.gpus:
            return failed(f"expected {ctx.profile.gpus} GPUs but torch sees none", "gpu")
        return skipped("no accelerator: host<->device copies do not apply")
    h2d, d2h = measure(torch, device, int(args.get("size_mb", 256)), int(args.get("iters", 5)))
    tol = float(args.get("tolerance", 0.2))
    up = compare(ctx, f"h2d_gbps:{label}", h2d, "GB/s", tol)
    down = compare(ctx, f"d2h_gbps:{label}", d2h, "GB/s", tol)
    worst = next((r for r in (up, down) if r.status == "fail"), None) or \
        next((r for r in (up, down) if r.status == "skip"), up)
    worst.message = f"h2d {h2d:.1f} GB/s, d2h {d2h:.1f} GB/s: {worst.message}"
    worst.data.update({**up.data, **down.data})
    return worst
