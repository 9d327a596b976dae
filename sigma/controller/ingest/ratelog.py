"""One warning per reason a second: a flood of refusals must not flood the log (the counters keep every one)."""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter


class RateLimitedLog:
    def __init__(self, log: logging.Logger):
        self.log = log
        self.last: dict[str, float] = {}
        self.folded: Counter = Counter()
        self.lock = threading.Lock()

    def warning(self, reason: str, message: str, *args) -> None:
        now = time.monotonic()
        with self.lock:
            if now - self.last.get(reason, -1e9) < 1.0:
                self.folded[reason] += 1
                return
            self.last[reason] = now
            folded, self.folded[reason] = self.folded[reason], 0
        self.log.warning(message + (f" (and {folded} more like it in the last second)" if folded else ""), *args)
