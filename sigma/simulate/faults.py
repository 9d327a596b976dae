"""Fault kinds: how each is detected, how long detection takes, and what repairs it.

Detection delays are uniform over the ranges an earlier 20-minute chaos soak measured on the local cluster
(docs/simulate.md: 30 faults, a 20 s hang timeout): xid 1.0-1.8 s, straggler 11.3-15.6 s, node-death 12.6-26.0 s,
hang 6.8-21.8 s, so a hang's delay here is that range minus 20 s plus the policy's `watchdog.hang_timeout_s`.
Kernel-log faults other than the Xid take the same sidecar -> controller path as the Xid line and use its range.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from sigma.simulate.fit import FailureModel
from sigma.simulate.trace import Outage


@dataclass(frozen=True)
class Kind:
    name: str
    detect: str  # log: the rule's own line is ingested; slurm: slurmd stops answering; watchdog / isolation
    rule: str  # the rule (log) or detector id that names the node
    delay_s: tuple[float, float]  # soak-measured detection delay range
    reboot_fixes: bool  # a reboot repairs it; otherwise hands-on repair (repair time from the model or trace)
    speed: float = 0.0  # how fast a job on the node still trains (a straggler slows it, the rest stop it)


KINDS = {k.name: k for k in (
    Kind("xid", "log", "gpu-xid-79", (1.0, 1.8), True),
    Kind("software", "log", "kernel-hung-task", (1.0, 1.8), True),
    Kind("memory", "log", "memory-uncorrectable", (1.0, 1.8), False),
    Kind("network", "log", "ib-port-down", (1.0, 1.8), False),
    Kind("node-death", "slurm", "slurm-node-not-responding", (12.6, 26.0), False),
    Kind("hang", "watchdog", "watchdog-hang", (6.8 - 20.0, 21.8 - 20.0), True),
    Kind("straggler", "isolation", "isolation-outlier", (11.3, 15.6), True, speed=0.3),
)}


def log_events(rules) -> dict[str, dict]:
    """For each log-detected kind, the event the real sidecar makes of its rule's first example line (through the
    logtail collector, as bench/catalogue.py does); an error when the rule does not act on it."""
    from sigma.rules.catalogue import FORMATS_BY_TARGET, sidecar_sections, target_of, try_line
    from sigma.paths import configs_dir

    sections = sidecar_sections(configs_dir() / "telemetry.yaml")
    by_id = {r.id: r for r in rules}
    out = {}
    for kind in KINDS.values():
        if kind.detect != "log":
            continue
        rule = by_id.get(kind.rule)
        if rule is None or not rule.examples:
            raise ValueError(f"fault kind {kind.name}: the knowledge base has no rule {kind.rule!r} with an example")
        outcome = try_line(rules, rule, rule.examples[0], FORMATS_BY_TARGET[target_of(rule)][0], sections)
        if not outcome.events or not any(f.rule_id == rule.id for f in outcome.findings):
            raise ValueError(f"fault kind {kind.name}: rule {rule.id} does not act on its own example line")
        out[kind.name] = outcome.events[-1]
    return out


def generate(model: FailureModel, nodes: int, start: float, end: float, rng: np.random.Generator) -> list[Outage]:
    """Each node a renewal process: time to failure from the model, then its repair time, then the next. The
    sequence is drawn once, so the policy and the baseline see the same faults. At the start each node is found
    part-way through an uptime as a node looked at a random moment is: in a length-biased one (a long uptime is
    more likely to contain the moment), at a uniform point of it; a fresh draw instead would make a decreasing
    hazard look like a burst of failures in the first weeks."""
    kinds = list(model.kinds)
    shares = np.asarray([model.kinds[k] for k in kinds], dtype=float)
    shares /= shares.sum()
    out = []
    for node in range(nodes):
        t = start + _residual_h(model, rng) * 3600.0
        while t < end:
            repair = float(model.repair_h.sample(rng)) * 3600.0
            kind = kinds[int(rng.choice(len(kinds), p=shares))]
            out.append(Outage(node, t, t + repair, kind, f"model {model.name}, node {node}"))
            t += repair + float(model.uptime_h.sample(rng)) * 3600.0
    return sorted(out, key=lambda o: (o.start, o.node))


def _residual_h(model: FailureModel, rng: np.random.Generator, candidates: int = 256) -> float:
    """Time left in the uptime a node is in at a random moment (length-biased pick, uniform point)."""
    ups = np.asarray(model.uptime_h.sample(rng, candidates), dtype=float)
    chosen = ups[int(rng.choice(candidates, p=ups / ups.sum()))]
    return float(chosen * rng.random())
