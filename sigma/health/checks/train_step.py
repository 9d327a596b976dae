"""A tiny deterministic training run with a known loss: a small MLP whose weights and data come from fixed
formulas (no RNG), trained a few SGD steps on the node's device. The losses must match a float64 CPU reference
computed in the same run (silent data corruption, broken kernels) and the configured golden final loss."""

from __future__ import annotations

import math

from sigma.health.device import torch_device
from sigma.health.result import Result, failed, passed

CATEGORY = "gpu"


def build(torch, device, dtype, width: int = 64, samples: int = 256):
    """Inputs, targets and parameters from formulas: identical on every machine."""
    i = torch.arange(samples * 16, dtype=torch.float64).reshape(samples, 16)
    x = torch.sin(i * 0.37) + 0.1 * torch.cos(i * 1.3)
    target = torch.tanh(x[:, :4] * 1.5 - x[:, 4:8] * 0.5)
    w1 = torch.cos(torch.arange(16 * width, dtype=torch.float64).reshape(16, width) * 0.71) * 0.3
    w2 = torch.sin(torch.arange(width * 4, dtype=torch.float64).reshape(width, 4) * 0.53) * 0.2
    cast = lambda t: t.to(device=device, dtype=dtype)  # noqa: E731
    params = [cast(w1).requires_grad_(), cast(w2).requires_grad_()]
    return cast(x), cast(target), params


def train(torch, device, dtype, steps: int, lr: float) -> list[float]:
    x, target, (w1, w2) = build(torch, device, dtype)
    losses = []
    for _ in range(steps):
        loss = ((torch.tanh(x @ w1) @ w2 - target) ** 2).mean()
        loss.backward()
        loss = loss.detach()
        with torch.no_grad():
            for w in (w1, w2):
                w -= lr * w.grad
                w.grad = None
        losses.append(loss.item())
    return losses


def check_train_step(losses: list[float], reference: list[float], golden: float | None, rtol: float) -> Result:
    data = dict(losses=[round(v, 6) for v in losses], reference=[round(v, 6) for v in reference])
    if any(not math.isfinite(v) for v in losses):
        return failed(f"non-finite loss: {losses}", **data)
    for step, (got, want) in enumerate(zip(losses, reference)):
        if abs(got - want) > rtol * abs(want):
            return failed(f"loss at step {step} is {got:.6f}, float64 reference {want:.6f} (rtol {rtol})", **data)
    if golden is not None and abs(reference[-1] - golden) > rtol * abs(golden):
        return failed(f"reference final loss {reference[-1]:.6f} differs from the known {golden:.6f}: "
                      f"host floating point is broken", "host-memory", **data)
    if losses[-1] >= losses[0]:
        return failed(f"loss did not decrease ({losses[0]:.6f} -> {losses[-1]:.6f})", **data)
    return passed(f"{len(losses)} steps, loss {losses[0]:.4f} -> {losses[-1]:.4f} as expected", **data)


def run(ctx, args: dict) -> Result:
    torch, device, label = torch_device(ctx)
    steps, lr = int(args.get("steps", 10)), float(args.get("lr", 0.2))
    losses = train(torch, device, torch.float32, steps, lr)
    reference = train(torch, torch.device("cpu"), torch.float64, steps, lr)
    golden = args.get("expected_final_loss")
    result = check_train_step(losses, reference, None if golden is None else float(golden),
                              float(args.get("rtol", 1e-3)))
    result.data["device"] = label
    return result
