"""Sources of throughput noise for `sigma chaos`, each the real mechanism at small scale (run in the background as
`python -m sigma.chaos.noise KIND ...` until SIGTERM; the injector journals the pid):

  cpu-hog     processes pinned to the CPUs the job's ranks may use, busy for `percent` of every period (a cron job,
              a monitoring agent, another user's process): they compete for the same cores
  page-cache  a filler file read into the page cache while the pages the job's processes map (its code, libraries
              and data) are reclaimed every period: what reclaim does to a job when the cache is full of other data
  io-stall    synced writes saturating the disk while the job's mapped pages are reclaimed every period: what it
              reads comes from a disk that another writer keeps busy

Reclaiming another process's mapped pages is process_madvise(MADV_PAGEOUT) (Linux 5.10+, root or CAP_SYS_NICE),
the kernel's own reclaim path; posix_fadvise(DONTNEED) is the fallback, which drops only pages nobody maps.

Each process names itself (/proc/self/comm) so node telemetry lists it under that name.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys
import time
from pathlib import Path

CHUNK = 1 << 20
MADV_PAGEOUT = 21
SYS_PROCESS_MADVISE = 440  # the same number on every architecture (added after the syscall table unification)


def name_self(name: str) -> None:
    with contextlib.suppress(OSError):
        Path("/proc/self/comm").write_text(name[:15])


def file_mappings(pid: int) -> list[tuple[int, int, str]]:
    """(start, end, path) of the regular files a process maps (/proc/PID/maps): its code, libraries and data."""
    try:
        maps = Path(f"/proc/{pid}/maps").read_text()
    except OSError:
        return []
    out = []
    for line in maps.splitlines():
        parts = line.split(None, 5)
        if len(parts) < 6 or not parts[5].startswith("/") or parts[5].endswith(" (deleted)"):
            continue
        path = parts[5]
        if path.startswith("/dev/"):
            continue
        start, _, end = parts[0].partition("-")
        out.append((int(start, 16), int(end, 16), path))
    return out


def mapped_files(pids) -> list[str]:
    return sorted({path for pid in pids for _, _, path in file_mappings(pid)})


class _Iovec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]


def page_out(pids) -> bool:
    """Reclaim the processes' file-backed pages now, as memory pressure does (process_madvise MADV_PAGEOUT);
    where the kernel refuses (older than 5.10, no privilege) evict the files with posix_fadvise instead.
    True when the kernel's reclaim path was used."""
    libc = ctypes.CDLL(None, use_errno=True)
    reclaimed = True
    for pid in pids:
        ranges = file_mappings(pid)
        try:
            pidfd = os.pidfd_open(pid)
        except OSError:
            continue
        try:
            for at in range(0, len(ranges), 512):  # IOV_MAX is 1024
                chunk = ranges[at:at + 512]
                iov = (_Iovec * len(chunk))(*[_Iovec(start, end - start) for start, end, _ in chunk])
                if libc.syscall(SYS_PROCESS_MADVISE, pidfd, iov, len(chunk), MADV_PAGEOUT, 0) < 0:
                    reclaimed = False
                    break
        finally:
            os.close(pidfd)
    if not reclaimed:
        evict(mapped_files(pids))
    return reclaimed


def evict(files) -> int:
    """Drop the files' clean pages from the page cache (POSIX_FADV_DONTNEED); return how many files it reached."""
    done = 0
    for path in files:
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError:
            continue
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            done += 1
        finally:
            os.close(fd)
    return done


class _Stop:
    def __init__(self):
        self.stopped = False
        signal.signal(signal.SIGTERM, self._stop)

    def _stop(self, *_):
        self.stopped = True


def cpu_hog(cpus: list[int], busy_fraction: float = 1.0, period_s: float = 1.0) -> None:
    name_self("sigma-cpu-hog")
    if cpus:
        os.sched_setaffinity(0, cpus)
    stop = _Stop()
    x = 0
    while not stop.stopped:
        start = time.monotonic()
        while time.monotonic() - start < busy_fraction * period_s and not stop.stopped:
            for _ in range(10000):
                x = (x * 1103515245 + 12345) & 0x7FFFFFFF
        if busy_fraction < 1.0 and not stop.stopped:
            time.sleep(period_s * (1.0 - busy_fraction))


def page_cache(pids: list[int], filler: Path, size_mb: int, period_s: float) -> None:
    name_self("sigma-pagecache")
    stop = _Stop()
    block = os.urandom(CHUNK)
    try:
        with open(filler, "wb") as f:
            for _ in range(size_mb):
                f.write(block)
        with open(filler, "rb") as f:  # the filler is what the cache holds instead
            while f.read(CHUNK) and not stop.stopped:
                pass
        while not stop.stopped:
            page_out(pids)
            time.sleep(period_s)
    finally:
        filler.unlink(missing_ok=True)


def io_stall(pids: list[int], target: Path, size_mb: int, period_s: float) -> None:
    name_self("sigma-io-stall")
    stop = _Stop()
    block = os.urandom(CHUNK)
    last_evict = 0.0
    try:
        with open(target, "wb") as f:
            while not stop.stopped:
                f.seek(0)
                for _ in range(size_mb):
                    f.write(block)
                    os.fsync(f.fileno())  # every megabyte reaches the disk before the next
                    if time.monotonic() - last_evict >= period_s:
                        page_out(pids)
                        last_evict = time.monotonic()
                    if stop.stopped:
                        break
    finally:
        target.unlink(missing_ok=True)


def main(argv: list[str]) -> int:
    kind, rest = argv[0], argv[1:]
    if kind == "cpu-hog":
        cpu_hog([int(c) for c in rest[0].split(",") if c], *(float(x) for x in rest[1:3]))
    elif kind == "page-cache":
        page_cache([int(p) for p in rest[3:]], Path(rest[0]), int(rest[1]), float(rest[2]))
    elif kind == "io-stall":
        io_stall([int(p) for p in rest[3:]], Path(rest[0]), int(rest[1]), float(rest[2]))
    else:
        raise SystemExit(f"unknown noise kind {kind!r}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
