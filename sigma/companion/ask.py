"""`ask(question)`: route a question to the fast tier or the language-model tier and time the answer.

The classifier is deliberately simple and explainable: a question is *simple* when one catalogued intent matches it
and it carries none of the words that make a question compositional (comparisons, per-group breakdowns,
conditions, orderings across entities); everything else is *hard*. Simple questions never wait for a model.
"""

from __future__ import annotations

import re
import sqlite3
import time

from sigma.companion import fast
from sigma.companion.answer import Answer
from sigma.companion.slots import parse

HARD_WORDS = re.compile(
    r"\b(compar\w*|correlat\w*|versus|vs\.?|trend|per (day|hour|node|rule|job|kind)|for each|by (node|rule|day)|"
    r"distribution|median|percentile|p\d\d|longest|shortest|slowest|fastest|more than|fewer than|less than|"
    r"at least|at most|excluding|except|without|both|neither|difference|ratio of|percentage|share of|"
    r"before|after|while|during which|followed by|same time|overlap\w*|average \w+ (of|per)|"
    r"metric|cpu|memory|temperature|utili[sz]ation of)\b")


def classify(question: str) -> str:
    """'simple' when the fast tier can answer it as asked, else 'hard'."""
    q = question.lower()
    if fast.match(q) is None or HARD_WORDS.search(q) or q.count("?") > 1:
        return "hard"
    return "simple"


def known_nodes(conn: sqlite3.Connection) -> set[str]:
    rows = conn.execute("SELECT node FROM node_snapshots UNION SELECT node FROM incidents WHERE node IS NOT NULL "
                        "UNION SELECT node FROM node_lifecycle").fetchall()
    return {r[0] for r in rows}


def capabilities() -> str:
    return "; ".join(f"“{i.example}”" for i in fast.INTENTS[:8])


def ask(conn: sqlite3.Connection, question: str, *, llm=None, now: float | None = None) -> Answer:
    """Answer one question. `llm` is an LLMTier or None (fast tier only)."""
    from sigma.companion.llm import LLMError

    started = time.monotonic()
    question = (question or "").strip()
    if not question:
        return Answer(text="Ask a question, e.g. " + capabilities(), tier="none", clarify=True)
    tier = classify(question)
    slots = parse(question, known_nodes(conn), now=now)
    answer = None
    if tier == "hard" and llm is not None:
        try:
            answer = llm.answer(conn, question, now=now)
        except LLMError as exc:
            note = f"The language model could not answer ({exc})."
            answer = fast.answer(conn, question, slots)
            if answer is None:
                answer = Answer(text=note, tier="none")
            else:
                answer.text = f"{note} A partial answer from the catalogue: {answer.text}"
    if answer is None:
        answer = fast.answer(conn, question, slots)
        if answer is not None and tier == "hard" and not answer.clarify:
            answer.text = ("Without a language model I can answer only part of this: " + answer.text)
        if answer is None:
            answer = Answer(text="I cannot answer that from the catalogue of questions, and no language model is "
                                 "configured (set SIGMA_LLM_BASE_URL and SIGMA_LLM_MODEL). I can answer, for example: "
                                 + capabilities(), tier="none")
    answer.latency_s = time.monotonic() - started
    return answer
