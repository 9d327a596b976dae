"""The failure-signature rule schema: one rule = one known fault, how to recognise it and what to do.

A rule file (`configs/rules/*.yaml` or `*.yml`) holds `version:` and `rules:`, a list of Rule mappings. Exactly
one of the match kinds (log, metric, health, kpi, composite) is set per rule.

Adding a condition kind: a dataclass for its settings (validated in __post_init__), a field of that name on Rule
(default None), an entry in MATCH_KINDS below, and its evaluator in sigma.rules.matcher.EVALUATORS.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from functools import cached_property
from typing import Literal

Scope = Literal["node", "job"]
Severity = Literal["info", "warning", "error", "critical"]
Action = Literal["record", "notify", "drain", "drain+reboot", "drain+ticket", "requeue"]
Op = Literal["<", "<=", ">", ">=", "==", "!="]
Agg = Literal["last", "min", "max", "mean", "count", "delta", "range"]

DRAIN_ACTIONS = ("drain", "drain+reboot", "drain+ticket")
CLAIMED_SOURCE = "service"  # events of lines whose writer the line names itself (telemetry's services section)


def _listed(value) -> list:
    return [value] if isinstance(value, str) else list(value)


OPS = {"<": lambda a, b: a < b, "<=": lambda a, b: a <= b, ">": lambda a, b: a > b,
       ">=": lambda a, b: a >= b, "==": lambda a, b: a == b, "!=": lambda a, b: a != b}


@dataclass
class LogMatch:
    """Discrete events rows (kernel-log signatures, NVML events, KPI events)."""

    source: str | list[str] = "log"  # events.source (or a list): 'log', 'nvml', 'kpi', 'sidecar'
    kinds: list[str] = field(default_factory=list)  # events.kind values (glob patterns); empty = any
    fields: dict[str, list[str | int | float | bool]] = field(default_factory=dict)  # events.fields key ->
    # accepted values (always a list, even of one value)
    message: str = ""  # regex searched in events.message; empty = any
    count: int = 1  # at least this many matching events ...
    window_s: float = 600.0  # ... within this many seconds
    weight: str = ""  # an events.fields key whose number says how many occurrences one event reports (EDAC's
    # "262 CE" line is 262 corrected errors): count compares with their sum; empty or absent = 1 per event
    min_uptime_s: float | None = None  # only events the node logged at least this long after it booted (fields
    # uptime_s, set by the sidecar); an event whose uptime is unknown matches
    max_uptime_s: float | None = None  # only events logged within this many seconds of boot; unknown: no match

    def __post_init__(self):
        _check_regex(self.message, "message")
        _check_count(self.count, self.window_s)
        for name in ("min_uptime_s", "max_uptime_s"):
            value = getattr(self, name)
            if value is not None and not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0):
                raise ValueError(f"{name} must be a number of seconds >= 0, not {value!r}")
        if self.min_uptime_s is not None and self.max_uptime_s is not None and self.min_uptime_s >= self.max_uptime_s:
            raise ValueError("min_uptime_s must be below max_uptime_s")


@dataclass
class MetricMatch:
    """A condition on samples of one metric over a window, per node (and per label set, e.g. per GPU)."""

    metric: str  # samples.metric
    op: Op  # comparison of the aggregate with value
    value: float  # threshold
    agg: Agg = "last"  # aggregate over the window: last min max mean count delta (last-first) range (max-min)
    labels: dict[str, str] = field(default_factory=dict)  # only samples whose labels contain these
    window_s: float = 300.0  # window the aggregate covers
    min_samples: int = 1  # fewer samples than this in the window: no verdict

    def __post_init__(self):
        if self.window_s <= 0 or self.min_samples < 1:
            raise ValueError("window_s must be > 0 and min_samples >= 1")


HEALTH_STATUSES = ("pass", "fail", "skip", "error", "timeout", "accept", "reject")


@dataclass
class HealthMatch:
    """Health-check results (events with source 'health', kind = check name, severity = status)."""

    checks: list[str] = field(default_factory=list)  # check names (glob patterns); empty = any
    categories: list[str] = field(default_factory=list)  # fields.category values; empty = any
    suites: list[str] = field(default_factory=list)  # fields.suite values (prolog, epilog, ...); empty = any
    # check statuses, or a suite's verdict (check suite.<suite>, status reject)
    statuses: list[str] = field(default_factory=lambda: ["fail", "error", "timeout"])
    count: int = 1  # at least this many failing results ...
    window_s: float = 600.0  # ... within this many seconds

    def __post_init__(self):
        bad = [s for s in self.statuses if s not in HEALTH_STATUSES]
        if bad:
            raise ValueError(f"unknown statuses {bad}; valid: {' '.join(HEALTH_STATUSES)}")
        _check_count(self.count, self.window_s)


@dataclass
class KpiMatch:
    """A condition on a job's KPIs (kpis rows) over a window."""

    field: Literal["loss", "grad_norm", "step_time_s", "tokens_per_s", "mfu"]  # kpis column
    nonfinite: bool = False  # match NaN/Inf values (op/value are then ignored)
    op: Op | None = None  # comparison of the aggregate with value
    value: float | None = None  # threshold
    agg: Agg = "last"  # aggregate over the window
    window_s: float = 300.0  # window the aggregate covers

    def __post_init__(self):
        if not self.nonfinite and (self.op is None or self.value is None):
            raise ValueError("a kpi match needs either nonfinite: true or both op and value")


@dataclass
class Rule:
    """One known fault. origin (set by the loader, not a YAML key) is 'file:line [rules.N.id]'; a site override
    (sigma.rules.overrides) sets overridden and keeps the shipped action."""

    id: str  # stable identifier, used in drain reasons (`sigma: <id> ...`)
    description: str  # what the fault is, in one line
    severity: Severity  # how bad it is
    action: Action  # what the controller does when it matches
    scope: Scope = "node"  # the node is at fault, or only the job
    version: int = 1  # bump when the match or the action changes
    category: str = ""  # remediation playbook category (gpu, nvlink, network, disk, kernel, ...)
    summary: str = ""  # short text in the drain reason (default: description)
    log: LogMatch | None = None  # match on events rows
    metric: MetricMatch | None = None  # match on samples
    health: HealthMatch | None = None  # match on health-check results
    kpi: KpiMatch | None = None  # match on job KPIs
    composite: Composite | None = None  # all/any of conditions on one node (sigma/rules/composite.py)
    evidence: list[str] = field(default_factory=lambda: ["events"])  # what to keep: events samples kpis health
    requeue_jobs: bool = True  # drain actions: requeue the jobs running on the node
    shadow: bool = False  # log what would happen, do nothing
    enabled: bool = True  # false: not evaluated at all
    references: list[str] = field(default_factory=list)  # public sources for the signature and the action (URLs)
    examples: list[str] = field(default_factory=list)  # real log lines this rule acts on (tests, sigma chaos)
    origin: str = field(default="", init=False, compare=False, repr=False)
    overridden: str = field(default="", init=False, compare=False, repr=False)  # the site's override (where, why)
    shipped_action: str = field(default="", init=False, compare=False, repr=False)  # the action before it

    def __post_init__(self):
        if not re.fullmatch(r"[a-z0-9][a-z0-9.-]*", self.id):
            raise ValueError(f"rule id {self.id!r} must be lower-case letters, digits, '.', '-'")
        kinds = [k for k in MATCH_KINDS if getattr(self, k) is not None]
        if len(kinds) != 1:
            raise ValueError(f"rule {self.id}: set exactly one of {', '.join(MATCH_KINDS)} (got {kinds or 'none'})")
        if self.composite is not None and self.scope != "node":
            raise ValueError(f"rule {self.id}: a composite match needs scope: node")
        if self.kpi is not None and self.scope != "job":
            raise ValueError(f"rule {self.id}: a kpi match needs scope: job")
        if self.scope == "job" and self.action in DRAIN_ACTIONS:
            raise ValueError(f"rule {self.id}: scope job cannot {self.action} a node")
        if self.log is not None and CLAIMED_SOURCE in _listed(self.log.source) and self.action in DRAIN_ACTIONS:
            raise ValueError(f"rule {self.id}: a service's line only names its writer (anyone can log under that "
                             f"name), so a rule on source {CLAIMED_SOURCE} may notify, not {self.action} a node")
        bad = [e for e in self.evidence if e not in ("events", "samples", "kpis", "health")]
        if bad:
            raise ValueError(f"rule {self.id}: unknown evidence {bad}; valid: events samples kpis health")
        if self.examples and self.log is None:
            raise ValueError(f"rule {self.id}: examples are log lines; only a log rule can have them")

    @cached_property  # read for every rule on every tick; a rule's condition is set once, when it is made
    def match_kind(self) -> str:
        return next(k for k in MATCH_KINDS if getattr(self, k) is not None)

    @property
    def window_s(self) -> float:
        return getattr(self, self.match_kind).window_s

    @property
    def drains(self) -> bool:
        return self.action in DRAIN_ACTIONS

    @property
    def short_text(self) -> str:
        return self.summary or self.description


# The condition kinds a rule can use: Rule field name -> its settings dataclass (see the module docstring).
MATCH_KINDS: dict[str, type] = {"log": LogMatch, "metric": MetricMatch, "health": HealthMatch, "kpi": KpiMatch}


@dataclass
class RuleFile:
    version: int  # version of the knowledge-base file
    rules: list[Rule] = field(default_factory=list)  # the rules


def _check_regex(pattern: str, name: str) -> None:
    try:
        re.compile(pattern)
    except re.error as exc:
        raise ValueError(f"{name}: invalid regex {pattern!r}: {exc}") from None


def _check_count(count: int, window_s: float) -> None:
    if count < 1 or not math.isfinite(window_s) or window_s <= 0:
        raise ValueError("count must be >= 1 and window_s > 0")


# Registration of composite conditions (they build on the match kinds above, so they are imported last).
from sigma.rules.composite import Composite  # noqa: E402

MATCH_KINDS["composite"] = Composite
