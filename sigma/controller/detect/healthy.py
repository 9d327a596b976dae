"""Each node's healthy deviation from its peers, per series, in fixed memory: the long memory isolation's weights need.

The isolation score (isolation.py) learns its scales from the last hour. That is enough for a metric's typical
noise, not for how rare its healthy spikes are: a metric whose healthy spikes jump far past its 99th percentile (a
rare event of a discrete size) needs its 99.9th percentile, about a thousand values per node. So per (node, series)
the controller keeps a log-bucket histogram of the node's deviation from its job's peer median (the quantity the
peer score measures), one value per `window_s` while the node is not under suspicion: two signs x SIDE buckets
GAMMA apart (each quantile within a factor GAMMA^0.5 of the truth), centred on the first value it saw, plus one for
an exact 0; values beyond the range count in the end buckets. Memory is fixed per (node, series); counts are halved
past CAP, so old behaviour fades and the counts fit in 16 bits.

From it, per metric, the weight of a lone metric: its healthy 99th-percentile peer score mapped to CALIBRATION_Z
and its 99.9th to where a Gaussian's would fall (x 3.29 / 2.58), the median over the job's nodes with MIN_VALUES or
more healthy values. With it one metric alone may name a node (isolation.score); without it (too little healthy
history) it may not, as before.

Who teaches (`Sketches.teach`, the controller's feed and the benches alike): a node not under suspicion, and
clearly below it: not one whose three farthest series lie, on average, 3x beyond their own healthy 99.5th
percentile (`positions`). An anomaly too small to act on would otherwise teach that it is normal. The same
positions rank a verdict's evidence (isolation.score's `position`).

Bad input: NaN and gaps are not values (nothing is added); a counter's reset gives no rate for that slice (the
feature reader marks the series a gauge, whose level is then not mixed with its rates: those slices are skipped);
a series that appears late starts its own histogram, one that vanishes keeps its own; a node of a job with a
finding, or one being remediated, teaches nothing.
"""

from __future__ import annotations

import base64
import io
import json
import logging
import math
import warnings
import zlib
from collections.abc import Callable, Iterable, Sequence
from statistics import NormalDist

import numpy as np

from sigma.controller.detect.features import KPI_FEATURES, STATS, _counters, _stack, job_matrices
from sigma.controller.detect.samples import bucket_stats

GAMMA = 1.3  # ratio between neighbouring buckets
SIDE = 40  # buckets per sign: a range of GAMMA^SIDE (36,000x) around the first value
BUCKETS = 2 * SIDE + 1
ZERO = SIDE  # the bucket of an exact 0; negatives below it, positives above
CAP = 50_000.0  # a histogram's counts are halved past this many
MIN_VALUES = 500  # healthy values a node's histogram needs before its percentiles count
NODES_PER_TICK = 16  # nodes whose slice is read in one tick
SLICE_S = 20.0  # seconds of samples each value is the mean (a gauge) or rate (a counter) of
SAVE_S = 600.0  # how often the histograms are written to detector_state
STATE_KEY = "isolation.healthy"
WEIGHTS_S = 300.0  # a job's lone weights are recomputed at most this often (loop.HISTORY_REFRESH_S)
# where a Gaussian's two-sided 99.9th percentile falls relative to its 99th: 3.29 / 2.58
GAUSS_TAIL = NormalDist().inv_cdf(1 - 0.001 / 2) / NormalDist().inv_cdf(1 - 0.01 / 2)
LOG_G = math.log(GAMMA)
CALIBRATION_Z = 3.0  # a value at its histogram's healthy 99.5th percentile is this far out (isolation's calibration)
Z_CAP = 1000.0
# a node whose SUSPECT_SERIES farthest series lie on average 3x beyond their healthy 99.5th percentile does not
# teach: far past anything healthy (7.7 sigma for a Gaussian), so the rare healthy extremes the 99.95th percentile
# is made of still teach (a gate at 1x or 2x drops them, and the weights it leaves are too high: bench/isolation_real)
SUSPECT_Z = 3 * CALIBRATION_Z
SUSPECT_SERIES = 3
POSITION_QS = (0.0005, 0.005, 0.5, 0.995, 0.9995)  # the quantiles `positions` and `lone_weights` read
log = logging.getLogger("sigma.controller.detect.healthy")


class Sketches:
    """(node, series) -> log-bucket histogram of healthy deviations from the peers."""

    def __init__(self):
        self.index: dict[tuple[str, str], int] = {}
        self.counts = np.zeros((0, BUCKETS), np.uint16)
        self.anchor = np.zeros(0, np.int16)  # log_GAMMA key of the middle of each histogram's range
        self.anchored = np.zeros(0, bool)  # False until the histogram's first value
        self.kinds: dict[str, bool] = {}  # series -> counter (its rates are kept) or gauge (its levels)
        self._grids: dict[tuple, np.ndarray] = {}  # (nodes, series) -> their rows: a job's layout repeats

    def __len__(self) -> int:
        return len(self.index)

    @property
    def nbytes(self) -> int:
        """Memory of the histograms in use (the index's keys are the series names, shared with the reads)."""
        n = len(self.index)
        return self.counts[:n].nbytes + self.anchor[:n].nbytes + self.anchored[:n].nbytes

    def _grid(self, nodes: Sequence[str], series: Sequence[str], create: bool) -> np.ndarray:
        """[nodes, series] row of each histogram (-1: none and not created)."""
        key = (tuple(nodes), tuple(series))
        grid = self._grids.get(key)
        if grid is not None and (not create or grid.min(initial=0) >= 0):
            return grid
        grid = np.array([[self.index.get((n, s), -1) for s in series] for n in nodes], np.int64).reshape(
            len(nodes), len(series))
        if create and grid.size and grid.min() < 0:
            for i, j in zip(*np.nonzero(grid < 0)):
                grid[i, j] = self.index[(nodes[i], series[j])] = len(self.index)
            if len(self.index) > self.counts.shape[0]:  # grow by doubling
                grow = max(len(self.index) - self.counts.shape[0], self.counts.shape[0], 256)
                self.counts = np.vstack([self.counts, np.zeros((grow, BUCKETS), np.uint16)])
                self.anchor = np.concatenate([self.anchor, np.zeros(grow, np.int16)])
                self.anchored = np.concatenate([self.anchored, np.zeros(grow, bool)])
        if len(self._grids) > 1024:
            self._grids.clear()
        self._grids[key] = grid
        return grid

    def add(self, nodes: Sequence[str], series: Sequence[str], values: np.ndarray, healthy: np.ndarray) -> int:
        """values [nodes, series], or [nodes, time, series] (NaN: nothing); healthy [nodes]: only those nodes'
        values count. Returns the number of values added."""
        values = np.asarray(values, float)
        if values.ndim == 2:
            values = values[:, None, :]
        ok = np.isfinite(values) & np.asarray(healthy, bool)[:, None, None]
        if not ok.any():
            return 0
        grid = self._grid(nodes, series, create=True)
        rows = np.broadcast_to(grid[:, None, :], values.shape)[ok]
        v = values[ok]
        fresh = ~self.anchored[rows] & (v != 0)  # a histogram's range is centred on its first nonzero value
        if fresh.any():
            r, first = np.unique(rows[fresh], return_index=True)
            self.anchor[r] = np.clip(_key(v[fresh][first]), -32000, 32000)
            self.anchored[r] = True
        flat = rows * BUCKETS + _bucket(v, self.anchor[rows].astype(np.int64))
        used, inverse = np.unique(flat, return_inverse=True)
        added = np.bincount(inverse).astype(np.int64)
        counts = self.counts.reshape(-1)
        total = counts[used].astype(np.int64) + added
        counts[used] = np.minimum(total, np.iinfo(np.uint16).max)
        touched = np.unique(rows)
        full = touched[self.counts[touched].sum(axis=1, dtype=np.int64) > CAP]
        if full.size:  # old behaviour fades, and the counts stay within uint16
            self.counts[full] //= 2
        return int(v.size)

    def positions(self, nodes: Sequence[str], series: Sequence[str], values: np.ndarray,
                  q: np.ndarray | None = None) -> np.ndarray:
        """values [nodes, series] or [nodes, time, series] -> how far each lies from its own (node, series)
        histogram's median, in units where the healthy 99.5th percentile (the 0.5th below the median) is
        CALIBRATION_Z, as isolation calibrates its scores; the 99.95th / GAUSS_TAIL where the 99.5th is the median
        itself (a metric that nearly always reads the same), Z_CAP beyond a histogram that never moved. NaN where
        the histogram has fewer than MIN_VALUES values, or for a NaN value. q: their POSITION_QS quantiles, if the
        caller keeps them."""
        values = np.asarray(values, float)
        q = self.quantiles(nodes, series, POSITION_QS) if q is None else q
        if values.ndim == 3:
            q = q[:, :, None, :]
        lo, lo_far, med, hi, hi_far = q
        with np.errstate(invalid="ignore", divide="ignore"):
            up = np.where(hi > med, hi - med, (hi_far - med) / GAUSS_TAIL)
            down = np.where(lo < med, med - lo, (med - lo_far) / GAUSS_TAIL)
            d = values - med
            z = CALIBRATION_Z * np.where(d > 0, d / up, np.where(d < 0, -d / down, 0.0))
        return np.where(np.isnan(d), np.nan, np.minimum(z, Z_CAP))

    def teach(self, nodes: Sequence[str], series: Sequence[str], values: np.ndarray, healthy: np.ndarray) -> int:
        """add, from the nodes clearly below suspicion only: a node not under suspicion (healthy [nodes], the
        caller's word) whose slice lies, on the mean of its SUSPECT_SERIES farthest series, SUSPECT_Z or more from
        its own healthy histograms (`positions`) teaches nothing with that slice. Below the action threshold is
        not healthy: an anomaly too small to be acted on would otherwise teach the histograms that it is normal,
        and lower the weights that could name it later. A healthy node's rare spike in one series still teaches
        (the mean is over several). values [nodes, series] or [nodes, time, series] (each time judged alone)."""
        values = np.asarray(values, float)
        ok = np.asarray(healthy, bool)
        z = np.nan_to_num(self.positions(nodes, series, values), nan=0.0)
        if z.shape[-1]:
            clear = _top_mean(z, SUSPECT_SERIES) < SUSPECT_Z  # [nodes] or [nodes, time]
            if values.ndim == 3:
                values = np.where(clear[:, :, None], values, np.nan)
            else:
                ok = ok & clear
        return self.add(nodes, series, values, ok)

    def quantiles(self, nodes: Sequence[str], series: Sequence[str], qs: Sequence[float]) -> np.ndarray:
        """[len(qs), nodes, series] healthy quantiles (NaN where a histogram is missing or has < MIN_VALUES)."""
        out = np.full((len(qs), len(nodes), len(series)), np.nan)
        grid = self._grid(nodes, series, create=False)
        ni, sj = np.nonzero(grid >= 0)
        if not ni.size:
            return out
        rows = grid[ni, sj]
        cum = np.cumsum(self.counts[rows], axis=1, dtype=np.int64)
        total = cum[:, -1]
        enough = total >= MIN_VALUES
        ni, sj, rows, cum, total = ni[enough], sj[enough], rows[enough], cum[enough], total[enough]
        for k, q in enumerate(qs):
            b = np.minimum((cum < q * total[:, None]).sum(axis=1), BUCKETS - 1)
            out[k, ni, sj] = _value(b, self.anchor[rows].astype(np.int64))
        return out

    # ---------- persistence ----------
    def dumps(self) -> str:
        n = len(self.index)
        buf = io.BytesIO()
        np.savez(buf, counts=self.counts[:n], anchor=self.anchor[:n], anchored=self.anchored[:n])
        keys = json.dumps(sorted(self.index, key=self.index.get))
        return json.dumps({"keys": zlib.compress(keys.encode()).hex(), "kinds": self.kinds,
                           "arrays": base64.b64encode(zlib.compress(buf.getvalue())).decode()})

    @classmethod
    def loads(cls, text: str) -> Sketches:
        """The histograms `dumps` wrote; an unreadable state starts empty (they are learned again)."""
        out = cls()
        try:
            d = json.loads(text)
            keys = json.loads(zlib.decompress(bytes.fromhex(d["keys"])))
            arrays = np.load(io.BytesIO(zlib.decompress(base64.b64decode(d["arrays"]))))
            counts, anchor, anchored = arrays["counts"], arrays["anchor"], arrays["anchored"]
            if counts.shape != (len(keys), BUCKETS) or anchor.shape != (len(keys),) or anchored.shape != (len(keys),):
                raise ValueError(f"{len(keys)} keys, arrays of shapes {counts.shape}, {anchor.shape}, {anchored.shape}")
        except (ValueError, KeyError, TypeError, zlib.error, OSError) as exc:
            log.warning("detector_state %s unreadable (%s: %s): the healthy histograms are learned again",
                        STATE_KEY, type(exc).__name__, exc)
            return out
        out.index = {(k[0], k[1]): i for i, k in enumerate(keys)}
        out.counts, out.anchor, out.anchored = counts.astype(np.uint16), anchor.astype(np.int16), anchored.astype(bool)
        out.kinds = {str(k): bool(v) for k, v in (d.get("kinds") or {}).items()}
        return out


def _top_mean(z: np.ndarray, k: int) -> np.ndarray:
    """Mean of the k largest values along the last axis."""
    k = max(1, min(k, z.shape[-1]))
    return np.partition(z, z.shape[-1] - k, axis=-1)[..., -k:].mean(axis=-1)


def _key(v: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore"):
        return np.floor(np.log(np.abs(v)) / LOG_G).astype(np.int64)


def _bucket(v: np.ndarray, anchor: np.ndarray) -> np.ndarray:
    j = np.clip(_key(np.where(v == 0, 1.0, v)) - anchor + SIDE // 2, 0, SIDE - 1)
    return np.where(v > 0, ZERO + 1 + j, np.where(v < 0, ZERO - 1 - j, ZERO))


def _value(b: np.ndarray, anchor: np.ndarray) -> np.ndarray:
    """A bucket's representative value: the geometric middle of its range (0 for the zero bucket)."""
    j = np.where(b > ZERO, b - ZERO - 1, ZERO - 1 - b)
    magnitude = GAMMA ** (anchor + j - SIDE // 2 + 0.5)
    return np.where(b > ZERO, magnitude, np.where(b < ZERO, -magnitude, 0.0))


def lone_weights(sketches: Sketches, nodes: Sequence[str], series: Sequence[str], center: np.ndarray,
                 scale: np.ndarray, calibration_z: float = 3.0, q: np.ndarray | None = None) -> np.ndarray:
    """[series] weight of one metric's peer score alone (NaN where no node has enough healthy history): the
    healthy 99th-percentile score mapped to calibration_z and the 99.9th to calibration_z x GAUSS_TAIL, the
    median over the nodes. center, scale: [nodes, series] of the peer score (isolation.Baseline); q: the
    histograms' POSITION_QS quantiles, if the caller keeps them."""
    q = (sketches.quantiles(nodes, series, POSITION_QS) if q is None else q)[[0, 1, 3, 4]]
    with np.errstate(invalid="ignore", divide="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        z99 = np.maximum(q[2] - center, center - q[1]) / scale
        z999 = np.maximum(q[3] - center, center - q[0]) / scale
        w = np.minimum(1.0, np.minimum(calibration_z / np.maximum(z99, 1e-9),
                                       calibration_z * GAUSS_TAIL / np.maximum(z999, 1e-9)))
        w[np.isnan(z99) | np.isnan(z999)] = np.nan
        return np.nanmedian(w, axis=0) if w.shape[0] else np.full(len(series), np.nan)


def residuals(values: np.ndarray) -> np.ndarray:
    """[nodes, ..., series] deviation of each node from the peer median at the same time (NaN with fewer than 3
    nodes: two peers cannot say which side is odd)."""
    if values.shape[0] < 3:
        return np.full(values.shape, np.nan)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return values - np.nanmedian(values, axis=0, keepdims=True)


class HealthyFeed:
    """Feeds the histograms from the controller's samples: every `every_s`, one SLICE_S slice of every running
    job's nodes (jobs of 3 or more nodes; NODES_PER_TICK nodes a tick at most), each node's deviation from its
    job's peer median; saved every SAVE_S."""

    def __init__(self, conn, every_s: float, clock: Callable[[], float]):
        self.conn, self.every_s, self.clock = conn, every_s, clock
        row = conn.execute("SELECT value FROM detector_state WHERE key = ?", (STATE_KEY,)).fetchone()
        self.sketches = Sketches.loads(row[0]) if row else Sketches()
        self.next_at: dict[int, float] = {}  # job -> when its nodes are read next
        self.saved_at = clock()
        self.previous: dict[str, list[tuple]] = {}  # node -> its previous slice's rows (a counter's continuity)
        # (nodes, features) -> (when, lone weights, the quantiles behind them)
        self._weights: dict[tuple, tuple[float, np.ndarray, np.ndarray]] = {}

    def update(self, now: float, jobs: Iterable, findings: Iterable, active: Callable[[str], bool]) -> int:
        """jobs: the running jobs (job_id, nodes); findings: this tick's (a job or node named in one is under
        suspicion); active(node): being remediated. Returns the values added."""
        if now - self.saved_at >= SAVE_S and len(self.sketches):
            self.save()
        # each job once per every_s, at most NODES_PER_TICK nodes a tick (at least one job): the slices of a large
        # cluster are read over several ticks, not in one
        due, budget = [], NODES_PER_TICK
        for j in sorted((j for j in jobs if len(j.nodes) >= 3), key=lambda j: self.next_at.get(j.job_id, 0.0)):
            if now < self.next_at.get(j.job_id, 0.0) or (due and len(j.nodes) > budget):
                break
            due.append(j)
            budget -= len(j.nodes)
            self.next_at[j.job_id] = now + self.every_s
        jobs = due
        if len(self.next_at) > 4 * NODES_PER_TICK * 64:  # jobs long gone
            self.next_at = {k: v for k, v in self.next_at.items() if v > now - self.every_s}
        if not jobs:
            return 0
        findings = list(findings)
        suspect_jobs = {f.job_id for f in findings if f.job_id is not None}
        suspects = {f.node for f in findings if f.node}
        nodes = sorted({n for j in jobs for n in j.nodes})
        rows: dict[str, list[tuple]] = {}
        for r in bucket_stats(self.conn, nodes, now - SLICE_S, now, 1):
            rows.setdefault(r[0], []).append(r)
        added = 0
        for j in jobs:
            cur = [r for n in j.nodes for r in rows.get(n, [])]
            prev = [r for n in j.nodes for r in self.previous.get(n, [])]
            if not prev:
                continue  # a counter is told from a gauge across two slices at least
            names, current, _, _ = job_matrices(list(j.nodes), now, SLICE_S, [], cur, prev)
            k = len(KPI_FEATURES)
            series, values = names[k:], residuals(current[:, k:])
            # a histogram keeps one kind of value: a slice read the other way (a counter that reset reads as a
            # gauge) is skipped for that series
            index = {n: i for i, n in enumerate(j.nodes)}
            a, b = _stack(prev, index, series), _stack(cur, index, series)
            counter = _counters({s: np.concatenate([a[s], b[s]], axis=1) for s in STATS})
            same = np.array([self.sketches.kinds.setdefault(s, bool(c)) == bool(c) for s, c in zip(series, counter)], bool)
            values[:, ~same] = np.nan
            healthy = np.array([j.job_id not in suspect_jobs and n not in suspects and not active(n)
                                for n in j.nodes])
            added += self.sketches.teach(list(j.nodes), series, values, healthy)
        self.previous.update(rows)
        for n in nodes:
            if n not in rows:
                self.previous.pop(n, None)  # nothing in this slice: the next one has no continuity to read
        return added

    def save(self) -> None:
        with self.conn:
            self.conn.execute("INSERT OR REPLACE INTO detector_state (key, value, updated_at) VALUES (?,?,?)",
                              (STATE_KEY, self.sketches.dumps(), self.clock()))
        self.saved_at = self.clock()

    def weights(self, nodes: Sequence[str], names: Sequence[str], base) -> np.ndarray:
        """isolation.score's `lone`: the lone-metric weights of a job's features (NaN for the KPI features),
        recomputed at most every WEIGHTS_S (the hour's history they are scaled by is re-read as seldom; at 256
        nodes x 1,600 series they take about a second)."""
        return self._cached(nodes, names, base)[1]

    def positions(self, nodes: Sequence[str], names: Sequence[str], deviation: np.ndarray) -> np.ndarray:
        """isolation.score's `position`: where each node's deviation from the peers lies in its healthy histograms
        (Sketches.positions), on the quantiles kept with the job's weights (a job's weights come first in a
        round)."""
        cached = self._weights.get((tuple(nodes), tuple(names)))
        q = cached[2] if cached is not None else None
        return self.sketches.positions(nodes, names, deviation, q)

    def _cached(self, nodes: Sequence[str], names: Sequence[str], base) -> tuple[float, np.ndarray, np.ndarray]:
        key = (tuple(nodes), tuple(names))
        now = self.clock()
        cached = self._weights.get(key)
        if cached is None or now - cached[0] >= WEIGHTS_S:
            if len(self._weights) > 256:
                self._weights.clear()
            q = self.sketches.quantiles(nodes, names, POSITION_QS)
            cached = self._weights[key] = (now, lone_weights(self.sketches, nodes, names, base.peer_center,
                                                             base.peer_scale, q=q), q)
        return cached
