"""One module per check. Each module defines CATEGORY (default category of its failures), a pure `check_*`
function over gathered facts, and `run(ctx, args) -> Result` that gathers (cached) facts and calls it."""

from __future__ import annotations

import importlib
from types import ModuleType

# Registration order is the default display order.
CHECK_NAMES = (
    "accelerators", "kernel_log", "free_memory", "disk", "mounts", "net_interfaces", "infiniband",
    "stray_processes", "page_cache", "membw", "gemm", "gemm_sustained", "copy_bandwidth", "collective", "train_step",
)


def load(name: str) -> ModuleType:
    if name not in CHECK_NAMES:
        raise ValueError(f"unknown check {name!r}; checks: {', '.join(CHECK_NAMES)}")
    return importlib.import_module(f"sigma.health.checks.{name}")
