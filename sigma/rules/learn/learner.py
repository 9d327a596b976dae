"""The loop: propose -> repair -> review, for a bounded number of rounds, keeping the best accepted rule.

It stops early once a round's best rule catches every training fault with no healthy window matched, or when
a round brings nothing better (converged).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from sigma.rules.learn.examples import Problem
from sigma.rules.learn.propose import Feedback, ProposalError, Proposer
from sigma.rules.learn.review import RepairError, Review, repair, review
from sigma.rules.schema import Rule


@dataclass
class Outcome:
    cause: str
    accepted: list[tuple[Review, dict, str, int]] = field(default_factory=list)  # review, raw, proposer, round
    rejected: list[dict] = field(default_factory=list)  # {"rule", "proposer", "round", "reasons", "evidence"}
    messages: list[str] = field(default_factory=list)  # proposer failures, repairs
    proposed: int = 0
    rounds: int = 0
    wall_s: float = 0.0

    @property
    def best(self) -> tuple[Review, dict, str, int] | None:
        return max(self.accepted, key=lambda a: _rank(a[0]), default=None)


def _rank(r: Review) -> tuple:
    return (r.test.f1, r.train.f1, -r.test.fp, -r.train.fp, -len(str(r.rule)))


def learn(problem: Problem, proposers: list[Proposer], kb: list[Rule], *, max_iterations: int, fp_budget: float,
          breaker_limit: int, breaker_window_s: float) -> Outcome:
    t0 = time.monotonic()
    out = Outcome(problem.cause)
    feedback = Feedback()
    seen: set[str] = set()
    for round_ in range(max_iterations):
        out.rounds = round_ + 1
        rejected_now = []
        fresh = 0
        for proposer in proposers:
            try:
                raws = proposer.propose(problem, feedback)
            except ProposalError as exc:
                out.messages.append(f"{proposer.name}: {exc}")
                continue
            for raw in raws:
                key = repr(raw.get("id") if isinstance(raw, dict) else raw)
                if key in seen:
                    continue
                seen.add(key)
                fresh += 1
                out.proposed += 1
                try:
                    rule = repair(raw)
                except RepairError as exc:
                    out.messages.append(f"{proposer.name}: proposal not runnable: {exc}")
                    rejected_now.append({"rule": raw, "reasons": [str(exc)]})
                    out.rejected.append({"rule": raw, "proposer": proposer.name, "round": round_ + 1,
                                         "reasons": [str(exc)], "evidence": []})
                    continue
                rev = review(rule, problem, kb, fp_budget=fp_budget, breaker_limit=breaker_limit,
                             breaker_window_s=breaker_window_s)
                if rev.accepted:
                    out.accepted.append((rev, raw, proposer.name, round_ + 1))
                else:
                    rejected_now.append({"rule": raw, "reasons": rev.reasons})
                    out.rejected.append({"rule": raw, "proposer": proposer.name, "round": round_ + 1,
                                         "reasons": rev.reasons, "evidence": rev.evidence,
                                         "scores": rev.scores()})
        best = out.best
        if not fresh:
            break  # converged: the proposers have nothing new to offer
        # feedback is about the most promising rule of any verdict: an accepted one, else the best-scoring reject
        if best:
            rev, raw = best[0], best[1]
            ranked = [a[1] for a in sorted(out.accepted, key=lambda a: _rank(a[0]), reverse=True)]
            feedback = Feedback(round_ + 1, raw, rev.train.summary(), rev.train.wrong, rejected_now, ranked)
            if rev.train.fp == 0 and rev.train.fn == 0:
                break  # converged: nothing left to fix on the training data
        else:
            tried = [r for r in out.rejected if r.get("scores")]
            top = max(tried, key=lambda r: (r["scores"]["train"]["f1"], -r["scores"]["train"]["fp"]), default=None)
            feedback = Feedback(round_ + 1, top["rule"] if top else None,
                                top["scores"]["train"] if top else {}, [], rejected_now)
    out.wall_s = time.monotonic() - t0
    return out
