"""A verdict's evidence in the units an admin reads (pure): for each of a node's top metrics, its value now, the
peers' median now and the node's own usual value (the median of its history), how each metric was judged, and the
score it got, e.g. `gpu.util_pct 41 % vs peers' 97 % median, its own usual 96 % (z 14.2 against the peers)`.

Units come from the series name (the sidecar's naming: `_pct`, `_bytes`, `_mhz`, `_c`, `_w`, `_kbps`, `_s`);
a counter is read as a rate (per second). How a metric was judged (isolation.metric_scores):
- `peers`: against the peers now and its own usual gap to them;
- `own history`: the peers do not help for this node and metric (its deviation from them is as spread as its own
  series: a weakly related series, a node that goes its own way), so against its own history alone;
- `peers only`: no history of it (it appeared in the window): at most a hint;
- `not scored`: it never moved in the history (a constant): nothing to measure a change with, so it abstains.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence

import numpy as np

from sigma.controller.detect.isolation import Baseline, Scores

COUNTER_HINTS = ("seconds", "_total", "context_switches", "forks", "interrupts", "softirqs", "total_us")
_UNITS = (("_pct", "%", 1.0), ("_bytes", "B", 1.0), ("_mhz", "MHz", 1.0), ("_c", "°C", 1.0), ("_w", "W", 1.0),
          ("_kbps", "kB/s", 1.0), ("_s", "s", 1.0), ("_us", "µs", 1.0))


def unit(name: str) -> str:
    """The unit of a feature from its series name (labels after `{` ignored); '' where none is known."""
    base = name.split("{", 1)[0]
    if base == "kpi.tokens_per_s":
        return "tokens/s"
    if base == "kpi.steps_behind":
        return "steps"
    if base.endswith("seconds"):  # a counter of seconds: seconds per second (CPUs busy)
        return "s/s"
    for suffix, u, _ in _UNITS:
        if base.endswith(suffix):
            return ("/s" if u == "" else u + "/s") if any(h in base for h in COUNTER_HINTS) and u != "s" else u
    return "/s" if any(h in base for h in COUNTER_HINTS) else ""


def fmt(value: float, u: str) -> str:
    """A value with its unit, bytes in binary multiples, 3 significant digits."""
    if value is None or not math.isfinite(value):
        return "n/a"
    if u.startswith("B"):
        rest = u[1:]
        for prefix in ("", "Ki", "Mi", "Gi", "Ti"):
            if abs(value) < 1024 or prefix == "Ti":
                return f"{_num(value)} {prefix}B{rest}"
            value /= 1024
    return f"{_num(value)}{'' if u in ('', '%') or u.startswith('/') else ' '}{u}"


def _num(v: float) -> str:
    return f"{v:.3g}" if abs(v) < 1000 else f"{v:,.0f}"


def judged(base: Baseline | None, node: int, metric: int, peers: bool) -> str:
    if base is None:
        return "peers" if peers else "not scored"
    if base.flat[metric]:
        return "not scored"
    if not base.known[metric]:
        return "peers only"
    if not peers or not base.comparable[node, metric]:
        return "own history"
    return "peers"


def explain_nodes(scores: Scores, names: Sequence[str], current: np.ndarray, base: Baseline | None,
                  nodes: Sequence[str], all_nodes: Sequence[str], n: int = 5) -> dict[str, list[dict]]:
    """node -> its top metrics as {metric, value, peers, usual, unit, judged, z, text} (values in the metric's
    own units; peers/usual None where unknown). Metrics it abstained on but that moved appear too, as `not
    scored`, so a person sees them."""
    out: dict[str, list[dict]] = {}
    index = {m: i for i, m in enumerate(all_nodes)}
    peers = len(all_nodes) >= 3
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # a metric no node reports now
        med = np.nanmedian(current, axis=0) if current.shape[0] else np.zeros(current.shape[1])
    usual = base.own[0] if base is not None else None
    for node in nodes:
        if node not in index:
            continue
        i = index[node]
        z = scores.metric_z[i] if scores.entity_node is None else scores.metric_z[scores.entity_node == i].max(axis=0)
        order = [j for j in np.argsort(-z) if z[j] > 0][:n]
        if base is not None:  # the constants that moved: not scored, still shown
            moved = [j for j in np.flatnonzero(base.flat) if np.isfinite(current[i, j])
                     and usual is not None and current[i, j] != usual[i, j]]
            order += moved[: max(0, n - len(order)) or 1]
        rows = []
        for j in order:
            u = unit(names[j])
            how = judged(base, i, j, peers)
            value = float(current[i, j])
            peer = float(med[j]) if peers and np.isfinite(med[j]) else None
            own = float(usual[i, j]) if usual is not None and np.isfinite(usual[i, j]) else None
            text = f"{names[j]} {fmt(value, u)}"
            if peer is not None:
                text += f" vs peers' {fmt(peer, u)} median"
            if own is not None:
                text += f", its own usual {fmt(own, u)}"
            tail = (f"not scored: it never moved in the history" if how == "not scored" else
                    f"z {z[j]:.1f} against " + {"peers": "the peers", "own history": "its own history (the peers "
                                                 "do not help here)", "peers only": "the peers (no history)"}[how])
            rows.append({"metric": names[j], "value": value, "peers": peer, "usual": own, "unit": u, "judged": how,
                         "z": round(float(z[j]), 2), "text": f"{text} ({tail})"})
        out[node] = rows
    return out
