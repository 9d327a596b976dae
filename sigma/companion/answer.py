"""What the companion returns: a sentence or two, the table behind it and the query that produced it."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field


@dataclass
class Answer:
    text: str
    columns: list[str] = field(default_factory=list)
    rows: list[tuple] = field(default_factory=list)
    sql: str = ""
    params: list | dict = field(default_factory=list)
    tier: str = ""            # fast | llm | none
    intent: str = ""          # the fast tier's intent, or "sql" for the LLM tier
    clarify: bool = False     # the answer is a question back (missing or unknown node/job)
    truncated: bool = False   # more rows than the row limit
    latency_s: float = 0.0
    attempts: int = 0         # LLM tier: queries tried (repairs included)

    def to_json(self) -> dict:
        out = asdict(self)
        out["rows"] = [list(r) for r in self.rows]
        return out
