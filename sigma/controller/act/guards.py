"""Guard rails that decide whether an action may run at all (pure functions)."""

from __future__ import annotations

import math
from collections.abc import Iterable

from sigma.slurm.types import SIGMA_REASON_PREFIX, Node

# Reasons SLURM writes itself for a node it took out (not an admin's decision): the controller may act on these.
SLURM_OWN_REASONS = ("Not responding",)


def breaker_limit(total_nodes: int, max_nodes: int, max_fraction: float) -> int:
    """How many nodes one signature may take out in the window: the smaller of both limits, at least one."""
    return max(1, min(max_nodes, math.floor(max_fraction * total_nodes)))


def breaker_trips(node: str, nodes_with_signature: Iterable[str], total_nodes: int, max_nodes: int,
                  max_fraction: float) -> bool:
    """True when draining `node` would put more nodes than allowed out for the same signature.

    nodes_with_signature: nodes the same rule already drained (or tried to) inside the window.
    """
    nodes = set(nodes_with_signature) | {node}
    return len(nodes) > breaker_limit(total_nodes, max_nodes, max_fraction)


def wave_trips(node: str, nodes_out: Iterable[str], total_nodes: int, max_nodes: int, max_fraction: float) -> bool:
    """The global limit: True when taking `node` out would put more nodes out of service in the window than
    allowed, whatever rule, watchdog or isolation asks. A wave (a switch, a PDU, a bad driver roll-out) shows up
    through several rules at once; past this point drains do more harm than the faults (Kubernetes' node
    controller stops evicting in an unhealthy zone for the same reason)."""
    return breaker_trips(node, nodes_out, total_nodes, max_nodes, max_fraction)


def admin_hold(node: Node, own_reasons: Iterable[str] = ()) -> str | None:
    """The reason when someone else took the node out of service (DOWN, DRAIN or FAIL with a reason we did not
    write); such a node is never touched: no drain change, no reboot, no resume. None when it is ours to act on.

    own_reasons: SLURM's drains after our own health hooks (adopt_drain_reasons) that the controller may take over.
    """
    out = node.state in ("down", "fail") or bool({"DRAIN", "FAIL"} & set(node.flags))
    reason = node.reason.strip()
    if not out or not reason or reason.startswith(SIGMA_REASON_PREFIX):
        return None
    if reason in tuple(own_reasons) + SLURM_OWN_REASONS:
        return None
    return reason


NODE_FAULT_S = 600.0  # a node of the run taken out for a node fault this close to a requeue explains it


def own_failures(requeues: Iterable[tuple[float, str, Iterable[str]]], rule_id: str,
                 node_faults: Iterable[tuple[float, str]], explain_s: float = NODE_FAULT_S) -> int:
    """How many earlier requeues were the job failing by itself in the same way: requeues (time, rule, the run's
    nodes) for the same fault signature (rule) as now, that no node fault explains (one of the run's nodes drained
    for a node fault within explain_s). Two unrelated faults (a hang, then a NaN) are not a loop; the same NaN
    again and again is."""
    faults = list(node_faults)
    count = 0
    for ts, rule, nodes in requeues:
        if rule != rule_id:
            continue
        nodes = set(nodes)
        if any(node in nodes and abs(ts - t) <= explain_s for t, node in faults):
            continue
        count += 1
    return count


def crash_looping(restart_times: Iterable[float], now: float, max_restarts: int, window_s: float) -> bool:
    """A job restarted max_restarts times within the window: requeueing it again would not help."""
    return sum(1 for t in restart_times if now - t <= window_s) >= max_restarts
