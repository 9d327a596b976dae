"""Guard rails that decide whether an action may run at all (pure functions)."""

from __future__ import annotations

import math
from collections.abc import Iterable


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


def in_shadow(rule_id: str, rule_shadow: bool, global_shadow: bool, shadow_rules: Iterable[str]) -> bool:
    return global_shadow or rule_shadow or rule_id in set(shadow_rules)


def crash_looping(restart_times: Iterable[float], now: float, max_restarts: int, window_s: float) -> bool:
    """A job restarted max_restarts times within the window: requeueing it again would not help."""
    return sum(1 for t in restart_times if now - t <= window_s) >= max_restarts
