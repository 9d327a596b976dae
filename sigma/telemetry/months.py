"""Month and weekday names in every locale glibc knows, for time stamps that `journalctl`, `dmesg -T` and syslog
daemons print in the node's locale (`lis 27`, `11月 27`, `jan. 29`, `[wo jul 28 ...]`).

A name can mean different months in different locales (`lis` is November in Polish and Czech, October in Croatian):
`months(name)` gives every month it can mean, and the parser picks the one that puts the line closest to now, as it
does for the missing year. months.json is generated from glibc's locale sources:

    python -m sigma.telemetry.months /usr/share/i18n/locales > sigma/telemetry/months.json
"""

from __future__ import annotations

import functools
import json
import re
import sys
from pathlib import Path

_DATA = Path(__file__).with_name("months.json")


@functools.lru_cache(maxsize=1)
def _tables() -> tuple[dict[str, tuple[int, ...]], frozenset[str]]:
    data = json.loads(_DATA.read_text(encoding="utf-8"))
    return {k: tuple(v) for k, v in data["months"].items()}, frozenset(data["weekdays"])


def months(name: str) -> tuple[int, ...]:
    """Every month (1-12) an abbreviated month name can mean in some locale; () for no month name."""
    return _tables()[0].get(name.casefold(), ())


def is_weekday(name: str) -> bool:
    return name.casefold() in _tables()[1]


# ---------- generation from glibc's locale sources ----------

_UCODE = re.compile(r"<U([0-9A-Fa-f]{4,8})>")


def _values(text: str) -> list[str]:
    return [_UCODE.sub(lambda m: chr(int(m.group(1), 16)), s) for s in re.findall(r'"([^"]*)"', text)]


def _lc_time(directory: Path, name: str, seen: set[str]) -> dict[str, list[str]]:
    """The LC_TIME keywords of one locale source (following `copy`)."""
    if name in seen or not (directory / name).is_file():
        return {}
    seen.add(name)
    comment, escape = "%", "/"
    section, keyword, values, inside = {}, None, "", False
    for raw in (directory / name).read_text(encoding="utf-8", errors="replace").splitlines():
        if raw.startswith("comment_char"):
            comment = raw.split()[1]
        elif raw.startswith("escape_char"):
            escape = raw.split()[1]
        line = raw.strip()
        if not inside:
            inside = line == "LC_TIME"
            continue
        if line.startswith("END LC_TIME"):
            break
        if keyword is None:
            if not line or line.startswith(comment):
                continue
            word, _, rest = line.partition(" ")
            if word == "copy":
                return {**_lc_time(directory, _values(rest)[0], seen), **section}
            keyword, values = word, rest
        else:
            values += line
        if values.rstrip().endswith(escape):
            values = values.rstrip()[:-1]
            continue
        section[keyword] = _values(values)
        keyword = None
    return section


def generate(directory: Path) -> dict:
    months_of: dict[str, set[int]] = {}
    weekdays: set[str] = set()
    for path in sorted(directory.iterdir()):
        time_section = _lc_time(directory, path.name, set())
        for key in ("abmon", "ab_alt_mon"):
            for i, name in enumerate(time_section.get(key, [])[:12], start=1):
                if name.strip():
                    months_of.setdefault(name.strip().casefold(), set()).add(i)
        weekdays.update(n.strip().casefold() for n in time_section.get("abday", []) if n.strip())
    return {"source": "glibc localedata (abmon, ab_alt_mon, abday of every locale)",
            "months": {k: sorted(v) for k, v in sorted(months_of.items())}, "weekdays": sorted(weekdays)}


if __name__ == "__main__":
    json.dump(generate(Path(sys.argv[1] if len(sys.argv) > 1 else "/usr/share/i18n/locales")), sys.stdout,
              ensure_ascii=False, indent=0, sort_keys=True)
    print()
