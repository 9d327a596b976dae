"""Which node a synchronous job is waiting for, from direct evidence the trainer reports (pure: rows in, node out).

Peer statistics (isolation.py) need at least 3 nodes; a 2-node job cannot say which side is odd that way. Ranks of a
synchronous job tell it directly:
- hang: every rank stops stepping, but only the stuck node's ranks stop sending their `heartbeat` events (the
  others are alive, blocked in a collective waiting for it); where the step is split in phases the others can
  finish without the stuck node, its ranks are also the only ones behind the job's highest step;
- slowdown: the slow node's ranks spend almost none of the step waiting in collectives (`wait_s` in the KPI line),
  while every other node's ranks wait most of the step for it.
"""

from __future__ import annotations

import json
import statistics
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence

SILENT_S = 15.0  # no heartbeat for this long: silent (the trainer beats every 5 s by default)
FRESH_S = 12.0  # a heartbeat at most this old: alive
WAITING_SHARE = 0.5  # the other nodes' ranks wait at least this share of the step ...
CULPRIT_RATIO = 0.6  # ... and the slow node's ranks at most this fraction of the least-waiting other node's share
# (not ~0: a rank stopped while inside a collective counts the stop as time in the collective)


def silent_node(nodes: Sequence[str], last_heartbeat: Mapping[str, float], now: float) -> str | None:
    """The one node whose ranks stopped beating while all the others still beat."""
    if len(nodes) < 2 or not last_heartbeat:
        return None
    silent = [n for n in nodes if now - last_heartbeat.get(n, float("-inf")) > SILENT_S]
    fresh = [n for n in nodes if now - last_heartbeat.get(n, float("-inf")) <= FRESH_S]
    return silent[0] if len(silent) == 1 and len(fresh) == len(nodes) - 1 else None


def heartbeats_settled(nodes: Sequence[str], last_heartbeat: Mapping[str, float], now: float) -> bool:
    """True when the heartbeats can be read: none at all, or every node clearly alive or clearly silent (a node
    in between may be a stopped one whose last beat is not old enough yet)."""
    ages = [now - last_heartbeat.get(n, float("-inf")) for n in nodes]
    return not last_heartbeat or all(a <= FRESH_S or a > SILENT_S for a in ages)


def behind_node(laggards: Mapping[str, Sequence[int]], ranks: Mapping[str, Mapping]) -> str | None:
    """The one node all of whose ranks are behind the job's highest step while every other rank reached it.
    laggards: node -> ranks behind (JobProgress.laggards); ranks: rank -> {"node", ...}."""
    if len(laggards) != 1:
        return None
    (node, behind), = laggards.items()
    own = [r for r, v in ranks.items() if v.get("node") == node]
    return node if own and len(behind) == len(own) and len(ranks) > len(own) else None


def wait_shares(kpis: Iterable[Mapping]) -> dict[str, float]:
    """Median share of the step each node's ranks spent waiting in collectives."""
    shares: dict[str, list[float]] = defaultdict(list)
    for k in kpis:
        payload = k.get("payload") or {}
        if isinstance(payload, str):
            payload = json.loads(payload or "{}")
        wait, step_time = payload.get("wait_s"), k.get("step_time_s")
        if wait is not None and step_time:
            shares[k["node"]].append(min(1.0, max(0.0, float(wait) / float(step_time))))
    return {node: statistics.median(v) for node, v in shares.items() if v}


def waited_for_node(nodes: Sequence[str], kpis: Iterable[Mapping]) -> tuple[str | None, dict[str, float]]:
    """(the one node every other node waits for, the wait shares as evidence)."""
    shares = wait_shares(kpis)
    if len(nodes) < 2 or set(shares) != set(nodes):
        return None, shares
    least = min(nodes, key=lambda n: shares[n])
    others = [shares[n] for n in nodes if n != least]
    waited_for = min(others) >= WAITING_SHARE and shares[least] <= CULPRIT_RATIO * min(others)
    return (least if waited_for else None), shares
