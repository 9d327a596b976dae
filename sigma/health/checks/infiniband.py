"""InfiniBand port state from sysfs: every port ACTIVE and LinkUp (and as many ports as the node should have)."""

from __future__ import annotations

from sigma.health import facts
from sigma.health.result import Result, failed, passed, skipped

CATEGORY = "infiniband"


def check_infiniband(ports: list[dict[str, str]] | None, expected_ports: int | None) -> Result:
    if ports is None or not ports:
        if expected_ports:
            return failed(f"expected {expected_ports} InfiniBand ports, found none in /sys/class/infiniband")
        return skipped("no InfiniBand devices")
    bad = [p for p in ports if "ACTIVE" not in p["state"] or "LinkUp" not in p["phys_state"]]
    data = dict(ports=len(ports), bad=[f"{p['device']}/{p['port']}" for p in bad])
    if bad:
        desc = ", ".join(f"{p['device']}/{p['port']} state={p['state'] or '?'} phys={p['phys_state'] or '?'}"
                         for p in bad)
        return failed(f"{len(bad)} InfiniBand port(s) not active: {desc}", **data)
    if expected_ports and len(ports) < expected_ports:
        return failed(f"{len(ports)} InfiniBand ports, expected {expected_ports}", **data)
    return passed(f"{len(ports)} InfiniBand port(s) ACTIVE/LinkUp", **data)


def run(ctx, args: dict) -> Result:
    return check_infiniband(facts.ib_ports(ctx), ctx.profile.ib_ports)
