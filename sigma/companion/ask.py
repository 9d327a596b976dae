"""`ask(question)`: the fast tier first; the language-model tier when the fast tier could not answer as fact and one
is configured. Nothing is presented as fact that was not understood in full: the fast tier says what it did not
understand, and a model's answer is labelled as the model's.
"""

from __future__ import annotations

import sqlite3
import time
from datetime import tzinfo

from sigma.companion import fast
from sigma.companion.answer import Answer


def ask(conn: sqlite3.Connection, question: str, *, llm=None, now: float | None = None,
        tz: tzinfo | None = None) -> Answer:
    """Answer one question. `llm` is an LLMTier or None (fast tier only); `tz` the site's timezone (None: local)."""
    from sigma.companion.llm import LLMError

    started = time.monotonic()
    question = (question or "").strip()
    if not question:
        return Answer(text="Ask a question, e.g. “which nodes were drained this week?”, “how long was node2 out of "
                           "service?”, “why did job 42 restart?”", tier="none", status="clarify")
    answer = fast.answer(conn, question, now=now, tz=tz)
    if answer.status in ("partial", "cannot") and llm is not None:
        try:
            answer = llm.answer(conn, question, now=now, understood=answer.understood)
        except LLMError as exc:
            answer.text = f"The language model could not answer ({exc}). {answer.text}"
    answer.latency_s = time.monotonic() - started
    return answer
