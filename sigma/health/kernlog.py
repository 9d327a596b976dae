"""Kernel-log fault signatures and the remembered read position ("mark") per node.

Only lines after the mark are judged, so an old line does not fail every future job. The mark advances over
clean lines only: once a fatal line is seen the mark stays in front of it and every later run fails again,
until an admin acknowledges it after repair (`sigma health log-ack`), the log is rotated or truncated
(inode change or size below the mark), or — for the kernel ring buffer and the journal — the node reboots (new boot
id). The ring buffer and the journal say themselves which lines the kernel wrote (facility 0, kernel transport,
logsources); only those are judged.

A link that went down in the first minutes after boot (LINK_BOOT_WINDOW_S, as the rules' link-down-at-boot) is noted,
not fatal: ports still training and ports no cable was plugged into say so after every reboot; a port expected up
that is not is the `infiniband` check's to fail.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path

XID = re.compile(r"NVRM: Xid \((?:PCI:)?([^)]*)\):\s*(\d+)")
# xid -> (category, description); anything not here is recorded but never fatal.
XID_BUCKETS = {
    48: ("gpu-memory", "double-bit ECC error"),
    63: ("gpu-memory", "row remapping event"),
    64: ("gpu-memory", "row remapping failure"),
    74: ("nvlink", "NVLink error"),
    79: ("gpu", "GPU has fallen off the bus"),
    92: ("gpu-memory", "high single-bit ECC error rate"),
    94: ("gpu-memory", "contained ECC error"),
    95: ("gpu-memory", "uncontained ECC error"),
    119: ("gpu", "GSP RPC timeout"),
    120: ("gpu", "GSP error"),
}
DEFAULT_FATAL_XIDS = (48, 64, 74, 79, 95, 119, 120)
LINK_BOOT_WINDOW_S = 300.0
LINK_KINDS = ("ib-link-down", "link-down")

# (kind, category, description, pattern) for non-Xid signatures; all fatal.
SIGNATURES = (
    ("ecc", "host-memory", "uncorrectable memory error",
     re.compile(r"EDAC MC\d+: \d+ UE|[Uu]ncorrect(?:ed|able) (?:ECC |memory )?error|Hardware Error\].*[Uu]ncorrected")),
    ("hung-task", "kernel", "hung task", re.compile(r"INFO: task \S+ blocked for more than \d+ seconds")),
    ("soft-lockup", "kernel", "soft lockup", re.compile(r"watchdog: BUG: soft lockup")),
    ("ib-link-down", "infiniband", "InfiniBand link down",
     re.compile(r"\b(?:ib\d+|mlx\d+_\d+)\b.*(?:[Ll]ink (?:is )?[Dd]own|[Ll]ost carrier)|mlx\d+_core.*[Ll]ink down")),
    ("link-down", "network", "network link down", re.compile(r"NIC Link is Down|\b\w+: [Ll]ost carrier")),
)


@dataclass
class Finding:
    kind: str  # xid, ecc, hung-task, ib-link-down, ...
    category: str
    description: str
    line: str
    fatal: bool
    xid: int | None = None
    pci: str | None = None

    @property
    def label(self) -> str:
        return f"xid-{self.xid}" if self.xid is not None else self.kind


def classify(line: str, fatal_xids=DEFAULT_FATAL_XIDS, *, writer_required: bool = False, booted: float | None = None,
             uptime: float | None = None, link_boot_window_s: float = LINK_BOOT_WINDOW_S) -> Finding | None:
    """The fault a kernel-log line shows, in any envelope (syslog, dmesg, journal JSON; logformats); a line that
    names another program than the kernel (a user's `logger` text) is none. writer_required (a file's lines): a line
    whose writer is not established as the kernel is none too, fail closed (logformats.unattributed).

    uptime: seconds after boot the line was logged, where the reader knows it (a kmsg record); else the line's own
    stamp, or its time after `booted`. A link down inside link_boot_window_s of boot is noted, not fatal."""
    finding = _classify(line, fatal_xids)
    if finding is None:
        return None  # most lines: no envelope parsing needed
    from sigma.telemetry.logformats import parse, unattributed

    parsed = parse(line, booted=booted)
    if ((parsed.ident and parsed.ident != "kernel") or (parsed.transport and parsed.transport != "kernel")
            or (parsed.facility and parsed.facility not in ("kern", "kernel"))):
        return None  # the envelope names another writer: a program, a journal transport, a syslog facility
    if writer_required and unattributed(parsed, ["kernel"]):
        return None
    if uptime is None:
        uptime = parsed.uptime
    if uptime is None and parsed.ts is not None and booted is not None and parsed.ts >= booted:
        uptime = parsed.ts - booted
    return _boot_grace(_classify(parsed.message, fatal_xids), uptime, link_boot_window_s)


def _boot_grace(finding: Finding | None, uptime: float | None, window_s: float) -> Finding | None:
    """A link down logged `uptime` seconds after boot, inside window_s, is noted, not fatal."""
    if finding is not None and finding.kind in LINK_KINDS and uptime is not None and uptime < window_s:
        finding.fatal = False
        finding.description += f" {uptime:.0f} s after boot"
    return finding


def _classify(line: str, fatal_xids) -> Finding | None:
    m = XID.search(line)
    if m:
        xid = int(m.group(2))
        category, desc = XID_BUCKETS.get(xid, ("gpu", "Xid error"))
        return Finding("xid", category, desc, line.strip(), xid in fatal_xids, xid, m.group(1))
    for kind, category, desc, pattern in SIGNATURES:
        if pattern.search(line):
            return Finding(kind, category, desc, line.strip(), True)
    return None


@dataclass
class Mark:
    source: str
    inode: int = 0  # file sources: identity of the file the offset belongs to
    offset: int = 0  # bytes judged clean so far
    boot_id: str = ""  # kmsg and journal sources: marks from an earlier boot are void
    seq: int = -1  # kmsg source: last clean record sequence number
    cursor: str = ""  # journal source: the last clean entry's cursor


@dataclass
class Scan:
    findings: list[Finding] = field(default_factory=list)
    lines: int = 0
    mark: Mark | None = None
    reset: str = ""  # why the mark was reset (rotation, truncation, reboot)
    end: Mark | None = None  # the mark after everything read: what an acknowledgement stores


def mark_path(state_dir: Path) -> Path:
    return state_dir / "kernel_log.mark.json"


def load_mark(state_dir: Path, source: str) -> Mark | None:
    try:
        mark = Mark(**json.loads(mark_path(state_dir).read_text()))
    except (OSError, ValueError, TypeError):
        return None
    return mark if mark.source == source else None


def save_mark(state_dir: Path, mark: Mark) -> None:
    state_dir.mkdir(parents=True, exist_ok=True)
    path = mark_path(state_dir)
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    tmp.write_text(json.dumps(asdict(mark)) + "\n")
    os.replace(tmp, path)


def scan_file(path: Path, mark: Mark | None, fatal_xids=DEFAULT_FATAL_XIDS, max_bytes: int = 8 << 20,
              booted: float | None = None, link_boot_window_s: float = LINK_BOOT_WINDOW_S) -> Scan:
    """Judge the bytes after the mark. Opening blocks on a hung filesystem or FIFO: the runner times it out.
    booted: the node's boot time, to tell a link down at boot from a later one."""
    scan = Scan()
    with open(path, "rb") as f:
        st = os.fstat(f.fileno())
        start = 0
        if mark is not None:
            if mark.inode != st.st_ino:
                scan.reset = "log file replaced (rotated)"
            elif st.st_size < mark.offset:
                scan.reset = "log file truncated"
            else:
                start = mark.offset
        start = max(start, st.st_size - max_bytes)
        f.seek(start)
        data = f.read(max_bytes)
    clean_to = start
    pos = start
    for raw in data.splitlines(keepends=True):
        if not raw.endswith(b"\n"):
            break  # a line being written: judge it next time
        pos += len(raw)
        scan.lines += 1
        finding = classify(raw.decode(errors="replace"), fatal_xids, writer_required=True, booted=booted,
                           link_boot_window_s=link_boot_window_s)
        if finding is not None:
            scan.findings.append(finding)
        if not any(f.fatal for f in scan.findings):
            clean_to = pos
    scan.mark = Mark(str(path), st.st_ino, clean_to)
    scan.end = Mark(str(path), st.st_ino, pos)
    return scan


def scan_kmsg(path: Path, mark: Mark | None, boot_id: str, fatal_xids=DEFAULT_FATAL_XIDS,
              link_boot_window_s: float = LINK_BOOT_WINDOW_S) -> Scan:
    """/dev/kmsg records read without blocking (logsources.KmsgReader), marked by sequence number."""
    from sigma.telemetry.logsources import KmsgReader, parse_kmsg

    scan = Scan()
    mark = _this_boot(scan, mark, boot_id)
    reader = KmsgReader(str(path), mark.seq if mark is not None else None, from_end=False)
    try:
        lines = reader.read()
    finally:
        reader.close()
    after = mark.seq if mark is not None else -1
    clean, last = _judge(scan, [(parse_kmsg(line.text)[1], line) for line in lines], fatal_xids, after,
                         link_boot_window_s=link_boot_window_s)
    scan.mark = Mark(str(path), boot_id=boot_id, seq=clean)
    scan.end = Mark(str(path), boot_id=boot_id, seq=last)
    return scan


def scan_journal(source: str, entries: list, mark: Mark | None, boot_id: str, fatal_xids=DEFAULT_FATAL_XIDS,
                 booted: float | None = None, link_boot_window_s: float = LINK_BOOT_WINDOW_S) -> Scan:
    """The journal's (cursor, SourceLine) entries after the mark (logsources.journal_since), marked by cursor.
    booted: the node's boot time, for an entry without its monotonic time."""
    scan = Scan()
    mark = _this_boot(scan, mark, boot_id)
    clean, last = _judge(scan, entries, fatal_xids, mark.cursor if mark is not None else "", booted=booted,
                         link_boot_window_s=link_boot_window_s)
    scan.mark = Mark(source, boot_id=boot_id, cursor=clean)
    scan.end = Mark(source, boot_id=boot_id, cursor=last)
    return scan


def _this_boot(scan: Scan, mark: Mark | None, boot_id: str) -> Mark | None:
    if mark is not None and mark.boot_id != boot_id:
        scan.reset = "node rebooted"
        return None
    return mark


def _judge(scan: Scan, entries: list, fatal_xids, position, *, booted: float | None = None,
           link_boot_window_s: float = LINK_BOOT_WINDOW_S):
    """(position, SourceLine) in order: only lines their source establishes as the kernel's are judged (a record
    root wrote to /dev/kmsg, a journal entry of another facility never fails a node); a link down is timed by the
    record's uptime stamp, the entry's monotonic time, or its time after `booted`. Returns (the position of the
    last line before the first fatal one, the last position)."""
    from sigma.telemetry.logformats import parse

    clean = last = position
    fatal_seen = False
    for pos, line in entries:
        scan.lines += 1
        finding = None
        if line.established:
            parsed = parse(line.text) if line.source == "kmsg" else None
            finding = _classify(parsed.message if parsed else line.text, fatal_xids)
            uptime = parsed.uptime if parsed else line.uptime
            if uptime is None and line.ts is not None and booted is not None and line.ts >= booted:
                uptime = line.ts - booted
            _boot_grace(finding, uptime, link_boot_window_s)
        if finding is not None:
            scan.findings.append(finding)
            fatal_seen = fatal_seen or finding.fatal
        if not fatal_seen:
            clean = pos
        last = pos
    return clean, last
