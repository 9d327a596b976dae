"""One validation run as the prolog, the epilog, the comprehensive job or an admin runs it:
watchdog, optional job-process cleanup and page-cache drop, the checks, the result file, an exit code."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

from sigma.health import report as reporting
from sigma.health.config import HealthConfig, HookConfig
from sigma.health.context import Context
from sigma.health.runner import run_checks

EXIT_ACCEPT, EXIT_REJECT = 0, 1
WATCHDOG_GRACE_S = 0.5  # after the budget, the watchdog ends the process whatever it is doing


def execute(config: HealthConfig, suite: str, hook: HookConfig, *, started: float, node: str | None = None,
            root: str | None = None, node_dir: str | None = None, job_id: int | None = None,
            only: list[str] | None = None, record: bool = True, custom=None) -> tuple[dict, int]:
    """Returns (report, exit code). exit 1 only for a rejected node; sigma's own failures follow tool_failure."""
    ctx = Context.create(config, node, root, node_dir, job_id, suite)
    t_wall = time.time()
    deadline = started + hook.budget_s
    observe = hook.mode == "observe"  # warn only: record what the verdict would do, never fail the hook
    tool_exit = EXIT_REJECT if hook.tool_failure == "reject" and not observe else EXIT_ACCEPT
    dog = _watchdog(ctx, suite, job_id, started, deadline, tool_exit, record, t_wall)
    try:
        report: dict = {"node": ctx.node, "ts": t_wall, "suite": suite, "job_id": job_id,
                        **({"mode": "observe"} if observe else {})}
        if hook.kill_job_processes and job_id is not None and str(ctx.root) == "/":
            key = "left_job_processes" if observe else "killed_job_processes"
            report[key] = kill_job_processes(ctx, job_id, kill=not observe)
        if hook.drop_caches:
            from sigma.health.dropcache import drop_page_cache

            drop = drop_page_cache(ctx.root, hook.drop_caches_mode)
            report["page_cache_drop"] = drop.to_json()
            if not drop.dropped:
                reporting.log(ctx.node_dir, f"{suite}: page cache not dropped: {drop.message}")
        names = only or config.suites[hook.suite]
        outcome = run_checks(ctx, names, deadline=deadline, tool_failure=hook.tool_failure, custom=custom)
        report.update(verdict=outcome.verdict, duration_s=round(time.monotonic() - started, 4),
                      budget_s=hook.budget_s, node_type=ctx.profile.type,
                      checks=[r.to_json() for r in outcome.records], issues=outcome.issues)
        for name, tb in outcome.tracebacks.items():
            reporting.log(ctx.node_dir, f"{suite}: check {name} crashed (sigma bug, policy "
                                        f"tool_failure={hook.tool_failure}):\n{tb.rstrip()}")
        for issue in outcome.issues:
            reporting.log(ctx.node_dir, f"{suite}: {issue['check']} {issue['status']} [{issue['category']}]"
                                        f"{'' if issue['blocking'] else ' (not blocking)'}: {issue['message']}")
        if record:
            report["result_file"] = str(reporting.write_result(ctx.node_dir, report))
        if outcome.verdict == "reject" and observe:
            reporting.log(ctx.node_dir, f"{suite}: OBSERVE mode: node {ctx.node} would be REJECTED (job {job_id}); "
                                        f"exit 0, SLURM drains nothing")
            return report, EXIT_ACCEPT
        if outcome.verdict == "reject":
            reporting.log(ctx.node_dir, f"{suite}: node {ctx.node} REJECTED (job {job_id})")
        return report, EXIT_REJECT if outcome.verdict == "reject" else EXIT_ACCEPT
    finally:
        dog.cancel()


def _watchdog(ctx: Context, suite: str, job_id, started_at: float, deadline: float, tool_exit: int,
              record: bool, t_wall: float) -> threading.Timer:
    """Ends the process at deadline + grace whatever blocks it (a hung write, a wedged library call)."""
    def expire():
        try:
            reporting.log(ctx.node_dir, f"{suite}: watchdog fired after the {deadline - started_at:.1f}s budget; "
                                        f"exiting {tool_exit} per tool_failure policy")
            if record:
                reporting.write_result(ctx.node_dir, {
                    "node": ctx.node, "ts": t_wall, "suite": suite, "job_id": job_id, "verdict": "accept"
                    if tool_exit == EXIT_ACCEPT else "reject", "duration_s": round(time.monotonic() - started_at, 4),
                    "checks": [], "issues": [{"check": "watchdog", "status": "timeout", "category": "tool",
                                              "message": "run exceeded its budget", "blocking": bool(tool_exit)}]})
        finally:
            os._exit(tool_exit)

    timer = threading.Timer(max(0.0, deadline - time.monotonic()) + WATCHDOG_GRACE_S, expire)
    timer.daemon = True
    timer.start()
    return timer


def kill_job_processes(ctx: Context, job_id: int, kill: bool = True) -> list[int]:
    """Epilog: processes of the finished job still alive on this node (daemonised, reparented to init); killed
    unless kill=False (observe mode: only named)."""
    from sigma.health import facts
    from sigma.health.checks.stray_processes import kill as kill_all

    conf = os.environ.get("SLURM_CONF")  # job ids repeat across clusters sharing one host (local clusters)
    mine = [p for p in facts.processes(ctx) if p.env.get("SLURM_JOB_ID") == str(job_id)
            and p.env.get("SLURMD_NODENAME", ctx.node) == ctx.node and "SLURM_SCRIPT_CONTEXT" not in p.env
            and (not conf or p.env.get("SLURM_CONF", conf) == conf) and p.pid != os.getpid()]
    ctx.forget("processes")  # the process table changed
    if mine and not kill:
        reporting.log(ctx.node_dir, f"OBSERVE mode: would kill {len(mine)} leftover process(es) of job {job_id}: "
                                    f"{', '.join(f'{p.pid}:{p.name}' for p in mine)}")
    elif mine:
        survivors = kill_all(mine)
        reporting.log(ctx.node_dir, f"killed {len(mine) - len(survivors)} leftover process(es) of job {job_id}: "
                                    f"{', '.join(f'{p.pid}:{p.name}' for p in mine)}")
    return [p.pid for p in mine]
