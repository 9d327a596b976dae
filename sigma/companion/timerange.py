"""Time ranges in the forms people write, read in the site's timezone: "in the last 3 hours", "past day", "today",
"yesterday", "this afternoon", "this week", "last week", "since Tuesday", "since 10:30", "since 2026-11-20",
"between 10:00 and 10:30", "from 10:00 to 10:30", "before 10:00", "after 10:00", "from 15:00 on", "since midnight",
"in the last half hour", "since yesterday", "before today",
"since 2 hours ago". Each match says which characters of the question it used, so the parser knows those words are
understood."""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime, timedelta, tzinfo

WEEKDAYS = ("monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday")
UNITS = {"second": 1, "sec": 1, "s": 1, "minute": 60, "min": 60, "m": 60, "hour": 3600, "hr": 3600, "h": 3600,
         "day": 86400, "d": 86400, "week": 604800, "month": 30 * 86400}
COUNT = r"(\d+|a|an|one|two|three|four|five|six|seven|eight|nine|ten|twelve|twenty-four|few|couple of)"
COUNTS = {"a": 1, "an": 1, "one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7, "eight": 8,
          "nine": 9, "ten": 10, "twelve": 12, "twenty-four": 24, "few": 3, "couple of": 2}
CLOCK = r"(\d{1,2})(?::(\d{2}))?\s*(am|pm)?"
DAY_PARTS = {"afternoon": (12, 18), "evening": (18, 24)}   # hours of the day; "this morning" is since midnight
UNIT = r"(seconds?|secs?|minutes?|mins?|hours?|hrs?|days?|weeks?|months?)"


@dataclass
class TimeRange:
    since: float | None
    until: float | None
    words: str                       # the words it came from, for the answer
    spans: list[tuple[int, int]]     # character spans of the question it used


def _unit(word: str) -> int:
    word = word.rstrip("s") if word not in ("s",) else word
    return UNITS.get(word, UNITS.get(word + "s", 0)) or UNITS[word[:3]]


def _clock(day: datetime, h: str, m: str | None, ampm: str | None) -> datetime:
    hour = int(h) % 12 + (12 if ampm == "pm" else 0) if ampm else int(h)
    return day.replace(hour=hour, minute=int(m or 0), second=0, microsecond=0)


def find(q: str, now: float, tz: tzinfo | None) -> TimeRange | None:
    """The time range in the normalised question q, or None."""
    local = datetime.fromtimestamp(now, tz).astimezone(tz)
    midnight = local.replace(hour=0, minute=0, second=0, microsecond=0)
    week = midnight - timedelta(days=midnight.weekday())

    def out(m, since, until):
        return TimeRange(since.timestamp() if since else None, until.timestamp() if until else None,
                         m.group(0).strip(), [m.span()])

    m = re.search(r"\b(?:between|from) " + CLOCK + r" (?:and|to|until|till|-) " + CLOCK + r"\b", q)
    if m:
        start, end = _clock(midnight, *m.group(1, 2, 3)), _clock(midnight, *m.group(4, 5, 6))
        if start > local:  # a clock range later than now today means yesterday's
            start, end = start - timedelta(days=1), end - timedelta(days=1)
        return out(m, start, end if end > start else end + timedelta(days=1))
    # a day or week as the bound of an open range: "since yesterday" is from yesterday's start on, "before today"
    # until today's start; "since 2 hours ago" from that instant
    days = {"yesterday": (midnight - timedelta(days=1)), "today": midnight, "this morning": midnight,
            "midnight": midnight, "this week": week, "last week": week - timedelta(days=7)}
    m = re.search(r"\b(since|after|from|before|until) (yesterday|today|this morning|midnight|this week|last week)\b",
                  q)
    if m:
        start = days[m.group(2)]
        return out(m, start, None) if m.group(1) in ("since", "after", "from") else out(m, None, start)
    m = re.search(r"\b(since|after|from|before|until) " + COUNT + r" ?" + UNIT + r" ago\b", q)
    if m:
        n = COUNTS.get(m.group(2), None)
        at = local - (int(m.group(2)) if n is None else n) * timedelta(seconds=_unit(m.group(3)))
        return out(m, at, None) if m.group(1) in ("since", "after", "from") else out(m, None, at)
    m = re.search(r"(?<!the )(?<!past )\blast week\b", q)
    if m:  # the calendar week before this one ("in the last week" is the past 7 days)
        return out(m, week - timedelta(days=7), week)
    m = re.search(r"\b(?:in |over |during |within )?(?:the )?(?:last|past|previous) " + COUNT + r"? ?" + UNIT + r"\b",
                  q)
    if m:
        n = COUNTS.get(m.group(1), None) if m.group(1) else 1
        n = int(m.group(1)) if n is None else n
        return TimeRange(now - n * _unit(m.group(2)), None, m.group(0).strip(), [m.span()])
    m = re.search(r"\b(?:in |over |during |within )?(?:the )?(?:last|past|previous) half(?: an?)? (hour|day)\b", q)
    if m:   # "in the last half hour"
        return TimeRange(now - _unit(m.group(1)) / 2, None, m.group(0).strip(), [m.span()])
    m = re.search(r"\b(?:in the )?(?:last|past) (hour|day|week|month)\b", q)
    if m:
        return TimeRange(now - _unit(m.group(1)), None, m.group(0).strip(), [m.span()])
    m = re.search(r"\b(this|yesterday) (afternoon|evening)\b", q)
    if m:  # a part of a day: its hours on that day ("this afternoon" is 12:00-18:00 today)
        day = midnight - timedelta(days=1 if m.group(1) == "yesterday" else 0)
        start, end = DAY_PARTS[m.group(2)]
        return out(m, day + timedelta(hours=start), day + timedelta(hours=end))
    m = re.search(r"\b(?:so far )?today\b|\bthis morning\b", q)
    if m:
        return out(m, midnight, None)
    m = re.search(r"\byesterday\b", q)
    if m:
        return out(m, midnight - timedelta(days=1), midnight)
    m = re.search(r"\b(?:during |in )?this week\b", q)
    if m:
        return out(m, week, None)
    m = re.search(r"\bsince (?:last )?(" + "|".join(WEEKDAYS) + r")\b", q)
    if m:
        back = (midnight.weekday() - WEEKDAYS.index(m.group(1))) % 7 or 7
        return out(m, midnight - timedelta(days=back), None)
    m = re.search(r"\b(since|after|before|until) (\d{4}-\d{2}-\d{2})(?:[t ](\d{1,2}):(\d{2}))?\b", q)
    if m:
        d = datetime.fromisoformat(m.group(2)).replace(tzinfo=tz)
        d = d.replace(hour=int(m.group(3) or 0), minute=int(m.group(4) or 0))
        return out(m, d, None) if m.group(1) in ("since", "after") else out(m, None, d)
    m = re.search(r"\b(since|after|before|until) " + CLOCK + r"\b", q) or re.search(
        r"\b(from) " + CLOCK + r" (?:on|onwards?)\b", q)
    if m and (m.group(3) or m.group(4)):  # "since 10:30", "after 9 pm", "from 15:00 on"; not "since 3" (a count)
        t = _clock(midnight, *m.group(2, 3, 4))
        if t > local:
            t -= timedelta(days=1)
        return out(m, t, None) if m.group(1) in ("since", "after", "from") else out(m, None, t)
    return None


# the second period of a comparison, named from the first: "vs the hour before that", "compared with after"
VERSUS = re.compile(r"\b(?:vs\.?|versus|compared (?:with|to)|against)\s+(?:the\s+)?(?:(?P<unit>minute|hour|day|week)"
                    r"\s+before(?:\s+(?:that|it))?|previous\s+(?P<prev>minute|hour|day|week)|(?P<side>after|before)"
                    r"(?:\s+(?:that|it))?)(?!\s*\d)\b")


def versus(q: str, first: TimeRange) -> TimeRange | None:
    """The period a comparison sets beside the question's time range, or None where none is named or it does not
    follow from that range: the unit before a range that starts somewhere ("in the last hour vs the hour before
    that"), the other side of a range open on one side ("before 16:00 compared with after")."""
    m = VERSUS.search(q, max(end for _, end in first.spans))
    if not m:
        return None
    unit = m.group("unit") or m.group("prev")
    if unit and first.since is not None:
        since, until = first.since - UNITS[unit], first.since
    elif m.group("side") == "after" and first.until is not None and first.since is None:
        since, until = first.until, None
    elif m.group("side") == "before" and first.since is not None and first.until is None:
        since, until = None, first.since
    else:
        return None
    return TimeRange(since, until, m.group(0).split(None, 1)[1] if not m.group(0).startswith("compared") else
                     m.group(0).split(None, 2)[2], [m.span()])
