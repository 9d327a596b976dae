"""Required mounts (shared filesystems, scratch) must be mounted."""

from __future__ import annotations

from sigma.health import facts
from sigma.health.result import Result, failed, passed, skipped

CATEGORY = "mount"


def check_mounts(mounts: list[dict[str, str]], required: list[str]) -> Result:
    if not required:
        return skipped("no required mounts configured for this node")
    present = {m["mountpoint"]: m["fstype"] for m in mounts}
    missing = [p for p in required if p.rstrip("/") not in present and p not in present]
    if missing:
        return failed(f"not mounted: {', '.join(missing)}", missing=missing)
    return passed(f"{len(required)} required mounts present")


def run(ctx, args: dict) -> Result:
    return check_mounts(facts.mounts(ctx), list(ctx.profile.mounts or []))
