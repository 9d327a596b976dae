"""What detection hands to the decision layer: a finding names a rule, a target (node or job) and evidence."""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field


@dataclass
class Finding:
    rule_id: str  # knowledge-base rule id, or a detector id (watchdog-hang, isolation-outlier, ...)
    source: str  # 'rule', 'watchdog' or 'isolation'
    scope: str  # 'node' or 'job'
    severity: str
    action: str  # record notify drain drain+reboot drain+ticket requeue
    summary: str  # one line for humans and drain reasons
    first_ts: float  # earliest evidence (the fault), used for detection latency
    last_ts: float  # newest evidence
    node: str | None = None
    job_id: int | None = None
    rule_version: int = 1
    category: str = ""
    requeue_jobs: bool = True
    shadow: bool = False
    evidence: dict = field(default_factory=dict)

    @property
    def key(self) -> str:
        """Same rule on the same target is one incident while it stays open."""
        return f"{self.rule_id}|{self.node or ''}|{self.job_id or ''}"

    def to_json(self) -> str:
        return json.dumps(asdict(self), default=_jsonable, allow_nan=False)


def _jsonable(value):
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if hasattr(value, "keys"):
        return {k: value[k] for k in value.keys()}
    if hasattr(value, "tolist"):
        return value.tolist()
    return str(value)


def clean(value):
    """JSON-safe copy: NaN/Inf become strings (SQLite and strict JSON reject them)."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {k: clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [clean(v) for v in value]
    return value
