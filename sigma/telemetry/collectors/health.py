"""Health-check results: <node_dir>/health/<unix_ts_ms>-<suite>.json files written by prolog/epilog/validation.

Each check becomes an `events` row (source 'health', kind = check name, severity = status); the suite verdict is
one more row (kind 'suite.<suite>', severity accept|reject, message naming the blocking issues): rules act on that
verdict, so they follow the suite's own policy (warn-only checks, tool failures). Files are written atomically, so
a file seen is complete; processed names are remembered (persisted) so each result is sent once. Results already
there when the sidecar first starts are history, not news (start_at: end), like the log tail's files.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

from sigma.telemetry.base import Collector, CollectorParams, Output, register

STATUSES = ("pass", "fail", "skip", "error", "timeout")


@register("health")
class HealthCollector(Collector):
    @dataclass
    class Params(CollectorParams):
        dir: str = "{node_dir}/health"  # where health results appear
        keep_names: int = 5000  # processed file names remembered (older files are assumed done)
        start_at: str = "end"  # results present at the very first start: end = skip them, start = send them

        def __post_init__(self):
            super().__post_init__()
            if self.start_at not in ("end", "start"):
                raise ValueError(f"start_at must be 'end' or 'start', not {self.start_at!r}")

    def __init__(self, section, params, ctx):
        super().__init__(section, params, ctx)
        self.key = f"health:{section}"
        saved = ctx.positions.get(self.key)
        self.done: list[str] = list(saved or [])
        self.done_set = set(self.done)
        self.skip_existing = saved is None and params.start_at == "end"

    def collect(self, out: Output) -> None:
        try:
            names = sorted(n for n in os.listdir(self.params.dir) if n.endswith(".json") and not n.startswith("."))
        except FileNotFoundError:
            return
        if self.skip_existing:
            self.skip_existing = False
            self.done = names[-self.params.keep_names:]  # older ones fall below oldest_kept
            self.done_set = set(self.done)
            out.position(self.key, self.done)
            return
        oldest_kept = self.done[0] if len(self.done) >= self.params.keep_names else ""
        new = [n for n in names if n not in self.done_set and n > oldest_kept]
        for name in new:
            path = os.path.join(self.params.dir, name)
            try:
                with open(path) as f:
                    result = json.load(f)
                self._result(out, result, name)
            except (OSError, ValueError, TypeError, KeyError, AttributeError) as exc:
                out.event("sidecar", "health_malformed", f"{name}: {exc}", "warning", {"file": path})
            self.done.append(name)
            self.done_set.add(name)
        if new:
            self.done.sort()
            while len(self.done) > self.params.keep_names:
                self.done_set.discard(self.done.pop(0))
            out.position(self.key, self.done)

    def _result(self, out: Output, r: dict, name: str) -> None:
        if not isinstance(r, dict):
            raise ValueError("a health result must be a JSON object")
        ts = float(r["ts"])
        suite = str(r["suite"])
        job_ids = [int(r["job_id"])] if r.get("job_id") not in (None, "", 0) else None
        verdict = r["verdict"]
        if verdict not in ("accept", "reject"):
            raise ValueError(f"verdict must be accept or reject, got {verdict!r}")
        for check in r.get("checks") or []:
            status = check.get("status")
            if status not in STATUSES:
                raise ValueError(f"check {check.get('name')!r}: status must be one of {STATUSES}, got {status!r}")
            out.event("health", str(check["name"]), str(check.get("message", "")), status,
                      {"suite": suite, "category": check.get("category", ""),
                       "duration_s": check.get("duration_s"), "file": name},
                      ts=ts, job_ids=job_ids)
        blocking = [i for i in r.get("issues") or [] if isinstance(i, dict) and i.get("blocking", True)]
        message = f"{suite}: {verdict}" + "".join(f"; {i.get('check')}: {i.get('message', '')}" for i in blocking)
        out.event("health", f"suite.{suite}", message[:500], verdict,
                  {"suite": suite, "duration_s": r.get("duration_s"), "checks": len(r.get("checks") or []),
                   "category": blocking[0].get("category", "") if blocking else "", "file": name},
                  ts=ts, job_ids=job_ids)
