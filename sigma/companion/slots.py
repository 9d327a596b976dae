"""Slots of a question, parsed without a language model: nodes, jobs, rules (by id or by the words people use for
them), a time range in the forms people write ("this week", "last 2 hours", "since Tuesday", "since 10:00",
"yesterday", an ISO date) and "top N". Unknown node or job names are kept so the answer can say they are unknown.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from datetime import datetime, timedelta

# Words people use for a fault -> SQL LIKE patterns over incidents.rule_id.
RULE_WORDS: dict[str, tuple[str, ...]] = {
    r"\bxids?\b": ("gpu-xid-%",),
    r"\bgpu\b.*\b(fell|fallen) off\b|\boff the bus\b": ("gpu-xid-79",),
    r"\bhang(s|ing)?\b|\bhung\b|\bstuck\b": ("watchdog-hang", "watchdog-proc-hang"),
    r"\bnan\b|\bnot a number\b": ("kpi-nan%",),
    r"\bstragglers?\b|\bslow(down|er)?\b|\boutliers?\b|\bisolat": ("isolation-outlier", "watchdog-throughput-drop"),
    r"\bthroughput\b": ("watchdog-throughput-drop",),
    r"\bprolog\b": ("health-prolog-%",),
    r"\bepilog\b": ("health-epilog-%",),
    r"\bnode death\b|\bnot responding\b|\bdied\b|\bdead\b|\bunreachable\b": ("slurm-node-not-responding",),
    r"\bcrash[- ]?loop": ("watchdog-crash-loop",),
    r"\becc\b|\bmemory errors?\b": ("%ecc%", "%edac%"),
    r"\binfiniband\b|\bib\b|\blink down\b|\blost carrier\b": ("%ib%", "%carrier%", "%link%"),
}

# How rule and detector ids start (gpu-xid-79, watchdog-hang, ...): such a token names a rule, not a node.
RULE_PREFIXES = ("gpu-xid", "xid", "watchdog-", "isolation-", "health-", "kpi-", "slurm-", "ib-", "mem-")
WEEKDAYS = ("monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday")
UNITS = {"second": 1, "sec": 1, "minute": 60, "min": 60, "hour": 3600, "hr": 3600, "day": 86400, "week": 604800}


@dataclass
class Slots:
    nodes: list[str] = field(default_factory=list)
    unknown_nodes: list[str] = field(default_factory=list)
    jobs: list[int] = field(default_factory=list)
    rules: list[str] = field(default_factory=list)      # LIKE patterns over incidents.rule_id
    since: float | None = None
    until: float | None = None
    period: str = ""                                    # the words the range came from, for the answer
    top: int | None = None


def _midnight(t: float) -> float:
    d = datetime.fromtimestamp(t)
    return datetime(d.year, d.month, d.day).timestamp()


def parse_range(q: str, now: float) -> tuple[float | None, float | None, str]:
    """(since, until, words) for the time range in q; (None, None, '') when it has none."""
    m = re.search(r"\b(?:in the |over the |during the )?(?:last|past) (\d+|a|an|one|few)? ?"
                  r"(second|sec|minute|min|hour|hr|day|week)s?\b", q)
    if m:
        n = {"a": 1, "an": 1, "one": 1, "few": 3, None: 1}.get(m.group(1), None)
        n = n if n is not None else int(m.group(1))
        return now - n * UNITS[m.group(2)], None, m.group(0).strip()
    if re.search(r"\btoday\b", q):
        return _midnight(now), None, "today"
    if re.search(r"\byesterday\b", q):
        return _midnight(now) - 86400, _midnight(now), "yesterday"
    if re.search(r"\bthis week\b", q):
        d = datetime.fromtimestamp(_midnight(now))
        return (d - timedelta(days=d.weekday())).timestamp(), None, "this week"
    if re.search(r"\blast week\b", q):
        d = datetime.fromtimestamp(_midnight(now))
        start = d - timedelta(days=d.weekday() + 7)
        return start.timestamp(), (start + timedelta(days=7)).timestamp(), "last week"
    m = re.search(r"\bsince (" + "|".join(WEEKDAYS) + r")\b", q)
    if m:
        d = datetime.fromtimestamp(_midnight(now))
        back = (d.weekday() - WEEKDAYS.index(m.group(1))) % 7 or 7
        return (d - timedelta(days=back)).timestamp(), None, m.group(0)
    m = re.search(r"\bsince (\d{4}-\d{2}-\d{2})(?:[t ](\d{1,2}:\d{2}))?", q)
    if m:
        text = m.group(1) + (" " + m.group(2) if m.group(2) else "")
        fmt = "%Y-%m-%d %H:%M" if m.group(2) else "%Y-%m-%d"
        return datetime.strptime(text, fmt).timestamp(), None, m.group(0)
    m = re.search(r"\bsince (\d{1,2}):(\d{2})\b", q)
    if m:
        t = _midnight(now) + int(m.group(1)) * 3600 + int(m.group(2)) * 60
        return (t if t <= now else t - 86400), None, m.group(0)
    return None, None, ""


def parse(question: str, known_nodes: set[str], *, now: float | None = None) -> Slots:
    now = time.time() if now is None else now
    q = question.lower()
    s = Slots()
    for token in re.findall(r"[a-z][a-z0-9_.-]*\d[a-z0-9_-]*", q):
        token = token.rstrip(".-")
        if token in known_nodes:
            s.nodes.append(token)
        elif re.fullmatch(r"node\d+|[a-z]+(?:-[a-z0-9]+)*-\d+", token) and not token.startswith(RULE_PREFIXES):
            s.unknown_nodes.append(token)
    for a, b in re.findall(r"\bjobs? ?(?:id )?#?(\d+)\b|#(\d+)\b", q):
        s.jobs.append(int(a or b))
    for pattern, likes in RULE_WORDS.items():
        if re.search(pattern, q):
            s.rules.extend(x for x in likes if x not in s.rules)
    for rid in re.findall(r"\b([a-z]+(?:-[a-z0-9]+)+)\b", q):
        if rid.startswith(RULE_PREFIXES):
            s.rules = [rid]
            break
    m = re.search(r"\bxid[- ]?(\d+)\b", q)
    if m:
        s.rules = [f"gpu-xid-{m.group(1)}"]
    s.since, s.until, s.period = parse_range(q, now)
    m = re.search(r"\btop (\d+)\b|\b(\d+) (?:most|worst|busiest|least)\b", q)
    if m:
        s.top = int(m.group(1) or m.group(2))
    return s
