"""Repair (does the proposal run?) and review (is it right, and better than what we have?).

repair: the proposal must be a valid rule of the schema (unknown keys and wrong types are errors), every message
regex must have bounded matching time, and a dry run on the examples must not fail.
review: the rule runs through the real matcher on every example. It is accepted only when, on the held-out
(newest) examples and on all healthy history, it matches no more healthy windows than the false-positive budget
allows, it catches a fault
the knowledge base misses, adding it to the knowledge base does not lower F1, and on healthy history it would
never have asked to drain more nodes in one breaker window than the circuit breaker allows.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from sigma.config import ConfigError, from_dict
from sigma.rules.composite import Condition
from sigma.rules.learn.examples import Example, Problem
from sigma.rules.matcher import evaluate
from sigma.rules.regexcheck import UnsafeRegex, check_regex
from sigma.rules.schema import Rule

MAX_LISTED = 10  # examples listed as right/wrong per kind


class RepairError(ValueError):
    """A proposal that is not a runnable rule; the message says what to fix."""


def repair(raw) -> Rule:
    if not isinstance(raw, dict):
        raise RepairError(f"a rule must be a mapping, got {type(raw).__name__}")
    try:
        rule = from_dict(Rule, raw)
    except ConfigError as exc:
        raise RepairError(f"schema: {exc}") from None
    for where, pattern in messages(rule):
        try:
            check_regex(pattern, where)
        except UnsafeRegex as exc:
            raise RepairError(str(exc)) from None
    try:  # dry run: a rule that raises on real rows never reaches the controller
        evaluate([rule], now=0.0, events=[{"node": "n", "ts": 0.0, "source": "log", "kind": "k", "message": "m"}],
                 samples=[{"node": "n", "ts": 0.0, "metric": "m", "value": 1.0}])
    except Exception as exc:  # noqa: BLE001 - any failure is the proposal's fault, reported back
        raise RepairError(f"dry run failed: {type(exc).__name__}: {exc}") from None
    return rule


def messages(rule: Rule) -> list[tuple[str, str]]:
    out = [("log.message", rule.log.message)] if rule.log is not None and rule.log.message else []
    if rule.composite is not None:
        out += [("composite log.message", leaf.log.message) for leaf in rule.composite.root.leaves()
                if isinstance(leaf, Condition) and leaf.log is not None and leaf.log.message]
    return out


def hits(rules: Iterable[Rule], ex: Example) -> bool:
    """Does any of the rules name the example's node at the end of its window (the real matcher)?"""
    rules = [r for r in rules if r.enabled and r.action not in ("record", "notify")]
    if not rules:
        return False
    found = evaluate(rules, now=ex.end, events=ex.events, samples=ex.samples, kpis=ex.kpis,
                     jobs_on_node=ex.jobs_on_node)
    jobs = set(ex.jobs_on_node.get(ex.node, []))
    return any(f.node == ex.node or (f.node is None and f.job_id in jobs) for f in found)


@dataclass
class Score:
    tp: int = 0
    fp: int = 0
    fn: int = 0
    tn: int = 0
    right: list[dict] = field(default_factory=list)
    wrong: list[dict] = field(default_factory=list)
    false_positives: list[Example] = field(default_factory=list)
    caught: set = field(default_factory=set)  # ids of the faults it catches

    @property
    def precision(self) -> float:
        return self.tp / (self.tp + self.fp) if self.tp + self.fp else 0.0

    @property
    def recall(self) -> float:
        return self.tp / (self.tp + self.fn) if self.tp + self.fn else 0.0

    @property
    def f1(self) -> float:
        p, r = self.precision, self.recall
        return 2 * p * r / (p + r) if p + r else 0.0

    @property
    def fp_rate(self) -> float:
        return self.fp / (self.fp + self.tn) if self.fp + self.tn else 0.0

    def summary(self) -> dict:
        return {"tp": self.tp, "fp": self.fp, "fn": self.fn, "tn": self.tn, "precision": round(self.precision, 4),
                "recall": round(self.recall, 4), "f1": round(self.f1, 4), "fp_rate": round(self.fp_rate, 4)}


def score(rules: list[Rule], examples: list[Example]) -> Score:
    s = Score()
    for ex in examples:
        hit = hits(rules, ex)
        if ex.positive and hit:
            s.tp += 1
            s.caught.add(id(ex))
        elif ex.positive:
            s.fn += 1
        elif hit:
            s.fp += 1
            s.false_positives.append(ex)
        else:
            s.tn += 1
        listed = s.right if hit == ex.positive else s.wrong
        if len(listed) < MAX_LISTED:
            listed.append({**ex.describe(), "matched": hit})
    return s


@dataclass
class Review:
    rule: Rule
    accepted: bool
    reasons: list[str]  # why rejected (empty when accepted)
    train: Score
    test: Score
    kb_test: Score
    combined_test: Score
    evidence: list[dict] = field(default_factory=list)  # healthy windows it matched, with the matching lines

    def scores(self) -> dict:
        return {"train": self.train.summary(), "test": self.test.summary(),
                "knowledge_base_test": self.kb_test.summary(), "with_knowledge_base_test": self.combined_test.summary()}


def review(rule: Rule, problem: Problem, kb: list[Rule], *, fp_budget: float, breaker_limit: int,
           breaker_window_s: float) -> Review:
    train, test = score([rule], problem.train), score([rule], problem.test)
    kb_test, combined = score(kb, problem.test), score(kb + [rule], problem.test)
    reasons = []
    healthy, matched = train.fp + train.tn + test.fp + test.tn, train.fp + test.fp
    if test.fp_rate > fp_budget or (healthy and matched / healthy > fp_budget):
        reasons.append(f"matched {matched} of {healthy} healthy windows ({test.fp} of {test.fp + test.tn} held out; "
                       f"false-positive budget {fp_budget:.1%})")
    if not (test.caught | train.caught) - (kb_test.caught | score(kb, problem.train).caught):
        reasons.append("catches no fault the knowledge base does not already catch")
    if combined.f1 < kb_test.f1:
        reasons.append(f"adding it lowers held-out F1 from {kb_test.f1:.3f} to {combined.f1:.3f}")
    healthy_hits = train.false_positives + test.false_positives
    burst = max_nodes_in_window(healthy_hits, breaker_window_s)
    if rule.drains and burst > breaker_limit:
        reasons.append(f"on healthy history it would have drained {burst} nodes within {breaker_window_s:.0f}s; "
                       f"the circuit breaker allows {breaker_limit}")
    evidence = [{**ex.describe(), "lines": [e.get("message", "") for e in ex.own_events()][:3]}
                for ex in healthy_hits[:MAX_LISTED]]
    return Review(rule, not reasons, reasons, train, test, kb_test, combined, evidence)


def max_nodes_in_window(examples: list[Example], window_s: float) -> int:
    """The most distinct nodes among the examples whose windows end within window_s of each other."""
    ends = sorted((ex.end, ex.node) for ex in examples)
    best = 0
    for i, (t, _) in enumerate(ends):
        best = max(best, len({n for u, n in ends[i:] if u - t <= window_s}))
    return best
