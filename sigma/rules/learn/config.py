"""Typed settings of `sigma rules learn` (configs/learn.yaml)."""

from __future__ import annotations

from dataclasses import dataclass, field

from sigma.config import load_config


@dataclass
class LlmConfig:
    base_url: str = ""  # OpenAI-compatible endpoint (e.g. http://llm.internal:8000/v1); empty = no LLM proposer
    model: str = ""  # model name the endpoint serves
    api_key_env: str = "OPENAI_API_KEY"  # environment variable holding the key (a local server may need none)
    timeout_s: float = 60.0  # one request must answer within this long
    max_tokens: int = 1500  # answer length limit
    temperature: float = 0.0  # sampling temperature (0: as repeatable as the server allows)


@dataclass
class LearnConfig:
    since: str = "7d"  # default look-back for incidents and normal history (30m, 2h, 7d, ...)
    window_before_s: float = 300.0  # an incident's example window starts this long before the fault ...
    window_after_s: float = 60.0  # ... and ends this long after it
    min_incidents: int = 1  # fewer confirmed incidents (with data) of a cause than this: nothing is learned
    min_normal_windows: int = 3  # fewer healthy windows than this: no false-positive estimate, nothing learned
    max_normal_windows: int = 400  # healthy windows sampled per cause (same nodes earlier, peers meanwhile)
    test_fraction: float = 0.3  # the newest share of examples is held out for review (chronological split)
    fp_budget: float = 0.0  # largest share of healthy held-out windows a rule may match; beyond it: rejected
    max_iterations: int = 3  # propose -> repair -> review rounds per cause
    max_templates: int = 5  # log templates proposed per round (the most contrastive ones)
    action: str = "drain"  # action of learned rules unless the label names one
    candidates_dir: str = ""  # where candidates are written; empty = <knowledge base>/candidates
    proposers: list[str] = field(default_factory=lambda: ["deterministic", "llm"])  # llm only where configured
    llm: LlmConfig = field(default_factory=LlmConfig)  # the LLM proposer's endpoint

    def __post_init__(self):
        if not 0 <= self.fp_budget < 1 or not 0 < self.test_fraction < 1:
            raise ValueError("fp_budget must be in [0, 1) and test_fraction in (0, 1)")
        if self.max_iterations < 1 or self.min_incidents < 1 or self.min_normal_windows < 1:
            raise ValueError("max_iterations, min_incidents and min_normal_windows must be >= 1")
        bad = [p for p in self.proposers if p not in ("deterministic", "llm")]
        if bad:
            raise ValueError(f"unknown proposers {bad}; valid: deterministic llm")


def load_learn_config(path) -> LearnConfig:
    return load_config(LearnConfig, path)
