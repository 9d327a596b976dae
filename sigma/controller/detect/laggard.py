"""Which node a synchronous job is waiting for, from direct evidence the trainer reports (pure: rows in, node out).

Peer statistics (isolation.py) need at least 3 nodes; a 2-node job cannot say which side is odd that way. Ranks of a
synchronous job tell it directly:
- hang: every rank stops stepping, but only the stuck node's ranks stop sending their `heartbeat` events (the
  others are alive, blocked in a collective waiting for it); where the step is split in phases the others can
  finish without the stuck node, its ranks are also the only ones behind the job's highest step;
- slowdown: the slow node's ranks spend less of their time waiting in collectives (`wait_s` in the KPI line; in a
  pipeline also the schedule's exchanges with the neighbouring stages, `pipeline_s` less `stage_busy_s`) and
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

Where the ranks also say where their time outside collectives went (`blocked_s`: the training thread neither running
nor runnable), that decides instead: the node waited for must be the one whose ranks are held off the CPU outside
collectives (stopped, throttled, blocked) more of their time than every other node's. A node slowed by another
process taking its CPU is runnable, not held: its ranks queue for a CPU while the ranks it holds up wait in a
collective, so under CPU contention alone the node waited for is the *least* held one (bench/straggler.py --trace
prints the shares of each run; docs/controller.md quotes them). Time blocked on the disk is not held either (the
rank's `io_wait_s`, else a step with a storm of major faults, else the share of the time the node's disk stalled
some task, PSI): a disk busy with another process's I/O is the disk's noise, which the noise attribution names
(io-stall), not a node that stops its ranks.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence

from sigma.controller.detect.noise import NoiseConfig, kpi_payload

SILENT_S = 15.0  # no heartbeat for this long: silent (the trainer beats every 5 s by default)
FRESH_S = 12.0  # a heartbeat at most this old: alive
WAIT_GAP = 0.1  # the other nodes' ranks wait at least this much more of their time than the slow node's ...
CULPRIT_RATIO = 0.6  # ... and the slow node's ranks wait at most this fraction of the least-waiting other's share
BUSY_RATIO = 1.5  # ... or are busy (not waiting) at least this many times as much of their time
OFF_GAP = 0.02  # ... or, where the ranks report blocked_s, its ranks are held off the CPU outside collectives this
# much more of their time than every other node's
WINDOW_S = 30.0  # recent steps that say which node the others wait for ...
STEADY_S = 2 * WINDOW_S  # ... once the run has stepped this long (its first steps are each rank's start-up)
SLICES = 5  # the window is split in this many slices of time ...
CONSISTENT = 0.8  # ... and the same node must be the one waited for in at least this share of them
MAJFLT_STORM = NoiseConfig.majflt_min  # major faults in one step that say its time off the CPU went to the disk
IO_STALL = "host.pressure.io.some.total_us"  # the node's PSI counter: microseconds some task was stalled on I/O


def steady_window(rows: Iterable[Mapping], now: float) -> list[Mapping]:
    """The last WINDOW_S of the run's step rows, or [] while the run has stepped for less than STEADY_S: its first
    steps carry each rank's start-up (imports, first compilation, the data's first reads), which differs between
    nodes and is no straggler (on a host at load average 124 one node's start-up was named 4 s after the first step)."""
    steps = [r for r in rows if r.get("step") is not None]
    if not steps or min(r["ts"] for r in steps) > now - STEADY_S:
        return []
    return [r for r in steps if r["ts"] >= now - WINDOW_S]


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


def waited_s(payload: Mapping) -> float | None:
    """A step's time waiting for other ranks: in collectives (`wait_s`) and, in a pipeline, in the schedule's
    exchanges with the neighbouring stages (`pipeline_s` less `stage_busy_s`: its time in the schedule not spent
    computing); None where the rank does not say."""
    w = payload.get("wait_s")
    if w is None:
        return None
    exchange = 0.0
    if payload.get("pipeline_s") is not None and payload.get("stage_busy_s") is not None:
        exchange = max(0.0, float(payload["pipeline_s"]) - float(payload["stage_busy_s"]))
    return max(0.0, float(w)) + exchange


def wait_shares(kpis: Iterable[Mapping]) -> dict[str, float]:
    """Share of their time each node's ranks spent waiting for other ranks (sum of waits / sum of step times)."""
    wait: dict[str, float] = defaultdict(float)
    total: dict[str, float] = defaultdict(float)
    for k in kpis:
        w, step_time = waited_s(kpi_payload(k)), k.get("step_time_s")
        if w is not None and step_time and step_time > 0:
            wait[k["node"]] += min(float(step_time), w)
            total[k["node"]] += float(step_time)
    return {node: wait[node] / total[node] for node in total}


def disk_s(payload: Mapping) -> float | None:
    """Of a step's time off the CPU, what the rank spent blocked on its disk: `io_wait_s` (delay accounting) where
    the rank reports it; else, in a step with a storm of major faults (pages that had to come from disk), all of
    it; else None (nothing says the rank waited for its disk)."""
    if payload.get("io_wait_s") is not None:
        return max(0.0, float(payload["io_wait_s"]))
    return float("inf") if float(payload.get("majflt") or 0) >= MAJFLT_STORM else None


def disk_stall_shares(buckets: Iterable[Sequence], since: float) -> dict[str, float]:
    """Share of the time since `since` each node had some task stalled on I/O (PSI, the IO_STALL counter), from
    bucket_stats rows (node, series, bucket, count, mean, mean of squares, min, max, first ts, last ts): its increase
    within each bucket over the time the bucket's samples span."""
    stalled: dict[str, float] = defaultdict(float)
    spanned: dict[str, float] = defaultdict(float)
    for node, series, _, count, _, _, low, high, first, last in buckets:
        if series == IO_STALL and count >= 2 and last >= since and last > first:
            stalled[node] += max(0.0, high - low) * 1e-6
            spanned[node] += last - first
    return {node: min(1.0, stalled[node] / spanned[node]) for node in spanned}


def held_shares(kpis: Iterable[Mapping], stalled: Mapping[str, float] | None = None) -> dict[str, float]:
    """Share of their time each node's ranks were held off the CPU outside collectives and outside disk I/O
    (`blocked_s` less `wait_s` less the time blocked on the disk, summed over steps, over the summed step times);
    only nodes every row of which carries blocked_s. Waiting for a disk is the disk's noise (another process's
    I/O, a busy shared file system), as waiting for a CPU is contention, not a node that stops its ranks.
    stalled: node -> share of the time its disk stalled some task (disk_stall_shares), taken off its held share
    where the ranks cannot say their own disk time (delay accounting off: a rank blocked writing has no major
    faults); not floored at 0, so nodes that share a stall keep their difference."""
    held: dict[str, float] = defaultdict(float)
    total: dict[str, float] = defaultdict(float)
    missing: set[str] = set()
    untold: set[str] = set()  # nodes some row of which does not say its own disk time (no io_wait_s)
    for k in kpis:
        payload = kpi_payload(k)
        step_time = k.get("step_time_s")
        if not step_time or step_time <= 0:
            continue
        if payload.get("blocked_s") is None:
            missing.add(k["node"])
            continue
        if payload.get("io_wait_s") is None:
            untold.add(k["node"])
        off = float(payload["blocked_s"]) - (waited_s(payload) or 0.0) - (disk_s(payload) or 0.0)
        held[k["node"]] += min(float(step_time), max(0.0, off))
        total[k["node"]] += float(step_time)
    stalled = stalled or {}
    return {node: held[node] / total[node] - (stalled.get(node, 0.0) if node in untold else 0.0)
            for node in total if node not in missing}


def _held_node(nodes: Sequence[str], shares: Mapping[str, float], held: Mapping[str, float]) -> str | None:
    least = min(nodes, key=lambda n: shares[n])
    others = [n for n in nodes if n != least]
    gap = min(shares[n] for n in others) - shares[least]
    return least if gap >= WAIT_GAP and held[least] - max(held[n] for n in others) >= OFF_GAP else None


def _waited_for(nodes: Sequence[str], shares: Mapping[str, float]) -> str | None:
    if len(nodes) < 2 or set(shares) != set(nodes):
        return None
    least = min(nodes, key=lambda n: shares[n])
    others = min(shares[n] for n in nodes if n != least)
    ratio = shares[least] <= CULPRIT_RATIO * others or 1 - shares[least] >= BUSY_RATIO * (1 - others)
    return least if others - shares[least] >= WAIT_GAP and ratio else None


def waited_for_node(nodes: Sequence[str], kpis: Iterable[Mapping], stalled: Mapping[str, float] | None = None
                    ) -> tuple[str | None, dict[str, float]]:
    """(the one node every other node waits for, and, where the ranks report it, the one held off the CPU outside
    collectives (less its disk's stalls: `stalled`, see held_shares); else the one waited for all along the window;
    the wait shares as evidence)."""
    kpis = list(kpis)
    shares = wait_shares(kpis)
    if len(nodes) < 2 or set(shares) != set(nodes):
        return None, shares
    held = held_shares(kpis, stalled)
    if set(held) == set(nodes):  # the ranks say where their time went: that tells a held node from CPU contention
        return _held_node(nodes, shares, held), shares
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
