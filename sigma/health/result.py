"""Check outcomes and the machine-readable verdict a suite run produces."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

PASS, FAIL, SKIP, ERROR, TIMEOUT = "pass", "fail", "skip", "error", "timeout"
STATUSES = (PASS, FAIL, SKIP, ERROR, TIMEOUT)

# Categories the controller acts on (a fault's kind decides the playbook). "tool" means sigma itself failed.
CATEGORIES = ("gpu", "gpu-memory", "nvlink", "host-memory", "kernel", "infiniband", "network", "storage", "mount",
              "process", "performance", "host-noise", "tool")


@dataclass
class Result:
    """What one check found: pass, fail with a message, or skip with a reason; data holds measurements."""

    status: str
    message: str = ""
    category: str | None = None  # overrides the check's default category (e.g. an Xid bucket)
    data: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self):
        if self.status not in STATUSES:
            raise ValueError(f"status must be one of {STATUSES}, not {self.status!r}")
        if self.category is not None and self.category not in CATEGORIES:
            raise ValueError(f"category must be one of {CATEGORIES}, not {self.category!r}")


def passed(message: str = "", **data) -> Result:
    return Result(PASS, message, data=data)


def failed(message: str, category: str | None = None, **data) -> Result:
    return Result(FAIL, message, category, data=data)


def skipped(reason: str, **data) -> Result:
    return Result(SKIP, reason, data=data)


@dataclass
class CheckRecord:
    """A result as run: which check, how long it took, and whether a failure blocks the node."""

    name: str
    status: str
    message: str
    category: str
    duration_s: float
    blocking: bool = True  # a failure of this check rejects the node (on_fail: reject)
    data: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict:
        d = {"name": self.name, "status": self.status, "message": self.message, "category": self.category,
             "duration_s": round(self.duration_s, 4)}
        if self.data:
            d["data"] = self.data
        return d


def verdict(records: list[CheckRecord], tool_failure: str = "ignore") -> tuple[str, list[dict]]:
    """("accept" | "reject", issues). A blocking failure rejects; errors and timeouts reject only when the
    tool_failure policy is "reject" (the default "ignore" keeps a node in service when sigma itself breaks)."""
    issues = []
    reject = False
    for r in records:
        if r.status == FAIL:
            blocks = r.blocking
        elif r.status in (ERROR, TIMEOUT):
            blocks = tool_failure == "reject"
        else:
            continue
        reject = reject or blocks
        issues.append({"check": r.name, "status": r.status, "category": r.category, "message": r.message,
                       "blocking": blocks})
    return ("reject" if reject else "accept"), issues
