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
    intent: str = ""          # the fast tier's entity, or "sql" for the LLM tier
    status: str = "fact"      # fact: every part understood and answered | model: a language model's query, shown
    #                           as such | partial: some words not understood (no table) | clarify: a question back
    #                           | cannot: nothing the data can answer
    understood: str = ""      # how the question was read, in slots
    not_understood: list[str] = field(default_factory=list)
    units: dict[str, str] = field(default_factory=dict)   # column -> s, time, %, bytes, ...
    truncated: bool = False   # more rows than the row limit
    latency_s: float = 0.0
    attempts: int = 0         # LLM tier: queries tried (repairs included)

    @property
    def clarify(self) -> bool:
        return self.status == "clarify"

    def to_json(self) -> dict:
        out = asdict(self)
        out["rows"] = [list(r) for r in self.rows]
        return out
