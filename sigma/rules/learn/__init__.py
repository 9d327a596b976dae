"""Rule learning from confirmed incidents: examples -> proposals -> repair -> review -> candidates.

Two proposers share one interface (sigma.rules.learn.propose.Proposer): a deterministic one built on Drain3 log
templates, contrastive feature scoring and threshold / peer-rank search, which always works, and one that asks an
OpenAI-compatible LLM. Every proposal goes through the same repair (schema, safe regex, dry run) and review
(held-out scoring against the current knowledge base, false-positive budget, circuit-breaker bound).
"""


class LearnError(RuntimeError):
    """Learning cannot go on as asked (too few incidents, no data for a window, bad configuration)."""
