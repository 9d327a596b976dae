"""The LLM proposer: the problem's contrastive features and the last review, as a chat request to any
OpenAI-compatible endpoint (`base_url`, `model`); the answer must be JSON {"rules": [<rule mapping>, ...]}.

The answer is only a proposal: it goes through the same repair and review as the deterministic ones, so a model
can never put a rule into the knowledge base by itself, and a rule is data (no code runs from it).
"""

from __future__ import annotations

import json
import os
import re

from sigma.rules.learn.config import LlmConfig
from sigma.rules.learn.examples import Problem
from sigma.rules.learn.features import best_thresholds, contrastive_templates, peer_leaders
from sigma.rules.learn.propose import Feedback, ProposalError, rule_id

SYSTEM = """You write failure-detection rules for a GPU cluster controller. A rule is a JSON object:
{"description": str, "severity": "error", "action": "drain", "scope": "node", "category": str,
 and exactly one match: "log": {"source": "log", "message": <Python regex searched in the kernel-log line>,
 "count": int, "window_s": float} | "metric": {"metric": str, "agg": "last|min|max|mean|delta|range",
 "op": "<|<=|>|>=", "value": float, "window_s": float} | "composite": {"all" or "any": [conditions]} where a
 condition is one of {"log": ...}, {"metric": ...}, {"peer_rank": {"metric": str, "top_k": int, "agg": str,
 "window_s": float, "min_gap": float}} (the node is among the top_k of its job's nodes on the metric, ahead of
 the next node by more than min_gap), {"all": [...]}, {"any": [...]}}.
Regexes must not nest quantifiers. Answer with JSON only: {"rules": [rule, ...]} (at most 3 rules)."""


class LlmProposer:
    def __init__(self, cfg: LlmConfig):
        if not cfg.base_url or not cfg.model:
            raise ProposalError("the LLM proposer needs llm.base_url and llm.model in the learn config")
        from openai import OpenAI

        self.cfg = cfg
        self.name = f"llm:{cfg.model}"
        self.client = OpenAI(base_url=cfg.base_url, api_key=os.environ.get(cfg.api_key_env) or "none",
                             timeout=cfg.timeout_s, max_retries=0)

    def propose(self, problem: Problem, feedback: Feedback) -> list[dict]:
        import openai

        try:
            reply = self.client.chat.completions.create(
                model=self.cfg.model, temperature=self.cfg.temperature, max_tokens=self.cfg.max_tokens,
                messages=[{"role": "system", "content": SYSTEM},
                          {"role": "user", "content": prompt(problem, feedback)}])
        except openai.APITimeoutError:
            raise ProposalError(f"the LLM at {self.cfg.base_url} did not answer within {self.cfg.timeout_s:.0f}s "
                                f"(llm.timeout_s)") from None
        except openai.APIError as exc:
            raise ProposalError(f"the LLM at {self.cfg.base_url} failed: {exc}") from None
        try:
            text = reply.choices[0].message.content or ""
        except (AttributeError, IndexError, TypeError):
            raise ProposalError(f"the LLM at {self.cfg.base_url} sent no chat completion choices") from None
        raws = parse_rules(text)
        for raw in raws:  # ids come from the content, as for the deterministic proposals
            if isinstance(raw, dict):
                raw.pop("id", None)
                raw["id"] = rule_id(problem, {k: v for k, v in raw.items() if k in ("log", "metric", "composite")})
                # what the rule does is the admin's call (the label, the learn config), never the model's
                raw.update(scope="node", action=problem.action, category=problem.category, shadow=False,
                           enabled=True)
        return raws


def parse_rules(text: str) -> list:
    """{"rules": [...]} from the answer, tolerating a ```json fence around it; anything else is garbage."""
    body = text.strip()
    fenced = re.search(r"```(?:json)?\s*(.*?)```", body, re.S)
    if fenced:
        body = fenced.group(1).strip()
    try:
        data = json.loads(body)
    except json.JSONDecodeError as exc:
        raise ProposalError(f"the LLM answer is not JSON ({exc.msg} at character {exc.pos}): {text[:120]!r}") from None
    if not isinstance(data, dict) or not isinstance(data.get("rules"), list):
        raise ProposalError(f"the LLM answer is not an object with a 'rules' list: {text[:120]!r}")
    return data["rules"]


def prompt(problem: Problem, feedback: Feedback) -> str:
    train = problem.train
    n_pos, n_neg = len(problem.positives()), len(problem.negatives())
    lines = [f"Cause: {problem.cause}. Training data: {n_pos} fault windows, {n_neg} healthy windows, each "
             f"{problem.window_s:.0f}s of one node's telemetry.", "", "Log templates (share of fault windows / "
             "share of healthy windows / example line):"]
    for t in contrastive_templates(train)[:10]:
        lines.append(f"- {t.template!r}: {t.pos:.0%} / {t.neg:.0%} / {t.examples[0]!r}")
    ths = best_thresholds(train, limit=5)
    if ths:
        lines += ["", "Metric thresholds (faults caught / healthy windows matched):"]
        lines += [f"- {t.agg}({t.metric}) {t.op} {t.value}: {t.tp} / {t.fp}" for t in ths]
    peers = peer_leaders(train, limit=5)
    if peers:
        lines += ["", "The node leads its job's nodes by a margin (faults caught / healthy windows matched):"]
        lines += [f"- {sp.agg}({sp.metric}) ahead by > {sp.min_gap}: {sp.tp} / {sp.fp}" for sp in peers]
    if feedback.round:
        lines += ["", f"Review of round {feedback.round}:"]
        if feedback.best:
            lines.append(f"best rule so far {json.dumps(feedback.best)} scored {json.dumps(feedback.best_scores)}")
        for w in feedback.wrong[:5]:
            lines.append(f"- got wrong: {json.dumps(w)}")
        for r in feedback.rejected[:5]:
            lines.append(f"- rejected {json.dumps(r['rule'])[:300]}: {'; '.join(r['reasons'])}")
    lines += ["", "Propose rules that match the fault windows and no healthy window."]
    return "\n".join(lines)
