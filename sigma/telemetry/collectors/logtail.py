"""Log lines -> structured events: files (rotation-safe tails), the kernel ring buffer (/dev/kmsg), the journal.

Each pattern is a regex; a matching line becomes an `events` row (source 'log', kind = pattern name) whose fields
are the regex's named groups (digits become integers, so `Xid.*?: (?P<xid>\\d+)` gives {"xid": 79}). Positions
(file inode+offset, kmsg sequence number, journal cursor) persist with the events, so restarts neither lose nor
repeat lines. A kernel line's event time is when the kernel printed it (its `[seconds since boot]` stamp), not when
the sidecar read it, so detection latencies count the tail interval too.
"""

from __future__ import annotations

import errno
import glob
import json
import os
import re
import stat
import subprocess
import time
from dataclasses import dataclass, field

from sigma.telemetry.base import Collector, CollectorParams, Output, register
from sigma.telemetry.tail import FileTailer

MESSAGE_MAX = 2000
KERNEL_STAMP = re.compile(r"kernel: \[\s*(\d+\.\d+)\]")  # printk time: seconds on the monotonic clock since boot
STAMP_TRUSTED_S = 300.0  # a stamp further back than this is from an earlier boot (or a replayed file): not used


def kernel_line_time(line: str, now: float) -> float | None:
    """Wall time a kernel-log line was printed, from its printk stamp; None without a stamp from this boot."""
    m = KERNEL_STAMP.search(line)
    if m is None:
        return None
    ts = time.time() - time.monotonic() + float(m.group(1))
    return ts if now - STAMP_TRUSTED_S <= ts <= now + 1.0 else None


@dataclass
class Pattern:
    name: str  # event kind, e.g. xid
    regex: str  # Python regex searched in each line; named groups become event fields
    severity: str = "warning"  # event severity: info, warning, error, critical
    fields: dict[str, str] = field(default_factory=dict)  # constant fields added to every match

    def __post_init__(self):
        if not self.name:
            raise ValueError("pattern name must not be empty")
        try:
            self.compiled = re.compile(self.regex)
        except re.error as exc:
            raise ValueError(f"bad regex {self.regex!r}: {exc}") from None


@register("logtail")
class LogTailCollector(Collector):
    @dataclass
    class Params(CollectorParams):
        files: list[str] = field(default_factory=list)  # paths or globs to follow (placeholders allowed)
        kmsg: bool = False  # read the kernel ring buffer
        kmsg_path: str = "/dev/kmsg"  # ring buffer device (a file of kmsg records in tests)
        journal: bool = False  # read the systemd journal through journalctl
        journal_args: list[str] = field(default_factory=list)  # extra journalctl arguments, e.g. ["-k"]
        start_at: str = "end"  # where to start a file or stream seen for the first time: end or start
        patterns: list[Pattern] = field(default_factory=list)  # line patterns that become events
        max_events_per_run: int = 1000  # more matches in one run are counted, not stored one by one

        def __post_init__(self):
            super().__post_init__()
            if self.start_at not in ("end", "start"):
                raise ValueError(f"start_at must be 'end' or 'start', not {self.start_at!r}")
            if not (self.files or self.kmsg or self.journal):
                raise ValueError("logtail needs at least one source: files, kmsg or journal")

    def __init__(self, section, params, ctx):
        super().__init__(section, params, ctx)
        self.tailers: dict[str, FileTailer] = {}
        self.kmsg = KmsgReader(params.kmsg_path, ctx.positions.get(self._key("kmsg")),
                               params.start_at == "end") if params.kmsg else None
        self.journal_cursor = ctx.positions.get(self._key("journal"))
        self.first_run = True

    def _key(self, what: str) -> str:
        return f"logtail:{self.section}:{what}"

    def close(self) -> None:
        for t in self.tailers.values():
            t.close()
        if self.kmsg:
            self.kmsg.close()

    def collect(self, out: Output) -> None:
        budget = [self.params.max_events_per_run, 0]  # remaining, suppressed
        for path in self._paths():
            tailer = self.tailers.get(path)
            if tailer is None:
                key = self._key(f"file:{path}")
                saved = self.ctx.positions.get(key)
                tailer = self.tailers[path] = FileTailer(path, saved,
                                                         from_end=self.first_run and self.params.start_at == "end")
            lines = tailer.read_lines()
            for line in lines:
                self._match(out, line.decode("utf-8", "replace"), {"file": path}, budget)
            out.position(self._key(f"file:{path}"), tailer.position)
            out.sample("log.lines", len(lines), {"source": path})
        if self.kmsg:
            records = self.kmsg.read()
            for text in records:
                self._match(out, text, {"stream": "kmsg"}, budget)
            out.position(self._key("kmsg"), self.kmsg.seq)
            out.sample("log.lines", len(records), {"source": "kmsg"})
        if self.params.journal:
            self._journal(out, budget)
        if budget[1]:
            out.event("sidecar", "log_flood", f"{budget[1]} more matching lines in one run than "
                      f"max_events_per_run={self.params.max_events_per_run}; counted, not stored",
                      "warning", {"collector": self.section, "suppressed": budget[1]})
        self.first_run = False

    def _paths(self) -> list[str]:
        paths = []
        for pattern in self.params.files:
            if glob.has_magic(pattern):
                paths += sorted(glob.glob(pattern))
            else:
                paths.append(pattern)
        # a file that appears after the first run is new: read it from its beginning
        return paths

    def _match(self, out: Output, line: str, where: dict, budget: list) -> None:
        for p in self.params.patterns:
            m = p.compiled.search(line)
            if m is None:
                continue
            if budget[0] <= 0:
                budget[1] += 1
                return
            budget[0] -= 1
            fields = {**where, **p.fields}
            for k, v in m.groupdict().items():
                if v is not None:
                    fields[k] = int(v) if v.isdigit() else v
            out.event("log", p.name, line[:MESSAGE_MAX], p.severity, fields, ts=kernel_line_time(line, out.ts))
            return  # first matching pattern wins: one line is one event

    def _journal(self, out: Output, budget: list) -> None:
        argv = ["journalctl", "-o", "json", "--no-pager", *self.params.journal_args]
        if self.journal_cursor:
            argv += [f"--after-cursor={self.journal_cursor}", "-n", "10000"]
        elif self.params.start_at == "end":
            argv += ["-n", "1"]  # only to learn the current cursor
        else:
            argv += ["-n", "10000"]
        try:
            proc = subprocess.run(argv, capture_output=True, text=True, timeout=10)
        except FileNotFoundError:
            raise RuntimeError("journal: journalctl not found (set journal: false)") from None
        except subprocess.TimeoutExpired:
            raise RuntimeError("journal: journalctl took more than 10 s") from None
        skip = self.journal_cursor is None and self.params.start_at == "end"
        n = 0
        for line in proc.stdout.splitlines():
            try:
                entry = json.loads(line)
            except ValueError:
                continue
            self.journal_cursor = entry.get("__CURSOR", self.journal_cursor)
            if skip:
                continue
            n += 1
            msg = entry.get("MESSAGE")
            if isinstance(msg, list):  # binary messages come as byte arrays
                msg = bytes(msg).decode("utf-8", "replace")
            self._match(out, str(msg), {"stream": "journal", "unit": entry.get("_SYSTEMD_UNIT", "")}, budget)
        if self.journal_cursor:
            out.position(self._key("journal"), self.journal_cursor)
        out.sample("log.lines", n, {"source": "journal"})


class KmsgReader:
    """Records of the kernel ring buffer ('pri,seq,ts_us,flags;message'), tracked by sequence number."""

    def __init__(self, path: str, seq: int | None, from_end: bool):
        self.path = path
        self.seq = seq if seq is not None else -1
        self.from_end = seq is None and from_end
        self.fd = None
        self.device = stat.S_ISCHR(os.stat(path).st_mode)

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None

    def read(self) -> list[str]:
        raw = self._read_device() if self.device else self._read_file()
        messages = []
        for record in raw:
            parsed = parse_kmsg(record)
            if parsed is None:
                continue
            seq, text = parsed
            if seq <= self.seq:
                continue
            self.seq = seq
            if not self.from_end:
                messages.append(text)
        self.from_end = False
        return messages

    def _read_device(self) -> list[str]:
        if self.fd is None:
            self.fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK)
        records = []
        while len(records) < 10000:
            try:
                data = os.read(self.fd, 16384)
            except BlockingIOError:
                break
            except OSError as exc:
                if exc.errno == errno.EPIPE:  # overwritten before we read it; the next read continues
                    continue
                raise
            if not data:
                break
            records.append(data.decode("utf-8", "replace"))
        return records

    def _read_file(self) -> list[str]:
        with open(self.path, encoding="utf-8", errors="replace") as f:
            return [line for line in f if line and not line.startswith(" ")]


def parse_kmsg(record: str) -> tuple[int, str] | None:
    head, sep, rest = record.partition(";")
    if not sep:
        return None
    parts = head.split(",")
    if len(parts) < 3 or not parts[1].isdigit():
        return None
    return int(parts[1]), rest.split("\n", 1)[0]
