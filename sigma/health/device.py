"""Which torch device a performance check uses: the GPU when one is present, the CPU otherwise."""

from __future__ import annotations


def torch_device(ctx):
    """(torch, device, label); label goes into baseline metric names so CPU and GPU figures never mix."""
    import torch

    torch.set_num_threads(max(1, int(ctx.config.torch_threads)))
    if torch.cuda.is_available():
        return torch, torch.device("cuda:0"), torch.cuda.get_device_name(0)
    return torch, torch.device("cpu"), "cpu"


def synchronize(torch, device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
