"""Turn a job's rows into isolation matrices (pure): one row per node of the job, one column per feature.

KPI features (per node, from its ranks): mean step time, mean throughput, steps behind the job's highest step,
seconds since its last KPI line. Telemetry features come pre-aggregated per (node, series, time bucket) —
`samples.bucket_stats`, so an hour of 1 Hz samples is summed up by SQLite, not walked in Python: the mean of each
(metric, labels) series in the window; their history (earlier buckets) feeds the temporal score. A counter (a
series that never decreases on any node, e.g. CPU seconds or bytes received since boot) is compared by its rate:
its level says how long a node has been up, not how it is doing. The sidecar's own metrics describe the sidecar,
not the node, and are left out (by the query).
"""

from __future__ import annotations

import warnings
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence

import numpy as np

KPI_FEATURES = ("kpi.step_time_s", "kpi.tokens_per_s", "kpi.steps_behind", "kpi.seconds_silent")
STATS = ("n", "mean", "mean_sq", "vmin", "vmax", "tmin", "tmax")  # per bucket, as samples.bucket_stats returns


def job_matrices(nodes: Sequence[str], now: float, window_s: float, kpis: Iterable[Mapping],
                 current: Iterable[Sequence] = (), history: Iterable[Sequence] = ()
                 ) -> tuple[list[str], np.ndarray, np.ndarray | None, np.ndarray]:
    """current / history: bucket rows (node, series, bucket, *STATS) of the window and of the time before it.
    Returns (feature names, current [nodes, features], history [nodes, buckets, features] or None, jitter
    [features]: how much each telemetry series moves within the window on a typical node — a gap between peers
    smaller than that is sampling noise, not evidence)."""
    index = {n: i for i, n in enumerate(nodes)}
    kpis = [k for k in kpis if k["node"] in index]
    current_kpi = np.full((len(nodes), len(KPI_FEATURES)), np.nan)
    if kpis:
        max_step = max((k["step"] for k in kpis if k.get("step") is not None), default=None)
        per_node: dict[str, list[Mapping]] = defaultdict(list)
        for k in kpis:
            per_node[k["node"]].append(k)
        for node, rows in per_node.items():
            i = index[node]
            recent = [r for r in rows if r["ts"] >= now - window_s]
            st = [r["step_time_s"] for r in recent if r.get("step_time_s") is not None]
            tp = [r["tokens_per_s"] for r in recent if r.get("tokens_per_s") is not None]
            steps = [r["step"] for r in rows if r.get("step") is not None]
            current_kpi[i, 0] = np.mean(st) if st else np.nan
            current_kpi[i, 1] = np.mean(tp) if tp else np.nan
            current_kpi[i, 2] = (max_step - max(steps)) if steps and max_step is not None else np.nan
            current_kpi[i, 3] = now - max(r["ts"] for r in rows)
        # a node with no KPI line at all while its peers report is as silent as it gets
        for node, i in index.items():
            if node not in per_node:
                current_kpi[i, 3] = now - min(k["ts"] for k in kpis)
    current, history = list(current), list(history)
    series = sorted({r[1] for r in current})
    names = list(KPI_FEATURES) + series
    tel_current, tel_jitter, tel_history = _telemetry(current, history, index, series)
    current_matrix = np.concatenate([current_kpi, tel_current], axis=1)
    jitter = np.concatenate([np.zeros(len(KPI_FEATURES)), tel_jitter])
    history_matrix = None
    if tel_history is not None:
        history_matrix = np.concatenate(
            [np.full((len(nodes), tel_history.shape[1], len(KPI_FEATURES)), np.nan), tel_history], axis=2)
    return names, current_matrix, history_matrix, jitter


def _telemetry(current: list[Sequence], history: list[Sequence], index: Mapping[str, int], series: list[str]
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """(current [nodes, series], jitter [series], history [nodes, buckets, series] or None)."""
    if not series:
        return np.zeros((len(index), 0)), np.zeros(0), None
    cur = _stack(current, index, series)
    hist = _stack(history, index, series)
    counter = _counters({k: np.concatenate([hist[k], cur[k]], axis=1) for k in STATS})
    with np.errstate(invalid="ignore", divide="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN slices: a series a node does not report
        # the window: a gauge's mean over all its samples, a counter's rate from first to last sample
        n = np.nansum(cur["n"], axis=1)
        mean = np.nansum(cur["n"] * cur["mean"], axis=1) / n
        spread = np.sqrt(np.maximum(np.nansum(cur["n"] * cur["mean_sq"], axis=1) / n - mean ** 2, 0.0))
        rate = (np.nanmax(cur["vmax"], axis=1) - np.nanmin(cur["vmin"], axis=1)) / (
            np.nanmax(cur["tmax"], axis=1) - np.nanmin(cur["tmin"], axis=1))
        rate_spread = np.nanstd(_values(cur, counter), axis=1)
        values = np.where(counter, rate, mean)
        jitter = np.nan_to_num(np.nanmedian(np.where(counter, rate_spread, spread), axis=0))
    values[(n == 0) | ~np.isfinite(values)] = np.nan
    return values, jitter, (_values(hist, counter) if history else None)


def _stack(rows: list[Sequence], index: Mapping[str, int], series: list[str]) -> dict[str, np.ndarray]:
    """Bucket rows -> one [nodes, buckets, series] array per statistic (NaN where a bucket is empty)."""
    col = {s: j for j, s in enumerate(series)}
    rows = [r for r in rows if r[0] in index and r[1] in col]
    buckets = max((int(r[2]) for r in rows), default=-1) + 1
    out = {k: np.full((len(index), buckets, len(series)), np.nan) for k in STATS}
    for node, key, b, *stats in rows:
        for name, value in zip(STATS, stats):
            out[name][index[node], int(b), col[key]] = value
    return out


def _counters(stats: Mapping[str, np.ndarray]) -> np.ndarray:
    """[series] True where the series never decreases on any node (one bucket's values all at or above the
    previous one's) and rises somewhere."""
    vmin, vmax = stats["vmin"], stats["vmax"]
    falls = np.zeros(vmin.shape[2], dtype=bool)
    rises = np.zeros_like(falls)
    previous = np.full((vmin.shape[0], vmin.shape[2]), np.nan)
    with np.errstate(invalid="ignore"):
        for b in range(vmin.shape[1]):
            present = ~np.isnan(vmin[:, b, :])
            falls |= np.any(present & (vmin[:, b, :] < previous), axis=0)
            rises |= np.any(present & ((vmax[:, b, :] > vmin[:, b, :]) | (vmin[:, b, :] > previous)), axis=0)
            previous = np.where(present, vmax[:, b, :], previous)
    return rises & ~falls


def _values(stats: Mapping[str, np.ndarray], counter: np.ndarray) -> np.ndarray:
    """Each bucket's value: a gauge's mean, a counter's rate within the bucket."""
    with np.errstate(invalid="ignore", divide="ignore"):
        rate = (stats["vmax"] - stats["vmin"]) / (stats["tmax"] - stats["tmin"])
    rate[~np.isfinite(rate)] = np.nan
    return np.where(counter, rate, stats["mean"])
