"""One learning run (what cron calls): problems from the controller database, proposers, candidates on disk."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

from sigma.rules.learn import LearnError
from sigma.rules.learn.config import LearnConfig
from sigma.rules.learn.history import problems
from sigma.rules.learn.learner import Outcome, learn
from sigma.rules.learn.propose import DeterministicProposer, ProposalError
from sigma.rules.learn.store import Candidates
from sigma.rules.schema import Rule


@dataclass
class Breaker:
    """The controller's circuit breaker for drains (configs/controller.yaml `breaker`)."""

    max_nodes: int = 8
    max_fraction: float = 0.25
    window_s: float = 3600.0

    def limit(self, total_nodes: int) -> int:
        # the same bound the controller applies (sigma.controller.act.guards.breaker_limit)
        return max(1, min(self.max_nodes, math.floor(self.max_fraction * total_nodes)))


def proposers_for(cfg: LearnConfig, only: str | None = None) -> tuple[list, list[str]]:
    """The configured proposers (or only one); an LLM without endpoint is skipped with a note unless asked for."""
    names = [only] if only else cfg.proposers
    out, notes = [], []
    for name in names:
        if name == "deterministic":
            out.append(DeterministicProposer(cfg.max_templates))
        elif name == "llm":
            from sigma.rules.learn.llm import LlmProposer

            try:
                out.append(LlmProposer(cfg.llm))
            except ProposalError as exc:
                if only:
                    raise LearnError(str(exc)) from None
                notes.append(f"llm proposer skipped: {exc}")
        else:
            raise LearnError(f"unknown proposer {name!r}; valid: deterministic llm")
    return out, notes


def run(conn, cfg: LearnConfig, kb: list[Rule], store: Candidates, *, since: float, breaker: Breaker,
        total_nodes: int, incident: int | None = None, only: str | None = None, now: float | None = None) -> dict:
    """Learn every cause; write one candidate per cause and proposer (the best accepted rule). With a single
    proposer asked for by name, its failure fails the run before anything is written."""
    t0 = time.monotonic()
    proposers, notes = proposers_for(cfg, only)
    probs = problems(conn, cfg, since=since, now=now, incident=incident)
    outcomes: list[tuple] = []
    for p in probs:
        out = learn(p, proposers, kb, max_iterations=cfg.max_iterations, fp_budget=cfg.fp_budget,
                    breaker_limit=breaker.limit(total_nodes), breaker_window_s=breaker.window_s)
        if only and not out.accepted and out.messages and out.proposed == 0:
            raise LearnError(f"{p.cause}: " + "; ".join(out.messages))
        outcomes.append((p, out))
    written = []
    for p, out in outcomes:  # only now, after every cause was learned: a failure above leaves no files
        for rev, raw, proposer, round_ in _best_per_proposer(out):
            decided = _decided(store, raw["id"])
            if decided:  # learned again: an admin's promotion or rejection stands
                notes.append(f"{raw['id']} learned again; it was {decided} before, left as it is")
                continue
            record = {"candidate": {
                "id": raw["id"], "status": "candidate", "created_at": time.strftime("%Y-%m-%d %H:%M:%S"),
                "cause": p.cause, "proposer": proposer, "round": round_, "rounds": out.rounds,
                "proposed": out.proposed, "learning_wall_s": round(out.wall_s, 3), "provenance": p.provenance,
                "in_sample": p.in_sample, "scores": rev.scores(),
                "examples": {"right": rev.test.right + rev.train.right, "wrong": rev.test.wrong + rev.train.wrong},
                "notes": p.notes}, "rule": raw}
            written.append(str(store.write(record)))
    return {"candidates": written, "notes": notes, "wall_s": round(time.monotonic() - t0, 3),
            "causes": [_summary(p, out) for p, out in outcomes]}


def _decided(store: Candidates, cid: str) -> str | None:
    try:
        status = store.get(cid)["candidate"].get("status", "candidate")
    except LearnError:
        return None
    return None if status == "candidate" else status


def _best_per_proposer(out: Outcome) -> list[tuple]:
    best: dict[str, tuple] = {}
    for a in out.accepted:
        if a[2] not in best or _key(a) > _key(best[a[2]]):
            best[a[2]] = a
    return list(best.values())


def _key(a) -> tuple:
    rev = a[0]
    return (rev.test.f1, rev.train.f1, -rev.test.fp, -rev.train.fp, -len(str(a[1])))


def _summary(p, out: Outcome) -> dict:
    return {"cause": p.cause, "proposed": out.proposed, "accepted": len(out.accepted), "rounds": out.rounds,
            "wall_s": round(out.wall_s, 3), "messages": out.messages, "notes": p.notes,
            "rejected": [{"rule": r["rule"].get("id") if isinstance(r["rule"], dict) else str(r["rule"])[:60],
                          "proposer": r["proposer"], "reasons": r["reasons"], "evidence": r["evidence"][:3]}
                         for r in out.rejected]}
