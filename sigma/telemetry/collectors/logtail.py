"""Log lines -> structured events: files (rotation-safe tails) and a node's kernel log wherever it is (the systemd
journal, /dev/kmsg, a syslog file: sigma.telemetry.logsources).

Each line is first split from its envelope (dmesg, dmesg -T, syslog RFC 3164/5424, journal JSON, kmsg records:
sigma.telemetry.logformats), so patterns see the same message in every format and the event keeps the line's own
time. Each pattern is a regex searched in the message; a matching line becomes an `events` row (source 'log', kind
= pattern name) whose fields are the regex's named groups (digits become integers, so `Xid.*?: (?P<xid>\\d+)`
gives {"xid": 79}); a line also gets `uptime_s`, how long after its boot it was logged (its own dmesg or kmsg
stamp, else its time in the node's current boot), so rules tell a link still coming up at boot from one that fails
later. Positions (file inode+offset+fingerprints, kmsg boot id+sequence number, journal cursor)
persist with the events, so restarts, rotation and rewritten files neither lose nor repeat lines.

`source: auto` finds the kernel log (the journal, else /dev/kmsg, else the first readable of `files`) and says
which (event kernel_log_source); when it finds none it says so loudly (event kernel_log_unavailable, severity
error, naming why for each candidate; sample log.kernel_source_ok = 0 every run) and looks again every recheck_s.

Who may speak: journal entries count only from `journal_transports` (the kernel's own, facility 0, not `logger`
text) and kmsg records only of the kernel's facility; a line naming its program counts only from `idents`; a file
must belong to root (or the sidecar's own user) and be writable by no one else, in a directory others cannot
replace it in: `untrusted_source: refuse` skips such a file, `flag` reads it and marks its events `untrusted`.
Each is logged, reported as a `log_source_untrusted` event and counted in `log.rejected_lines{source,reason}`.

A record dmesg or journalctl prints on several lines (its continuation lines indented, or after a ring-buffer record
as older dmesg printed them) is matched as one line.

Who may speak, beyond that: with `idents` set (the kernel section), a line counts only when its writer is established: an envelope
a parser reads whole that names one of `idents` (and the kern facility where the envelope carries one), a format
only the kernel writes (dmesg, /dev/kmsg), or a journal entry of the kernel's transport (`journal_transports`). A
line whose source cannot be established (no known envelope, another program's name or facility, a journal field
missing) is never acted on as the kernel's: it is counted in `log.unattributed_lines{source,reason}` and, when a
pattern would have matched it, reported as a `log_unattributed` event (source sidecar) with the line and the reason.
A file must belong to root (or the sidecar's own user) and be writable by no one else, in a directory others cannot
replace it in: `untrusted_source: refuse` skips such a file, `flag` reads it and marks its events `untrusted`. Each
is logged, reported as a `log_source_untrusted` event and counted in `log.rejected_lines{source,reason}`.
"""

from __future__ import annotations

import glob
import json
import logging
import os
import re
import stat
from dataclasses import dataclass, field, replace

from sigma.telemetry import logformats, logsources
from sigma.telemetry.base import Collector, CollectorParams, Output, register
from sigma.telemetry.tail import FileTailer

MESSAGE_MAX = 2000
RECORD_MAX = 2048  # the longest record the kernel's ring buffer keeps (PRINTK_MESSAGE_MAX): continuations stop there
UNATTRIBUTED_EVENTS_PER_RUN = 20  # lines a pattern matched but no writer vouches for, reported one by one per run
FUTURE_SLACK_S = 60.0  # a line stamped further ahead than this (a wrong year, a bad clock) gets the read time
REPORT_AGAIN_S = 86400.0  # the kernel log status is said again daily: the controller's events outlive no retention
REWRITE_SLACK_S = 1.0  # syslog stamps have whole seconds: a line of the second of the last read may be new
log = logging.getLogger("sigma.sidecar.logtail")


@dataclass
class Pattern:
    name: str  # event kind, e.g. xid
    regex: str  # Python regex searched in each line; named groups become event fields
    severity: str = "warning"  # event severity: info, warning, error, critical
    fields: dict[str, str] = field(default_factory=dict)  # constant fields added to every match
    extract: list[str] = field(default_factory=list)  # more regexes searched in a matching line: their named
    # groups add fields where they match (a culprit rank or host, a subcode the line may or may not carry)

    def __post_init__(self):
        if not self.name:
            raise ValueError("pattern name must not be empty")
        self.compiled, *self.extractors = (_compile(r) for r in [self.regex, *self.extract])

    def fields_of(self, m: re.Match, message: str) -> dict:
        """The event's fields: the constants, then what the extra regexes find, then the pattern's own groups."""
        fields = dict(self.fields)
        for found in [e.search(message) for e in self.extractors] + [m]:
            for k, v in (found.groupdict() if found else {}).items():
                if v is not None:
                    fields[k] = int(v) if v.isdigit() else v
        return fields


def _compile(regex: str, setting: str = "") -> re.Pattern:
    try:
        return re.compile(regex)
    except re.error as exc:
        raise ValueError(f"{setting + ': ' if setting else ''}bad regex {regex!r}: {exc}") from None


def _setting_regex(setting: str, regex: str) -> re.Pattern | None:
    """An optional regex setting (empty: none), its error naming the setting."""
    return _compile(regex, setting) if regex else None


SOURCES = ("files", "auto", "journal", "kmsg")


@register("logtail")
class LogTailCollector(Collector):
    @dataclass
    class Params(CollectorParams):
        source: str = "files"  # files: follow `files`; auto: the kernel log wherever it is (auto_order); journal;
        # kmsg: that one only (reported like auto when it cannot be read)
        files: list[str] = field(default_factory=list)  # paths or globs to follow (placeholders allowed)
        auto_order: list[str] = field(default_factory=lambda: ["journal", "kmsg", "files"])  # what auto tries
        recheck_s: float = 60.0  # with no kernel log found, look again this often
        kmsg_path: str = "/dev/kmsg"  # ring buffer device (a file of kmsg records in tests)
        journal_dir: str = ""  # read the journal files of this directory (journalctl -D); "" = the system journal
        journal_reader: str = "auto"  # native (libsystemd), journalctl, or auto: native where it loads
        journal_transports: list[str] = field(default_factory=lambda: ["kernel"])  # journal _TRANSPORT values read
        idents: list[str] = field(default_factory=list)  # writers whose lines count (syslog tag, journal identifier);
        # set: lines whose writer cannot be established are not acted on (fail closed); empty = any line counts
        untrusted_source: str = "refuse"  # a file others can write: refuse (skip it) or flag (mark its events)
        job_id_from_path: str = ""  # regex with a (?P<job_id>...) group: a file's events belong to that job only
        line_prefix: str = ""  # regex matched at the start of a line: what other programs put before its own text (a
        # launcher's host or rank tag, a time stamp), cut off before patterns are searched, so a pattern anchored
        # at ^ sees the text as its writer printed it; extracts still search the whole line
        start_at: str = "end"  # where to start a file or stream seen for the first time: end or start
        patterns: list[Pattern] = field(default_factory=list)  # line patterns that become events
        max_events_per_run: int = 1000  # more matches in one run are counted, not stored one by one
        log_name: str = "kernel"  # the log a source other than files reads, as its status events name it
        # ({log_name}_log_source / {log_name}_log_unavailable, sample log.{log_name}_source_ok): `sigma nodes` shows
        # the kernel's; another section (services) reports under its own name, so no status is said twice
        event_source: str = "log"  # events.source of this section's lines: 'service' where the writer is only
        # named by the line (a service's name anyone can log under): rules on it may notify, never drain

        def __post_init__(self):
            super().__post_init__()
            if self.source not in SOURCES:
                raise ValueError(f"source must be one of {', '.join(SOURCES)}, not {self.source!r}")
            bad = [s for s in self.auto_order if s not in ("journal", "kmsg", "files")]
            if bad or not self.auto_order:
                raise ValueError(f"auto_order: {bad[0] if bad else 'empty'}; choose from journal, kmsg, files")
            if self.journal_reader not in ("auto", "native", "journalctl"):
                raise ValueError(f"journal_reader must be auto, native or journalctl, not {self.journal_reader!r}")
            if self.start_at not in ("end", "start"):
                raise ValueError(f"start_at must be 'end' or 'start', not {self.start_at!r}")
            if self.untrusted_source not in ("refuse", "flag"):
                raise ValueError(f"untrusted_source must be 'refuse' or 'flag', not {self.untrusted_source!r}")
            self.job_path = _setting_regex("job_id_from_path", self.job_id_from_path)
            self.prefix = _setting_regex("line_prefix", self.line_prefix)
            if self.job_path is not None and "job_id" not in self.job_path.groupindex:
                raise ValueError("job_id_from_path needs a named group (?P<job_id>...)")
            if not re.fullmatch(r"[a-z][a-z0-9_]*", self.log_name) or not re.fullmatch(r"[a-z][a-z0-9_]*",
                                                                                       self.event_source):
                raise ValueError("log_name and event_source must be lower-case words (letters, digits, _)")
            if self.source == "files" and not self.files:
                raise ValueError("logtail needs something to read: files, or source auto, journal or kmsg")

        @property
        def order(self) -> list[str]:
            return self.auto_order if self.source == "auto" else [self.source]

    def __init__(self, section, params, ctx):
        super().__init__(section, params, ctx)
        self.tailers: dict[str, FileTailer] = {}
        self.booted = logformats.boot_time(ctx.host_root)
        self.boot_id = logsources.boot_id(ctx.host_root)
        self.kmsg: logsources.KmsgReader | None = None
        self.journal = None
        self.choice: logsources.Choice | None = None  # the kernel log read (source != files)
        self.reported: tuple | None = None  # the kernel log status last reported, and when
        self.reported_at = 0.0
        self.choose_at = 0.0  # when to look for the kernel log again while none is found
        self.first_run = True
        self.untrusted: dict[str, str] = {}  # source -> why, while it is untrusted (reported once per change)
        self.saved: dict[str, str] = {}  # positions last handed to the store, to write only changes
        self.last_record: dict[str, logformats.LogLine] = {}  # per source: the record a continuation line extends

    def _key(self, what: str) -> str:
        return f"logtail:{self.section}:{what}"

    def close(self) -> None:
        for t in self.tailers.values():
            t.close()
        self._drop_kernel_source()

    def _drop_kernel_source(self) -> None:
        if self.kmsg:
            self.kmsg.close()
        if self.journal:
            self.journal.close()
        self.kmsg = self.journal = self.choice = None

    def collect(self, out: Output) -> None:
        budget = [self.params.max_events_per_run, 0]  # remaining, suppressed
        self.rejected: dict[tuple[str, str], int] = {}
        self.unattributed: dict[tuple[str, str], int] = {}
        self.unattributed_budget = [UNATTRIBUTED_EVENTS_PER_RUN, 0]  # reported one by one, then only counted
        if self.params.source == "files":
            self._files(out, budget, self._paths())
        else:
            self._kernel(out, budget)
        for (source, reason), n in self.rejected.items():
            out.sample("log.rejected_lines", n, {"source": source, "reason": reason})
        for (source, reason), n in self.unattributed.items():
            out.sample("log.unattributed_lines", n, {"source": source, "reason": reason})
        if self.unattributed_budget[1]:
            out.event("sidecar", "log_unattributed", f"{self.unattributed_budget[1]} more lines a pattern matched "
                      f"but no writer vouches for in one run; counted, not listed", "warning",
                      {"collector": self.section, "suppressed": self.unattributed_budget[1]})
        if budget[1]:
            out.event("sidecar", "log_flood", f"{budget[1]} more matching lines in one run than "
                      f"max_events_per_run={self.params.max_events_per_run}; counted, not stored",
                      "warning", {"collector": self.section, "suppressed": budget[1]})
        self.first_run = False

    # ---------- the kernel log, wherever it is ----------
    def _kernel(self, out: Output, budget: list) -> None:
        if not (self.choice and self.choice.kind) and out.ts >= self.choose_at:
            self._choose()
        kind = self.choice.kind if self.choice else ""
        try:
            if kind == "journal":
                self._journal(out, budget)
            elif kind == "kmsg":
                self._kmsg(out, budget)
            elif kind == "file":
                self._files(out, budget, [self.choice.path])
                if logsources.file_unreadable(self.choice.path):  # removed, or no longer ours to read
                    raise OSError(f"{self.choice.path}: {logsources.file_unreadable(self.choice.path)}")
        except (OSError, logsources.JournalUnavailable) as exc:
            lost = self.choice.describe()
            self._drop_kernel_source()
            self.choice = logsources.Choice("", reasons={lost: f"stopped working: {exc}"})
            kind = ""
        if kind == "":
            self.choose_at = out.ts + self.params.recheck_s
        self._report_log_source(out)

    def _choose(self) -> None:
        p = self.params
        refuse = p.untrusted_source == "refuse"
        # a journal first seen after the start (it became readable) starts at its end all the same: its history may
        # be weeks of lines; the ring buffer holds this boot's only, read whole
        self.choice = logsources.choose(
            p.order, files=self._paths(), kmsg_path=p.kmsg_path, journal_dir=p.journal_dir,
            journal_reader=p.journal_reader, transports=tuple(p.journal_transports),
            cursor=self._saved_position("journal"), from_end=p.start_at == "end",
            host_root=self.ctx.host_root, untrusted=(lambda path: _untrusted_file(path)) if refuse else (lambda _: ""))
        if self.choice.kind == "journal":
            self.journal = self.choice.journal
        elif self.choice.kind == "kmsg":
            self.kmsg = logsources.KmsgReader(p.kmsg_path, self._saved_position("kmsg"), self._from_end(),
                                              self.boot_id)

    def _saved_position(self, what: str):
        """Where this source was left: as last handed to the store in this process, else as the store had it."""
        key = self._key(what)
        return json.loads(self.saved[key]) if key in self.saved else self.ctx.positions.get(key)

    def _from_end(self) -> bool:
        return self.first_run and self.params.start_at == "end"

    def _report_log_source(self, out: Output) -> None:
        choice = self.choice
        ok = bool(choice and choice.kind)
        name = self.params.log_name
        out.sample(f"log.{name}_source_ok", 1 if ok else 0, {"source": choice.kind if ok else "none"})
        state = (choice.kind, choice.path) if ok else ("", choice.why_none() if choice else "")
        if state == self.reported and out.ts - self.reported_at < REPORT_AGAIN_S:
            return
        self.reported, self.reported_at = state, out.ts
        fields = {"collector": self.section, "source": choice.kind if ok else "none"}
        if ok:
            msg = f"{name} log: reading {choice.describe()}"
            if choice.reasons:
                msg += f" (not {choice.why_none()})"
            log.info("%s [collector %s]", msg, self.section)
            out.event("sidecar", f"{name}_log_source", msg, "info",
                      {**fields, "path": choice.path, "skipped": choice.reasons})
        else:
            msg = (f"no {name} log can be read: {name}-log fault detection is OFF on this node "
                   f"({choice.why_none() if choice else 'not looked for yet'}); looking again every "
                   f"{self.params.recheck_s:g} s")
            log.error("%s [collector %s]", msg, self.section)
            out.event("sidecar", f"{name}_log_unavailable", msg, "error",
                      {**fields, "reasons": choice.reasons if choice else {}})

    def _kmsg(self, out: Output, budget: list) -> None:
        lines = self.kmsg.read()
        for line in lines:
            if not line.established:
                self._reject("kmsg", line.writer)  # root's `echo >/dev/kmsg`, systemd at boot: not the kernel
                continue
            self._match(out, logformats.parse(line.text, now=out.ts, booted=self.booted), {"stream": "kmsg"},
                        budget, "kmsg", raw=line.text)
        self._position(out, self._key("kmsg"), self.kmsg.position)
        out.sample("log.lines", len(lines), {"source": "kmsg"})

    def _journal(self, out: Output, budget: list) -> None:
        lines = self.journal.read()
        transports = self.params.journal_transports
        for line in lines:
            transport = line.writer.split(":", 1)[1] if line.writer.startswith("transport:") else "kernel"
            if transports and transport not in transports:
                # the reader matched _TRANSPORT: an entry of another transport means a journal we cannot trust
                self._trust(out, "journal", f"entry with _TRANSPORT={transport}, not one of {', '.join(transports)}")
                self._reject("journal", line.writer)
                continue
            if not line.established and transport == "kernel":
                self._reject("journal", line.writer)  # facility:N: a kernel-transport line user space wrote
                continue
            # another transport a site chose to read: the program it names, which `idents` may refuse
            ident = "kernel" if line.established else line.ident
            parsed = logformats.LogLine(line.text, line.ts, ident=ident, transport=transport, format="journal")
            self._match(out, parsed, {"stream": "journal", **line.fields}, budget, "journal", raw=line.text)
        if self.journal.cursor:
            self._position(out, self._key("journal"), self.journal.cursor)
        out.sample("log.lines", len(lines), {"source": "journal"})

    def _reject(self, source: str, reason: str) -> None:
        self.rejected[(source, reason)] = self.rejected.get((source, reason), 0) + 1

    # ---------- files ----------
    def _files(self, out: Output, budget: list, paths: list[str]) -> None:
        for path in paths:
            why = _untrusted_file(path)
            flagged = self._trust(out, path, why)
            tailer = self.tailers.get(path)
            if tailer is None:
                key = self._key(f"file:{path}")
                saved = self.ctx.positions.get(key)
                tailer = self.tailers[path] = FileTailer(path, saved, from_end=self._from_end())
            lines = tailer.read()
            if why and not flagged:  # refused: what anyone could have written meanwhile never counts, not even later
                self.rejected[(path, "untrusted_file")] = self.rejected.get((path, "untrusted_file"), 0) + len(lines)
                self._position(out, self._key(f"file:{path}"), tailer.position)
                continue
            replayed = 0
            where = {"file": path, **({"untrusted": True} if why else {})}
            job = self.params.job_path.search(path) if self.params.job_path else None
            job_ids = [int(job["job_id"])] if job and job["job_id"].isdigit() else None
            for parsed, raws, maybe_seen in self._records(path, lines, out.ts):
                if maybe_seen and (tailer.was_shipped(logformats.fingerprint(raws[0])) or (
                        parsed.ts is not None and parsed.ts < tailer.guard_ts - REWRITE_SLACK_S)):
                    replayed += 1  # a rewritten file shows a line already shipped (or older history): never again
                    continue
                if self._match(out, parsed, where, budget, path, job_ids, raws[0]):
                    for raw in raws:
                        tailer.remember(logformats.fingerprint(raw))
            self._position(out, self._key(f"file:{path}"), tailer.position)
            out.sample("log.lines", len(lines), {"source": path})
            if replayed:
                out.sample("log.replayed_lines_skipped", replayed, {"source": path})

    def _position(self, out: Output, key: str, value) -> None:
        text = json.dumps(value)
        if self.saved.get(key) != text:
            out.position(key, value)
            self.saved[key] = text

    def _trust(self, out: Output, source: str, why: str) -> bool:
        """Report a source that became untrusted (or trusted again); True when its lines are read (flag)."""
        if self.untrusted.get(source, "") != why:
            if why:
                verdict = "refused" if self.params.untrusted_source == "refuse" else "read, events flagged untrusted"
                msg = f"log source {source} is untrusted ({why}): {verdict}"
                log.warning("%s [collector %s]", msg, self.section)
                out.event("sidecar", "log_source_untrusted", msg, "warning",
                          {"collector": self.section, "source": source, "reason": why,
                           "policy": self.params.untrusted_source})
                self.untrusted[source] = why
            else:
                log.info("log source %s is trusted again [collector %s]", source, self.section)
                self.untrusted.pop(source, None)
        return self.params.untrusted_source == "flag"

    def _paths(self) -> list[str]:
        paths = []
        for pattern in self.params.files:
            if glob.has_magic(pattern):
                paths += sorted(glob.glob(pattern))
            else:
                paths.append(pattern)
        # a file that appears after the first run is new: read it from its beginning
        return paths

    def _records(self, source: str, lines: list[tuple[bytes, bool]], now: float):
        """(parsed record, its raw lines, maybe seen) per record: a line no parser reads extends the record before
        it, and takes its writer, when it is indented (dmesg's and journalctl's continuation of a multi-line record)
        or follows a record of the kernel's own ring buffer (older dmesg printed the record's newlines as they are),
        up to the longest record the kernel keeps."""
        record = None
        for raw, maybe_seen in lines:
            text = raw.decode("utf-8", "replace").rstrip("\r\n")
            parsed = logformats.parse(text, now=now, booted=self.booted)
            head = self.last_record.get(source)
            if (parsed.format == "plain" and head is not None and len(head.message) + len(text) < RECORD_MAX
                    and (text[:1] in (" ", "\t") or head.format in logformats.KERNEL_FORMATS and not head.ident)):
                if record is not None:
                    record[0].message += " " + text.strip()
                    record[1].append(raw)
                    continue
                parsed = replace(head, message=text.strip())  # its record was read in an earlier run
            if record is not None:
                yield record
            record = [parsed, [raw], maybe_seen]
            self.last_record[source] = parsed
        if record is not None:
            yield record

    def _match(self, out: Output, line: logformats.LogLine, where: dict, budget: list, source: str,
               job_ids: list[int] | None = None, raw: bytes | str = b"") -> bool:
        """The line as an event if a pattern matches; True when it matched (stored or counted)."""
        why = logformats.unattributed(line, self.params.idents)
        if why:
            key = (source, why)
            self.unattributed[key] = self.unattributed.get(key, 0) + 1
        tag = self.params.prefix.match(line.message) if self.params.prefix else None
        text = line.message[tag.end():] if tag else line.message
        for p in self.params.patterns:
            m = p.compiled.search(text)
            if m is None:
                continue
            if why:
                self._report_unattributed(out, p, line, raw, source, why)
                return False
            if budget[0] <= 0:
                budget[1] += 1
                return True
            budget[0] -= 1
            fields = {**where, **p.fields_of(m, line.message)}
            ts = line.ts if line.ts is not None and line.ts <= out.ts + FUTURE_SLACK_S else None
            uptime = line.uptime  # the line's own stamp; else its time in this boot
            if uptime is None and ts is not None and self.booted is not None and ts >= self.booted:
                uptime = ts - self.booted
            if uptime is not None:
                fields["uptime_s"] = int(uptime)  # how long after its boot it was logged (rules on boot)
            if ts is not None and ts == int(ts) and 0 <= out.ts - ts < 1.0:
                ts = None  # a whole-second stamp of the current second: the read time is as true, and finer
            out.event(self.params.event_source, p.name, line.message[:MESSAGE_MAX], p.severity, fields, ts=ts,
                      job_ids=job_ids)
            return True  # first matching pattern wins: one line is one event
        return False

    def _report_unattributed(self, out: Output, pattern: Pattern, line: logformats.LogLine, raw, source: str,
                             why: str) -> None:
        """A line that reads like a fault but no writer vouches for: shown (sigma explain), never acted on."""
        if self.unattributed_budget[0] <= 0:
            self.unattributed_budget[1] += 1
            return
        self.unattributed_budget[0] -= 1
        text = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else raw
        out.event("sidecar", "log_unattributed", (text.rstrip("\r\n") or line.message)[:MESSAGE_MAX], "warning",
                  {"collector": self.section, "source": source, "reason": why, "pattern": pattern.name,
                   "format": line.format})


def _untrusted_file(path: str) -> str:
    """Why others could have written this file's lines, or "" (also "" when it is not there yet)."""
    try:
        st = os.stat(path)
        parent = os.stat(os.path.dirname(os.path.abspath(path)))
    except OSError:
        return ""
    if st.st_uid not in (0, os.geteuid()):
        return f"owned by uid {st.st_uid}, not root"
    if st.st_mode & (stat.S_IWOTH | stat.S_IWGRP) and st.st_gid not in (0, os.getegid()):
        return f"writable by group {st.st_gid} or others (mode {stat.S_IMODE(st.st_mode):o})"
    if st.st_mode & stat.S_IWOTH:
        return f"world-writable (mode {stat.S_IMODE(st.st_mode):o})"
    if parent.st_mode & stat.S_IWOTH and not parent.st_mode & stat.S_ISVTX:
        return f"in a world-writable directory without the sticky bit ({os.path.dirname(os.path.abspath(path))})"
    if parent.st_uid not in (0, os.geteuid()):
        return f"in a directory owned by uid {parent.st_uid}"
    return ""
