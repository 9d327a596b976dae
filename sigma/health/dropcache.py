"""Drop the page cache: `sync; echo MODE > /proc/sys/vm/drop_caches`, reporting what actually happened.

Containers and sandboxed kernels (gVisor) may lack the file, refuse the write, or accept it without effect;
each case is reported in words instead of failing the run.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from sigma.health.checks.page_cache import page_cache_kb


@dataclass
class DropOutcome:
    attempted: bool
    dropped: bool  # the write was accepted
    before_kb: int
    after_kb: int
    duration_s: float
    message: str

    def to_json(self) -> dict:
        return asdict(self)


def _meminfo(root: Path) -> dict[str, int]:
    out = {}
    for line in (root / "proc/meminfo").read_text().splitlines():
        key, _, rest = line.partition(":")
        parts = rest.split()
        if parts and parts[0].isdigit():
            out[key] = int(parts[0])
    return out


def _sync(timeout_s: float) -> bool:
    """os.sync() in a thread: a hung filesystem must not hang the prolog."""
    worker = threading.Thread(target=os.sync, daemon=True)
    worker.start()
    worker.join(timeout_s)
    return not worker.is_alive()


def drop_page_cache(root: Path = Path("/"), mode: int = 3, sync_timeout_s: float = 3.0) -> DropOutcome:
    if mode not in (1, 2, 3):
        raise ValueError(f"drop_caches mode must be 1, 2 or 3, not {mode}")
    t0 = time.monotonic()
    before = page_cache_kb(_meminfo(root))
    target = root / "proc/sys/vm/drop_caches"
    synced = _sync(sync_timeout_s)
    try:
        fd = os.open(target, os.O_WRONLY)  # never create it: a missing file means no support
        try:
            os.write(fd, f"{mode}\n".encode())
        finally:
            os.close(fd)
        dropped, why = True, ""
    except FileNotFoundError:
        dropped, why = False, f"{target} does not exist (container or sandboxed kernel)"
    except PermissionError:
        dropped, why = False, f"not permitted to write {target} (needs root, or the sandbox forbids it)"
    except OSError as exc:
        dropped, why = False, f"writing {target} failed: {exc.strerror or exc}"
    after = page_cache_kb(_meminfo(root))
    if dropped:
        freed = before - after
        why = f"dropped: page cache {before / 1024:.0f} MiB -> {after / 1024:.0f} MiB"
        if before > 64 * 1024 and freed < before * 0.05:
            why += " (no visible effect: the kernel accepted the write but kept the cache, e.g. gVisor)"
    if not synced:
        why += f"; sync did not finish within {sync_timeout_s:g}s (hung filesystem?)"
    return DropOutcome(True, dropped, before, after, round(time.monotonic() - t0, 4), why)
