"""Failure traces: outages (node, start, end, kind) read from a file, every bad row named.

Layouts read: the LANL failure records as published (`System,...,nodenumz,...,Prob Started,Prob Fixed,Down Time,
<blame columns>`, every system in one file; the systems asked for are kept), a plain CSV `node,start,end,kind`
(times as epoch seconds or ISO dates, `end` the time the node was repaired, empty for a fault that needs no repair
beyond a reboot), and StepFun's InfiniteHBD fault trace (sigma.simulate.infinitehbd).
"""

from __future__ import annotations

import calendar
import contextlib
import csv
import datetime as dt
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path


class TraceError(ValueError):
    """Bad input in a trace, workload or model file; the message names the file and row."""


class BadRows:
    """What a reader does with a row it cannot use: strict (the default) raises naming the file, line and field;
    otherwise the row is skipped and kept here, so the run can say how many were skipped and which."""

    def __init__(self, skip: bool = False):
        self.skip = skip
        self.skipped: list[str] = []

    def __call__(self, message: str) -> None:
        if not self.skip:
            raise TraceError(message + " (--skip-bad skips such rows and counts them)")
        self.skipped.append(message)


@dataclass(frozen=True)
class Outage:
    node: int  # index into the simulated cluster's nodes (0-based)
    start: float  # epoch seconds
    end: float | None  # repaired at (None: no recorded repair time)
    kind: str  # fault kind (sigma.simulate.faults.KINDS)
    origin: str  # "file:line", for errors and the report
    detail: str = ""  # the trace's own words for the fault (a LANL blame, an InfiniteHBD description)

    @property
    def repair_s(self) -> float | None:
        return None if self.end is None else self.end - self.start


def lanl_kind(row: dict) -> str:
    """The fault kind of a LANL record, from its blame columns: the closest signature the controller knows."""
    if row.get("Hardware"):
        return "memory" if "memory" in row["Hardware"].lower() else "node-death"
    if row.get("Software"):
        return "software"
    if row.get("Network"):
        return "network"
    return "node-death"  # facilities, human error, undetermined: the node went away


LANL_BLAME = ("Facilities", "Hardware", "Human Error", "Network", "Undetermined", "Software")


def read_lanl(path: str | Path, systems: int | Iterable[int] | None = None,
              bad: BadRows | None = None) -> dict[int, list[Outage]]:
    """Outages per LANL system (node = `nodenumz`), the published file with every system or a part of it.
    `systems` keeps those (default all); a row of another system is never judged beyond its System column (system
    17 has no node numbers). A row that cannot be used is `bad` (default: an error naming file, line and field).
    Overlaps are left to the caller (`check` or `merge_overlaps`): the public records have a few."""
    path = Path(path)
    bad = bad or BadRows()
    keep = None if systems is None else ({systems} if isinstance(systems, int) else set(systems))
    out: dict[int, list[Outage]] = {}
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        missing = {"System", "nodenumz", "Prob Started", "Prob Fixed"} - set(reader.fieldnames or ())
        if missing:
            raise TraceError(f"{path}:1: not a LANL failure file: missing columns {sorted(missing)}")
        for line, row in enumerate(reader, start=2):
            where = f"{path}:{line}"
            try:
                sys_id = int(row["System"])
            except (TypeError, ValueError):
                bad(f"{where}: System {row['System']!r} is not a system number")
                continue
            if keep is not None and sys_id not in keep:
                continue
            try:
                node = int(row["nodenumz"])
            except (TypeError, ValueError):
                bad(f"{where}: nodenumz {row['nodenumz']!r} is not a node number (system {sys_id})")
                continue
            try:
                start = _lanl_time(row["Prob Started"], where, "Prob Started")
                end = _lanl_time(row["Prob Fixed"], where, "Prob Fixed")
                _ordered(start, end, where)
            except TraceError as exc:
                bad(str(exc))
                continue
            blame = next((f"{c}: {row[c]}" for c in LANL_BLAME if row.get(c)), "")
            out.setdefault(sys_id, []).append(Outage(node, start, end, lanl_kind(row), where, blame))
    for s in sorted(keep or ()):
        if s not in out:
            raise TraceError(f"{path}: no usable records of system {s}" + (
                f" ({len(bad.skipped)} skipped as unusable; the first: {bad.skipped[0]})" if bad.skipped else ""))
    return {k: sorted(v, key=lambda o: (o.start, o.node)) for k, v in out.items()}


def read_plain(path: str | Path, node_names: list[str], bad: BadRows | None = None) -> list[Outage]:
    """A `node,start,end,kind` CSV onto the simulated nodes (names as `sigma simulate` gives them: node0001...)."""
    from sigma.simulate.faults import KINDS

    path = Path(path)
    bad = bad or BadRows()
    index = {n: i for i, n in enumerate(node_names)}
    out = []
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        missing = {"node", "start", "end", "kind"} - set(reader.fieldnames or ())
        if missing:
            raise TraceError(f"{path}:1: missing columns {sorted(missing)} (a trace has node,start,end,kind)")
        for line, row in enumerate(reader, start=2):
            where = f"{path}:{line}"
            try:
                if row["node"] not in index:
                    raise TraceError(f"{where}: unknown node {row['node']!r} (the cluster has {node_names[0]} .. "
                                     f"{node_names[-1]})")
                if row["kind"] not in KINDS:
                    raise TraceError(f"{where}: unknown fault kind {row['kind']!r}; valid: {', '.join(KINDS)}")
                start = _plain_time(row["start"], where, "start")
                end = _plain_time(row["end"], where, "end") if (row["end"] or "").strip() else None
                _ordered(start, end, where)
            except TraceError as exc:
                bad(str(exc))
                continue
            out.append(Outage(index[row["node"]], start, end, row["kind"], where))
    return sorted(out, key=lambda o: (o.start, o.node))  # overlaps: `check` or `merge_overlaps`


def _ordered(start: float, end: float | None, where: str) -> None:
    if end is not None and end < start:
        raise TraceError(f"{where}: outage ends before it starts ({_iso(end)} < {_iso(start)})")


def check(outages: list[Outage]) -> list[Outage]:
    """Sorted by start; two overlapping outages of one node are an error naming both rows."""
    last: dict[int, Outage] = {}
    for o in sorted(outages, key=lambda o: (o.node, o.start)):
        prev = last.get(o.node)
        if prev is not None and o.start < (prev.end if prev.end is not None else prev.start):
            raise TraceError(f"{o.origin}: outage of node {o.node} starting {_iso(o.start)} overlaps the one at "
                             f"{prev.origin} ({_iso(prev.start)} .. {_iso(prev.end or prev.start)}); merge them "
                             f"(or pass --overlaps merge)")
        last[o.node] = o
    return sorted(outages, key=lambda o: (o.start, o.node))


def merge_overlaps(outages: list[Outage]) -> tuple[list[Outage], list[str]]:
    """Overlapping outages of one node folded into one (the earliest start, the latest end); returns the rows
    folded, so the report can list them."""
    out: list[Outage] = []
    last: dict[int, int] = {}  # node -> index in out of its latest outage
    folded = []
    for o in sorted(outages, key=lambda o: (o.node, o.start)):
        i = last.get(o.node)
        if i is not None and o.start < (out[i].end if out[i].end is not None else out[i].start):
            prev = out[i]
            out[i] = Outage(o.node, prev.start, max(prev.end or prev.start, o.end or o.start), prev.kind, prev.origin,
                            prev.detail)
            folded.append(o.origin)
            continue
        last[o.node] = len(out)
        out.append(o)
    return sorted(out, key=lambda o: (o.start, o.node)), folded


def _lanl_time(text: str, where: str, column: str) -> float:
    """`6/21/2005 10:54` (UTC; parsed by hand: strptime on 18,000 stamps was most of a bare run's start-up)."""
    text = (text or "").strip()
    if not text:
        raise TraceError(f"{where}: missing {column}")
    try:
        day, clock = text.split(" ")
        month, mday, year = (int(x) for x in day.split("/"))
        hour, minute = (int(x) for x in clock.split(":"))
    except ValueError:
        ok = False
    else:
        ok = 1 <= month <= 12 and 1 <= mday <= 31 and hour < 24 and minute < 60
    if not ok:
        raise TraceError(f"{where}: {column} {text!r} is not a time like 6/21/2005 10:54")
    return float(calendar.timegm((year, month, mday, hour, minute, 0)))


def _plain_time(text: str, where: str, column: str) -> float:
    text = (text or "").strip()
    if not text:
        raise TraceError(f"{where}: missing {column}")
    with contextlib.suppress(ValueError):  # epoch seconds, else an ISO time below
        return float(text)
    try:
        t = dt.datetime.fromisoformat(text)
    except ValueError:
        raise TraceError(f"{where}: {column} {text!r} is neither epoch seconds nor an ISO time") from None
    return (t if t.tzinfo else t.replace(tzinfo=dt.timezone.utc)).timestamp()


def _iso(ts: float) -> str:
    return dt.datetime.fromtimestamp(ts, dt.timezone.utc).strftime("%Y-%m-%d %H:%M")
