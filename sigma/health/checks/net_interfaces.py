"""Network interfaces up (operstate/carrier from sysfs)."""

from __future__ import annotations

from sigma.health import facts
from sigma.health.result import Result, failed, passed, skipped

CATEGORY = "network"


def check_net_interfaces(interfaces: dict[str, dict[str, str]], required: list[str]) -> Result:
    if required:
        missing = [n for n in required if n not in interfaces]
        down = [n for n in required if n in interfaces and not _up(interfaces[n])]
        if missing or down:
            states = [f"{n} ({interfaces[n]['operstate']})" for n in down]
            parts = ([f"missing: {', '.join(missing)}"] if missing else []) + \
                    ([f"down: {', '.join(states)}"] if down else [])
            return failed("; ".join(parts), missing=missing, down=down)
        return passed(f"required interfaces up: {', '.join(required)}")
    candidates = [n for n in interfaces if n != "lo"]
    if not candidates:
        return skipped("no network interfaces besides loopback")
    up = [n for n in candidates if _up(interfaces[n])]
    if not up:
        return failed(f"no interface is up ({', '.join(candidates)})")
    return passed(f"up: {', '.join(up)}", up=up)


def _up(info: dict[str, str]) -> bool:
    # "unknown" is what virtual devices without carrier detection report; trust carrier then.
    return info["operstate"] == "up" or (info["operstate"] == "unknown" and info.get("carrier") == "1")


def run(ctx, args: dict) -> Result:
    return check_net_interfaces(facts.net_interfaces(ctx), list(ctx.profile.interfaces or []))
