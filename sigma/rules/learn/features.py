"""Contrastive features: which log templates and metric values separate the faults from healthy windows.

Log lines are grouped into templates with Drain3 (a streaming template miner: variable tokens become `<*>`);
a template's score is its share of fault windows minus its share of healthy ones. Metrics are aggregated per
window and searched for the threshold (and aggregate, which is the duration: `min` over the window = held for
all of it, `max` = reached once) that separates best; a peer rank counts how often the node leads its peers.
"""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass

from drain3 import TemplateMiner
from drain3.masking import MaskingInstruction
from drain3.template_miner_config import TemplateMinerConfig

from sigma.rules.learn.examples import Example
from sigma.rules.matcher import aggregate

# "Nov 23 19:49:18 node2 kernel: [  123.456] " and similar prefixes: they name the node and the time
SYSLOG_PREFIX = re.compile(r"^(?:\w{3}\s+\d+\s+[\d:]+\s+\S+\s+(?:kernel:\s*)?)?(?:\[\s*[\d.]+\]\s*)?")
WILDCARD = "<*>"
MASKS = [(r"0x[0-9a-fA-F]+", "HEX"), (r"(?<![A-Za-z0-9])[-+]?\d+(?:\.\d+)?(?![A-Za-z0-9])", "NUM")]


def content(message: str) -> str:
    return SYSLOG_PREFIX.sub("", str(message), count=1).strip()


@dataclass
class Template:
    template: str
    pos: float  # share of fault windows with a line of this template
    neg: float  # share of healthy windows with one
    count: int  # lines of it in the training windows
    examples: list[str]  # a few of its lines

    @property
    def score(self) -> float:
        return self.pos - self.neg


class Templates:
    """Drain3 over the training lines; match() maps any later line to its template (or None)."""

    def __init__(self, sim_th: float = 0.5, depth: int = 4):
        cfg = TemplateMinerConfig()
        cfg.drain_sim_th = sim_th
        cfg.drain_depth = depth
        cfg.masking_instructions = [MaskingInstruction(p, name) for p, name in MASKS]
        cfg.profiling_enabled = False
        self.miner = TemplateMiner(config=cfg)

    def add(self, message: str) -> int:
        return self.miner.add_log_message(content(message))["cluster_id"]

    def match(self, message: str) -> int | None:
        cluster = self.miner.match(content(message))
        return cluster.cluster_id if cluster else None

    def template(self, cluster_id: int) -> str:
        return next(c.get_template() for c in self.miner.drain.clusters if c.cluster_id == cluster_id)


def log_lines(ex: Example) -> list[dict]:
    """The node's log-line events (source 'log'), which is what a learned log condition matches."""
    return [e for e in ex.own_events() if e.get("source") == "log"]


def contrastive_templates(train: list[Example]) -> list[Template]:
    """Templates of the training windows' lines, the most fault-specific first."""
    miner = Templates()
    for ex in train:
        for e in log_lines(ex):
            miner.add(e.get("message", ""))
    per_window: dict[int, list[set]] = {True: [], False: []}
    lines: dict[int, list[str]] = defaultdict(list)
    for ex in train:
        seen = set()
        for e in log_lines(ex):
            cid = miner.match(e.get("message", ""))
            if cid is not None:
                seen.add(cid)
                lines[cid].append(content(e.get("message", "")))
        per_window[ex.positive].append(seen)
    n_pos, n_neg = max(1, len(per_window[True])), max(1, len(per_window[False]))
    out = []
    for cid, msgs in lines.items():
        pos = sum(cid in s for s in per_window[True]) / n_pos
        neg = sum(cid in s for s in per_window[False]) / n_neg
        if pos > 0:
            out.append(Template(miner.template(cid), round(pos, 4), round(neg, 4), len(msgs), sorted(set(msgs))[:3]))
    return sorted(out, key=lambda t: (-t.score, -t.pos, -t.count, t.template))


def template_regex(template: str) -> str:
    """A linear-time regex for a template: literal tokens escaped, wildcards and masks as one non-space run."""
    tokens = []
    for token in template.split():
        parts = re.split(r"(<\*>|<HEX>|<NUM>)", token)
        tokens.append("".join(r"\S*" if p in (WILDCARD, "<HEX>", "<NUM>") else re.escape(p) for p in parts if p))
    while tokens and tokens[0] == r"\S*":  # leading/trailing wildcards add nothing to a search
        tokens.pop(0)
    while tokens and tokens[-1] == r"\S*":
        tokens.pop()
    return r"\s+".join(tokens)


@dataclass
class Threshold:
    metric: str
    agg: str
    op: str
    value: float
    tp: int
    fp: int
    labels: dict

    @property
    def gain(self) -> int:
        return self.tp - 2 * self.fp


def metric_values(examples: list[Example], agg: str) -> dict[tuple[str, str], list[tuple[float, bool]]]:
    """(metric, labels json) -> [(aggregate over the example's window, positive)], the example's node only."""
    import json

    out: dict[tuple[str, str], list[tuple[float, bool]]] = defaultdict(list)
    for ex in examples:
        series: dict[tuple[str, str], list[tuple[float, float]]] = defaultdict(list)
        for s in ex.own_samples():
            if s.get("value") is not None:
                series[(s["metric"], json.dumps(s.get("labels") or {}, sort_keys=True))].append(
                    (s["ts"], float(s["value"])))
        for key, rows in series.items():
            out[key].append((aggregate([v for _, v in sorted(rows)], agg), ex.positive))
    return out


def best_thresholds(examples: list[Example], aggs=("max", "min", "mean", "delta"), limit: int = 3
                    ) -> list[Threshold]:
    """Per metric, the aggregate/op/threshold that catches the most faults for the fewest healthy windows."""
    import json

    found: list[Threshold] = []
    for agg in aggs:
        for (metric, labels), values in metric_values(examples, agg).items():
            pos = sorted(v for v, p in values if p)
            neg = sorted(v for v, p in values if not p)
            if not pos or not neg:
                continue
            for op in (">", "<"):
                # the threshold sits halfway between a fault's value and the nearest healthy value beyond it
                for v in pos:
                    beyond = [n for n in neg if (n < v if op == ">" else n > v)]
                    edge = (max(beyond) if op == ">" else min(beyond)) if beyond else None
                    value = (v + edge) / 2 if edge is not None else v - 1e-9 if op == ">" else v + 1e-9
                    hit = (lambda x: x > value) if op == ">" else (lambda x: x < value)
                    tp, fp = sum(map(hit, pos)), sum(map(hit, neg))
                    found.append(Threshold(metric, agg, op, round(value, 6), tp, fp, json.loads(labels)))
    found.sort(key=lambda t: (-t.gain, t.fp, t.metric, t.agg))
    out, seen = [], set()
    for t in found:
        if t.tp and t.metric not in seen:
            seen.add(t.metric)
            out.append(t)
        if len(out) >= limit:
            break
    return out


@dataclass
class PeerSplit:
    metric: str
    agg: str
    min_gap: float  # the node leads the next peer by more than this
    tp: int
    fp: int


def peer_gaps(examples: list[Example], agg: str) -> dict[str, list[tuple[float, bool]]]:
    """metric -> [(the node's aggregate minus the highest peer's, positive)] for examples with job peers."""
    out: dict[str, list[tuple[float, bool]]] = defaultdict(list)
    for ex in examples:
        mine = set(ex.jobs_on_node.get(ex.node, []))
        peers = {n for n, jobs in ex.jobs_on_node.items() if set(jobs) & mine}
        per_metric: dict[str, dict[str, list[tuple[float, float]]]] = defaultdict(lambda: defaultdict(list))
        for s in ex.samples:
            if s.get("value") is not None and s["node"] in peers | {ex.node}:
                per_metric[s["metric"]][s["node"]].append((s["ts"], float(s["value"])))
        for metric, by_node in per_metric.items():
            if ex.node not in by_node or len(by_node) < 2 or (agg == "delta" and len(by_node[ex.node]) < 2):
                continue
            value = {n: aggregate([v for _, v in sorted(rows)], agg) for n, rows in by_node.items()}
            out[metric].append((value[ex.node] - max(v for n, v in value.items() if n != ex.node), ex.positive))
    return out


def peer_leaders(examples: list[Example], aggs=("max", "delta"), limit: int = 2) -> list[PeerSplit]:
    """Metrics on which the faulty node leads its job's peers by a margin healthy nodes do not reach."""
    found = []
    for agg in aggs:
        for metric, gaps in peer_gaps(examples, agg).items():
            pos = [g for g, p in gaps if p and g > 0]
            neg = [g for g, p in gaps if not p]
            for g in pos:
                below = [n for n in neg if n < g] + [0.0]
                cut = round((g + max(below)) / 2, 6)
                tp, fp = sum(x > cut for x in pos), sum(x > cut for x in neg)
                found.append(PeerSplit(metric, agg, cut, tp, fp))
    found.sort(key=lambda s: (-(s.tp - 2 * s.fp), s.fp, s.metric, s.agg))
    out, seen = [], set()
    for s in found:
        if s.tp > s.fp and s.metric not in seen:
            seen.add(s.metric)
            out.append(s)
    return out[:limit]
