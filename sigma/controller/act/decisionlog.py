"""The controller's logs admins tail: JSON lines (controller.jsonl) and one short human line per decision
(decisions.log). Either directory may be None (tests), in which case lines are only kept in memory."""

from __future__ import annotations

import json
import time
from pathlib import Path

from sigma.findings import clean


class DecisionLog:
    def __init__(self, log_dir: str | Path | None, keep: int = 1000):
        self.dir = Path(log_dir) if log_dir else None
        if self.dir:
            self.dir.mkdir(parents=True, exist_ok=True)
        self.recent: list[dict] = []
        self.keep = keep

    def event(self, what: str, human: str | None = None, **fields) -> None:
        """Record one thing the controller did or decided; `human` adds a line to decisions.log."""
        now = time.time()
        record = {"ts": round(now, 3), "event": what, **clean(fields)}
        if human:
            record["msg"] = human
        self.recent.append(record)
        del self.recent[:-self.keep]
        if not self.dir:
            return
        with open(self.dir / "controller.jsonl", "a") as f:
            f.write(json.dumps(record, default=str) + "\n")
        if human:
            stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(now))
            with open(self.dir / "decisions.log", "a") as f:
                f.write(f"{stamp} {human}\n")
