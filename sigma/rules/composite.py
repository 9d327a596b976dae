"""Composite conditions: all/any of log, metric, health, kpi and peer-rank conditions on one node.

    composite:
      all:
        - log: {source: log, message: "machine check"}
        - peer_rank: {metric: gpu.ecc.corrected, top_k: 1, agg: delta, window_s: 600}

A composite rule is node-scoped: a node matches when its conditions hold together inside their windows. Leaf
conditions are evaluated by the plain matcher (one single-kind rule each), so they mean exactly what they mean
in a simple rule; `peer_rank` is new: the node is among the top_k of the job's nodes on a metric, which tells a
hardware fault on one node from the same message caused by the job everywhere. Everything is declarative: no
condition runs code, and message regexes must have bounded matching time (sigma.rules.regexcheck).
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field

from sigma.rules.regexcheck import check_regex

LEAF_KINDS = ("log", "metric", "health", "kpi", "peer_rank")


@dataclass
class PeerRank:
    """The node ranks among the top_k of its peers on a metric aggregated over the window."""

    metric: str  # samples.metric
    top_k: int = 1  # the node must be among this many highest
    agg: Agg = "max"  # aggregate per node over the window (delta for counters)
    labels: dict[str, str] = field(default_factory=dict)  # only samples whose labels contain these
    window_s: float = 300.0  # window the aggregate covers
    min_peers: int = 2  # fewer nodes than this with samples: no ranking
    min_value: float | None = None  # the node's aggregate must also be at least this (none: any)
    min_gap: float = 0.0  # ... and exceed the first node outside the top k by more than this
    peers: str = "job"  # job: the nodes of a job running on the node; all: every node with samples

    def __post_init__(self):
        if self.top_k < 1 or self.min_peers < 2 or self.window_s <= 0:
            raise ValueError("peer_rank needs top_k >= 1, min_peers >= 2 and window_s > 0")
        if self.peers not in ("job", "all"):
            raise ValueError(f"peer_rank.peers must be 'job' or 'all', not {self.peers!r}")


@dataclass
class Condition:
    """Exactly one of the keys: a leaf condition, or a nested all/any."""

    log: LogMatch | None = None  # events rows (as in a log rule)
    metric: MetricMatch | None = None  # samples of one metric (as in a metric rule)
    health: HealthMatch | None = None  # health-check results (as in a health rule)
    kpi: KpiMatch | None = None  # the KPIs of a job running on the node
    peer_rank: PeerRank | None = None  # the node ranks top-k among its peers on a metric
    all: list[Condition] | None = None  # every one of these
    any: list[Condition] | None = None  # at least one of these

    def __post_init__(self):
        kinds = [k for k in LEAF_KINDS + ("all", "any") if getattr(self, k) is not None]
        if len(kinds) != 1:
            raise ValueError(f"a condition sets exactly one of {', '.join(LEAF_KINDS)}, all, any "
                             f"(got {kinds or 'none'})")
        if self.kind in ("all", "any") and not getattr(self, self.kind):
            raise ValueError(f"{self.kind}: needs at least one condition")
        if self.log is not None and self.log.message:
            check_regex(self.log.message, "log.message")

    @property
    def kind(self) -> str:
        return next(k for k in LEAF_KINDS + ("all", "any") if getattr(self, k) is not None)

    @property
    def window_s(self) -> float:
        if self.kind in ("all", "any"):
            return max(c.window_s for c in getattr(self, self.kind))
        return getattr(self, self.kind).window_s

    def leaves(self) -> list:
        if self.kind in ("all", "any"):
            return [leaf for c in getattr(self, self.kind) for leaf in c.leaves()]
        return [self]


@dataclass
class Composite:
    """all: every condition holds on the node; any: at least one does (exactly one of both)."""

    all: list[Condition] = field(default_factory=list)  # conditions that must all hold
    any: list[Condition] = field(default_factory=list)  # conditions of which one must hold

    def __post_init__(self):
        if bool(self.all) == bool(self.any):
            raise ValueError("composite: set exactly one of all, any (a non-empty list)")

    @property
    def root(self) -> Condition:
        return Condition(all=self.all) if self.all else Condition(any=self.any)

    @property
    def window_s(self) -> float:
        return self.root.window_s

    def needs(self) -> dict:
        """What the conditions read: {'events': window, 'kpis': window, 'metrics': {name: window}}."""
        out: dict = {"events": 0.0, "kpis": 0.0, "metrics": {}}
        for leaf in self.root.leaves():
            if leaf.kind in ("log", "health"):
                out["events"] = max(out["events"], leaf.window_s)
            elif leaf.kind == "kpi":
                out["kpis"] = max(out["kpis"], leaf.window_s)
            else:
                name = getattr(leaf, leaf.kind).metric
                out["metrics"][name] = max(out["metrics"].get(name, 0.0), leaf.window_s)
        return out


# The leaf types (used in annotations only, resolved when a rule file is read); imported after the classes above
# so that sigma.rules.schema, which registers Composite, can import this module whichever is imported first.
from sigma.rules.schema import Agg, HealthMatch, KpiMatch, LogMatch, MetricMatch  # noqa: E402,F401

# ---------- evaluation ----------

Hit = tuple[float, float, list]  # first_ts, last_ts, evidence per leaf


def evaluate_composite(rule, *, now: float, events: list[dict], samples: list[dict], kpis: list[dict],
                       since: Mapping[str, float], jobs_on_node: Mapping[str, list[int]],
                       since_job: Mapping[int, float]) -> list:
    """Findings (one per node) for a composite rule; rows are already normalised by the matcher."""
    from sigma.rules.matcher import _finding

    data = dict(events=events, samples=samples, kpis=kpis, since=since, jobs_on_node=jobs_on_node,
                since_job=since_job)
    hits = _eval(rule, rule.composite.root, now, data)
    return [_finding(rule, node, None, first, last, {"conditions": evidence})
            for node, (first, last, evidence) in sorted(hits.items())]


def _eval(rule, cond: Condition, now: float, data: dict) -> dict[str, Hit]:
    if cond.kind in ("all", "any"):
        parts = [_eval(rule, c, now, data) for c in getattr(cond, cond.kind)]
        nodes = set.intersection(*map(set, parts)) if cond.kind == "all" else set().union(*parts)
        return {n: (min(p[n][0] for p in parts if n in p), max(p[n][1] for p in parts if n in p),
                    [e for p in parts if n in p for e in p[n][2]]) for n in nodes}
    if cond.kind == "peer_rank":
        return _peer_rank(cond.peer_rank, now, data)
    return _leaf(rule, cond, now, data)


def _leaf(rule, cond: Condition, now: float, data: dict) -> dict[str, Hit]:
    """A single-kind rule through the plain matcher: the leaf means what it means in a simple rule."""
    from sigma.rules.matcher import evaluate
    from sigma.rules.schema import Rule

    kind = cond.kind
    single = Rule(id=rule.id, description=rule.description, severity=rule.severity, action="record",
                  scope="job" if kind == "kpi" else "node", **{kind: getattr(cond, kind)})
    out: dict[str, Hit] = {}
    for f in evaluate([single], now=now, **data):
        nodes = [f.node] if f.node else _job_nodes(f.job_id, data)
        for node in nodes:
            first, last, ev = out.get(node, (f.first_ts, f.last_ts, []))
            out[node] = (min(first, f.first_ts), max(last, f.last_ts), ev + [{kind: f.evidence}])
    return out


def _job_nodes(job_id, data: dict) -> list[str]:
    nodes = {n for n, jobs in data["jobs_on_node"].items() if job_id in jobs}
    nodes |= {k["node"] for k in data["kpis"] if k.get("job_id") == job_id and k.get("node")}
    return sorted(nodes)


def _peer_rank(p: PeerRank, now: float, data: dict) -> dict[str, Hit]:
    from sigma.rules.matcher import aggregate

    lo = now - p.window_s
    series: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for s in data["samples"]:
        if s.get("metric") != p.metric or s.get("value") is None or not lo <= s["ts"] <= now:
            continue
        if s["ts"] <= data["since"].get(s["node"], 0.0):
            continue
        labels = s.get("labels") or {}
        if any(str(labels.get(k)) != str(v) for k, v in p.labels.items()):
            continue
        series[s["node"]].append((s["ts"], float(s["value"])))
    value = {n: aggregate([v for _, v in sorted(rows)], p.agg) for n, rows in series.items()}
    if p.peers == "all":
        groups = [sorted(value)]
    else:
        by_job: dict[int, set[str]] = defaultdict(set)
        for node, jobs in data["jobs_on_node"].items():
            for j in jobs:
                by_job[j].add(node)
        groups = [sorted(nodes & value.keys()) for nodes in by_job.values()]
    out: dict[str, Hit] = {}
    for group in groups:
        if len(group) < p.min_peers:
            continue
        ranked = sorted(group, key=lambda n: value[n], reverse=True)
        for rank, node in enumerate(ranked[:p.top_k], 1):
            if p.min_value is not None and value[node] < p.min_value:
                continue
            if len(ranked) > p.top_k and value[node] - value[ranked[p.top_k]] <= p.min_gap:
                continue  # not clearly above the nodes outside the top k: the ranking says nothing
            ts = [t for t, _ in series[node]]
            out[node] = (min(ts), max(ts), [{"peer_rank": {
                "metric": p.metric, "agg": p.agg, "rank": rank, "value": value[node],
                "peers": json.loads(json.dumps({n: value[n] for n in ranked}))}}])
    return out
