"""What reading a node's kernel log costs the sidecar, per source: the same N kernel lines (1 in 50 an Xid) through a
real systemd-journald read natively (libsystemd) and through `journalctl --follow`, and as syslog file lines, into
the logtail collector with the shipped kernel patterns. Prints lines per second of sidecar CPU (the collector's
thread plus, for journalctl, the child's), the file tail as the baseline, and the events each produced.

    python bench/kernel_log.py [--lines 20000]

Needs root (the private journald runs in a mount namespace, tests/journald.py).
"""

from __future__ import annotations

import argparse
import resource
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from sigma.config import from_dict  # noqa: E402
from sigma.telemetry.base import Context, Output  # noqa: E402
from sigma.telemetry.collectors.logtail import LogTailCollector  # noqa: E402
from sigma.telemetry.config import load  # noqa: E402
from tests import journald  # noqa: E402


def message(i: int) -> str:
    if i % 50 == 0:
        return f"NVRM: Xid (PCI:0000:3b:00): 79, pid={i}, name=python, GPU has fallen off the bus."
    return f"mlx5_core 0000:5e:00.0: port {i % 4} module event: cable plugged, seq {i}"


def kernel_patterns() -> dict:
    loaded = load(REPO / "configs" / "telemetry.yaml", node="bench")
    return loaded.collectors["kernel"][1]


def collect_all(collector, want: int, timeout: float = 120.0) -> tuple[int, float, float]:
    """(events, collector thread CPU s, child CPU s) reading until `want` lines were read."""
    lines = events = 0
    cpu0 = time.thread_time()
    child0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    deadline = time.monotonic() + timeout
    while lines < want and time.monotonic() < deadline:
        out = Output()
        collector.collect(out)
        lines += sum(v for _, m, v, _ in out.samples if m == "log.lines")
        events += sum(1 for e in out.events if e[1] == "log")
    cpu = time.thread_time() - cpu0
    collector.close()
    child1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    return events, cpu, (child1.ru_utime + child1.ru_stime) - (child0.ru_utime + child0.ru_stime)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lines", type=int, default=20000)
    args = ap.parse_args()
    why = journald.available()
    if why:
        print(f"cannot run: {why}")
        return 1
    base = kernel_patterns()
    n = args.lines
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        results = {}
        kern = root / "kern.log"
        kern.write_text("".join(f"{time.strftime('%b %d %H:%M:%S')} gpu01 kernel: [{1000 + i / 1000:12.6f}] "
                                f"{message(i)}\n" for i in range(n)))
        params = from_dict(type(base), {"source": "files", "files": [str(kern)], "start_at": "start",
                                        "idents": ["kernel"], "max_events_per_run": 10 ** 6})
        params.patterns = base.patterns
        results["syslog file"] = collect_all(LogTailCollector("kernel", params, Context("bench", tmp)), n)
        with journald.Journald(root / "jd") as jd:
            t0 = time.monotonic()
            for i in range(n):
                jd.kernel(message(i))
            jd.sync()
            written = time.monotonic() - t0
            for reader in ("native", "journalctl"):
                p = from_dict(type(base), {"source": "journal", "journal_dir": str(jd.directory),
                                           "journal_reader": reader, "start_at": "start",
                                           "max_events_per_run": 10 ** 6})
                p.patterns = base.patterns
                results[f"journal ({reader})"] = collect_all(LogTailCollector("kernel", p, Context("bench", tmp)), n)
    print(f"{n} kernel lines ({n // 50} Xid), shipped kernel patterns; journald took {written:.1f} s to store them")
    file_rate = n / max(results["syslog file"][1], 1e-9)
    print(f"{'source':22} {'events':>7} {'CPU s':>7} {'lines/CPU s':>12} {'vs file':>8}")
    for name, (events, cpu, child) in results.items():
        total = cpu + child
        rate = n / max(total, 1e-9)
        print(f"{name:22} {events:7d} {total:7.2f} {rate:12,.0f} {rate / file_rate:7.2f}x"
              + (f"  (journalctl itself {child:.2f} s)" if child > 0.01 else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
