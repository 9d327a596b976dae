"""Reject regular expressions whose matching time can explode (catastrophic backtracking).

A rule's message regex runs on every log line the controller receives, so one like `(a+)+$` could stall the
daemon on a crafted line. Two checks, both needed: a structural one (an unbounded repeat inside another
unbounded repeat, the classic exponential shape) and a bounded-time probe with the `regex` module, which can
stop a match after a timeout, on adversarial inputs built from the pattern's own literals.
"""

from __future__ import annotations

import re
import re._parser as sre_parse  # the stdlib parser `re` itself uses (sre_parse before 3.11)

import regex

PROBE_TIMEOUT_S = 0.05  # a safe pattern searches a few kB in microseconds
PROBE_LENGTH = 4000
_REPEATS = {sre_parse.MAX_REPEAT, sre_parse.MIN_REPEAT, getattr(sre_parse, "POSSESSIVE_REPEAT", None)}
_UNBOUNDED = sre_parse.MAXREPEAT


class UnsafeRegex(ValueError):
    """A regex that does not compile, or whose matching time is not bounded."""


def check_regex(pattern: str, what: str = "regex") -> None:
    """Raise UnsafeRegex naming `what` when pattern is invalid or catastrophic."""
    try:
        parsed = sre_parse.parse(pattern)
    except re.error as exc:
        raise UnsafeRegex(f"{what}: invalid regex {pattern!r}: {exc}") from None
    if _nested_unbounded(parsed, inside=False):
        raise UnsafeRegex(f"{what}: regex {pattern!r} nests an unbounded repeat inside another "
                          f"(catastrophic backtracking); rewrite it without the nested quantifier")
    compiled = regex.compile(pattern)
    for probe in _probes(pattern):
        try:
            compiled.search(probe, timeout=PROBE_TIMEOUT_S)
        except TimeoutError:
            raise UnsafeRegex(f"{what}: regex {pattern!r} took more than {PROBE_TIMEOUT_S * 1000:.0f} ms on a "
                              f"{len(probe)}-character line (catastrophic backtracking)") from None


def _nested_unbounded(items, inside: bool) -> bool:
    for op, arg in items:
        if op in _REPEATS:
            lo, hi, sub = arg
            unbounded = hi == _UNBOUNDED or hi > 100
            if unbounded and inside:
                return True
            if _nested_unbounded(sub, inside or unbounded):
                return True
        elif op == sre_parse.SUBPATTERN:
            if _nested_unbounded(arg[-1], inside):
                return True
        elif op == sre_parse.BRANCH:
            if any(_nested_unbounded(branch, inside) for branch in arg[1]):
                return True
        elif op in (sre_parse.ASSERT, sre_parse.ASSERT_NOT):
            if _nested_unbounded(arg[1], inside):
                return True
    return False


def _probes(pattern: str) -> list[str]:
    """Long near-misses: the pattern's literal characters repeated, then a character that breaks the match."""
    literals = "".join(ch for ch in re.sub(r"\\.", "", pattern) if ch.isalnum() or ch in " _-:.") or "a"
    return [(literals * (PROBE_LENGTH // len(literals) + 1))[:PROBE_LENGTH] + "\x00",
            ("a" * PROBE_LENGTH) + "!", (" " * PROBE_LENGTH) + "!"]
