"""The false-drain budget isolation keeps by construction (pure numpy).

The budget is stated in false drains per node-day (IsolationConfig.budget_per_1000_node_days / 1000). A score verdict
acts when a node's score stays at or above the action threshold for `rounds` consecutive rounds, one round per
`window_s`: its *action statistic* is the smallest of its last `rounds` scores. So the threshold is a quantile of
that statistic on healthy rounds: the one a healthy node exceeds at most `rate` = budget x window_s / 86,400 times
per round (p = 1.4e-6 at one per 1,000 node-days and 120 s rounds).

Where that quantile comes from (`calibrate`), from the cluster's own healthy rounds (`Tail`: how many there were
and the KEEP largest, a fixed-size record that re-calibrates as history grows):
- *empirical*: once the history holds n >= -ln(1 - CONFIDENCE) / rate healthy rounds (3 / rate at 95 %), the
  largest action statistic ever seen is a threshold whose exceedance rate is at most `rate` at that confidence
  (no exceedance in n rounds), whatever the distribution;
- *tail fit*: before that, the peaks over a high threshold u (the k-th largest value) follow a generalised Pareto
  distribution (Pickands-Balkema-de Haan); its parameters are fitted by probability-weighted moments (Hosking &
  Wallis 1987) and the quantile at `rate` is extrapolated from it; the threshold is the upper CONFIDENCE bound of
  that quantile over BOOTSTRAP resamples of the peaks (heavier tails or fewer peaks give a higher threshold). The
  fit is trusted only with at least MIN_TAIL peaks and no further than MAX_EXTRAPOLATION times beyond the share of
  history the peaks are (k / n <= MAX_EXTRAPOLATION x rate);
- otherwise the history does not support the budget yet: the verdict only notifies (`Calibration.threshold` is
  None) and says how many healthy rounds it still needs.
The threshold is never below the configured floor (`min_score`). Rounds of nodes under suspicion are not healthy
history (the caller's word); unlabelled anomalies that slip in only raise the threshold: the safe side.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass

import numpy as np

DAY_S = 86400.0
CONFIDENCE = 0.95
KEEP = 512  # largest healthy action statistics kept per tail
MIN_TAIL = 50  # peaks a tail fit needs
MAX_EXTRAPOLATION = 1000.0  # a tail fit is trusted down to rates this many times below the share of its peaks
BOOTSTRAP = 200  # resamples behind the upper confidence bound of a tail fit


def allowed_rate(budget_per_node_day: float, window_s: float) -> float:
    """Exceedances per node and round that keep false drains within the budget (rounds are window_s apart)."""
    return budget_per_node_day * window_s / DAY_S


class Tail:
    """How many healthy action statistics a cluster (or one job shape) has seen, and the KEEP largest of them."""

    def __init__(self, n: int = 0, top: np.ndarray | None = None):
        self.n = int(n)
        self.top = np.sort(np.asarray([] if top is None else top, float))[::-1][:KEEP]

    def add(self, values) -> int:
        v = np.asarray(values, float).ravel()
        v = v[np.isfinite(v)]
        if v.size:
            self.n += int(v.size)
            self.top = np.sort(np.concatenate([self.top, v]))[::-1][:KEEP]
        return int(v.size)

    def dumps(self) -> str:
        return json.dumps({"n": self.n, "top": [round(float(x), 4) for x in self.top]})

    @classmethod
    def loads(cls, text: str) -> Tail:
        d = json.loads(text)
        return cls(int(d["n"]), np.asarray(d["top"], float))


@dataclass
class Calibration:
    """The action threshold a tail supports for a rate, and the evidence for it."""
    threshold: float | None  # score to act at; None: the history does not support the budget yet (notify only)
    rate: float  # allowed exceedances per node and round
    n: int  # healthy node-rounds behind it
    method: str  # 'empirical', 'tail fit' or 'too little history'
    detail: str  # the evidence, in words
    needed: int = 0  # healthy node-rounds it needs before it may act (where it may not yet)

    @property
    def acts(self) -> bool:
        return self.threshold is not None

    def as_dict(self) -> dict:
        return asdict(self)


def _gpd_pwm(y: np.ndarray) -> tuple[float, float]:
    """(shape xi, scale sigma) of a generalised Pareto fitted to the excesses y > 0 by probability-weighted
    moments (Hosking & Wallis 1987; their k is -xi)."""
    y = np.sort(y)
    k = y.size
    a0 = y.mean()
    a1 = np.mean((1.0 - (np.arange(1, k + 1) - 0.35) / k) * y)
    d = a0 - 2.0 * a1
    if d <= 0 or a0 <= 0:
        return float("inf"), float(a0)
    return -(a0 / d - 2.0), 2.0 * a0 * a1 / d


def _gpd_quantile(u: float, xi: float, sigma: float, share: float, rate: float) -> float:
    """The value exceeded with probability `rate` when a share `share` of all values lie above u."""
    x = rate / share
    if not math.isfinite(xi):
        return float("inf")
    if abs(xi) < 1e-9:
        return u - sigma * math.log(x)
    return u + sigma / xi * (x ** (-xi) - 1.0)


def calibrate(tail: Tail, rate: float, floor: float, confidence: float = CONFIDENCE, seed: int = 0) -> Calibration:
    """The threshold that keeps the exceedance rate of the tail's statistic within `rate` at `confidence`."""
    n, top = tail.n, tail.top
    empirical_n = int(math.ceil(-math.log(1.0 - confidence) / rate))
    if n >= empirical_n and top.size:
        return Calibration(max(floor, float(top[0])), rate, n, "empirical",
                           f"never above {top[0]:.2f} in {n:,} healthy node-rounds (the {confidence:.0%} bound on "
                           f"its rate {-math.log(1 - confidence) / n:.2g} <= {rate:.2g})")
    # the most peaks whose share of history is within MAX_EXTRAPOLATION x rate (the closest a fit comes to it)
    k = min(top.size - 1, int(MAX_EXTRAPOLATION * rate * n))
    needed = int(math.ceil(MIN_TAIL / (MAX_EXTRAPOLATION * rate)))
    if k < MIN_TAIL:
        return Calibration(None, rate, n, "too little history",
                           f"{n:,} healthy node-rounds; a tail fit needs {needed:,} ({MIN_TAIL} peaks, extrapolated at"
                           f" most {MAX_EXTRAPOLATION:g}x)", needed=needed)
    u = float(top[k])
    excess = top[:k] - u
    share = k / n
    xi, sigma = _gpd_pwm(excess)
    point = _gpd_quantile(u, xi, sigma, share, rate)
    rng = np.random.default_rng(seed)
    bounds = []
    for _ in range(BOOTSTRAP):
        bxi, bsigma = _gpd_pwm(rng.choice(excess, excess.size))
        bounds.append(_gpd_quantile(u, bxi, bsigma, share, rate))
    upper = float(np.quantile(bounds, confidence))
    if not math.isfinite(upper):
        return Calibration(None, rate, n, "too little history",
                           f"{n:,} healthy node-rounds: the tail above {u:.2f} is too heavy to bound (shape "
                           f"{xi:.2f})", needed=2 * n)
    return Calibration(max(floor, upper), rate, n, "tail fit",
                       f"{n:,} healthy node-rounds, the {k} largest above {u:.2f}: generalised Pareto shape {xi:.2f}, "
                       f"scale {sigma:.2f}; the score exceeded {rate:.2g} of rounds {point:.2f}, its {confidence:.0%} "
                       f"bound {upper:.2f}")


CLUSTER = "cluster"  # the tail every healthy round feeds; a job shape's own tail is kept beside it
RECALIBRATE = 0.01  # a tail's calibration is recomputed once its history grew by this share


class Calibrator:
    """The healthy action statistics of a cluster and of each job shape, and the threshold they support.

    Each healthy round of a job adds, per node, the smallest of its last `rounds` scores (rounds counted once per
    window_s, as the verdicts count them) to the cluster's tail and to the tail of the job's shape (jobs of the same
    name and size: a pipeline's first stage or an expert-heavy rank differs the same way in every run). The
    threshold for a job is the higher of the cluster's and its shape's where each supports the budget; without the
    cluster's support there is none (notify only).

    The budget counts node time, and a verdict is only asked for where the watchdog found a job anomalous: the
    allowed exceedance per *asked* node-round is the budget's rate divided by the share of node-rounds isolation
    is asked about (its upper confidence bound, (sqrt(k + 1) + 1)^2 / n for k asked of n; at most 1): expected false
    drains = asked node-rounds x exceedance rate <= budget x node time. The scores of a healthy node in an asked
    round are taken to be those of its healthy rounds (a job-wide slowdown moves every node alike)."""

    def __init__(self, budget_per_node_day: float, window_s: float, rounds: int, floor: float, shapes: int = 64):
        self.budget, self.window_s, self.rounds, self.floor = budget_per_node_day, window_s, rounds, floor
        self.rate = allowed_rate(budget_per_node_day, window_s)
        self.shapes = shapes  # job shapes kept (the least recently fed go first)
        self.tails: dict[str, Tail] = {}
        self.fed: dict[str, float] = {}  # shape -> when it was last fed
        self.recent: dict[str, tuple[float, dict[str, list[float]]]] = {}  # job -> (last counted, node -> scores)
        self.node_rounds = 0  # node time seen, in rounds (every running job's nodes, once per window_s)
        self.asked_rounds = 0  # node-rounds isolation was asked about
        self._exposed_at = float("-inf")
        self._asked_at: dict[str, float] = {}
        self._cache: dict[str, tuple[tuple, Calibration]] = {}

    # ---------- history ----------
    def exposure(self, nodes: int, now: float) -> None:
        """Running nodes now (counted once per window_s)."""
        if now - self._exposed_at >= self.window_s:
            self.node_rounds += int(nodes)
            self._exposed_at = now

    def asked(self, job: str, nodes: int, now: float) -> None:
        """Isolation was asked about a job (counted once per window_s per job)."""
        if now - self._asked_at.get(job, float("-inf")) >= self.window_s:
            self.asked_rounds += int(nodes)
            self._asked_at[job] = now
            if len(self._asked_at) > 4096:
                self._asked_at = dict(sorted(self._asked_at.items(), key=lambda kv: kv[1])[-2048:])

    def last_round(self, job: str) -> float:
        return self.recent.get(job, (float("-inf"), {}))[0]

    def due(self, job: str, now: float) -> bool:
        return now - self.last_round(job) >= self.window_s

    def observe(self, job: str, shape: str, nodes, totals, healthy: bool, now: float) -> int:
        """One scored round of a job (totals per node); healthy: nothing flagged the job or its nodes this round.
        Returns the node statistics added (0 until `rounds` rounds were counted, or when not healthy)."""
        last, scores = self.recent.get(job, (float("-inf"), {}))
        if now - last < self.window_s:
            return 0
        if not healthy:  # a round under suspicion breaks the run: the next statistics start after it
            self.recent[job] = (now, {})
            return 0
        scores = {n: (scores.get(n, []) + [float(v)])[-self.rounds:] for n, v in zip(nodes, totals)}
        self.recent[job] = (now, scores)
        if len(self.recent) > 4096:  # jobs long gone
            self.recent = dict(sorted(self.recent.items(), key=lambda kv: kv[1][0])[-2048:])
        stats = [min(v) for v in scores.values() if len(v) == self.rounds]
        if not stats:
            return 0
        for key in (CLUSTER, shape):
            self.tails.setdefault(key, Tail()).add(stats)
            self.fed[key] = now
        if len(self.tails) > self.shapes + 1:
            oldest = min((k for k in self.tails if k != CLUSTER), key=lambda k: self.fed.get(k, 0.0))
            self.tails.pop(oldest), self.fed.pop(oldest, None), self._cache.pop(oldest, None)
        return len(stats)

    # ---------- thresholds ----------
    @property
    def asked_share(self) -> float:
        """Upper confidence bound of the share of node-rounds isolation is asked about (1 without node time)."""
        if self.node_rounds <= 0:
            return 1.0
        return min(1.0, (math.sqrt(self.asked_rounds + 1) + 1) ** 2 / self.node_rounds)

    def calibration(self, key: str = CLUSTER) -> Calibration:
        tail = self.tails.get(key, Tail())
        rate = min(1.0, self.rate / self.asked_share)
        cached = self._cache.get(key)
        if cached is None or tail.n > cached[0][0] * (1 + RECALIBRATE) or (tail.n and not cached[0][0]) \
                or not math.isclose(rate, cached[0][1], rel_tol=0.05):
            cached = self._cache[key] = ((tail.n, rate), calibrate(tail, rate, self.floor))
        return cached[1]

    def for_shape(self, shape: str) -> tuple[Calibration, str]:
        """(the calibration a job of this shape acts on, which tail it comes from): the cluster's, or its shape's
        where that supports the budget and asks more."""
        cluster = self.calibration(CLUSTER)
        if shape not in self.tails or not cluster.acts:
            return cluster, CLUSTER
        own = self.calibration(shape)
        return (own, shape) if own.acts and own.threshold > cluster.threshold else (cluster, CLUSTER)

    def summary(self) -> dict:
        """What `sigma controller rules` and the evidence show: the budget and each tail's calibration."""
        return {"budget_per_1000_node_days": round(1000 * self.budget, 6), "rounds": self.rounds,
                "window_s": self.window_s, "rate_per_node_round": self.rate, "node_rounds": self.node_rounds,
                "asked_node_rounds": self.asked_rounds, "asked_share_bound": self.asked_share,
                "tails": {k: self.calibration(k).as_dict() for k in sorted(self.tails, key=lambda k: k != CLUSTER)}}

    # ---------- persistence ----------
    def dumps(self) -> str:
        return json.dumps({"statistic": [self.rounds, self.window_s], "node_rounds": self.node_rounds,
                           "asked_rounds": self.asked_rounds, "fed": self.fed,
                           "tails": {k: t.dumps() for k, t in self.tails.items()}})

    def load(self, text: str, statistic: tuple | None = None) -> None:
        """The state `dumps` wrote (the recent scores of running jobs start again); tails of another statistic
        (other rounds or window_s) are not this one's history and are left out."""
        d = json.loads(text)
        if statistic is not None and tuple(d.get("statistic", ())) != tuple(statistic):
            return
        self.tails = {k: Tail.loads(v) for k, v in d.get("tails", {}).items()}
        self.fed = {k: float(v) for k, v in d.get("fed", {}).items()}
        self.node_rounds, self.asked_rounds = int(d.get("node_rounds", 0)), int(d.get("asked_rounds", 0))
        self._cache.clear()
