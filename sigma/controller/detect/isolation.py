"""Find the culprit node of an anomalous job when no rule names one (pure numpy).

Synchronous training makes healthy peers look alike, so a node is suspicious when it deviates from its peers in
the same job (spatial score) and from its own healthy history (temporal score). Scores are robust z-scores
(median/MAD; the temporal one on the deviation from the peers, so the common workload cancels out), aggregated
per entity as the mean of its top-k metric deviations, so a fault that moves a handful
of the hundreds of metrics still stands out while one noisy metric does not. An accelerator-level matrix is
reduced to its node by the node's worst accelerator.

Acting needs a dominant outlier (top score >= min_score and >= dominance x the runner-up) in `rounds`
consecutive rounds; the ranked evidence is kept with the decision.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

MAD_TO_SIGMA = 1.4826
Z_CAP = 1000.0


def robust_z(values: np.ndarray, center: np.ndarray, scale: np.ndarray, rel_floor: float = 1e-3,
             abs_floor: float = 1e-6) -> np.ndarray:
    """|values - center| / scale, with the scale floored so identical peers do not divide by zero."""
    floor = np.maximum(rel_floor * np.abs(center), abs_floor)
    # capped: a deviation among identical peers is "very large", not 1e6 (keeps scores readable as evidence)
    return np.minimum(np.abs(values - center) / np.maximum(scale, floor), Z_CAP)


def top_k_mean(z: np.ndarray, k: int) -> np.ndarray:
    """Mean of the k largest values along the last axis."""
    k = max(1, min(k, z.shape[-1]))
    part = np.partition(z, z.shape[-1] - k, axis=-1)[..., -k:]
    return part.mean(axis=-1)


def spatial_z(current: np.ndarray, jitter: np.ndarray | None = None) -> np.ndarray:
    """current: [entities, metrics] (NaN = missing). Each entity against the median of all of them; the spread
    of the peers is at least `jitter` [metrics] (peers that happen to agree closely do not make noise a fault)."""
    med = np.nanmedian(current, axis=0) if np.isnan(current).any() else np.median(current, axis=0)
    dev = np.abs(current - med)
    mad = (np.nanmedian(dev, axis=0) if np.isnan(dev).any() else np.median(dev, axis=0)) * MAD_TO_SIGMA
    return robust_z(current, med, mad if jitter is None else np.maximum(mad, jitter))


def _median(a: np.ndarray, axis: int) -> np.ndarray:
    return np.nanmedian(a, axis=axis) if np.isnan(a).any() else np.median(a, axis=axis)


def history_stats(history: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each entity's healthy history [entities, time, metrics] -> (center, scale) of its deviation from the peer
    median at the same time. Removing the common workload first means a job changing phase is not a fault;
    computed once per history window and reused by every round."""
    residual = history - _median(history, axis=0)[None, :, :]
    center = _median(residual, axis=1)
    scale = _median(np.abs(residual - center[:, None, :]), axis=1) * MAD_TO_SIGMA
    # a few dozen points give a noisy scale; an entity whose history happened to be quiet must not turn every
    # wiggle into an outlier, so the scale is at least the typical scale of its peers for that metric
    pooled = _median(scale, axis=0)
    return center, np.maximum(scale, pooled[None, :])


def temporal_z(current: np.ndarray, stats: tuple[np.ndarray, np.ndarray]) -> np.ndarray:
    """How far each entity's deviation from its peers now is from its usual deviation (its own history)."""
    center, scale = stats
    residual = current - _median(current, axis=0)[None, :]
    return robust_z(residual, center, scale, rel_floor=0.0)


def combine(spatial: np.ndarray, temporal: np.ndarray | None) -> np.ndarray:
    """Per metric: where the entity has history, both must agree (the smaller score: high only if it differs from
    its peers AND from its own past); where it has none (e.g. KPIs of a fresh job), the spatial score alone."""
    if temporal is None:
        return spatial
    return np.where(np.isnan(temporal), spatial, np.minimum(spatial, temporal))


def per_node(entity_scores: np.ndarray, entity_node: np.ndarray, n_nodes: int) -> np.ndarray:
    """Reduce accelerator scores to their node's worst one."""
    out = np.zeros(n_nodes)
    np.maximum.at(out, entity_node, entity_scores)
    return out


@dataclass
class Verdict:
    culprit: str | None  # the dominant outlier this round, if any
    ranked: list[tuple[str, float]]  # (node, score), best first (the evidence)
    reason: str


def pick_outlier(names: Sequence[str], scores: np.ndarray, min_score: float, dominance: float,
                 keep: int = 5) -> Verdict:
    order = np.argsort(-scores)
    ranked = [(names[i], round(float(scores[i]), 3)) for i in order[:keep]]
    if len(names) < 3:
        return Verdict(None, ranked, "fewer than 3 peers: no spatial baseline")
    top, second = float(scores[order[0]]), float(scores[order[1]])
    if top < min_score:
        return Verdict(None, ranked, f"top score {top:.1f} below {min_score}")
    if top < dominance * max(second, 1e-9):
        return Verdict(None, ranked, f"top score {top:.1f} not {dominance}x the runner-up {second:.1f}")
    return Verdict(names[order[0]], ranked, f"{names[order[0]]} scores {top:.1f}, runner-up {second:.1f}")


def score_nodes(nodes: Sequence[str], current: np.ndarray, history: np.ndarray | None = None,
                entity_node: np.ndarray | None = None, k: int = 3,
                stats: tuple[np.ndarray, np.ndarray] | None = None, jitter: np.ndarray | None = None) -> np.ndarray:
    """One isolation round. current: [entities, metrics]; history: [entities, time, metrics] or None (or its
    precomputed history_stats); entity_node maps each entity (accelerator) to its node index (default: one
    entity per node); jitter: each metric's usual movement within the window (see spatial_z)."""
    with warnings.catch_warnings():  # all-NaN columns (a metric nobody reports) are expected
        warnings.simplefilter("ignore", RuntimeWarning)
        spatial = spatial_z(current, jitter)
        if stats is None and history is not None and history.shape[1] >= 3:
            stats = history_stats(history)
        temporal = temporal_z(current, stats) if stats is not None else None
        z = np.nan_to_num(combine(spatial, temporal), nan=0.0, posinf=1e6)
    scores = top_k_mean(z, k)
    if entity_node is None:
        return scores
    return per_node(scores, entity_node, len(nodes))


class Streaks:
    """Consecutive rounds each job has had the same dominant outlier (kept by the caller between rounds)."""

    def __init__(self, state: Mapping[str, list] | None = None):
        self.state: dict[str, list] = dict(state or {})  # job -> [node, count]

    def update(self, job: str, culprit: str | None) -> int:
        if culprit is None:
            self.state.pop(job, None)
            return 0
        node, count = self.state.get(job, [None, 0])
        count = count + 1 if node == culprit else 1
        self.state[job] = [culprit, count]
        return count
