"""`sigma health ...`: run suites or single checks, the prolog/epilog entry points, baselines, log acknowledgement."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

_T0 = time.monotonic()  # imported while `sigma` builds its parser: the prolog's budget starts here

SUITE_HOOKS = ("prolog", "epilog", "comprehensive")


def register(sub: argparse._SubParsersAction) -> None:
    health = sub.add_parser("health", help="validate this node (prolog/epilog/comprehensive suites)",
                            description="Node health validation: quick prolog/epilog suites, the comprehensive "
                                        "return-to-service suite, performance baselines.")
    hsub = health.add_subparsers(dest="action", metavar="ACTION", required=True)

    def add(name: str, func, help: str) -> argparse.ArgumentParser:
        p = hsub.add_parser(name, help=help, description=help)
        p.add_argument("--config", type=Path, default=None,
                       help="health config (default $SIGMA_HEALTH_CONFIG, /etc/sigma/health.yaml, configs/health.yaml)")
        p.add_argument("--node", default=None, help="node name (default $SLURMD_NODENAME or the short hostname)")
        p.add_argument("--root", default=None, help="host root for /proc, /sys and log reads (default config root)")
        p.add_argument("--node-dir", default=None, help="where results and marks live (default: see docs)")
        p.set_defaults(func=func)
        return p

    run = add("run", _run, "run a suite (or single checks) on this node and print the verdict")
    run.add_argument("--suite", choices=SUITE_HOOKS, default="prolog", help="suite to run (default prolog)")
    run.add_argument("--check", action="append", default=None, metavar="NAME", help="run only this check (repeatable)")
    run.add_argument("--json", action="store_true", help="print the machine-readable result")
    run.add_argument("--budget", type=float, default=None, help="total seconds (default: the suite's budget_s)")
    run.add_argument("--drop-caches", action="store_true", help="drop the page cache first, as the hooks do")
    run.add_argument("--no-record", action="store_true", help="do not write the result file")
    run.add_argument("--job-id", type=int, default=None, help="job being started (default $SLURM_JOB_ID)")
    add("prolog", _prolog, "SLURM Prolog entry point: quick suite under the hard budget; exit 1 = node fault")
    add("epilog", _epilog, "SLURM Epilog entry point: kill leftovers, drop caches, post-check; exit 1 = node fault")
    ack = add("log-ack", _log_ack, "after repair: acknowledge kernel-log faults so they stop failing the node")
    ack.add_argument("--json", action="store_true")
    add("list", _list, "list checks and suites")

    base = add("baseline", _baseline_show, "performance baselines per node type")
    bsub = base.add_subparsers(dest="baseline_action", metavar="ACTION")
    rec = bsub.add_parser("record", help="measure this (known-good) node and merge it into the baselines",
                          description="Run the performance checks N times on this node and store the median; the "
                                      "node type's baseline is the median over recorded nodes.")
    rec.add_argument("--runs", type=int, default=3)
    rec.add_argument("--check", action="append", default=None, metavar="NAME",
                     help="performance check to record (default: membw gemm copy_bandwidth collective)")
    rec.set_defaults(func=_baseline_record)
    show = bsub.add_parser("show", help="print the baselines file")
    show.set_defaults(func=_baseline_show)
    for p in (rec, show):
        for a in base._actions:
            if a.dest in ("config", "node", "root", "node_dir"):
                p._add_action(a)


def _config(args):
    from sigma.health.config import load_health_config

    return load_health_config(args.config)


def _check_node(args) -> None:
    """On the local cluster a --node must be one of its nodes: never create state for a node that does not exist."""
    from sigma.cli import CommandError
    from sigma.health.context import cluster_dir_from_env
    from sigma.slurm.cluster import LocalCluster

    cluster_dir = cluster_dir_from_env()
    if not args.node or args.node_dir or cluster_dir is None or not (cluster_dir / "cluster.json").exists():
        return
    names = LocalCluster(cluster_dir).node_names()
    if args.node not in names:
        raise CommandError(f"unknown node {args.node!r} on the local cluster under {cluster_dir}; "
                           f"its nodes: {', '.join(names)}")


def _job_id(value) -> int | None:
    if value is not None:
        return value
    env = os.environ.get("SLURM_JOB_ID", "")
    return int(env) if env.isdigit() else None


def _print_report(report: dict, as_json: bool) -> None:
    if as_json:
        print(json.dumps(report, indent=1))
        return
    width = max((len(c["name"]) for c in report["checks"]), default=5)
    for c in report["checks"]:
        print(f"{c['name']:<{width}}  {c['status']:<7} {c['duration_s']:7.3f}s  {c['message']}")
    if "page_cache_drop" in report:
        print(f"page cache: {report['page_cache_drop']['message']}")
    print(f"verdict: {report['verdict']} ({report['node']}, suite {report['suite']}, {report['duration_s']:.2f}s)")
    for issue in report["issues"]:
        print(f"  issue [{issue['category']}] {issue['check']}: {issue['message']}"
              f"{'' if issue['blocking'] else ' (not blocking)'}")


def _run(args) -> int:
    from dataclasses import replace

    from sigma.health import checks
    from sigma.health.hooks import execute

    config = _config(args)
    _check_node(args)
    for name in args.check or ():
        checks.load(name)  # unknown names are a usage error
    hook = config.hook(args.suite)
    hook = replace(hook, drop_caches=args.drop_caches, kill_job_processes=False,
                   budget_s=args.budget if args.budget is not None else hook.budget_s)
    suite = args.suite if not args.check else f"{args.suite}-checks"
    report, code = execute(config, suite, hook, started=time.monotonic(), node=args.node, root=args.root,
                           node_dir=args.node_dir, job_id=_job_id(args.job_id), only=args.check,
                           record=not args.no_record)
    _print_report(report, args.json)
    if any(c["status"] == "timeout" for c in report["checks"]):
        _exit_now(code)
    return code


def _exit_now(code: int) -> None:
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _hook(args, kind: str) -> int:
    """Prolog/epilog: sigma's own failures never look like a node fault unless the policy says so."""
    from sigma.health import report as reporting

    policy = os.environ.get("SIGMA_HEALTH_TOOL_FAILURE", "ignore")
    try:
        from sigma.health.hooks import execute

        config = _config(args)
        hook = config.hook(kind)
        policy = "ignore" if hook.mode == "observe" else hook.tool_failure
        report, code = execute(config, kind, hook, started=_T0, node=args.node, root=args.root,
                               node_dir=args.node_dir, job_id=_job_id(None))
        summary = ", ".join(f"{i['check']}={i['status']}" for i in report["issues"]) or "all checks passed"
        observed = " [OBSERVE mode: exit 0]" if hook.mode == "observe" else ""
        print(f"sigma {kind}: {report['verdict']} ({summary}) in {report['duration_s']:.2f}s{observed}",
              file=sys.stderr)
        _exit_now(code)  # an abandoned check thread (stuck in a read) must not delay the exit
    except BaseException as exc:  # noqa: BLE001 - a sigma bug must follow the policy, never crash the hook
        import traceback

        node_dir = None
        try:
            from sigma.health.context import node_name, resolve_node_dir

            node_dir = Path(args.node_dir) if args.node_dir else resolve_node_dir(args.node or node_name())
        except Exception:  # noqa: BLE001
            pass
        reporting.log(node_dir, f"{kind}: SIGMA FAILED ITSELF (policy tool_failure={policy}): "
                                f"{type(exc).__name__}: {exc}\n{traceback.format_exc().rstrip()}")
        return 1 if policy == "reject" else 0


def _prolog(args) -> int:
    return _hook(args, "prolog")


def _epilog(args) -> int:
    return _hook(args, "epilog")


def _log_ack(args) -> int:
    from sigma.health.checks import kernel_log
    from sigma.health.context import Context

    config = _config(args)
    _check_node(args)
    ctx = Context.create(config, args.node, args.root, args.node_dir)
    scan = kernel_log.acknowledge(ctx, dict(config.check("kernel_log").args))
    fatal = [f for f in scan.findings if f.fatal]
    out = {"node": ctx.node, "source": scan.end.source, "acknowledged": [f.line for f in fatal]}
    if args.json:
        print(json.dumps(out, indent=1))
    else:
        print(f"{ctx.node}: acknowledged {len(fatal)} fatal kernel-log line(s) in {scan.end.source}; "
              f"only newer lines are judged from now on")
        for f in fatal:
            print(f"  {f.label}: {f.line[:160]}")
    return 0


def _list(args) -> int:
    from sigma.health import checks

    config = _config(args)
    for name in checks.CHECK_NAMES:
        module = checks.load(name)
        doc = (module.__doc__ or "").strip().splitlines()[0]
        suites = [s for s, names in config.suites.items() if name in names]
        print(f"{name:<16} [{module.CATEGORY}] {doc}  suites: {', '.join(suites) or '-'}")
    return 0


PERF_CHECKS = ("membw", "gemm", "copy_bandwidth", "collective")


def _baseline_record(args) -> int:
    import statistics

    from sigma.cli import CommandError
    from sigma.health import baselines
    from sigma.health.context import Context
    from sigma.health.runner import run_checks

    config = _config(args)
    _check_node(args)
    ctx = Context.create(config, args.node, args.root, args.node_dir)
    names = args.check or list(PERF_CHECKS)
    samples: dict[str, list[float]] = {}
    units: dict[str, str] = {}
    for _ in range(args.runs):
        ctx.forget("baselines")
        outcome = run_checks(ctx, names, deadline=time.monotonic() + 3600)
        for rec in outcome.records:
            if rec.status in ("error", "timeout"):
                raise CommandError(f"{rec.name} {rec.status}: {rec.message}")
            for key, value in rec.data.items():
                if ":" in key:
                    if isinstance(value, (int, float)):
                        samples.setdefault(key, []).append(float(value))
                        units[key] = rec.data.get("unit", "")
    if not samples:
        raise CommandError(f"none of {names} produced a measurement on this node (all skipped?)")
    metrics = {k: (statistics.median(v), units[k]) for k, v in samples.items()}
    path = baselines.baseline_path(ctx)
    baselines.record(path, ctx.profile.type, ctx.node, metrics)
    for k, (v, unit) in sorted(metrics.items()):
        print(f"{ctx.node} ({ctx.profile.type}) {k} = {v:.4g} {unit} (median of {len(samples[k])})")
    print(f"baselines written to {path}")
    return 0


def _baseline_show(args) -> int:
    from sigma.health import baselines
    from sigma.health.context import Context

    _check_node(args)
    ctx = Context.create(_config(args), args.node, args.root, args.node_dir)
    path = baselines.baseline_path(ctx)
    data = baselines.load(path)
    if not data["types"]:
        print(f"no baselines in {path}; record some with `sigma health baseline record` on known-good nodes")
    for node_type, metrics in sorted(data["types"].items()):
        for metric, entry in sorted(metrics.items()):
            print(f"{node_type:<12} {metric:<40} {entry['value']:>10.4g} {entry.get('unit', ''):<8} "
                  f"from {len(entry['nodes'])} node(s)")
    return 0
