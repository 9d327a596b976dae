"""Run checks one after another, each in a worker thread with its own timeout, inside a total budget.

A check that overruns is reported as `timeout` and abandoned (its thread is a daemon; the hook process exits
with os._exit so a thread stuck in a blocking read cannot hold it). Checks left when the budget is spent are
reported as `timeout` without running. A check that raises is reported as `error` (category "tool").
"""

from __future__ import annotations

import threading
import time
import traceback
from dataclasses import dataclass, field
from typing import Callable, Mapping

from sigma.health import checks as registry
from sigma.health.context import Context
from sigma.health.result import ERROR, TIMEOUT, CheckRecord, Result, verdict

CheckFn = Callable[[Context, dict], Result]
RESERVE_S = 0.3  # budget kept back for writing the result


@dataclass
class Outcome:
    records: list[CheckRecord]
    verdict: str
    issues: list[dict]
    duration_s: float
    tracebacks: dict[str, str] = field(default_factory=dict)


def resolve(name: str, custom: Mapping[str, tuple[CheckFn, str]] | None = None) -> tuple[CheckFn, str]:
    """(run function, default category); custom entries are used instead of the registry."""
    if custom and name in custom:
        return custom[name]
    module = registry.load(name)
    return module.run, module.CATEGORY


def run_checks(ctx: Context, names: list[str], *, deadline: float, tool_failure: str = "ignore",
               custom: Mapping[str, tuple[CheckFn, str]] | None = None) -> Outcome:
    """deadline is a time.monotonic() value by which every check has finished or been abandoned."""
    started = time.monotonic()
    records, tracebacks = [], {}
    for name in names:
        cfg = ctx.config.check(name)
        try:
            fn, category = resolve(name, custom)
        except Exception as exc:  # noqa: BLE001 - a broken check module must not stop the others
            tracebacks[name] = traceback.format_exc()
            records.append(CheckRecord(name, ERROR, f"cannot load check: {type(exc).__name__}: {exc}", "tool",
                                       0.0, cfg.on_fail == "reject"))
            continue
        remaining = deadline - time.monotonic() - RESERVE_S
        if remaining <= 0:
            records.append(CheckRecord(name, TIMEOUT, "not run: total budget spent", category, 0.0,
                                       cfg.on_fail == "reject"))
            continue
        limit = min(cfg.timeout_s, remaining)
        box: dict = {}

        def work(fn=fn, args=dict(cfg.args), box=box):
            try:
                box["result"] = fn(ctx, args)
            except BaseException as exc:  # noqa: BLE001 - any failure of a check is reported, never raised
                box["error"] = f"{type(exc).__name__}: {exc}"
                box["traceback"] = traceback.format_exc()

        t0 = time.monotonic()
        worker = threading.Thread(target=work, name=f"check-{name}", daemon=True)
        worker.start()
        worker.join(limit)
        took = time.monotonic() - t0
        blocking = cfg.on_fail == "reject"
        if worker.is_alive():
            why = "total budget spent" if limit < cfg.timeout_s else f"timeout {cfg.timeout_s:g}s"
            records.append(CheckRecord(name, TIMEOUT, f"did not finish within {limit:.1f}s ({why}); abandoned",
                                       category, took, blocking))
        elif "error" in box:
            tracebacks[name] = box["traceback"]
            records.append(CheckRecord(name, ERROR, box["error"], "tool", took, blocking))
        else:
            r: Result = box["result"]
            records.append(CheckRecord(name, r.status, r.message, r.category or category, took, blocking, r.data))
    decision, issues = verdict(records, tool_failure)
    return Outcome(records, decision, issues, time.monotonic() - started, tracebacks)
