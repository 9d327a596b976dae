"""Evidence that accumulates while a node stays apart: Page's one-sided CUSUM over isolation rounds (pure numpy).

The isolation score judges each round against the node's last hour, so a fault that lasts becomes its own normal
within a few rounds. A sequential test keeps adding evidence instead. Per round, a node's *increment* is how far its
deviation from the peers' median lies in its own long healthy history of that deviation (healthy.Sketches.positions:
units where its healthy 99.5th percentile is 3, learned over days, from rounds the node was not under suspicion),
the mean of its TOP farthest metrics, at most `cap` (one spike alone cannot carry the statistic). The statistic is

    S_t = max(0, S_{t-1} + increment_t - reference)

so a node that always stands apart from its peers (a pipeline's first or last stage) is normal by construction (its
usual gap is the median of its own histograms), a node whose gap holds steady drifts to 0, and a lasting fault
drifts up linearly, by (increment - reference) a round; it falls back to 0 once the node is back. The action
statistic is S itself (the persistence is in S), and its threshold comes from the same false-drain budget
(budget.py) calibrated on the cluster's healthy rounds of S.

Bad input: a NaN position (too little healthy history of a metric, a gap) adds nothing; a node with no known
position at all adds 0 (S falls by `reference`): a gap is never evidence. With fewer than 3 nodes there are no peers
and no positions: the statistic stays 0 and the caller keeps the per-round score.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

TOP = 3  # metrics whose positions are averaged into a round's increment (as healthy.py's teaching rule reads them)
# k, the increment a healthy round stays under, and the most one round may add (before k is taken off): chosen on
# ASD's history and the first half of its scored part (bench/isolation_real.py --tune-cusum; docs/controller.md)
REFERENCE = 8.0
CAP = 9.0


def increments(positions: np.ndarray, top: int = TOP, cap: float = CAP) -> np.ndarray:
    """positions [..., nodes, metrics] (NaN where unknown) -> [..., nodes] the mean of the `top` largest, at most
    `cap` (0 where none is known)."""
    z = np.nan_to_num(np.asarray(positions, float), nan=0.0)
    if z.shape[-1] == 0:
        return np.zeros(z.shape[:-1])
    k = max(1, min(top, z.shape[-1]))
    return np.minimum(np.partition(z, z.shape[-1] - k, axis=-1)[..., -k:].mean(axis=-1), cap)


def step(previous: np.ndarray, increment: np.ndarray, reference: float = REFERENCE) -> np.ndarray:
    """One round of the statistic: max(0, previous + increment - reference)."""
    return np.maximum(0.0, np.asarray(previous, float) + np.asarray(increment, float) - reference)


def run(increment: np.ndarray, reference: float = REFERENCE, start: np.ndarray | None = None) -> np.ndarray:
    """[rounds, nodes] increments -> [rounds, nodes] the statistic after each round (from `start`, default 0)."""
    out = np.empty(increment.shape)
    s = np.zeros(increment.shape[1:]) if start is None else np.asarray(start, float)
    for t in range(increment.shape[0]):
        s = out[t] = step(s, increment[t], reference)
    return out


class Cusum:
    """Each job's statistic per node, kept between rounds (the caller persists `state`). A node new to the job
    starts at 0; a job's nodes that left it are forgotten with it."""

    def __init__(self, reference: float = REFERENCE, cap: float = CAP, state: Mapping[str, Mapping] | None = None):
        if not reference > 0:
            raise ValueError(f"isolation cusum reference must be > 0, got {reference!r}")
        if not cap > reference:
            raise ValueError(f"isolation cusum cap must exceed its reference {reference}, got {cap!r}")
        self.reference, self.cap = float(reference), float(cap)
        self.state: dict[str, dict[str, float]] = {j: {n: float(v) for n, v in s.items()} for j, s in
                                                   (state or {}).items()}

    def update(self, job: str, nodes: Sequence[str], positions: np.ndarray) -> np.ndarray:
        """One round of a job: positions [nodes, metrics] -> [nodes] the statistic after it."""
        before = self.state.get(job, {})
        s = step(np.array([before.get(n, 0.0) for n in nodes]), increments(positions, cap=self.cap), self.reference)
        self.state[job] = {n: float(v) for n, v in zip(nodes, s)}
        return s

    def forget(self, job: str) -> None:
        self.state.pop(job, None)
