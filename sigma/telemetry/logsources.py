"""Where a node keeps its kernel log, and readers for each place: the systemd journal, /dev/kmsg, syslog files.

A reader hands out SourceLine records: the line as its source holds it, where it came from, and whether the source
itself establishes who wrote it. Two sources do:
- the journal: an entry journald read from the kernel's ring buffer has _TRANSPORT=kernel, a field no client can
  set, and SYSLOG_FACILITY=0;
- /dev/kmsg: a record's facility (its first number // 8) is 0 only for the kernel's own lines; the kernel gives
  what user space writes there (root's `echo >/dev/kmsg`, systemd at boot) another facility.
A line from a file has no such proof (anyone who can write the file writes any envelope): `established` is False
and whether its envelope may be believed is for the line parsers to say.

`choose()` picks a node's kernel log (`source: auto`): the journal when it holds this boot's kernel lines (journald
reads /dev/kmsg there; in a container or with ReadKMsg=no it does not), else /dev/kmsg when it can be opened, else
the first syslog file that is there and readable. When none is, it says why for each, so a node that cannot see its
kernel is reported, never silently blind.

The journal is read natively through libsystemd (the cysystemd wheel, `pip install sigma-slurm[journal]`) where it
imports, else through one long-running `journalctl --follow -o json`; both resume after the persisted cursor, so a
sidecar restart neither loses nor repeats an entry, including the last lines before a reboot.
"""

from __future__ import annotations

import errno
import fcntl
import json
import logging
import os
import stat
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger("sigma.sidecar.logsources")

JOURNAL_DIRS = ("/var/log/journal", "/run/log/journal")  # persistent, then volatile storage
SYSLOG_FILES = ("/var/log/kern.log", "/var/log/messages", "/var/log/syslog")  # Debian/Ubuntu, RHEL, both
MAX_ENTRIES_PER_READ = 10000


@dataclass(slots=True)
class SourceLine:
    text: str  # the line as its source holds it: a file's line, a kmsg record, a journal entry's MESSAGE
    source: str  # where it came from: "journal", "kmsg" or the file's path
    established: bool  # the source itself says the kernel wrote it (see the module's doc)
    writer: str = ""  # who wrote it, as the source records it: "kernel", "facility:3", "transport:syslog"
    ts: float | None = None  # the source's own time for the line, where it keeps one (the journal)
    fields: dict = field(default_factory=dict)  # more of where it came from, for the event (journal unit, boot)
    ident: str = ""  # the program the line names (journal SYSLOG_IDENTIFIER): a claim, not an attribution
    uptime: float | None = None  # seconds after boot it was logged, where the journal keeps it (monotonic time)


def boot_id(host_root: str = "/") -> str:
    """This boot's id as the journal writes it (_BOOT_ID: 32 hex digits, no dashes)."""
    try:
        with open(f"{host_root.rstrip('/')}/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip().replace("-", "")
    except OSError:
        return ""


# ---------- /dev/kmsg ----------

def parse_kmsg(record: str) -> tuple[int, int, str] | None:
    """(priority, sequence number, message) of a 'pri,seq,usec,flags;message' record; None if it is not one."""
    head, sep, rest = record.partition(";")
    if not sep:
        return None
    parts = head.split(",")
    if len(parts) < 3 or not parts[0].isdigit() or not parts[1].isdigit():
        return None
    return int(parts[0]), int(parts[1]), rest.split("\n", 1)[0]


class KmsgReader:
    """Records of the kernel ring buffer ('pri,seq,ts_us,flags;message'), tracked by boot id and sequence number
    (sequence numbers start again at every boot: a number from an earlier boot says nothing). A regular file of
    records (tests, a saved dump) is read whole each time."""

    def __init__(self, path: str, position, from_end: bool, boot: str = ""):
        self.path = path
        self.boot_id = boot
        if isinstance(position, dict):
            saved_boot, seq = position.get("boot", ""), position.get("seq")
        else:
            saved_boot, seq = "", position  # older positions: the number alone
        if seq is not None and saved_boot and boot and saved_boot.replace("-", "") != boot:
            seq = None  # rebooted since: every record of this boot is new
            from_end = False
        self.seq = seq if seq is not None else -1
        self.from_end = seq is None and from_end
        self.fd = None
        self.device = stat.S_ISCHR(os.stat(path).st_mode)

    @property
    def position(self) -> dict:
        return {"boot": self.boot_id, "seq": self.seq}

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None

    def read(self) -> list[SourceLine]:
        raw = self._read_device() if self.device else self._read_file()
        lines = []
        for record in raw:
            parsed = parse_kmsg(record)
            if parsed is None:
                continue
            pri, seq, _ = parsed
            if seq <= self.seq:
                continue
            self.seq = seq
            if not self.from_end:
                facility = pri >> 3
                # the whole record: its uptime stamp is the line's time
                lines.append(SourceLine(record.split("\n", 1)[0], "kmsg", facility == 0,
                                        "kernel" if facility == 0 else f"facility:{facility}"))
        self.from_end = False
        return lines

    def _read_device(self) -> list[str]:
        if self.fd is None:
            self.fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK)
        records = []
        while len(records) < MAX_ENTRIES_PER_READ:
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


# ---------- the journal ----------

def _entry_line(entry: dict, ts: float | None = None) -> SourceLine:
    msg = entry.get("MESSAGE", "")
    if isinstance(msg, list):  # journalctl -o json: a binary message as a list of bytes
        msg = bytes(b & 0xFF for b in msg if isinstance(b, int))
    if isinstance(msg, bytes):
        msg = msg.decode("utf-8", "replace")
    transport = str(entry.get("_TRANSPORT", ""))
    facility = str(entry.get("SYSLOG_FACILITY", ""))
    kernel = transport == "kernel" and facility == "0"
    writer = ("kernel" if kernel else
              f"facility:{facility or 'none'}" if transport == "kernel" else f"transport:{transport or 'none'}")
    for key in ("__REALTIME_TIMESTAMP", "_SOURCE_REALTIME_TIMESTAMP"):
        if ts is not None:
            break
        try:
            ts = int(entry[key]) / 1e6
        except (KeyError, TypeError, ValueError):
            continue
    uptime = None
    for key in ("_SOURCE_MONOTONIC_TIMESTAMP", "__MONOTONIC_TIMESTAMP"):  # the kernel's own stamp first
        try:
            uptime = int(entry[key]) / 1e6
            break
        except (KeyError, TypeError, ValueError):
            continue
    fields = {"boot": entry["_BOOT_ID"]} if entry.get("_BOOT_ID") else {}
    if entry.get("_SYSTEMD_UNIT"):
        fields["unit"] = entry["_SYSTEMD_UNIT"]
    return SourceLine(str(msg), "journal", kernel, writer, ts, fields, str(entry.get("SYSLOG_IDENTIFIER", "")),
                      uptime)


class JournalUnavailable(RuntimeError):
    """The journal cannot be read here; the message says why."""


def native_available() -> str:
    """'' when libsystemd can be used from Python here (the cysystemd wheel), else why not."""
    try:
        import cysystemd.reader  # noqa: F401
    except ImportError as exc:
        return f"no libsystemd binding ({exc}; pip install sigma-slurm[journal])"
    return ""


class NativeJournal:
    """The journal through libsystemd (sd_journal), matching _TRANSPORT on each transport read."""

    name = "libsystemd"

    def __init__(self, directory: str, transports: tuple[str, ...], cursor: str | None, from_end: bool):
        self.directory = directory
        self.transports = transports
        self.reader = self._open()
        _ = self.reader.fd  # sets up inotify: journal files added later (rotation, a new boot) are found
        self.cursor = cursor
        if cursor:
            self.reader.seek_cursor(cursor.encode())
            first = self.reader.next()
            if first is not None and _cursor(first) != cursor:  # the cursor's entry is gone (vacuumed): from here
                self.reader.previous()
        elif from_end:
            self.reader.seek_tail()
            self.reader.skip_previous(1)  # (cysystemd's previous() right after seek_tail() returns the last but one)
            last = self.reader.next()
            if last is not None:
                self.cursor = _cursor(last)
        else:
            self.reader.seek_head()

    def _open(self, boot: str = ""):
        from cysystemd.reader import JournalOpenMode, JournalReader, Rule

        reader = JournalReader()
        if self.directory:
            reader.open_directory(self.directory)
        else:
            reader.open(JournalOpenMode.SYSTEM)  # system services and the kernel, not users' journals
        rule = None
        for t in self.transports:
            rule = Rule("_TRANSPORT", t) if rule is None else rule | Rule("_TRANSPORT", t)
        if boot:
            rule = Rule("_BOOT_ID", boot) if rule is None else rule & Rule("_BOOT_ID", boot)
        if rule is not None:
            reader.add_filter(rule)
        return reader

    def has_boot(self, boot: str) -> bool:
        """Whether the journal holds an entry of this boot (journald reads the kernel's ring buffer here)."""
        reader = self._open(boot)
        reader.seek_head()
        return reader.next() is not None

    def after(self, boot: str, cursor: str, limit: int) -> list[tuple[str, SourceLine]]:
        """Up to `limit` (cursor, line) of this boot after `cursor`, once (journal_since)."""
        reader = self._open(boot)
        reader.seek_cursor(cursor.encode())
        first = reader.next()
        if first is not None and _cursor(first) != cursor:  # the cursor's entry is gone (vacuumed): from here
            reader.previous()
        return self._take(reader, limit)

    def newest(self, boot: str, limit: int) -> list[tuple[str, SourceLine]]:
        reader = self._open(boot)
        reader.seek_tail()  # (cysystemd: at the last entry; next() after skip_previous(n) gives the newest n)
        if reader.skip_previous(limit) < limit:
            reader.seek_head()  # no more than `limit` entries (the first one is not skipped over)
        return self._take(reader, limit)

    @staticmethod
    def _take(reader, limit: int) -> list[tuple[str, SourceLine]]:
        out = []
        while len(out) < limit:
            entry = reader.next()
            if entry is None:
                break
            out.append((_cursor(entry), _entry_line(entry.data, entry.get_realtime_usec() / 1e6)))
        return out

    def read(self) -> list[SourceLine]:
        self.reader.process_events()
        lines = []
        while len(lines) < MAX_ENTRIES_PER_READ:
            entry = self.reader.next()
            if entry is None:
                break
            self.cursor = _cursor(entry)
            lines.append(_entry_line(entry.data, entry.get_realtime_usec() / 1e6))
        return lines

    def close(self) -> None:
        self.reader = None


def _cursor(entry) -> str:
    c = entry.cursor
    return c.decode() if isinstance(c, bytes) else str(c)


class JournalctlJournal:
    """The journal through one `journalctl --follow -o json` (where libsystemd cannot be loaded), restarted after
    the last cursor read if it exits."""

    name = "journalctl"

    def __init__(self, directory: str, transports: tuple[str, ...], cursor: str | None, from_end: bool):
        self.directory = directory
        self.transports = transports
        self.cursor = cursor
        self.proc: subprocess.Popen | None = None
        self.buffer = b""
        self.restarts = 0
        if cursor is None and from_end:  # only to learn the current cursor, so that a restart resumes there
            for entry in self._run(["-n", "1"]):
                self.cursor = entry.get("__CURSOR", self.cursor)
        self.from_start = self.cursor is None and not from_end

    def _argv(self, extra: list[str]) -> list[str]:
        argv = ["journalctl", "-o", "json", "--no-pager", *(["-D", self.directory] if self.directory else [])]
        return argv + extra + [f"_TRANSPORT={t}" for t in self.transports]

    def _run(self, extra: list[str]) -> list[dict]:
        try:
            proc = subprocess.run(self._argv(extra), capture_output=True, text=True, timeout=10)
        except FileNotFoundError:
            raise JournalUnavailable("journalctl not found") from None
        except subprocess.TimeoutExpired:
            raise JournalUnavailable("journalctl took more than 10 s") from None
        if proc.returncode != 0 and not proc.stdout:
            raise JournalUnavailable(f"journalctl failed: {proc.stderr.strip()[:300]}")
        out = []
        for line in proc.stdout.splitlines():
            try:
                entry = json.loads(line)
            except ValueError:
                continue
            if isinstance(entry, dict):
                out.append(entry)
        return out

    def has_boot(self, boot: str) -> bool:
        return bool(self._run(["-n", "1", f"_BOOT_ID={boot}"]))

    def after(self, boot: str, cursor: str, limit: int) -> list[tuple[str, SourceLine]]:
        """Up to `limit` (cursor, line) of this boot after `cursor`, once (journal_since)."""
        return self._lines(self._run([f"--after-cursor={cursor}", "-n", str(limit), *_boot_match(boot)]))

    def newest(self, boot: str, limit: int) -> list[tuple[str, SourceLine]]:
        return self._lines(self._run(["-n", str(limit), *_boot_match(boot)]))

    @staticmethod
    def _lines(entries: list[dict]) -> list[tuple[str, SourceLine]]:
        return [(str(e.get("__CURSOR", "")), _entry_line(e)) for e in entries]

    def _start(self) -> None:
        where = [f"--after-cursor={self.cursor}"] if self.cursor else (["--lines=all"] if self.from_start
                                                                      else ["--lines=0"])
        try:
            self.proc = subprocess.Popen(self._argv(["--follow", *where]), stdout=subprocess.PIPE,
                                         stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL)
        except FileNotFoundError:
            raise JournalUnavailable("journalctl not found") from None
        fd = self.proc.stdout.fileno()
        fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) | os.O_NONBLOCK)
        self.buffer = b""

    def read(self) -> list[SourceLine]:
        if self.proc is None:
            self._start()
        lines = []
        exited = False
        while len(lines) < MAX_ENTRIES_PER_READ:
            try:
                chunk = os.read(self.proc.stdout.fileno(), 1 << 16)
            except BlockingIOError:
                break
            if not chunk:
                exited = True
                break
            self.buffer += chunk
            *complete, self.buffer = self.buffer.split(b"\n")
            for raw in complete:
                try:
                    entry = json.loads(raw)
                except ValueError:
                    continue
                if isinstance(entry, dict):
                    self.cursor = entry.get("__CURSOR", self.cursor)
                    lines.append(_entry_line(entry))
        if lines:
            self.restarts = 0
        if exited or self.proc.poll() is not None:  # restarted after the last cursor read: nothing lost
            code = self.proc.wait()
            self.close()
            self.restarts += 1
            if self.restarts > 3:
                raise JournalUnavailable(f"journalctl --follow exits at once (exit status {code})")
        return lines

    def close(self) -> None:
        if self.proc is not None:
            if self.proc.poll() is None:
                self.proc.terminate()
                try:
                    self.proc.wait(5)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
                    self.proc.wait()
            self.proc.stdout.close()
            self.proc = None


def _boot_match(boot: str) -> list[str]:
    return [f"_BOOT_ID={boot}"] if boot else []


def open_journal(reader: str, directory: str, transports: tuple[str, ...], cursor: str | None, from_end: bool):
    """A journal reader: reader 'native' (libsystemd), 'journalctl', or 'auto' (native where it loads)."""
    if reader == "native" or (reader == "auto" and not native_available()):
        why = native_available()
        if why:
            raise JournalUnavailable(why)
        try:
            return NativeJournal(directory, transports, cursor, from_end)
        except OSError as exc:
            raise JournalUnavailable(f"libsystemd cannot open the journal: {exc}") from None
    return JournalctlJournal(directory, transports, cursor, from_end)


def journal_since(reader: str, directory: str, boot: str, cursor: str | None,
                  limit: int) -> list[tuple[str, SourceLine]]:
    """(cursor, line) of this boot's kernel-transport entries after `cursor`, read once, not followed (the
    prolog's kernel_log check): at most `limit`, the newest when there are more (a flood since the last read never
    hides the newest line, as a file is read from its tail); no cursor: the boot's newest `limit`."""
    journal = open_journal(reader, directory, ("kernel",), None, False)
    try:
        got = journal.after(boot, cursor, limit + 1) if cursor else []
        return got if cursor and len(got) <= limit else journal.newest(boot, limit)
    finally:
        journal.close()


def journal_unreadable(directory: str, host_root: str = "/") -> str:
    """Why this host's journal files cannot be read (none there, or not ours to read), or ''."""
    dirs = [directory] if directory else [f"{host_root.rstrip('/')}{d}" for d in JOURNAL_DIRS]
    files, denied = [], []
    for d in dirs:
        for path in list(Path(d).glob("*.journal")) + list(Path(d).glob("*/*.journal")):
            (files if os.access(path, os.R_OK) else denied).append(path)
    if files:
        return ""
    if denied:
        return (f"permission denied on {denied[0]} (run the sidecar as root, or add its user to the "
                f"systemd-journal group)")
    return f"no journal files under {' or '.join(dirs)} (journald not running or Storage=none)"


# ---------- choosing ----------

@dataclass
class Choice:
    kind: str  # journal, kmsg, file, or "" when nothing can be read
    path: str = ""  # the file (kind file) or the device (kmsg) or journal directory ("" = the system journal)
    journal: object = None  # the opened journal reader (kind journal)
    reasons: dict[str, str] = field(default_factory=dict)  # candidate -> why it was not taken

    def describe(self) -> str:
        if self.kind == "journal":
            where = f" in {self.path}" if self.path else ""
            transports = ", ".join(self.journal.transports)
            return f"the systemd journal{where} ({transports} transport, read through {self.journal.name})"
        if self.kind == "kmsg":
            return f"the kernel ring buffer {self.path}"
        if self.kind == "file":
            return f"the syslog file {self.path}"
        return "none"

    def why_none(self) -> str:
        return "; ".join(f"{name}: {why}" for name, why in self.reasons.items())


def kmsg_unreadable(path: str) -> str:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except FileNotFoundError:
        return "not there"
    except PermissionError:
        return "permission denied (kernel.dmesg_restrict needs CAP_SYSLOG; run the sidecar as root)"
    except OSError as exc:
        return exc.strerror or str(exc)
    try:
        os.read(fd, 8192)
    except BlockingIOError:
        pass  # nothing new: readable
    except OSError as exc:
        if exc.errno not in (errno.EPIPE, errno.EINVAL):  # EINVAL: a record larger than the buffer, still readable
            return exc.strerror or str(exc)
    finally:
        os.close(fd)
    return ""


def file_unreadable(path: str) -> str:
    if not os.path.exists(path):
        return "not there"
    if not os.access(path, os.R_OK):
        return "permission denied"
    return ""


def choose(order: list[str], *, files: list[str], kmsg_path: str, journal_dir: str, journal_reader: str,
           transports: tuple[str, ...], cursor: str | None, from_end: bool, host_root: str = "/",
           untrusted=lambda path: "") -> Choice:
    """The first of `order` (journal, kmsg, files) this node can read its kernel log from; a Choice of kind ""
    with a reason per candidate when there is none."""
    reasons: dict[str, str] = {}
    boot = boot_id(host_root)
    for candidate in order:
        if candidate == "journal":
            why = journal_unreadable(journal_dir, host_root)
            journal = None
            if not why:
                try:
                    journal = open_journal(journal_reader, journal_dir, transports, cursor, from_end)
                    if boot and not journal.has_boot(boot):
                        why = ("it holds no kernel line of this boot (journald does not read /dev/kmsg here: "
                               "ReadKMsg=no, or a container)" if "kernel" in transports else
                               f"it holds no entry of this boot of transport {', '.join(transports)}")
                except JournalUnavailable as exc:
                    why = str(exc)
            if not why:
                return Choice("journal", journal_dir, journal, reasons)
            if journal is not None:
                journal.close()
            reasons["journal"] = why
        elif candidate == "kmsg":
            why = kmsg_unreadable(kmsg_path)
            if not why:
                return Choice("kmsg", kmsg_path, reasons=reasons)
            reasons[kmsg_path] = why
        elif candidate == "files":
            for path in files:
                why = file_unreadable(path) or untrusted(path)
                if not why:
                    return Choice("file", path, reasons=reasons)
                reasons[path] = why
        else:
            raise ValueError(f"unknown kernel log source {candidate!r}; sources: journal, kmsg, files")
    return Choice("", reasons=reasons)


def choose_now(params, host_root: str = "/") -> Choice:
    """What a logtail collector with these params would read now (`sigma sidecar --check`, `sigma site check`),
    without keeping it open."""
    found = choose(params.order, files=params.files, kmsg_path=params.kmsg_path, journal_dir=params.journal_dir,
                   journal_reader=params.journal_reader, transports=tuple(params.journal_transports), cursor=None,
                   from_end=True, host_root=host_root)
    if found.journal is not None:
        found.journal.close()
    return found
