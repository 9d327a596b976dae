"""Keep freed host memory for reuse while a CPU training step runs.

A CPU step frees and allocates the same large buffers every time (activations, gathered expert rows, bf16 copies of
the weights, their gradients). glibc serves each allocation over its mmap threshold with a fresh mapping and unmaps it
on free, so every such buffer is faulted in page by page, zero-filled by the kernel, on every step: a copy or cast
of such a buffer then costs several times its memory traffic. With mapping turned off and the heap's top kept
instead of trimmed, the next step reuses the memory the last one freed. GPU tensors do not come from malloc; there this changes nothing.

    with kept_freed_memory(enabled) as applied:   # applied: False where the C library is not glibc
        ...
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import functools

# glibc mallopt parameters (malloc.h) and their defaults
M_TRIM_THRESHOLD, M_MMAP_MAX = -1, -4
DEFAULT_TRIM_THRESHOLD, DEFAULT_MMAP_MAX = 128 * 1024, 65536
KEEP_TRIM_THRESHOLD = 2**31 - 1  # mallopt takes an int: at most 2 GiB of free heap top kept


@functools.cache
def _glibc():
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name)
        libc.gnu_get_libc_version  # only glibc has it: other C libraries' mallopt means something else or nothing
    except (OSError, AttributeError, TypeError):
        return None
    return libc


def _set(libc, trim_threshold: int, mmap_max: int) -> bool:
    return bool(libc.mallopt(M_TRIM_THRESHOLD, trim_threshold)) and bool(libc.mallopt(M_MMAP_MAX, mmap_max))


@contextlib.contextmanager
def kept_freed_memory(enabled: bool = True):
    """Inside: large allocations come from the heap and freed memory stays there for reuse. On leaving, glibc's
    defaults come back and the heap is trimmed, so the memory a finished run kept goes back to the system."""
    libc = _glibc() if enabled else None
    applied = libc is not None and _set(libc, KEEP_TRIM_THRESHOLD, 0)
    try:
        yield applied
    finally:
        if applied:
            _set(libc, DEFAULT_TRIM_THRESHOLD, DEFAULT_MMAP_MAX)
            libc.malloc_trim(0)
