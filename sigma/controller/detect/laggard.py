"""Which node a synchronous job is waiting for, from direct evidence the trainer reports (pure: rows in, node out).

Peer statistics (isolation.py) need at least 3 nodes; a 2-node job cannot say which side is odd that way. Ranks of a
synchronous job tell it directly:
- hang: every rank stops stepping, but only the stuck node's ranks stop sending their `heartbeat` events (the
  others are alive, blocked in a collective waiting for it); where the step is split in phases the others can
  finish without the stuck node, its ranks are also the only ones behind the job's highest step;
- slowdown: the slow node's ranks spend less of their time waiting in collectives (`wait_s` in the KPI line) and
  more of it busy than every other node's ranks, which wait for it, and they do so all along: the same node is the
  one waited for in nearly every slice of the window. Load that comes and goes on a shared host (another process
  taking the CPU) slows one side, then the other; a stopped or throttled node slows its side every time.
Shares are weighted by time (sum of waits over sum of step times): a straggler stopped for half of every second
makes a few long steps among many fast ones, and the time, not the count of steps, is what the others lose.
Beyond the gap, the slow node's share must differ from theirs by a ratio: a wait share at most CULPRIT_RATIO x
theirs (where ranks wait little), or a busy share (1 - wait share) at least BUSY_RATIO x theirs (where they wait a
lot: on a busy host every rank already waits half of its step, and a rank stopped inside a collective counts the
stop as waiting, so a 50 % straggler waits 45-60 % of its time against the others' 75-85 %, a wait ratio near 0.7,
while it is busy about twice as much of its time as they are).
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence

SILENT_S = 15.0  # no heartbeat for this long: silent (the trainer beats every 5 s by default)
FRESH_S = 12.0  # a heartbeat at most this old: alive
WAIT_GAP = 0.1  # the other nodes' ranks wait at least this much more of their time than the slow node's ...
CULPRIT_RATIO = 0.6  # ... and the slow node's ranks wait at most this fraction of the least-waiting other's share
BUSY_RATIO = 1.5  # ... or are busy (not waiting) at least this many times as much of their time
SLICES = 5  # the window is split in this many slices of time ...
CONSISTENT = 0.8  # ... and the same node must be the one waited for in at least this share of them


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
    """Share of their time each node's ranks spent waiting in collectives (sum of waits / sum of step times)."""
    wait: dict[str, float] = defaultdict(float)
    total: dict[str, float] = defaultdict(float)
    for k in kpis:
        payload = k.get("payload") or {}
        if isinstance(payload, str):
            payload = json.loads(payload or "{}")
        w, step_time = payload.get("wait_s"), k.get("step_time_s")
        if w is not None and step_time and step_time > 0:
            wait[k["node"]] += min(float(step_time), max(0.0, float(w)))
            total[k["node"]] += float(step_time)
    return {node: wait[node] / total[node] for node in total}


def _waited_for(nodes: Sequence[str], shares: Mapping[str, float]) -> str | None:
    if len(nodes) < 2 or set(shares) != set(nodes):
        return None
    least = min(nodes, key=lambda n: shares[n])
    others = min(shares[n] for n in nodes if n != least)
    ratio = shares[least] <= CULPRIT_RATIO * others or 1 - shares[least] >= BUSY_RATIO * (1 - others)
    return least if others - shares[least] >= WAIT_GAP and ratio else None


def waited_for_node(nodes: Sequence[str], kpis: Iterable[Mapping]) -> tuple[str | None, dict[str, float]]:
    """(the one node every other node waits for, all along the window; the wait shares as evidence)."""
    kpis = list(kpis)
    shares = wait_shares(kpis)
    node = _waited_for(nodes, shares)
    stamps = [k.get("ts") for k in kpis]
    if node is None or None in stamps:
        return None, shares  # no time, no way to tell a steady straggler from passing load
    t0, width = min(stamps), (max(stamps) - min(stamps)) / SLICES or 1.0
    slices: dict[int, list[Mapping]] = defaultdict(list)
    for k in kpis:
        slices[min(SLICES - 1, int((k["ts"] - t0) / width))].append(k)
    verdicts = [_waited_for(nodes, wait_shares(rows)) for rows in slices.values()]
    same = sum(v == node for v in verdicts)
    return (node if len(verdicts) >= 3 and same >= CONSISTENT * len(verdicts) else None), shares
