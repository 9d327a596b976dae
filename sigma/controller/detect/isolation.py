"""Find the culprit node of an anomalous job when no rule names one (pure numpy).

Every entity (node, or accelerator) is scored per metric in units of that metric's own noise:
- with 3 or more entities (peers), where the peers help: the entity's deviation from the peer median, against the
  spread of the peers now AND against its own usual deviation (its healthy history: a node that always runs
  hotter is no outlier); the smaller of the two, so the common workload and its phases cancel out. The peers help
  an entity for a metric when its deviation from the median of the others is spread less than its own series
  (Baseline.comparable): they share its workload;
- elsewhere (a weakly related series, a node that goes its own way, a single-node job; two peers cannot say which
  side is odd): the entity against its own healthy history alone (median / MAD, the per-node detector).

Scales mean something: a scale is never below the metric's noise floor — its resolution (the quantisation step of
its values) and its typical change between samples — so "0 everywhere, 0.03 here" is a few sigmas, not a thousand.
A metric that never moved in the healthy history (flat, constant) has no scale to learn: it abstains (scores 0;
explain.py still shows it to a person); one with no history at all (it appeared in the window) scores at most
FLAT_Z against the peers, a hint that can add to other evidence but never names a culprit alone. Each metric's
score is calibrated by how predictable it was on healthy entities: divided by (its healthy 99th-percentile score /
3), so a spiky metric needs a proportionally larger excursion. An entity's score is the mean of its top-k metric
scores, or one metric's peer score alone where the long healthy history (healthy.py: the 99.9th percentile too)
weighs it; an accelerator-level matrix reduces to its node by the node's worst accelerator. Missing values (NaN)
score 0: a gap is never evidence, and an entity without history (it joined late) is scored against its peers
alone. The evidence (`Scores.top_metrics`) ranks each metric by its strongest reading: peers, own history, long
healthy history.

Acting needs one outlier (top score >= the threshold and >= dominance x the runner-up) in `rounds` consecutive
rounds; the threshold is calibrated to the false-drain budget (budget.py), never below min_score. When several
entities are outliers at once, the job's own evidence (the node the others wait for) may pick among them;
otherwise the verdict says they cannot be told apart and the caller escalates instead of picking one.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

MAD_TO_SIGMA = 1.4826
Z_CAP = 1000.0  # keeps scores readable as evidence
FLAT_Z = 3.0  # most a metric that never moved in the healthy history can score
CALIBRATION_Q = 99.0  # healthy percentile of a metric's scores that is mapped to ...
CALIBRATION_Z = 3.0  # ... this score
REL_FLOOR = 1e-3  # the scale is at least this fraction of the level (a float's last digits are not a signal)
ABS_FLOOR = 1e-9
QUANTUM_SAMPLE = 4096  # values per metric looked at to find its resolution
STATS_SAMPLE = 20_000  # values per metric behind a typical change or a healthy percentile


def _median(a: np.ndarray, axis: int) -> np.ndarray:
    """The median of the values that are not NaN (NaN where there are none); np.nanmedian loops in Python over
    small slices, this sorts once (NaN sort last) and reads the middle of each slice's known values."""
    if not np.isnan(a).any():
        return np.median(a, axis=axis)
    s = np.sort(a, axis=axis)
    n = np.expand_dims(np.sum(~np.isnan(a), axis=axis), axis)
    lo = np.take_along_axis(s, np.maximum(n - 1, 0) // 2, axis)
    hi = np.take_along_axis(s, np.minimum(n // 2, s.shape[axis] - 1), axis)
    return np.squeeze(np.where(n > 0, (lo + hi) / 2, np.nan), axis)


def _rows(a: np.ndarray, most: int | None = None) -> np.ndarray:
    """[..., metrics] -> [rows, metrics] (also with no metrics at all); with `most`, an evenly strided sample of
    at most that many rows (a percentile of 20,000 values per metric is as good as one of millions, and cheaper)."""
    flat = a.reshape(int(np.prod(a.shape[:-1])), a.shape[-1])
    if most is not None and flat.shape[0] > most:
        flat = flat[:: -(-flat.shape[0] // most)]
    return flat


def top_k_mean(z: np.ndarray, k: int) -> np.ndarray:
    """Mean of the k largest values along the last axis."""
    k = max(1, min(k, z.shape[-1]))
    if z.shape[-1] == 0:
        return np.zeros(z.shape[:-1])
    part = np.partition(z, z.shape[-1] - k, axis=-1)[..., -k:]
    return part.mean(axis=-1)


def quantum(history: np.ndarray, rng_seed: int = 0) -> np.ndarray:
    """[metrics] the smallest positive gap between distinct values a metric takes (its resolution; 0 where it
    takes one value only). A sample of the values is enough, and keeps this cheap on large histories."""
    flat = _rows(history)
    if flat.shape[0] > QUANTUM_SAMPLE:
        idx = np.random.default_rng(rng_seed).choice(flat.shape[0], QUANTUM_SAMPLE, replace=False)
        flat = flat[idx]
    s = np.sort(flat, axis=0)  # NaN sort last
    gaps = np.diff(s, axis=0)
    gaps[~(gaps > 0)] = np.inf
    q = gaps.min(axis=0) if gaps.shape[0] else np.full(flat.shape[1], np.inf)
    q[~np.isfinite(q)] = 0.0
    return q


@dataclass
class Baseline:
    """What the healthy history says about each entity and metric; computed once per history window."""
    history: np.ndarray  # [entities, time, metrics] (kept, not copied: evidence reads its levels)
    floor: np.ndarray  # [metrics] noise floor: resolution and typical change between samples
    flat: np.ndarray  # [metrics] True where the metric has history and never moved in it (nothing to measure with)
    peer_center: np.ndarray  # [entities, metrics] usual deviation from the peer median
    peer_scale: np.ndarray  # [entities, metrics] its robust spread, at least peer_floor
    peer_floor: np.ndarray  # [metrics] the noise floor of the deviation from the peers (common workload removed)
    peer_weight: np.ndarray  # [metrics] calibration: CALIBRATION_Z / the healthy CALIBRATION_Q percentile (<= 1)
    own: tuple[np.ndarray, np.ndarray, np.ndarray]  # (center, scale, weight) against its own history alone
    known: np.ndarray  # [metrics] True where some entity has history of the metric
    # [entities, metrics] True where the peers help: the entity's deviation from them is steadier than its own
    # series (they share its workload). Elsewhere (a weakly related series, a node that goes its own way) it is
    # judged against its own history alone.
    comparable: np.ndarray


def noise_floor(history: np.ndarray, moving: np.ndarray | None = None) -> np.ndarray:
    """[metrics] max(resolution, median absolute change between consecutive samples of `moving` (default: the
    history itself), REL_FLOOR x level)."""
    q = quantum(history)
    step = _rows(np.abs(np.diff(history if moving is None else moving, axis=1)), STATS_SAMPLE)
    # a metric that mostly holds still moves by its resolution when it moves: the median of the nonzero changes
    moved = np.where(step > 0, step, np.inf)
    moved.sort(axis=0)
    count = (step > 0).sum(axis=0)
    change = np.where(count > 0, moved[np.maximum(count - 1, 0) // 2, np.arange(step.shape[1])], 0.0) \
        if step.shape[0] else np.zeros_like(q)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        level = np.nan_to_num(_median(np.abs(_rows(history, STATS_SAMPLE)), axis=0))
    return np.maximum.reduce([q, change, REL_FLOOR * level, np.full_like(q, ABS_FLOOR)])


def _calibration(values: np.ndarray, center: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """[metrics] weight that maps a metric's healthy CALIBRATION_Q percentile score (values [entities, time,
    metrics] against center and scale [entities, metrics]) to CALIBRATION_Z; on a sample of the rows."""
    E, T, M = values.shape
    rows = np.arange(0, E * T, max(1, -(-E * T // STATS_SAMPLE)))
    z = _z(values.reshape(E * T, M)[rows], center[rows // T], scale[rows // T])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        if not z.shape[0]:
            q = np.zeros(M)
        else:
            q = np.nanpercentile(z, CALIBRATION_Q, axis=0) if np.isnan(z).any() else np.percentile(
                z, CALIBRATION_Q, axis=0)
    q = np.nan_to_num(q, nan=0.0)
    return np.minimum(1.0, CALIBRATION_Z / np.maximum(q, 1e-9))


def baseline(history: np.ndarray, comparable_ratio: float = 1.0) -> Baseline:
    """history: [entities, time, metrics] of healthy operation (NaN where missing). comparable_ratio: the peers
    help where the entity's deviation from them is spread less than this times its own series."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN slices: a metric an entity never reported
        floor = noise_floor(history)
        spread = np.nanmax(history, axis=(0, 1)) - np.nanmin(history, axis=(0, 1))
        known = np.isfinite(spread)
        flat = known & (np.nan_to_num(spread, nan=0.0) == 0)
        # the deviation from the peers at the same time: the common workload (and its phases) cancels out
        residual = history - _median(history, axis=0)[None, :, :]
        peer_floor = noise_floor(history, residual) if history.shape[0] >= 3 else floor
        peer_center = _median(residual, axis=1)
        raw_scale = _median(np.abs(residual - peer_center[:, None, :]), axis=1) * MAD_TO_SIGMA
        # a quiet history gives a small scale by chance: at least the peers' typical one
        peer_scale = np.maximum(np.maximum(raw_scale, _median(raw_scale, axis=0)[None, :]), peer_floor)
        peer_weight = _calibration(residual, peer_center, peer_scale)
        center = _median(history, axis=1)
        own_raw = _median(np.abs(history - center[:, None, :]), axis=1) * MAD_TO_SIGMA
        own_scale = np.maximum(own_raw, floor)
        own = (center, own_scale, _calibration(history, center, own_scale))
        comparable = (history.shape[0] >= 3) & (_apart_scale(history, raw_scale) < comparable_ratio * own_raw)
    return Baseline(history, floor, flat, peer_center, peer_scale, peer_floor, peer_weight, own, known,
                    np.nan_to_num(comparable, nan=0.0).astype(bool))


LEAVE_ONE_OUT = 64  # up to this many entities, an entity's deviation for comparability is from the others' median


def _apart_scale(history: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """[entities, metrics] the robust spread of each entity's deviation from the median of the *other* entities
    (its own value pulls the median of all towards it: with unrelated series it would seem to follow its peers);
    beyond LEAVE_ONE_OUT entities that pull is negligible and `scale` (of the deviation from all) is used."""
    E = history.shape[0]
    if E < 3 or E > LEAVE_ONE_OUT:
        return scale
    out = np.empty(scale.shape)
    for i in range(E):
        dev = history[i] - _median(np.delete(history, i, axis=0), axis=0)
        out[i] = _median(np.abs(dev - _median(dev, axis=0)[None, :]), axis=0) * MAD_TO_SIGMA
    return out


def _z(values: np.ndarray, center, scale) -> np.ndarray:
    """|values - center| / scale, capped (NaN where either is unknown)."""
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.minimum(np.abs(values - center) / scale, Z_CAP)


@dataclass
class Scores:
    """One round: per entity (or node) the score, and per entity the metric scores behind it."""
    total: np.ndarray  # [nodes]
    metric_z: np.ndarray  # [entities, metrics] calibrated metric scores (0 where nothing is known)
    entity_node: np.ndarray | None = None
    # [entities, metrics] what ranks the metrics behind a score (default metric_z): each metric's strongest reading
    evidence: np.ndarray | None = None

    def top_metrics(self, node: int, names: Sequence[str], n: int = 5) -> list[tuple[str, float]]:
        """The metrics behind a node's score, highest first (its worst entity's, for accelerators)."""
        rows = np.array([node]) if self.entity_node is None else np.flatnonzero(self.entity_node == node)
        if rows.size == 0 or self.metric_z.shape[1] == 0:
            return []
        z = (self.metric_z if self.evidence is None else self.evidence)[rows].max(axis=0)
        order = np.argsort(-z)[:n]
        return [(names[j], round(float(z[j]), 2)) for j in order if z[j] > 0]


def metric_scores(current: np.ndarray, base: Baseline | None = None, jitter: np.ndarray | None = None,
                  peers: bool | None = None) -> np.ndarray:
    """[..., entities, metrics] calibrated metric scores of one round, or of rounds stacked on leading axes (NaN-free;
    0 where nothing is known). peers: use the spatial score (default: with 3 or more entities). Each metric is
    judged against the peers where they help (Baseline.comparable), else against the entity's own history alone;
    a metric that never moved in the history scores 0 (abstains); one with no history at all, at most FLAT_Z
    against the peers."""
    return _scores(current, base, jitter, peers)[0]


def _scores(current: np.ndarray, base: Baseline | None, jitter: np.ndarray | None, peers: bool | None
            ) -> tuple[np.ndarray, np.ndarray | None]:
    """(metric_scores, the peer scores alone or None without peers or history: what the lone weights scale)."""
    peers = current.shape[-2] >= 3 if peers is None else peers
    peer = None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        own = None
        if base is not None:  # each entity against its own history alone
            center, scale, weight = base.own
            own = _z(current, center, scale) * weight
        if not peers:
            z = np.zeros(current.shape) if own is None else own
        else:
            med = _median(current, axis=-2)
            residual = current - med[..., None, :]
            # the peers now: the deviation against the spread of the peers, at least the noise floor and the jitter
            floor = np.maximum(REL_FLOOR * np.abs(med), ABS_FLOOR) if base is None else base.peer_floor
            if jitter is not None:
                floor = np.maximum(floor, jitter)
            spread = np.maximum(_median(np.abs(residual), axis=-2) * MAD_TO_SIGMA, floor)
            z = _z(residual, 0.0, spread[..., None, :])
            if base is not None:
                # ... and against the entity's own history of that deviation (a node that always differs is no
                # outlier); where it has none (it joined late), the peers alone
                usual = _z(residual, base.peer_center, base.peer_scale)
                peer = np.where(np.isnan(usual), z, np.minimum(z, usual)) * base.peer_weight
                peer = np.where(base.known, peer, np.minimum(z, FLAT_Z))
                # where the peers do not help, its own history alone (the peers where it has none)
                z = np.where(base.comparable | np.isnan(own), peer, own)
        if base is not None:
            z = np.where(base.flat, 0.0, z)
            if peer is not None:
                peer = np.nan_to_num(np.where(base.flat, 0.0, peer), nan=0.0, posinf=Z_CAP)
    return np.nan_to_num(z, nan=0.0, posinf=Z_CAP), peer


def per_node(entity_scores: np.ndarray, entity_node: np.ndarray, n_nodes: int) -> np.ndarray:
    """Reduce accelerator scores to their node's worst one."""
    out = np.zeros(n_nodes)
    np.maximum.at(out, entity_node, entity_scores)
    return out


def score(nodes: Sequence[str], current: np.ndarray, history: np.ndarray | None = None,
          entity_node: np.ndarray | None = None, k: int = 3, base: Baseline | None = None,
          jitter: np.ndarray | None = None, lone: Callable[[Baseline], np.ndarray] | None = None,
          position: Callable[[np.ndarray], np.ndarray] | None = None) -> Scores:
    """One isolation round. current: [entities, metrics] (or rounds stacked on leading axes, without entity_node and
    position: the benches score a whole split at once); history: [entities, time, metrics] or None (or its
    precomputed `baseline`); entity_node maps each entity (accelerator) to its node index (default: one entity per
    node); jitter: each metric's usual movement within the window (a gap between peers smaller than that is
    sampling noise); lone(baseline): [metrics] the weight of one metric's peer score alone, from the long healthy
    history (healthy.lone_weights; NaN where there is too little): a metric may then name an entity alone.
    position(deviations from the peer median): [entities, metrics] how far each lies in the entity's long healthy
    history (healthy.Sketches.positions; NaN where unknown): evidence only, it ranks the metrics and decides
    nothing."""
    if base is None and history is not None and history.shape[1] >= 3:
        base = baseline(history)
    n_nodes = len(nodes)
    peers = n_nodes >= 3
    z, peer = _scores(current, base, jitter, peers)
    totals = top_k_mean(z, k)
    if lone is not None and peer is not None and z.shape[-1]:
        # the peer scores, weighted by how far the metric reaches on healthy nodes (its 99.9th percentile too):
        # one metric alone reaches min_score only beyond what the node's long history of deviations from its
        # peers ever does (those histograms calibrate it, whether or not the peers help in the hour)
        alone = peer / base.peer_weight * np.nan_to_num(lone(base), nan=0.0)
        totals = np.maximum(totals, alone.max(axis=-1))
        z = np.maximum(z, alone)  # the evidence: the scores that decided
    evidence = _evidence(current, z, base, position) if peers and z.shape[-1] else None
    if entity_node is not None:
        totals = per_node(totals, entity_node, n_nodes)
    return Scores(totals, z, entity_node, evidence)


def _evidence(current: np.ndarray, z: np.ndarray, base: Baseline | None,
              position: Callable[[np.ndarray], np.ndarray] | None) -> np.ndarray:
    """Each metric's strongest calibrated reading: against the peers (the score that decided), against the entity's
    own history, and against its long healthy history of deviations from the peers. The peer score alone ranks
    well the metrics that moved apart from the peers; the cause of a fault also shows in metrics the peers moved
    with, or that moved within the hour's noise but beyond anything the long history saw. (Chosen on the first
    half of bench/isolation_real.py's chronological ASD split: HitRate@100 % 0.78 -> 0.83; docs/controller.md.)"""
    out = z
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        if base is not None:
            out = np.maximum(out, metric_scores(current, base, peers=False))
        if position is not None:
            far = position(current - _median(current, axis=-2)[..., None, :])
            out = np.maximum(out, np.nan_to_num(far, nan=0.0, posinf=Z_CAP))
    return out


def score_nodes(nodes: Sequence[str], current: np.ndarray, history: np.ndarray | None = None,
                entity_node: np.ndarray | None = None, k: int = 3, base: Baseline | None = None,
                jitter: np.ndarray | None = None, lone: Callable[[Baseline], np.ndarray] | None = None,
                position: Callable[[np.ndarray], np.ndarray] | None = None) -> np.ndarray:
    """The per-node totals of `score`."""
    return score(nodes, current, history, entity_node, k, base, jitter, lone, position).total


@dataclass
class Verdict:
    culprit: str | None  # the outlier this round, if any
    ranked: list[tuple[str, float]]  # (node, score), best first (the evidence)
    reason: str
    ambiguous: list[str] = field(default_factory=list)  # several outliers the data cannot tell apart


def pick_outlier(names: Sequence[str], scores: np.ndarray, min_score: float, dominance: float,
                 keep: int = 5, hint: str | None = None) -> Verdict:
    """hint: the node the job's own evidence points at (the one the others wait for), used to choose among
    several outliers; never to make one."""
    order = np.argsort(-scores)
    ranked = [(names[i], round(float(scores[i]), 3)) for i in order[:keep]]
    if len(names) == 0:
        return Verdict(None, ranked, "no nodes")
    top = float(scores[order[0]])
    second = float(scores[order[1]]) if len(names) > 1 else 0.0
    if top < min_score:
        return Verdict(None, ranked, f"top score {top:.1f} below {min_score}")
    outliers = [names[i] for i in order if scores[i] >= min_score]
    if len(outliers) > 1:
        if hint in outliers:
            return Verdict(hint, ranked, f"{len(outliers)} outliers; the job's ranks wait for {hint}")
        return Verdict(None, ranked, f"{len(outliers)} outliers ({', '.join(outliers[:keep])}) cannot be told "
                                     f"apart", ambiguous=outliers)
    if top < dominance * max(second, 1e-9):
        return Verdict(None, ranked, f"top score {top:.1f} not {dominance}x the runner-up {second:.1f}")
    return Verdict(names[order[0]], ranked, f"{names[order[0]]} scores {top:.1f}, runner-up {second:.1f}")


class Streaks:
    """Consecutive rounds each job has had the same outlier (kept by the caller between rounds).

    A round scored on telemetry counts only once its window has moved past the last counted one (`spacing`): the
    controller scores every second over a sliding window, and two rounds a second apart share all but a second of
    their data, one piece of evidence rather than two. The ranks' own word (spacing 0) counts every round."""

    def __init__(self, state: Mapping[str, list] | None = None):
        self.state: dict[str, list] = dict(state or {})  # job -> [node, count, time of the last counted round]

    def update(self, job: str, culprit: str | None, now: float | None = None, spacing: float = 0.0) -> int:
        if culprit is None:
            self.state.pop(job, None)
            return 0
        node, count, counted = (list(self.state.get(job, [])) + [None, 0, None])[:3]
        if node != culprit:
            count, counted = 1, now
        elif now is None or counted is None or now - counted >= spacing:
            count, counted = count + 1, now
        self.state[job] = [culprit, count, counted]
        return count
