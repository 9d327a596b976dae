"""The language-model tier: any OpenAI-compatible endpoint (`base_url`, `model`) writes SQL from the schema document
and a few examples; the query runs through sigma.companion.safe_sql (read-only by construction), a failed query goes
back to the model with the error to repair (bounded attempts), and the model then says the result in words.
Nothing the model writes can change the database: it only ever produces a SELECT that the guard checks and runs.
"""

from __future__ import annotations

import json
import os
import re
import sqlite3
import time
from dataclasses import dataclass

from sigma.companion.answer import Answer
from sigma.companion.safe_sql import UnsafeQuery, run_select
from sigma.companion.schema import schema_document

FEW_SHOT = (
    ("which nodes were drained for Xid errors, and how long until each came back?",
     "SELECT a.target AS node, i.rule_id, (SELECT MIN(t.ts) FROM lifecycle_transitions t WHERE t.node = a.target "
     "AND t.to_state = 'resumed' AND t.ts > a.done_at) - a.done_at AS back_after_s FROM actions a JOIN incidents i "
     "ON i.id = a.incident_id WHERE a.kind = 'drain' AND a.state = 'done' AND i.rule_id LIKE 'gpu-xid-%'"),
    ("how many times was job 42 requeued?",
     "SELECT COUNT(*) FROM actions a JOIN incidents i ON i.id = a.incident_id WHERE a.kind = 'requeue' "
     "AND a.state = 'done' AND i.job_id = 42"),
    ("mean detection latency per rule over the last day",
     "SELECT rule_id, AVG(opened_at - fault_ts) AS mean_latency_s FROM incidents WHERE opened_at >= {now} - 86400 "
     "GROUP BY rule_id"),
    ("average CPU utilisation of node2 in the last hour",
     "SELECT AVG(value) FROM samples WHERE node = 'node2' AND metric = 'host.cpu.util_pct' AND ts >= {now} - 3600"),
)

SYSTEM = """You answer questions about a GPU training cluster from the SQLite database of its fault controller.
Write exactly one SQLite SELECT statement (WITH allowed) that answers the question, in a ```sql block, nothing else.
Only read the tables below. Never write, never use PRAGMA, ATTACH or files. Do not use parameters: put values in the
query. "Now" is the Unix time {now:.0f}; use it for relative time ranges. If the question cannot be answered from
these tables, reply with ```sql\nSELECT 'cannot answer: <why>' AS answer\n```.

{schema}"""

ANSWER = """Question: {question}
The query returned these columns: {columns}
Rows (at most 20 shown, {n} in all): {rows}
Answer the question in one or two plain sentences for a cluster admin or researcher, using only these results.
Give durations in seconds, minutes or hours as fits. If the result is empty, say what that means."""


@dataclass
class LLMConfig:
    base_url: str                 # OpenAI-compatible endpoint, e.g. http://127.0.0.1:8000/v1
    model: str
    api_key: str = "unused"       # many local servers ignore it
    timeout_s: float = 30.0       # per request
    max_attempts: int = 3         # queries tried per question (first + repairs)

    @classmethod
    def from_env(cls) -> LLMConfig | None:
        """$SIGMA_LLM_BASE_URL and $SIGMA_LLM_MODEL (and $SIGMA_LLM_API_KEY), or None when not configured."""
        url, model = os.environ.get("SIGMA_LLM_BASE_URL"), os.environ.get("SIGMA_LLM_MODEL")
        if not url or not model:
            return None
        return cls(url, model, os.environ.get("SIGMA_LLM_API_KEY") or os.environ.get("OPENAI_API_KEY") or "unused")


class LLMError(RuntimeError):
    """The endpoint failed, timed out or never produced a query that runs."""


def extract_sql(text: str) -> str:
    m = re.search(r"```(?:sql|sqlite)?\s*(.*?)```", text or "", re.S | re.I)
    sql = (m.group(1) if m else text or "").strip()
    if not re.match(r"(?is)^\s*(select|with)\b", sql):
        raise UnsafeQuery(f"the reply holds no SELECT: {sql[:120]!r}")
    return sql


class LLMTier:
    def __init__(self, cfg: LLMConfig):
        try:
            from openai import OpenAI
        except ImportError:
            raise LLMError("the LLM tier needs the openai package: pip install 'sigma-slurm[llm]'") from None
        self.cfg = cfg
        self.client = OpenAI(base_url=cfg.base_url, api_key=cfg.api_key, timeout=cfg.timeout_s, max_retries=0)

    def _chat(self, messages: list[dict]) -> str:
        try:
            reply = self.client.chat.completions.create(model=self.cfg.model, messages=messages, temperature=0)
        except Exception as exc:  # the client raises many types (timeouts, HTTP status, connection)
            raise LLMError(f"LLM endpoint {self.cfg.base_url} failed: {type(exc).__name__}: {exc}") from None
        try:
            return reply.choices[0].message.content or ""
        except (AttributeError, IndexError, TypeError):
            raise LLMError(f"LLM endpoint {self.cfg.base_url} sent a reply with no message") from None

    def answer(self, conn: sqlite3.Connection, question: str, *, now: float | None = None,
               understood: str = "") -> Answer:
        """The model's answer; `understood` is what the fast tier made of the question (a hint, may be empty)."""
        now = time.time() if now is None else now
        messages = [{"role": "system", "content": SYSTEM.format(now=now, schema=schema_document())}]
        for q, sql in FEW_SHOT:
            messages += [{"role": "user", "content": q},
                         {"role": "assistant", "content": f"```sql\n{sql.format(now=f'{now:.0f}')}\n```"}]
        messages.append({"role": "user", "content": question + (
            f"\n(A parser without a model read parts of it as: {understood})" if understood else "")})
        error = ""
        for attempt in range(1, self.cfg.max_attempts + 1):
            reply = self._chat(messages)
            try:
                sql = extract_sql(reply)
                result = run_select(conn, sql)
                break
            except (UnsafeQuery, sqlite3.Error) as exc:
                error = f"{type(exc).__name__}: {exc}"
                messages += [{"role": "assistant", "content": reply},
                             {"role": "user", "content": f"That query failed ({error}). Reply with a corrected "
                                                         "SELECT in a ```sql block."}]
        else:
            raise LLMError(f"no runnable query after {self.cfg.max_attempts} attempts; last error: {error}")
        if result.columns == ["answer"] and result.rows and str(result.rows[0][0]).startswith("cannot answer"):
            return Answer(text=str(result.rows[0][0]).capitalize() + ".", sql=sql, tier="llm", intent="sql",
                          status="cannot", attempts=attempt)
        shown = json.dumps([list(r) for r in result.rows[:20]], default=str)
        text = self._chat([{"role": "user", "content": ANSWER.format(
            question=question, columns=result.columns, rows=shown, n=len(result.rows))}]).strip()
        return Answer(text="Language model's answer (its query is below, check it): "
                           + (text or "(no summary; see the table)"), columns=result.columns, rows=result.rows,
                      sql=sql, tier="llm", intent="sql", status="model", truncated=result.truncated,
                      attempts=attempt)
