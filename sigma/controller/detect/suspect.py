"""When each node was under suspicion, so that its healthy history leaves those times out (pure Python).

A node is scored against its own last hour. An anomaly that lasts (a failing disk, a throttled GPU) would after a
few rounds be part of that hour and score as the node's normal: persistence, which the budget's action statistic
asks for (`rounds` consecutive rounds), would then fail the faults it is meant to let through. So the windows in
which a node scored at the floor (`min_score`) or above are marked here, and the history buckets that overlap them
are not the node's healthy history (the same rule the long-memory histograms are taught by: healthy.py).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence


class SuspectTimes:
    """Per node, the [start, end] windows it scored at the floor or above, kept for `keep_s`."""

    def __init__(self, keep_s: float):
        self.keep_s = keep_s
        self.spans: dict[str, list[list[float]]] = {}

    def mark(self, nodes: Sequence[str], totals: Iterable[float], floor: float, start: float, end: float) -> None:
        for node, total in zip(nodes, totals):
            if not total >= floor:
                continue
            spans = self.spans.setdefault(node, [])
            if spans and start <= spans[-1][1]:
                spans[-1][1] = max(spans[-1][1], end)  # overlapping windows of consecutive rounds: one span
            else:
                spans.append([start, end])
        for node in list(self.spans):
            kept = [s for s in self.spans[node] if s[1] >= end - self.keep_s]
            if kept:
                self.spans[node] = kept
            else:
                del self.spans[node]

    def suspected(self, node: str, first: float, last: float) -> bool:
        """Whether [first, last] overlaps a window in which the node was under suspicion."""
        return any(a <= last and first <= b for a, b in self.spans.get(node, ()))

    def healthy_rows(self, rows: Iterable[Sequence]) -> list[Sequence]:
        """Bucket rows (node, series, bucket, count, mean, mean of squares, min, max, first ts, last ts) without
        those of a node's suspected times."""
        if not self.spans:
            return list(rows)
        return [r for r in rows if not self.suspected(r[0], r[8], r[9])]
