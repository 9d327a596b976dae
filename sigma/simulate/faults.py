"""Fault kinds: how each is detected, how long detection takes, and what repairs it.

Detection delays are uniform over the ranges an earlier 20-minute chaos soak measured on the local cluster
(docs/simulate.md: 30 faults, a 20 s hang timeout): xid 1.0-1.8 s, straggler 11.3-15.6 s, node-death 12.6-26.0 s,
hang 6.8-21.8 s, so a hang's delay here is that range minus 20 s plus the policy's `watchdog.hang_timeout_s`.
Kernel-log faults other than the Xid take the same sidecar -> controller path as the Xid line and use its range.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from sigma.simulate.fit import FailureModel
from sigma.simulate.trace import Outage


LOG_DELAY_S = (1.0, 1.8)  # the soak's Xid row: a line on the node -> the sidecar -> the controller's tick


@dataclass(frozen=True)
class Kind:
    name: str
    detect: str  # log / health: the rule's own event is ingested; slurm: slurmd stops answering; watchdog /
    # isolation: seen only through a job running on the node; people: nothing Sigma reads sees it (people act)
    rule: str  # the rule (log, health) or detector id that names the node
    delay_s: tuple[float, float]  # soak-measured detection delay range
    reboot_fixes: bool  # a reboot repairs it; otherwise hands-on repair (repair time from the model or trace)
    speed: float = 0.0  # how fast a job on the node still trains (a straggler slows it, the rest stop it)
    what: str = ""  # the fault, in a few words (docs, --help)
    reboot_first: bool | None = None  # what its symptom's published guidance says to try first (a person reads
    # the same Xid as the policy: NVIDIA says reset for Xid 48/64 before a GPU is replaced); default reboot_fixes

    @property
    def tried_first(self) -> bool:
        return self.reboot_fixes if self.reboot_first is None else self.reboot_first

    @property
    def job_only(self) -> bool:
        """Shows only in a job's progress: on an idle node nobody (and no detector) can see it."""
        return self.detect in ("watchdog", "isolation")


KINDS = {k.name: k for k in (
    Kind("xid", "log", "gpu-xid-79", LOG_DELAY_S, True, what="GPU fell off the bus: a reboot brings it back"),
    Kind("gpu-memory", "log", "gpu-xid-repair", LOG_DELAY_S, False, reboot_first=True,
         what="GPU memory past its retirement limit (Xid 64): reset first, as NVIDIA says; then a new GPU"),
    Kind("software", "log", "kernel-hung-task", LOG_DELAY_S, True, what="kernel or driver hang: a reboot clears it"),
    Kind("memory", "log", "memory-uncorrectable", LOG_DELAY_S, False, what="host DIMM: replaced"),
    Kind("cpu", "log", "cpu-machine-check", LOG_DELAY_S, False, what="CPU or board machine check: hands-on"),
    Kind("network", "log", "ib-port-down", LOG_DELAY_S, False, what="link, cable, transceiver or NIC: hands-on"),
    Kind("health", "health", "health-prolog-failed", LOG_DELAY_S, False,
         what="a health or stress check rejected the node: hands-on"),
    Kind("node-death", "slurm", "slurm-node-not-responding", (12.6, 26.0), False,
         what="the node went away (board, power, undetermined): hands-on"),
    Kind("hang", "watchdog", "watchdog-hang", (6.8 - 20.0, 21.8 - 20.0), True, what="a rank hangs: a reboot clears it"),
    Kind("straggler", "isolation", "isolation-outlier", (11.3, 15.6), True, speed=0.3,
         what="the node slows its job (clocks, throttling): a reboot clears it"),
    Kind("slow-part", "isolation", "isolation-outlier", (11.3, 15.6), False, speed=0.3,
         what="a degraded part slows its job (PCIe or NIC link width or speed): hands-on"),
    Kind("people", "people", "", (0.0, 0.0), False, speed=1.0,
         what="nothing Sigma reads shows it (BMC sensors: fans, power supplies; planned work): people in both arms"),
)}


def log_events(rules) -> dict[str, dict]:
    """For each kind detected from its node's telemetry, the event the real sidecar makes of it: the rule's first
    example line through the logtail collector (as bench/catalogue.py does), or a rejected health check through the
    health collector; an error when the rule does not act on it."""
    from sigma.paths import configs_dir
    from sigma.rules.catalogue import FORMATS_BY_TARGET, sidecar_sections, target_of, try_line
    from sigma.rules.matcher import evaluate

    sections = sidecar_sections(configs_dir() / "telemetry.yaml")
    by_id = {r.id: r for r in rules}
    out = {}
    for kind in KINDS.values():
        if kind.detect not in ("log", "health"):
            continue
        rule = by_id.get(kind.rule)
        if kind.detect == "health":
            event = _health_event(rule, kind) if rule is not None and rule.health else None
            acts = event is not None and any(f.rule_id == kind.rule for f in evaluate(
                rules, now=event["ts"] + 1, events=[{**event, "id": 1, "node": "node1"}]))
        elif rule is None or not rule.examples:
            raise ValueError(f"fault kind {kind.name}: the knowledge base has no rule {kind.rule!r} with an example")
        else:
            outcome = try_line(rules, rule, rule.examples[0], FORMATS_BY_TARGET[target_of(rule)][0], sections)
            event = outcome.events[-1] if outcome.events else None
            acts = any(f.rule_id == rule.id for f in outcome.findings)
        if not acts:
            raise ValueError(f"fault kind {kind.name}: rule {kind.rule} does not act on the event it is known by")
        out[kind.name] = event
    return out


def _health_event(rule, kind: Kind) -> dict | None:
    """The verdict event the real health collector makes of a rejected suite result (the suite the rule reads)."""
    import tempfile

    from sigma.telemetry.base import Context, Output
    from sigma.telemetry.collectors.health import HealthCollector

    suite = rule.health.suites[0] if rule.health.suites else "prolog"
    with tempfile.TemporaryDirectory() as tmp:
        collector = HealthCollector("health", HealthCollector.Params(dir=tmp, start_at="start"),
                                    Context(node="node1", node_dir=tmp, host_root=tmp))
        check = {"name": "gpu_burn", "status": "fail", "category": "accelerator", "message": kind.what}
        (Path(tmp) / f"1000-{suite}.json").write_text(json.dumps({
            "node": "node1", "ts": 1000.0, "suite": suite, "verdict": "reject", "checks": [check],
            "issues": [{"check": "gpu_burn", "message": kind.what, "blocking": True, "category": "accelerator"}]}))
        out = Output(ts=1000.0)
        collector.collect(out)
    for ts, source, kind_, severity, message, fields, job_ids in out.events:
        if kind_ == f"suite.{suite}":
            return {"ts": ts, "source": source, "kind": kind_, "severity": severity, "message": message,
                    "fields": json.loads(fields), "job_ids": json.loads(job_ids) if job_ids else []}
    return None


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
