"""One log line in any of the formats nodes write: its own time, host, program and message, and who wrote it.

The same kernel message reaches the sidecar wrapped in different envelopes, depending on how a site collects logs:

    dmesg                    [ 5843.291473] NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus.
    dmesg (caller id, -H)    [ 5843.291473][  T812] NVRM: Xid ...   /   [  +0.000041] NVRM: Xid ...
    dmesg -T (any locale)    [Mon Nov 23 19:49:20 2026] NVRM: Xid ...   /   [wo jul 28 05:19:43 2021] ...
    dmesg --time-format iso  2026-11-23T19:49:20,123456+01:00 NVRM: Xid ...
    dmesg -x (--decode)      kern  :warn  : [ 5843.291473] NVRM: Xid ...
    syslog (RFC 3164)        Nov 23 19:49:20 gpu01 kernel: [ 5843.291473] NVRM: Xid ...
      as sent, any locale    <4>Nov 23 19:49:20 gpu01 kernel: NVRM: Xid ...   /   lis 27 19:49:20 gpu01 kernel: ...
    rsyslog RFC 3339 files   2026-11-23T19:49:20.123456+00:00 gpu01 kernel: ...   /   ... gpu01 kern.warning kernel: ...
    syslog (RFC 5424)        <4>1 2026-11-23T19:49:20.123456Z gpu01 kernel - - - NVRM: Xid ...
    journalctl short-precise Nov 23 19:49:20.123456 gpu01 kernel: ...
    journalctl short-unix    1795974560.123456 gpu01 kernel: ...
    journalctl short-monotonic  [ 5843.291473] gpu01 kernel: NVRM: Xid ...
    journalctl -o json       {"__REALTIME_TIMESTAMP": "1795974560123456", "_TRANSPORT": "kernel", "MESSAGE": "..."}
    /dev/kmsg record         4,1234,5843291473,-;NVRM: Xid ...
    logread (OpenWrt)        Mon Nov 23 19:49:20 2026 kern.err kernel: [ 5843.291473] NVRM: Xid ...
    talosctl dmesg           10.0.0.5: kern: err: [2026-11-23T19:49:20.123456Z]: NVRM: Xid ...
    SONiC syslog             2026 Nov 23 19:49:20.123456 gpu01 ERR kernel: [ 5843.291473] NVRM: Xid ...
      (older, no year)       Nov 23 19:49:20.123456 gpu01 ERR kernel: [ 5843.291473] NVRM: Xid ...
    loghub (BGL RAS, ...)    - 1118536327 2005.06.11 R04-M1-N4 2005-06-11-17.32.07.581048 R04-M1-N4 RAS KERNEL FATAL ...

One parser per format: `parse()` tries each and returns the first that matches the whole envelope, or the line as a
"plain" message when none does. Nothing is guessed: a line whose envelope no parser knows has no known writer, and
`unattributed()` says so. The message has every envelope removed (patterns see the same text in every format); the
line's own time is kept (an old line read again is old), and so is its time since boot where the line carries one.
Times without a zone (RFC 3164, dmesg -T) are the node's local time; RFC 3164 has no year either: the year that puts
the time closest to now, never more than a day ahead; a month name that means several months in different locales
(`lis`) is read the same way. Uptime stamps (dmesg, kmsg) need the boot time (/proc/stat btime).
"""

from __future__ import annotations

import functools
import hashlib
import json
import re
import time
from dataclasses import dataclass, replace
from datetime import datetime

from sigma.telemetry.months import is_weekday, months

_FACILITIES = ("kern", "user", "mail", "daemon", "auth", "syslog", "lpr", "news", "uucp", "cron", "authpriv", "ftp",
               "ntp", "security", "console", "solaris-cron", "local0", "local1", "local2", "local3", "local4",
               "local5", "local6", "local7")
_PRI = r"(?:<(?P<pri>\d{1,3})>)?"
# host, then (rsyslog templates with %syslogfacility-text%.%syslogpriority-text%) "kern.warning", then the tag
_HOST_IDENT = (r"(?:(?P<host>[^\s:\[]+) )?"
               r"(?:(?P<hfac>[a-z0-9]+)\.(?P<hlvl>emerg|alert|crit|err|warning|notice|info|debug) )?"
               r"(?P<ident>[^\s:\[]+)(?:\[(?P<pid>\d+)\])?: ?")
_MON_DAY = r"(?P<mon>[^\s\d\[\]][^\s\[\]]*|\d{1,2}\S+) {1,2}(?P<day>\d{1,2}) (?P<hms>\d\d:\d\d:\d\d)"
# RFC 3164 (and journalctl short / short-precise, in any locale): "Nov 23 19:49:20[.123456] host ident[pid]: message"
_RFC3164 = re.compile(_PRI + _MON_DAY + r"(?P<frac>\.\d+)? " + _HOST_IDENT)
# a syslog template that prints the facility and priority in brackets after the time, with or without a host and
# program ("Feb  9 22:22:29 [kern.warning] [  377.489617] WARNING: Pool ..."): the facility says who wrote it
_BRACKETED = re.compile(_PRI + _MON_DAY + r"(?P<frac>\.\d+)? (?:(?P<host>[^\s:\[]+) )?\[(?P<facility>[a-z0-9]+)\."
                        r"(?P<level>emerg|alert|crit|err|warning|warn|notice|info|debug)\] "
                        r"(?:(?P<ident>[^\s:\[]+)(?:\[(?P<pid>\d+)\])?: )?")
# RFC 3339 stamp first (rsyslog's high-precision file format, journalctl short-iso / short-iso-precise)
_ISO = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?(?:Z|[+-]\d\d:?\d\d)?"
_RFC3339 = re.compile(_PRI + r"(?P<iso>" + _ISO + r") " + _HOST_IDENT)
# RFC 5424: "<pri>1 TIMESTAMP HOST APP PROCID MSGID [SD]|- MSG"
_RFC5424 = re.compile(r"<(?P<pri>\d{1,3})>1 (?P<iso>" + _ISO + r"|-) (?P<host>\S+) (?P<ident>\S+) (?P<pid>\S+) \S+ "
                      r"(?P<sd>-|(?:\[(?:[^\]\\]|\\.)*\])+) ?")
_UNIX = re.compile(r"(?P<unix>\d{9,11}\.\d+) " + _HOST_IDENT)  # journalctl -o short-unix
# busybox / OpenWrt logread: "Tue Aug 12 16:40:43 2025 kern.crit kernel: message"
_LOGREAD = re.compile(r"(?P<wday>\S+) " + _MON_DAY + r" (?P<year>\d{4}) (?P<facility>[a-z0-9]+)\.(?P<level>[a-z]+) "
                      + _HOST_IDENT)
# talosctl dmesg: "[node: ]kern: warning: [2026-04-22T21:27:51.291660856Z]: message"
_TALOS = re.compile(r"(?:\S+: )?(?P<facility>[a-z0-9]+): +(?P<level>[a-z]+): \[(?P<iso>" + _ISO + r")\]: ")
# SONiC's rsyslog template: "2025 Jun 18 07:12:32.614365 host ERR kernel: message" (older releases: no year)
_SONIC = re.compile(r"(?:(?P<year>\d{4}) )?" + _MON_DAY + r"(?P<frac>\.\d+)? (?P<host>\S+) "
                    r"(?P<level>EMERG|ALERT|CRIT|ERR|WARNING|NOTICE|INFO|DEBUG) "
                    r"(?P<ident>[^\s:\[]+)(?:\[(?P<pid>\d+)\])?: ?")
# dmesg's stamps, any number of them in a row (dmesg prints several with repeated --time-format)
_UPTIME = re.compile(r"\[ *(?P<up>\d+\.\d+)(?: <[ \d.]+>)?\] ?")
_CALLER = re.compile(r"\[ *[TC]\d+\] ?")  # CONFIG_PRINTK_CALLER
# dmesg -H, reltime, delta
_RELATIVE = re.compile(r"\[(?: *\+\d+\.\d+| *< *\d+\.\d+>|[A-Z][a-z]{2}\d{1,2} \d\d:\d\d)\] ?")
# dmesg -T in the node's locale: "[Tue Aug 26 16:02:58 2025]", "[三 9月  6 11:00:27 2017]" (CJK months lead with digits)
_DMESG_T = re.compile(r"\[(?:(?P<wday>[^\s\]]+) )?(?P<mon>[^\s\d\]][^\s\]]*|\d{1,2}[^\s\d\]][^\s\]]*) {1,2}"
                      r"(?P<day>\d{1,2}) "
                      r"(?P<hms>\d\d:\d\d:\d\d) (?P<year>\d{4})\] ?")
_DMESG_ISO = re.compile(r"(?P<iso>\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d,\d+(?:[+-]\d\d:?\d\d)?) ")  # util-linux: comma
# dmesg -x / --decode: "kern  :warn  : " before the stamps (the facility is the ring buffer's own)
_DECODE = re.compile(r"(?P<facility>[a-z0-9-]+) *:(?P<level>emerg|alert|crit|err|warn|notice|info|debug|) *: ")
_AFTER_STAMP = re.compile(_HOST_IDENT)  # journalctl -o short-monotonic, or a program's text in the ring buffer
_KMSG = re.compile(r"(?P<pri>\d+),(?P<seq>\d+),(?P<usec>\d+),[^;]*;")
# loghub's labelled system logs: "LABEL EPOCH YYYY.MM.DD NODE " before a Blue Gene/L RAS record or a syslog line
_LOGHUB = re.compile(r"(?P<label>\S+) (?P<epoch>\d{9,10}) \d{4}\.\d\d\.\d\d \S+ ")
_BGL_RAS = re.compile(r"\d{4}-\d\d-\d\d-\d\d\.\d\d\.\d\d\.\d+ \S+ RAS (?P<component>[A-Z_]+) (?P<level>[A-Z]+) ")
_ESCAPED = re.compile(r"\\x([0-9a-fA-F]{2})")

# Formats only the kernel writes: their lines need no program name to be the kernel's (kmsg and talos name their
# facility, checked apart). Everything else must name its program.
KERNEL_FORMATS = frozenset({"dmesg", "dmesg-T", "dmesg-iso", "kmsg", "talos"})


@dataclass
class LogLine:
    message: str  # the line without its envelope (time, host, program, uptime stamp)
    ts: float | None = None  # the line's own time (unix seconds), None when it has none
    host: str = ""  # host name the line names, if any
    ident: str = ""  # the program that logged it (syslog tag, journal SYSLOG_IDENTIFIER), "" if unknown
    transport: str = ""  # journal _TRANSPORT (kernel, syslog, stdout, ...), "" when the format has none
    format: str = "plain"  # which envelope it had (the parser that read it); plain: none known
    facility: str = ""  # syslog facility where the envelope carries one (kern, user, daemon, ...)
    uptime: float | None = None  # seconds since its boot where the line says so itself (a dmesg or kmsg stamp, a
    # journal entry's monotonic time), None otherwise


def boot_time(host_root: str = "/") -> float | None:
    """The node's boot time (unix seconds) from /proc/stat, for uptime stamps; None where unreadable."""
    try:
        with open(f"{host_root.rstrip('/')}/proc/stat") as f:
            for line in f:
                if line.startswith("btime "):
                    return float(line.split()[1])
    except OSError:
        return None
    return None


def unattributed(line: LogLine, idents) -> str:
    """Why the line cannot be trusted as written by one of `idents` ("" when it can). Fail closed: a line with no
    known envelope, another program's name or facility, or a journal entry without its transport is not the kernel's,
    whatever it says. With `idents` that do not name the kernel (a section reading services), a line of the kernel's
    (its facility, transport or format) is not one of theirs: each line is attributed to one section only."""
    if not idents:
        return ""
    kernel = "kernel" in idents
    if line.format == "plain":
        return "envelope not recognised"
    if line.facility and (line.facility in ("kern", "kernel")) != kernel:
        return f"facility {line.facility}"
    if line.format == "journal-json":
        if not line.transport:
            return "journal entry without _TRANSPORT"
        if (line.transport == "kernel") != kernel:
            return f"journal _TRANSPORT={line.transport}"
        if kernel:
            return ""
    if line.ident:
        return "" if line.ident in idents else f"program {line.ident}"
    return "" if kernel and (line.format in KERNEL_FORMATS or line.facility) else "program not named"


def parse(line: str, *, now: float | None = None, booted: float | None = None) -> LogLine:
    """Split a line; never raises: a line no parser reads whole is a plain message without a time."""
    line = line.rstrip("\r\n")
    now = time.time() if now is None else now
    for parser in _PARSERS:
        parsed = parser(line, now, booted)
        if parsed is not None:
            return parsed
    return LogLine(line)


def _journal_json(line, now, booted):
    if not line.startswith("{"):
        return None
    try:
        entry = json.loads(line)
    except ValueError:
        return None
    if not isinstance(entry, dict) or "MESSAGE" not in entry:
        return None
    return journal_entry(entry, booted)


def journal_entry(entry: dict, booted: float | None = None) -> LogLine:
    """A `journalctl -o json` entry (binary messages come as byte arrays; a multi-line message is one line)."""
    msg = entry.get("MESSAGE")
    if isinstance(msg, list):
        msg = bytes(b & 0xFF for b in msg if isinstance(b, int)).decode("utf-8", "replace")
    ts = None
    for key, scale in (("__REALTIME_TIMESTAMP", 1e-6), ("_SOURCE_REALTIME_TIMESTAMP", 1e-6)):
        try:
            ts = int(entry[key]) * scale
            break
        except (KeyError, TypeError, ValueError):
            continue
    facility = entry.get("SYSLOG_FACILITY")
    parsed = LogLine(_one_line(str(msg if msg is not None else "")), ts, str(entry.get("_HOSTNAME", "")),
                     str(entry.get("SYSLOG_IDENTIFIER", "")), str(entry.get("_TRANSPORT", "")), "journal-json",
                     _facility(facility) if facility is not None else "")
    for key in ("_SOURCE_MONOTONIC_TIMESTAMP", "__MONOTONIC_TIMESTAMP"):  # the kernel's own stamp first
        try:
            parsed.uptime = int(entry[key]) * 1e-6
            break
        except (KeyError, TypeError, ValueError):
            continue
    return _inner(parsed, booted)


def _kmsg(line, now, booted):
    m = _KMSG.match(line)
    if not m:
        return None
    ts = booted + int(m["usec"]) / 1e6 if booted is not None else None
    text = _ESCAPED.sub(lambda e: chr(int(e.group(1), 16)), line[m.end():])
    return LogLine(_one_line(text), ts, format="kmsg", facility=_facility(int(m["pri"]) >> 3),
                   uptime=int(m["usec"]) / 1e6)


def _rfc5424(line, now, booted):
    m = _RFC5424.match(line)
    if not m:
        return None
    ts = None if m["iso"] == "-" else _iso(m["iso"])
    return _inner(LogLine(line[m.end():], ts, m["host"], m["ident"], format="rfc5424", facility=_pri(m)), booted)


def _rfc3339(line, now, booted):
    m = _RFC3339.match(line)
    if not m:
        return None
    return _inner(LogLine(line[m.end():], _iso(m["iso"]), m["host"] or "", m["ident"], format="rfc3339",
                          facility=_pri(m)), booted)


def _dmesg_iso(line, now, booted):
    m = _DMESG_ISO.match(line)
    if not m:
        return None
    return LogLine(line[m.end():], _iso(m["iso"].replace(",", ".")), format="dmesg-iso")


def _rfc3164(line, now, booted):
    m = _RFC3164.match(line)
    if not m or not months(m["mon"]):
        return None
    return _inner(LogLine(line[m.end():], _syslog_time(m, now), m["host"] or "", m["ident"], format="rfc3164",
                          facility=_pri(m)), booted)


def _bracketed(line, now, booted):
    m = _BRACKETED.match(line)
    if not m or not months(m["mon"]) or m["facility"] not in _FACILITIES:
        return None
    return _inner(LogLine(line[m.end():], _syslog_time(m, now), m["host"] or "", m["ident"] or "", format="rfc3164",
                          facility=m["facility"]), booted)


def _syslog_time(m, now) -> float | None:
    """A syslog stamp's time (no year: the one that puts it closest to now), with its fraction where it has one."""
    ts = _month_day(m["mon"], m["day"], m["hms"], None, now)
    return ts + float(m["frac"]) if ts is not None and m["frac"] else ts


def _unix(line, now, booted):
    m = _UNIX.match(line)
    if not m:
        return None
    return _inner(LogLine(line[m.end():], float(m["unix"]), m["host"] or "", m["ident"], format="unix",
                          facility=_pri(m)), booted)


def _logread(line, now, booted):
    m = _LOGREAD.match(line)
    if not m or not months(m["mon"]) or not is_weekday(m["wday"]) or m["facility"] not in _FACILITIES:
        return None
    ts = _month_day(m["mon"], m["day"], m["hms"], int(m["year"]), now)
    return _inner(LogLine(line[m.end():], ts, m["host"] or "", m["ident"], format="logread",
                          facility=m["facility"]), booted)


def _talos(line, now, booted):
    m = _TALOS.match(line)
    if not m or m["facility"] not in _FACILITIES:
        return None
    return LogLine(line[m.end():], _iso(m["iso"]), format="talos", facility=m["facility"])


def _sonic(line, now, booted):
    m = _SONIC.match(line)
    if not m or not months(m["mon"]):
        return None
    ts = _month_day(m["mon"], m["day"], m["hms"], int(m["year"]) if m["year"] else None, now)
    if ts is not None and m["frac"]:
        ts += float(m["frac"])
    return _inner(LogLine(line[m.end():], ts, m["host"], m["ident"], format="sonic"), booted)


def _dmesg(line, now, booted):
    """dmesg with any of its stamps, several in a row; after them, journalctl short-monotonic's host and program,
    or a program's own tag (text user space wrote into the ring buffer)."""
    rest, ts, fmt, facility, up = line, None, None, "", None
    m = _DECODE.match(line)
    if m and m["facility"] in _FACILITIES:
        rest, fmt, facility = line[m.end():], "dmesg", m["facility"]
    while True:
        m = _UPTIME.match(rest)
        if m:
            ts = booted + float(m["up"]) if ts is None and booted is not None else ts
            up = float(m["up"]) if up is None else up
            rest, fmt = rest[m.end():], fmt or "dmesg"
            continue
        m = _CALLER.match(rest) if fmt else None
        if m:
            rest = rest[m.end():]
            continue
        m = _DMESG_T.match(rest)
        if m and months(m["mon"]) and (m["wday"] is None or is_weekday(m["wday"])):
            ts = _month_day(m["mon"], m["day"], m["hms"], int(m["year"]), now)
            rest, fmt = rest[m.end():], "dmesg-T"
            continue
        m = _RELATIVE.match(rest)
        if m:
            rest, fmt = rest[m.end():], fmt or "dmesg"
            continue
        m = _DMESG_ISO.match(rest) if fmt else None
        if m:
            ts, rest = _iso(m["iso"].replace(",", ".")), rest[m.end():]
            continue
        break
    if fmt is None:
        return None
    m = _AFTER_STAMP.match(rest)
    if m and (m["ident"] == "kernel" or m["pid"]):
        return LogLine(rest[m.end():], ts, m["host"] or "", m["ident"], format=fmt, facility=facility, uptime=up)
    return LogLine(rest, ts, format=fmt, facility=facility, uptime=up)


def _loghub(line, now, booted):
    m = _LOGHUB.match(line)
    if not m:
        return None
    rest, ts = line[m.end():], float(m["epoch"])
    ras = _BGL_RAS.match(rest)
    if ras:
        return LogLine(rest[ras.end():], ts, format="bgl-ras", facility=ras["component"].lower())
    inner = parse(rest, now=now, booted=booted)
    return None if inner.format == "plain" else replace(inner, ts=ts, format=f"loghub-{inner.format}")


_PARSERS = (_journal_json, _kmsg, _rfc5424, _rfc3339, _dmesg_iso, _rfc3164, _bracketed, _unix, _logread, _talos,
            _sonic, _loghub, _dmesg)


def _inner(parsed: LogLine, booted: float | None) -> LogLine:
    """A syslog line of the kernel often keeps dmesg's uptime stamp after the tag: drop it from the message."""
    m = _UPTIME.match(parsed.message)
    if m:
        parsed.message = parsed.message[m.end():]
        parsed.uptime = float(m["up"]) if parsed.uptime is None else parsed.uptime
        if parsed.ts is None and booted is not None:
            parsed.ts = booted + float(m["up"])
    return parsed


def _one_line(text: str) -> str:
    """A multi-line record as one line (patterns search one line)."""
    return " ".join(part.strip() for part in text.splitlines()) if "\n" in text else text


def _facility(code) -> str:
    try:
        return _FACILITIES[int(code)]
    except (IndexError, ValueError, TypeError):
        return str(code)


def _pri(m) -> str:
    """The facility the envelope names: its <pri>, or a "kern.warning" field before the tag."""
    g = m.groupdict()
    if g.get("pri"):
        return _facility(int(g["pri"]) >> 3)
    return g.get("hfac") if g.get("hfac") in _FACILITIES else ""


def _iso(text: str) -> float | None:
    try:
        dt = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    return dt.timestamp()  # a naive time is local time, as the node wrote it


def _month_day(mon: str, day: str, hms: str, year: int | None, now: float) -> float | None:
    # lines of one second share their stamp: cached per stamp and hour of reading (the year guess moves no faster)
    return _month_day_cached(mon, day, hms, year, int(now // 3600) * 3600.0)


@functools.lru_cache(maxsize=4096)
def _month_day_cached(mon: str, day: str, hms: str, year: int | None, now: float) -> float | None:
    hh, mm, ss = (int(x) for x in hms.split(":"))
    years = [year] if year is not None else [time.localtime(now).tm_year + d for d in (1, 0, -1)]
    best = None
    for month in months(mon):
        for y in years:
            try:
                ts = time.mktime((y, month, int(day), hh, mm, ss, 0, 0, -1))
            except (OverflowError, ValueError):
                continue
            if year is None and ts > now + 3600 + 86400:
                continue  # "Dec 31" read on Jan 1 is last year's
            if best is None or abs(ts - now) < abs(best - now):
                best = ts
    return best


def fingerprint(line: bytes | str) -> str:
    """A short stable digest of a line, to recognise it when a rewritten file shows it again."""
    data = line.encode("utf-8", "replace") if isinstance(line, str) else line
    return hashlib.blake2b(data.rstrip(b"\r\n"), digest_size=8).hexdigest()


FORMATS = ("plain", "dmesg", "dmesg-T", "dmesg-iso", "rfc3164", "rfc3339", "rfc5424", "unix", "journal-json", "kmsg",
           "logread")


SERVICE_FORMATS = ("rfc3164", "rfc3339", "rfc5424", "unix", "journal-json", "logread")  # the ones naming a program


def render(message: str, fmt: str, *, ts: float, host: str = "node1", uptime: float = 5843.291473,
           seq: int = 1, ident: str = "kernel") -> str:
    """The same kernel message in one of FORMATS, as that tool writes it (for sigma chaos, tests and benches); with
    `ident` another program's (as PID 1234 of it; SERVICE_FORMATS only)."""
    kernel = ident == "kernel"
    if fmt in SERVICE_FORMATS:
        return _syslog(message, fmt, ts=ts, host=host, ident=ident, pid=None if kernel else 1234, uptime=uptime)
    if not kernel:
        raise ValueError(f"a service's line has no {fmt!r} envelope; formats: {' '.join(SERVICE_FORMATS)}")
    if fmt == "plain":
        return message
    if fmt == "dmesg":
        return f"[{uptime:12.6f}] {message}"
    if fmt == "dmesg-T":
        return f"[{time.strftime('%a %b %d %H:%M:%S %Y', time.localtime(ts))}] {message}"
    if fmt == "dmesg-iso":
        return f"{datetime.fromtimestamp(ts).astimezone().isoformat(timespec='microseconds').replace('.', ',', 1)} " \
               f"{message}"
    if fmt == "kmsg":
        return f"3,{seq},{int(uptime * 1e6)},-;{message}"
    raise ValueError(f"unknown log format {fmt!r}; formats: {' '.join(FORMATS)}")


def _syslog(message: str, fmt: str, *, ts: float, host: str, ident: str, pid: int | None, uptime: float) -> str:
    """A program's line in one of SERVICE_FORMATS, at level err; the kernel's (pid None) at its own facility, with
    no PID, and where syslogd keeps it (rfc3164, logread) with the kernel's own uptime stamp before the message."""
    local = time.localtime(ts)
    iso = datetime.fromtimestamp(ts).astimezone().isoformat(timespec="microseconds")
    kernel = pid is None
    tag = f"{ident}:" if kernel else f"{ident}[{pid}]:"
    stamped = f"[{uptime:12.6f}] {message}" if kernel else message
    if fmt == "rfc3164":
        return f"{time.strftime('%b', local)} {local.tm_mday:2d} {time.strftime('%H:%M:%S', local)} {host} {tag} " \
               f"{stamped}"
    if fmt == "rfc3339":
        return f"{iso} {host} {tag} {message}"
    if fmt == "rfc5424":
        return f"<{3 if kernel else 27}>1 {iso} {host} {ident} {pid or '-'} - - {message}"
    if fmt == "unix":
        return f"{int(ts)}{f'{ts % 1:.6f}'[1:]} {host} {tag} {message}"
    if fmt == "journal-json":
        facility = {} if kernel else {"SYSLOG_FACILITY": "3"}
        return json.dumps({"__REALTIME_TIMESTAMP": str(int(ts * 1e6)), "_TRANSPORT": "kernel" if kernel else "syslog",
                           "_HOSTNAME": host, "SYSLOG_IDENTIFIER": ident, **facility, "PRIORITY": "3",
                           "MESSAGE": message})
    assert fmt == "logread", fmt
    return f"{time.strftime('%a %b %e %H:%M:%S %Y', local)} {'kern' if kernel else 'daemon'}.err {tag} {stamped}"
