"""Kernel-log fault signatures and the remembered read position ("mark") per node.

Only lines after the mark are judged, so an old line does not fail every future job. The mark advances over
clean lines only: once a fatal line is seen the mark stays in front of it and every later run fails again,
until an admin acknowledges it after repair (`sigma health log-ack`), the log is rotated or truncated
(inode change or size below the mark), or — for the kernel ring buffer — the node reboots (new boot id).
"""

from __future__ import annotations

import errno
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


def classify(line: str, fatal_xids=DEFAULT_FATAL_XIDS, *, writer_required: bool = False) -> Finding | None:
    """The fault a kernel-log line shows, in any envelope (syslog, dmesg, journal JSON; logformats); a line that
    names another program than the kernel (a user's `logger` text) is none. writer_required (a file's lines): a line
    whose writer is not established as the kernel is none too, fail closed (logformats.unattributed)."""
    finding = _classify(line, fatal_xids)
    if finding is None:
        return None  # most lines: no envelope parsing needed
    from sigma.telemetry.logformats import parse, unattributed

    parsed = parse(line)
    if (parsed.ident and parsed.ident != "kernel") or (parsed.transport and parsed.transport != "kernel"):
        return None
    if writer_required and unattributed(parsed, ["kernel"]):
        return None
    return _classify(parsed.message, fatal_xids)


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
    boot_id: str = ""  # kmsg source: marks from an earlier boot are void
    seq: int = -1  # kmsg source: last clean record sequence number


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


def scan_file(path: Path, mark: Mark | None, fatal_xids=DEFAULT_FATAL_XIDS, max_bytes: int = 8 << 20) -> Scan:
    """Judge the bytes after the mark. Opening blocks on a hung filesystem or FIFO: the runner times it out."""
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
        finding = classify(raw.decode(errors="replace"), fatal_xids, writer_required=True)
        if finding is not None:
            scan.findings.append(finding)
        if not any(f.fatal for f in scan.findings):
            clean_to = pos
    scan.mark = Mark(str(path), st.st_ino, clean_to)
    scan.end = Mark(str(path), st.st_ino, pos)
    return scan


def scan_kmsg(path: Path, mark: Mark | None, boot_id: str, fatal_xids=DEFAULT_FATAL_XIDS) -> Scan:
    """/dev/kmsg records "prio,seq,usec,flags;message" read without blocking; marks by sequence number."""
    scan = Scan()
    last_clean = -1
    if mark is not None and mark.boot_id != boot_id:
        scan.reset = "node rebooted"
        mark = None
    after = mark.seq if mark is not None else -1
    last_clean = last_seq = after
    fatal_seen = False
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        buf = b""
        while True:
            try:
                chunk = os.read(fd, 8192)
            except OSError as exc:
                if exc.errno == errno.EAGAIN:
                    break
                if exc.errno == errno.EPIPE:  # records overwritten since the last read: go on
                    continue
                raise
            if not chunk:
                break
            buf += chunk
    finally:
        os.close(fd)
    for record in buf.decode(errors="replace").splitlines():
        head, sep, message = record.partition(";")
        fields_ = head.split(",")
        if not sep or len(fields_) < 2 or not fields_[1].isdigit():
            continue  # continuation lines (" KEY=value") and junk
        seq = int(fields_[1])
        if seq <= after:
            continue
        scan.lines += 1
        from_kernel = not fields_[0].isdigit() or int(fields_[0]) >> 3 == 0  # facility 0: not text user space wrote
        finding = classify(message, fatal_xids) if from_kernel else None
        if finding is not None:
            scan.findings.append(finding)
            fatal_seen = fatal_seen or finding.fatal
        if not fatal_seen:
            last_clean = seq
        last_seq = max(last_seq, seq)
    scan.mark = Mark(str(path), boot_id=boot_id, seq=last_clean)
    scan.end = Mark(str(path), boot_id=boot_id, seq=last_seq)
    return scan
