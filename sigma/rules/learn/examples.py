"""Labelled examples: windows of one node's telemetry, a confirmed fault or healthy, and the learning problem.

An Example carries the rows of its window for every node that shares a job with it (peer conditions need the
peers), so the real matcher can run on it: a rule "hits" an example when it names the example's node.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field


@dataclass
class Example:
    node: str
    start: float
    end: float
    positive: bool  # a confirmed fault of the cause being learned; False: healthy
    source: str  # where the label comes from: 'incident 7', 'label 3', 'normal', a data set's line id
    events: list[dict] = field(default_factory=list)
    samples: list[dict] = field(default_factory=list)
    kpis: list[dict] = field(default_factory=list)
    jobs_on_node: dict[str, list[int]] = field(default_factory=dict)

    @property
    def empty(self) -> bool:
        return not (self.events or self.samples or self.kpis)

    def own_events(self) -> list[dict]:
        return [e for e in self.events if e.get("node") == self.node]

    def own_samples(self) -> list[dict]:
        return [s for s in self.samples if s.get("node") == self.node]

    def describe(self) -> dict:
        return {"node": self.node, "start": round(self.start, 3), "end": round(self.end, 3),
                "label": "fault" if self.positive else "healthy", "source": self.source}


@dataclass
class Problem:
    """One cause to learn a rule for: its confirmed faults and healthy windows, split by time."""

    cause: str
    train: list[Example]
    test: list[Example]
    provenance: dict  # incidents, labels and windows learned from
    category: str = ""
    action: str = "drain"
    in_sample: bool = False  # too few faults to hold one out: test recall is measured on the training faults
    notes: list[str] = field(default_factory=list)  # windows skipped and why

    @property
    def window_s(self) -> float:
        spans = [e.end - e.start for e in self.train if e.positive]
        return max(spans) if spans else 300.0

    def positives(self, part: str = "train") -> list[Example]:
        return [e for e in getattr(self, part) if e.positive]

    def negatives(self, part: str = "train") -> list[Example]:
        return [e for e in getattr(self, part) if not e.positive]


def chronological_split(positives: list[Example], negatives: list[Example], test_fraction: float
                        ) -> tuple[list[Example], list[Example], bool]:
    """Learn on the past, review on the future. With a single fault there is nothing to hold out: it is used for
    both (in_sample=True) and the held-out part is the newest healthy windows only."""
    def split(xs: list[Example]) -> tuple[list[Example], list[Example]]:
        xs = sorted(xs, key=lambda e: e.end)
        n_test = max(1, round(len(xs) * test_fraction)) if len(xs) > 1 else 0
        return xs[:len(xs) - n_test], xs[len(xs) - n_test:]

    pos_train, pos_test = split(positives)
    neg_train, neg_test = split(negatives)
    in_sample = not pos_test
    if in_sample:
        pos_test = pos_train
    return pos_train + neg_train, pos_test + neg_test, in_sample


def slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")[:40] or "cause"
