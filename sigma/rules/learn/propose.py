"""Proposers: given a problem and what the last round got wrong, propose rules (plain mappings of the schema).

Both proposers return raw mappings on purpose: whatever proposes, the same repair and review decide.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Protocol

from sigma.rules.learn.examples import Problem, slug
from sigma.rules.learn.features import best_thresholds, contrastive_templates, peer_leaders, template_regex


MIN_FAULTS_FOR_THRESHOLDS = 3  # a threshold or ranking fitted to fewer faults than this fits noise


class ProposalError(RuntimeError):
    """The proposer could not answer (an LLM that timed out or answered something that is not a rule list)."""


@dataclass
class Feedback:
    """What review said about the previous round: the best rule so far and what it got wrong."""

    round: int = 0
    best: dict | None = None  # raw rule
    best_scores: dict = field(default_factory=dict)
    wrong: list[dict] = field(default_factory=list)
    rejected: list[dict] = field(default_factory=list)  # {"rule": raw, "reasons": [...]} of the last round
    accepted: list[dict] = field(default_factory=list)  # raw rules accepted so far, best first


class Proposer(Protocol):
    name: str

    def propose(self, problem: Problem, feedback: Feedback) -> list[dict]: ...


def rule_id(problem: Problem, body: dict) -> str:
    digest = hashlib.sha1(json.dumps(body, sort_keys=True).encode()).hexdigest()[:6]
    return f"learned-{slug(problem.cause)}-{digest}"


def finish(problem: Problem, match: dict, how: str) -> dict:
    """A full rule mapping around a match: id from its content, description naming where it was learned from."""
    sources = ", ".join(problem.provenance.get("sources", [])[:5])
    rule = {"description": f"learned for {problem.cause!r} from {sources or 'confirmed incidents'}: {how}"[:200],
            "summary": f"learned: {problem.cause}"[:60], "severity": "error", "action": problem.action,
            "scope": "node", "evidence": ["events", "samples"], **match}
    if problem.category:
        rule["category"] = problem.category
    return {"id": rule_id(problem, match), **rule}


class DeterministicProposer:
    """Drain3 templates, contrastive scoring, threshold/aggregate search and peer ranks; no randomness."""

    name = "deterministic"

    def __init__(self, max_templates: int = 5):
        self.max_templates = max_templates

    def propose(self, problem: Problem, feedback: Feedback) -> list[dict]:
        train = problem.train
        window = round(problem.window_s, 1)
        templates = [t for t in contrastive_templates(train) if t.pos > t.neg][:self.max_templates]
        logs = [{"source": "log", "message": template_regex(t.template), "window_s": window} for t in templates]
        logs = [m for m in logs if m["message"]]
        out = []
        if feedback.round == 0:  # first round: each feature alone
            out += [finish(problem, {"log": m}, f"log template {t.template!r} (in {t.pos:.0%} of faults, "
                                                f"{t.neg:.0%} of healthy windows)") for m, t in zip(logs, templates)]
            if len(problem.positives()) < MIN_FAULTS_FOR_THRESHOLDS:
                return out
            for th in best_thresholds(train):
                out.append(finish(problem, {"metric": _metric(th, window)},
                                  f"{th.agg}({th.metric}) {th.op} {th.value} over {window:.0f}s"))
            for sp in peer_leaders(train):
                out.append(finish(problem, {"composite": {"all": [{"peer_rank": _peer(sp, window)}]}},
                                  f"the node leads its job's nodes on {sp.agg}({sp.metric}) by > {sp.min_gap}"))
            return out
        # later rounds: the best log template was not specific enough (it also matched healthy windows) -> add
        # the metric or peer rank that separates the windows where the template appears; it missed faults ->
        # any of the top templates
        confusable = [ex for ex in train if any(_matches(m["message"], e.get("message", ""))
                                                for m in logs[:1] for e in ex.own_events())]
        if logs and feedback.best_scores.get("fp", 0):
            for th in best_thresholds(confusable):
                out.append(finish(problem, {"composite": {"all": [{"log": logs[0]},
                                                                  {"metric": _metric(th, window)}]}},
                                  f"log template and {th.agg}({th.metric}) {th.op} {th.value}"))
            for sp in peer_leaders(confusable):
                out.append(finish(problem, {"composite": {"all": [{"log": logs[0]}, {"peer_rank": _peer(sp, window)}]}},
                                  f"log template and the node leading its job's nodes on {sp.agg}({sp.metric})"))
        if len(logs) > 1 and feedback.best_scores.get("fn", 0):
            out.append(finish(problem, {"composite": {"any": [{"log": m} for m in logs[:3]]}},
                              f"any of {min(3, len(logs))} log templates"))
        if len(feedback.accepted) > 1 and feedback.best_scores.get("fn", 0):
            # each accepted rule catches some faults and no healthy window: together they catch more
            parts = [_condition(raw) for raw in feedback.accepted[:MAX_UNION]]
            out.append(finish(problem, {"composite": {"any": parts}}, f"any of {len(parts)} accepted rules"))
        return out


MAX_UNION = 6  # accepted rules joined into one `any` when each misses some faults


def _condition(raw: dict) -> dict:
    """A rule's match as a condition of a composite."""
    if "composite" in raw:
        return dict(raw["composite"])
    kind = next(k for k in ("log", "metric", "health", "kpi") if k in raw)
    return {kind: raw[kind]}


def _metric(th, window: float) -> dict:
    m = {"metric": th.metric, "agg": th.agg, "op": th.op, "value": th.value, "window_s": window}
    if th.labels:
        m["labels"] = {k: str(v) for k, v in th.labels.items()}
    if th.agg == "delta":
        m["min_samples"] = 2
    return m


def _peer(sp, window: float) -> dict:
    return {"metric": sp.metric, "top_k": 1, "agg": sp.agg, "min_gap": sp.min_gap, "window_s": window}


def _matches(pattern: str, message: str) -> bool:
    import re

    return re.search(pattern, str(message)) is not None
