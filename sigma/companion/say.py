"""Results in words an admin reads: durations in s/min/h, times in the site's timezone, node and job names, rule ids
with what they mean."""

from __future__ import annotations

import os
import re
from datetime import datetime, tzinfo
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from sigma.companion.compose import Built
from sigma.companion.parse import Query
from sigma.companion.words import plain

NOUNS = {"incidents": "incident", "drains": "drain", "reboots": "reboot", "restarts": "restart (requeue)",
         "out_of_service": "time out of service", "stages": "lifecycle stage", "remediation": "node in remediation",
         "nodes": "node", "snapshots": "SLURM state change", "health": "health-check result",
         "checkpoints": "checkpoint", "events": "event", "kpis": "KPI line", "samples": "sample",
         "actions": "action", "losses": "job loss as the controller recorded it",
         "checkpoint_requests": "checkpoint request"}


# A default taken for one value of several rows: (what it is, the words that ask for the others).
ASSUMED = {"latest": ("the last", "'each' or 'first'"), "sum": ("the total", "'each' or 'average'"),
           "avg": ("the average", "'each' or 'total'")}


def site_tz(name: str | None = None) -> tzinfo | None:
    """The site's timezone: NAME, else $SIGMA_TIMEZONE, else None (this machine's local time)."""
    name = name or os.environ.get("SIGMA_TIMEZONE")
    if not name:
        return None
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        raise ValueError(f"unknown timezone {name!r} (an IANA name such as Europe/Berlin)") from None


def when(ts, tz: tzinfo | None) -> str:
    if ts is None:
        return "never"
    return datetime.fromtimestamp(float(ts), tz).astimezone(tz).strftime("%Y-%m-%d %H:%M:%S %Z").strip()


def duration(seconds) -> str:
    if seconds is None:
        return "not yet"
    s = float(seconds)
    if abs(s) < 120:
        return f"{s:.1f} s"
    if abs(s) < 7200:
        return f"{s / 60:.1f} min"
    return f"{s / 3600:.1f} h"


def value(v, unit: str, tz: tzinfo | None) -> str:
    if v is None:
        return "none"
    if unit == "time":
        return when(v, tz)
    if unit == "s":
        return duration(v)
    if unit == "%":
        return f"{float(v):.1f} %"
    if unit == "bytes":
        return f"{float(v) / 2**30:.2f} GiB"
    if unit == "/s":
        return f"{float(v):,.1f}/s"
    if isinstance(v, float):
        v = f"{v:.3g}" if abs(v) < 1000 else f"{v:,.0f}"
    return f"{v} {unit}" if unit in ("GiB", "MiB", "GB", "MB", "min", "h") else str(v)


PLURALS = {"restart (requeue)": "restarts (requeues)", "time out of service": "times out of service",
           "node in remediation": "nodes in remediation",
           "job loss as the controller recorded it": "job losses as the controller recorded them"}


def noun(q: Query, n: int | None = None) -> str:
    word = NOUNS.get(q.entity.name, q.entity.name.replace("_", " "))
    return word if n == 1 else plural(word)


def plural(word: str) -> str:
    return PLURALS.get(word) or (word if word.endswith("s") else word + "s")


def scope(q: Query) -> str:
    bits = [c.label for c in q.conds]
    if q.rules:
        bits.append("rule " + " or ".join(r.replace("%", "*") for r in q.rules))
    if q.nodes:
        bits.append("on " + ", ".join(q.nodes))
    if q.jobs:
        bits.append("of job " + ", ".join(map(str, q.jobs)))
    if q.without is not None:   # "drained but never rebooted"
        bits.append(f"{q.project or 'those'} never in {q.without.name.replace('_', ' ')}")
    for ref, values in q.exclude.items():   # "excluding xid", "except on node1"
        bits.append(f"not {ref} " + " or ".join(str(v).replace("%", "*") for v in values))
    if q.cmp:
        op, v, unit = q.cmp
        bits.append(f"{q.measure.name if q.measure else 'value'} {op} {duration(v) if unit == 's' else f'{v:g}'}")
    if q.having:
        times = {1: "once", 2: "twice"}.get(int(q.having[1]), f"{q.having[1]:g} times")
        bits.append(f"more than {times}" if q.having[0] == ">" else f"count {q.having[0]} {q.having[1]:g}")
    if q.period:
        bits.append(q.period)
    return (" (" + "; ".join(bits) + ")") if bits else ""


def reading(q: Query) -> str:
    """One reading of a question in words: what it counts or lists, filtered how, and its measure."""
    measure = f", {column_words(q.measure.name)}" if q.measure else ""
    means = [f"{r}: {plain(r)}" for r in q.rules if "%" not in r and plain(r) != r]
    named = f", '{q.noun_of_name}' read as part of the name" if q.noun_of_name else ""
    return f"{noun(q)}{scope(q)}{measure}{named}" + (f" — {'; '.join(means)}" if means else "")


def column_words(column: str) -> str:
    """A column's name in words: requeued_at -> 'requeued at', recovery_s -> 'recovery', n_with_drains -> 'of them
    with drains' (a count of some of the rows)."""
    return re.sub(r"^n ", "of them ", re.sub(r"_(s|id|per_s)$", "", column).replace("_", " "))


def say(q: Query, b: Built, columns: list[str], rows: list[tuple], tz: tzinfo | None) -> str:
    units = b.units
    fmt = lambda col, v: value(v, units.get(col, ""), tz)  # noqa: E731
    what = noun(q) + scope(q)
    if b.shape == "hypo":
        action = {"drain": "Draining", "reboot": "Rebooting", "down": "Losing"}[q.hypo]
        nodes = ", ".join(q.nodes)
        if not rows:
            return f"{action} {nodes} now would interrupt no job: none is running there (latest SLURM state)."
        jobs = sorted({r[1] for r in rows})
        verb = "would stop new work there; SLURM lets running jobs finish" if q.hypo == "drain" else \
            "would interrupt"
        return (f"{action} {nodes} now: job(s) {', '.join(map(str, jobs))} run there (latest SLURM state); "
                f"{'it ' + verb if q.hypo == 'drain' else 'that ' + verb + ' them'}.")
    if b.shape == "parts":   # one value over the rows, and over the parts each merges
        if b.value == "n":
            return f"{rows[0][0]} {noun(q, rows[0][0])}{scope(q)}, written as {rows[0][1]} {q.entity.parts[0]}."
        label = column_words(b.value).replace("avg ", "average ")
        return (f"{label[0].upper() + label[1:]} — {noun(q)}{scope(q)}: {fmt(b.value, rows[0][0])}; over their "
                f"{q.entity.parts[0]}: {fmt(columns[1], rows[0][1])}.")
    if b.shape == "versus":   # one value of two periods
        if b.value == "n":
            return f"{rows[0][0]} {noun(q, rows[0][0])}{scope(q)}; {rows[0][1]} {q.versus.words}."
        label = column_words(b.value).replace("avg ", "average ")
        return (f"{label[0].upper() + label[1:]} — {noun(q)}{scope(q)}: {fmt(b.value, rows[0][0])}; "
                f"{q.versus.words}: {fmt(columns[1], rows[0][1])}.")
    if b.shape == "scalar":
        v = rows[0][columns.index(b.value)] if rows and b.value in columns else (rows[0][0] if rows else None)
        if b.value == "n" and q.count_distinct and q.project:   # "how many ranks": different values, not rows
            text = f"{v} different {plural(column_words(q.project))} — {what}."
        elif b.value == "n":
            text = f"{v} {noun(q, v)}{scope(q)}."
            if "n_all" in columns:   # "out of all ...": and how many there are in all
                text = text[:-1] + f", out of {rows[0][columns.index('n_all')]} in all."
            text += "".join(f" {column_words(c)[0].upper() + column_words(c)[1:]}: {fmt(c, x)}."
                            for c, x in zip(columns, rows[0] if rows else []) if c in b.extras)
        else:
            label = column_words(b.value).replace("avg ", "average ").replace("sum ", "total ")
            label = ("last " if q.assumed == "latest" else "") + label
            text = f"{label[0].upper() + label[1:]} — {what}: {fmt(b.value, v)}."
            if q.assumed and rows and b.extras:   # a default taken for one value of several rows: said, with how many
                n = rows[0][columns.index(b.extras[0])]
                which, others = ASSUMED[q.assumed]
                text = text[:-1] + f" ({which} of {n}; ask for {others} to see the others)."
        if q.qkind == "yesno":
            text = ("Yes. " if v else "No. ") + text
        return text
    if b.shape == "groups" or b.shape == "ranking":
        if not rows:
            return f"No {what}."
        width = len(columns) - len(b.extras)   # the second part's columns come last, beside the value
        keys = " and ".join(column_words(c) for c in columns[:width - 1])
        measure = ("count" if not q.distinct_of else f"different {plural(column_words(q.distinct_of))}") \
            if columns[width - 1] == "n" else column_words(columns[width - 1]).replace("avg ", "average ")
        most = "The least" if q.rank == "min" else "The most"
        head = f"{most}, by {measure}" if b.shape == "ranking" else f"{measure[0].upper() + measure[1:]} per {keys}"
        parts = [" / ".join(fmt(c, r[i]) for i, c in enumerate(columns[:width - 1]))
                 + (": " if width > 1 else "") + fmt(columns[width - 1], r[width - 1])
                 + "".join(f", {column_words(c)} {fmt(c, v)}" for c, v in zip(columns[width:], r[width:]))
                 for r in rows[:10]]
        more = f" and {len(rows) - 10} more" if len(rows) > 10 else ""
        return f"{head} — {what}: " + "; ".join(parts) + more + "."
    if not rows:
        return ("No. " if q.qkind == "yesno" else "") + f"No {what}."
    def row_words(r):
        return ", ".join(f"{column_words(c)} {fmt(c, v)}" + (f" ({plain(v)})" if c == "rule_id" and plain(v) != v
                                                               else "")
                         for c, v in zip(columns, r) if v not in (None, ""))
    if b.shape == "latest":
        lead = "The latest" if q.order == "latest" else "The first"
        return f"{lead} {noun(q, 1)}{scope(q)}: " + row_words(rows[0]) + "."
    if len(columns) == 1:
        listing = ", ".join(fmt(columns[0], r[0]) for r in rows[:12]) + (" ..." if len(rows) > 12 else "")
        return ("Yes. " if q.qkind == "yesno" else "") + f"{len(rows)} {what}: {listing}."
    first = "; ".join(row_words(r) for r in rows[:3])
    more = f" (and {len(rows) - 3} more)" if len(rows) > 3 else ""
    return ("Yes. " if q.qkind == "yesno" else "") + f"{len(rows)} {noun(q, len(rows))}{scope(q)}: {first}{more}."
