"""Words of a question: tokens, a small English stemmer (so "drained", "drains" and "draining" are one word), and the
function words that carry no content. Every other word of a question must be mapped to something, or the question
is not answered as fact (sigma.companion.parse).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# Words that carry no content of their own: articles, pronouns, auxiliaries, politeness, fillers, and prepositions
# whose meaning the slots around them already carry. Negations, comparisons and time words are NOT here: left
# unmapped they stop a question from being answered as fact. Nor is "who": it asks for a person, and the data
# records none (only whether an action was automatic), so a question about who is never answered with what.
STOPWORDS = frozenset("""
a an the this that these those it its it's they them their there here
i me my we us our you your he she his her someone anybody anyone somebody
itself themselves himself herself ourselves myself yourself
is are was were be been being am do does did done doing have has had having will would shall should can could may
might must get gets got gotten getting
what which whose how where
of in on at to for from with by about into onto as per via against
and or also both either
please show list tell give find display print report me let know see seen saw look
any some all every each so such just ever yet really actually currently exactly
there's what's who's that's
hey hi thanks
""".split())

# Irregular forms, and words whose stem would collide, mapped to one stem.
IRREGULAR = {
    "went": "go", "gone": "go", "goes": "go", "going": "go", "took": "take", "taken": "take", "takes": "take",
    "taking": "take", "ran": "run", "running": "run", "runs": "run", "lost": "lose", "losing": "lose",
    "loses": "lose", "fell": "fall", "fallen": "fall", "hung": "hang", "died": "die", "dead": "die",
    "dies": "die", "wrote": "write", "written": "write", "writes": "write", "writing": "write",
    "saved": "save", "saves": "save", "saving": "save", "came": "come", "comes": "come", "coming": "come",
    "spent": "spend", "spends": "spend", "hit": "hit", "hits": "hit", "analyses": "analysis",
    "utilisation": "utiliz", "utilization": "utiliz", "utilised": "utiliz", "utilized": "utiliz",
    "util": "utiliz", "usage": "utiliz", "mem": "memory", "data": "data", "status": "status", "statuses": "status",
    "latest": "latest", "recent": "recent", "gpus": "gpu", "cpus": "cpu", "xids": "xid", "less": "less",
    "was": "was", "has": "has", "does": "does", "is": "is", "this": "this", "its": "its", "us": "us",
    "checks": "check", "checked": "check", "failure": "failure", "failures": "failure", "failed": "fail",
    "failing": "fail", "fails": "fail",
    "cost": "lose", "costs": "lose", "costing": "lose", "used": "use", "uses": "use", "using": "use",
}

KEEP = {"note", "notes"}  # stems that would collide with a function word ("note" -> "not")

NUMBER_WORDS = {"one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7, "eight": 8, "nine": 9,
                "ten": 10, "twenty": 20, "thirty": 30, "once": 1, "twice": 2, "thrice": 3, "a": 1, "an": 1}


def stem(word: str) -> str:
    w = word.lower()
    w = IRREGULAR.get(w, w)
    if not w.isalpha() or len(w) <= 3 or w in KEEP:
        return w
    w = w.replace("isation", "ization")
    for suffix, repl in (("ies", "y"), ("sses", "ss"), ("xes", "x"), ("ches", "ch"), ("shes", "sh")):
        if w.endswith(suffix) and len(w) > len(suffix) + 2:
            w = w[: -len(suffix)] + repl
            break
    else:
        if w.endswith("s") and not w.endswith(("ss", "us", "is")) and len(w) > 3:
            w = w[:-1]
    for suffix in ("ations", "ation", "tion", "ing", "ed"):
        if w.endswith(suffix) and len(w) - len(suffix) >= 3:
            w = w[: -len(suffix)] + {"ations": "at", "ation": "at", "tion": "t"}.get(suffix, "")
            if suffix in ("ing", "ed") and len(w) > 3 and w[-1] == w[-2] and w[-1] not in "lsz":
                w = w[:-1]  # dropped -> drop, running -> run
            break
    if w.endswith("e") and len(w) > 3:
        w = w[:-1]
    return w


@dataclass
class Token:
    text: str       # as written (lower case)
    stem: str
    start: int      # character offsets in the normalised question
    end: int


TOKEN = re.compile(r"\d{4}-\d{2}-\d{2}(?:[t ]\d{1,2}:\d{2})?|\d{1,2}:\d{2}(?::\d{2})?|#\d+|\d+(?:\.\d+)?%?"
                   r"|[a-z][a-z0-9]*(?:[-_.][a-z0-9]+)*")


# Shorthands an admin types, written out before any word is read
ABBREVIATIONS = {"ckpt": "checkpoint", "ckpts": "checkpoints", "w/": "with", "w/o": "without"}
ABBREVIATION = re.compile(r"(?<![\w/])(ckpts?|w/o|w/)(?![\w/])")


def normalise(question: str) -> str:
    q = question.lower().replace("’", "'")
    q = re.sub(r"\b(\w+)'s\b", lambda m: m.group(1) + ("" if m.group(1) in ("what", "that", "there", "who", "it",
                                                                           "here", "where") else ""), q)
    q = re.sub(r"\b(what|that|there|who|it|here|where)'s\b", r"\1 is", q)
    q = re.sub(r"n't\b", " not", q)
    q = re.sub(r"\b(\w+)\(s\)", r"\1", q)   # "job(s)": the noun, as one or several
    q = ABBREVIATION.sub(lambda m: ABBREVIATIONS[m.group(1)], q)   # "ckpt", "w/": the word written out
    q = re.sub(r"\b(\d+)m\b", r"\1 minutes", q)   # "the last 45m": minutes, as "45 min"
    # the other contractions of a pronoun and its auxiliary ("we've had", "they'd have"): the auxiliary written out
    q = re.sub(r"\b(i|we|you|they|he|she)'(ve|re|ll|d)\b",
               lambda m: f"{m.group(1)} " + {"ve": "have", "re": "are", "ll": "will", "d": "would"}[m.group(2)], q)
    return q


def tokenize(q: str) -> list[Token]:
    """Tokens of an already normalised question."""
    return [Token(m.group(0), stem(m.group(0)), m.start(), m.end()) for m in TOKEN.finditer(q)]


def phrase_stems(phrase: str) -> tuple[str, ...]:
    return tuple(t.stem for t in tokenize(normalise(phrase)))
