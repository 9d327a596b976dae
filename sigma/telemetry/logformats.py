"""One log line in any of the formats nodes write, split into its own time, host, program and message.

The same kernel message reaches the sidecar wrapped in different envelopes, depending on how a site collects logs:

    [ 5843.291473] NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus.                      dmesg
    [Mon Nov 23 19:49:20 2026] NVRM: Xid ...                                                          dmesg -T
    Nov 23 19:49:20 gpu01 kernel: [ 5843.291473] NVRM: Xid ...                                        syslog (RFC 3164)
    <4>Nov 23 19:49:20 gpu01 kernel: NVRM: Xid ...                                                    the same, as sent
    2026-11-23T19:49:20.123456+00:00 gpu01 kernel: NVRM: Xid ...                                      rsyslog RFC 3339 files
    <4>1 2026-11-23T19:49:20.123456Z gpu01 kernel - - - NVRM: Xid ...                                 syslog (RFC 5424)
    Nov 23 19:49:20.123456 gpu01 kernel: ...  /  1795974560.123456 gpu01 kernel: ...                  journalctl -o short-precise / short-unix
    {"__REALTIME_TIMESTAMP": "1795974560123456", "_TRANSPORT": "kernel", "MESSAGE": "NVRM: Xid ..."}  journalctl -o json
    4,1234,5843291473,-;NVRM: Xid ...                                                                 /dev/kmsg record

`parse()` returns the message with every envelope removed (so patterns see the same text in every format) and the
line's own time in unix seconds where it has one: an event keeps the time the fault happened, not the time the
line was read, so an old line read again is old. Times without a zone (RFC 3164, dmesg -T) are the node's local
time; RFC 3164 has no year either: the year that puts the time closest to now, never more than a day ahead.
Uptime stamps (dmesg, kmsg) need the boot time (/proc/stat btime).
"""

from __future__ import annotations

import functools
import hashlib
import json
import re
import time
from dataclasses import dataclass
from datetime import datetime

_MONTHS = {m: i for i, m in enumerate(("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov",
                                       "Dec"), start=1)}
_PRI = r"(?:<(?P<pri>\d{1,3})>)?"
_HOST_IDENT = r"(?:(?P<host>[^\s:\[]+) )?(?P<ident>[^\s:\[]+)(?:\[(?P<pid>\d+)\])?: "
# RFC 3164 (and journalctl short / short-precise): "Nov 23 19:49:20[.123456] host ident[pid]: message"
_RFC3164 = re.compile(_PRI + r"(?P<mon>[A-Z][a-z]{2}) {1,2}(?P<day>\d{1,2}) (?P<hms>\d\d:\d\d:\d\d)(?P<frac>\.\d+)? "
                      + _HOST_IDENT)
# RFC 3339 stamp first (rsyslog's high-precision file format, journalctl short-iso / short-iso-precise)
_ISO = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?(?:Z|[+-]\d\d:?\d\d)?"
_RFC3339 = re.compile(_PRI + r"(?P<iso>" + _ISO + r") " + _HOST_IDENT)
# RFC 5424: "<pri>1 TIMESTAMP HOST APP PROCID MSGID [SD]|- MSG"
_RFC5424 = re.compile(r"<(?P<pri>\d{1,3})>1 (?P<iso>" + _ISO + r"|-) (?P<host>\S+) (?P<ident>\S+) (?P<pid>\S+) \S+ "
                      r"(?P<sd>-|(?:\[(?:[^\]\\]|\\.)*\])+) ?")
_UNIX = re.compile(r"(?P<unix>\d{9,11}\.\d+) " + _HOST_IDENT)  # journalctl -o short-unix
_DMESG_T = re.compile(r"\[(?:[A-Z][a-z]{2} )?(?P<mon>[A-Z][a-z]{2}) {1,2}(?P<day>\d{1,2}) (?P<hms>\d\d:\d\d:\d\d) "
                      r"(?P<year>\d{4})\] ?")
_UPTIME = re.compile(r"\[ *(?P<up>\d+\.\d+)\] ?")
_SHORT_MONOTONIC_HOST = re.compile(r"(?P<host>[^\s:\[]+) (?P<ident>kernel): ")  # journalctl -o short-monotonic
_KMSG = re.compile(r"(?P<pri>\d+),(?P<seq>\d+),(?P<usec>\d+),[^;]*;")


@dataclass
class LogLine:
    message: str  # the line without its envelope (time, host, program, uptime stamp)
    ts: float | None = None  # the line's own time (unix seconds), None when it has none
    host: str = ""  # host name the line names, if any
    ident: str = ""  # the program that logged it (syslog tag, journal SYSLOG_IDENTIFIER), "" if unknown
    transport: str = ""  # journal _TRANSPORT (kernel, syslog, stdout, ...), "" when the format has none
    format: str = "plain"  # which envelope it had: plain dmesg dmesg-T rfc3164 rfc3339 rfc5424 unix journal-json kmsg


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


def parse(line: str, *, now: float | None = None, booted: float | None = None) -> LogLine:
    """Split a line; never raises: an unknown envelope is a plain message without a time."""
    line = line.rstrip("\r\n")
    now = time.time() if now is None else now
    if line.startswith("{"):
        parsed = _journal_json(line, booted)
        if parsed is not None:
            return parsed
    m = _KMSG.match(line)
    if m:
        ts = booted + int(m["usec"]) / 1e6 if booted is not None else None
        return LogLine(line[m.end():], ts, ident="kernel", transport="kernel", format="kmsg")
    m = _RFC5424.match(line)
    if m:
        ts = None if m["iso"] == "-" else _iso(m["iso"])
        return _inner(LogLine(line[m.end():], ts, m["host"] or "", m["ident"], format="rfc5424"), booted)
    m = _RFC3339.match(line)
    if m:
        return _inner(LogLine(line[m.end():], _iso(m["iso"]), m["host"] or "", m["ident"], format="rfc3339"), booted)
    m = _RFC3164.match(line)
    if m:
        ts = _month_day(m["mon"], m["day"], m["hms"], None, now)
        if ts is not None and m["frac"]:
            ts += float(m["frac"])
        return _inner(LogLine(line[m.end():], ts, m["host"] or "", m["ident"], format="rfc3164"), booted)
    m = _UNIX.match(line)
    if m:
        return _inner(LogLine(line[m.end():], float(m["unix"]), m["host"] or "", m["ident"], format="unix"), booted)
    m = _DMESG_T.match(line)
    if m:
        return LogLine(line[m.end():], _month_day(m["mon"], m["day"], m["hms"], int(m["year"]), now),
                       format="dmesg-T")
    m = _UPTIME.match(line)
    if m:
        rest = line[m.end():]
        ts = booted + float(m["up"]) if booted is not None else None
        h = _SHORT_MONOTONIC_HOST.match(rest)
        if h:
            return LogLine(rest[h.end():], ts, h["host"], "kernel", format="dmesg")
        return LogLine(rest, ts, format="dmesg")
    return LogLine(line)


def _inner(parsed: LogLine, booted: float | None) -> LogLine:
    """A syslog line of the kernel often keeps dmesg's uptime stamp after the tag: drop it from the message."""
    m = _UPTIME.match(parsed.message)
    if m:
        parsed.message = parsed.message[m.end():]
        if parsed.ts is None and booted is not None:
            parsed.ts = booted + float(m["up"])
    return parsed


def _journal_json(line: str, booted: float | None) -> LogLine | None:
    try:
        entry = json.loads(line)
    except ValueError:
        return None
    if not isinstance(entry, dict) or "MESSAGE" not in entry:
        return None
    return journal_entry(entry, booted)


def journal_entry(entry: dict, booted: float | None = None) -> LogLine:
    """A `journalctl -o json` entry (binary messages come as byte arrays)."""
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
    parsed = LogLine(str(msg if msg is not None else ""), ts, str(entry.get("_HOSTNAME", "")),
                     str(entry.get("SYSLOG_IDENTIFIER", "")), str(entry.get("_TRANSPORT", "")), "journal-json")
    return _inner(parsed, booted)


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
    month = _MONTHS.get(mon)
    if month is None:
        return None
    hh, mm, ss = (int(x) for x in hms.split(":"))
    years = [year] if year is not None else [time.localtime(now).tm_year + d for d in (1, 0, -1)]
    best = None
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



FORMATS = ("plain", "dmesg", "dmesg-T", "rfc3164", "rfc3339", "rfc5424", "unix", "journal-json", "kmsg")


def render(message: str, fmt: str, *, ts: float, host: str = "node1", uptime: float = 5843.291473,
           seq: int = 1) -> str:
    """The same kernel message in one of FORMATS, as that tool writes it (for sigma chaos, tests and benches)."""
    local = time.localtime(ts)
    frac = f"{ts % 1:.6f}"[1:]
    if fmt == "plain":
        return message
    if fmt == "dmesg":
        return f"[{uptime:12.6f}] {message}"
    if fmt == "dmesg-T":
        return f"[{time.strftime('%a %b %d %H:%M:%S %Y', local)}] {message}"
    if fmt == "rfc3164":
        return f"{time.strftime('%b', local)} {local.tm_mday:2d} {time.strftime('%H:%M:%S', local)} {host} kernel: " \
               f"[{uptime:12.6f}] {message}"
    iso = datetime.fromtimestamp(ts).astimezone().isoformat(timespec="microseconds")
    if fmt == "rfc3339":
        return f"{iso} {host} kernel: {message}"
    if fmt == "rfc5424":
        return f"<3>1 {iso} {host} kernel - - - {message}"
    if fmt == "unix":
        return f"{int(ts)}{frac} {host} kernel: {message}"
    if fmt == "journal-json":
        return json.dumps({"__REALTIME_TIMESTAMP": str(int(ts * 1e6)), "_TRANSPORT": "kernel", "_HOSTNAME": host,
                           "SYSLOG_IDENTIFIER": "kernel", "PRIORITY": "3", "MESSAGE": message})
    if fmt == "kmsg":
        return f"3,{seq},{int(uptime * 1e6)},-;{message}"
    raise ValueError(f"unknown log format {fmt!r}; formats: {' '.join(FORMATS)}")
