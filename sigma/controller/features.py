"""Turn a job's rows into isolation matrices (pure): one row per node of the job, one column per feature.

KPI features (per node, from its ranks): mean step time, mean throughput, steps behind the job's highest step,
seconds since its last KPI line. Telemetry features: the mean of each (metric, labels) series in the window; their
history (earlier samples, bucketed in time) feeds the temporal score. A counter (a series that never decreases on
any node, e.g. CPU seconds or bytes received since boot) is compared by its rate: its level says how long a node
has been up, not how it is doing. The sidecar's own metrics describe the sidecar, not the node, and are left out.
"""

from __future__ import annotations

import json
import warnings
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence

import numpy as np

SELF_METRICS = "sidecar."
KPI_FEATURES = ("kpi.step_time_s", "kpi.tokens_per_s", "kpi.steps_behind", "kpi.seconds_silent")


def job_matrices(nodes: Sequence[str], now: float, window_s: float, kpis: Iterable[Mapping],
                 samples: Iterable[Mapping] = (), history_samples: Iterable[Mapping] = (),
                 buckets: int = 12) -> tuple[list[str], np.ndarray, np.ndarray | None, np.ndarray]:
    """Returns (feature names, current [nodes, features], history [nodes, buckets, features] or None, jitter
    [features]: how much each telemetry series moves within the window on a typical node — a gap between peers
    smaller than that is sampling noise, not evidence)."""
    index = {n: i for i, n in enumerate(nodes)}
    telemetry = as_rates([s for s in [*history_samples, *samples] if s["node"] in index
                          and s.get("value") is not None and not s["metric"].startswith(SELF_METRICS)])
    samples = [s for s in telemetry if s["ts"] >= now - window_s]
    history_samples = [s for s in telemetry if s["ts"] < now - window_s]
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
    series = _series_keys(samples)
    names = list(KPI_FEATURES) + series
    col = {s: j for j, s in enumerate(series)}
    current_tel = np.full((len(nodes), len(series)), np.nan)
    sums = np.zeros_like(current_tel)
    squares = np.zeros_like(current_tel)
    counts = np.zeros_like(current_tel)
    for s in samples:
        i, j = index[s["node"]], col[_key(s)]
        sums[i, j] += s["value"]
        squares[i, j] += s["value"] ** 2
        counts[i, j] += 1
    np.divide(sums, counts, out=current_tel, where=counts > 0)
    current = np.concatenate([current_kpi, current_tel], axis=1)
    variance = np.full_like(current_tel, np.nan)
    np.divide(squares, counts, out=variance, where=counts > 1)
    with warnings.catch_warnings():  # a series no node samples twice has no jitter
        warnings.simplefilter("ignore", RuntimeWarning)
        tel_jitter = np.nanmedian(np.sqrt(np.maximum(variance - current_tel ** 2, 0.0)), axis=0)
    jitter = np.concatenate([np.zeros(len(KPI_FEATURES)), np.nan_to_num(tel_jitter)])
    history = None
    hist = [h for h in history_samples if _key(h) in col]
    if hist and series:
        t0 = min(h["ts"] for h in hist)
        t1 = max(h["ts"] for h in hist) + 1e-9
        hs = np.zeros((len(nodes), buckets, len(series)))
        hc = np.zeros_like(hs)
        for h in hist:
            b = min(buckets - 1, int((h["ts"] - t0) / (t1 - t0) * buckets))
            hs[index[h["node"]], b, col[_key(h)]] += h["value"]
            hc[index[h["node"]], b, col[_key(h)]] += 1
        tel_hist = np.full_like(hs, np.nan)
        np.divide(hs, hc, out=tel_hist, where=hc > 0)
        history = np.concatenate([np.full((len(nodes), buckets, len(KPI_FEATURES)), np.nan), tel_hist], axis=2)
    return names, current, history, jitter


def as_rates(samples: Sequence[Mapping]) -> list[Mapping]:
    """The samples with each counter series replaced by its per-second rate between consecutive samples."""
    series: dict[tuple[str, str], list[Mapping]] = defaultdict(list)
    for s in sorted(samples, key=lambda s: s["ts"]):
        series[(s["node"], _key(s))].append(s)
    rises, falls = set(), set()
    for (_, key), rows in series.items():
        for a, b in zip(rows, rows[1:]):
            if b["value"] > a["value"]:
                rises.add(key)
            elif b["value"] < a["value"]:
                falls.add(key)
    counters = rises - falls
    out = []
    for (_, key), rows in series.items():
        if key not in counters:
            out.extend(rows)
            continue
        for a, b in zip(rows, rows[1:]):
            if b["ts"] > a["ts"]:
                out.append({**b, "value": (b["value"] - a["value"]) / (b["ts"] - a["ts"])})
    return out


def _key(s: Mapping) -> str:
    labels = s.get("labels") or {}
    if isinstance(labels, str):
        labels = json.loads(labels or "{}")
    return s["metric"] + (json.dumps(labels, sort_keys=True, separators=(",", ":")) if labels else "")


def _series_keys(samples: Iterable[Mapping]) -> list[str]:
    return sorted({_key(s) for s in samples if s.get("value") is not None})
