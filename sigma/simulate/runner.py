"""Wire one `sigma simulate` run: the failure sequence, the workload, the policy, both arms, their figures."""

from __future__ import annotations

import datetime as dt

import numpy as np

from sigma.simulate.trace import TraceError


def simulate(args) -> dict:
    from sigma.controller.config import load_controller_config, load_remediation_config, resolve
    from sigma.paths import configs_dir, project_root
    from sigma.rules.loader import load_rules
    from sigma.simulate import workload
    from sigma.simulate.engine import Engine, Params
    from sigma.simulate.faults import log_events
    from sigma.simulate.metrics import figures

    if args.nodes < 1 or args.days <= 0:
        raise TraceError("--nodes must be at least 1 and --days positive")
    names = [f"node{i + 1:04d}" for i in range(args.nodes)]
    outages, model, start, notes = _failures(args, names)
    end = start + args.days * 86400.0
    specs = workload.read(args.jobs, args.nodes) if args.jobs else workload.default(args.nodes)
    policy_path = args.policy or str(configs_dir() / "controller.yaml")
    root = project_root()
    params = Params(reboot_s=args.reboot_min * 60.0, validation_s=args.validation_min * 60.0,
                    human_median_min=args.human_median_min)
    rules = None
    arms = {}
    for arm in (["policy"] + (["manual"] if args.compare == "manual" else [])):
        policy = None
        if arm == "policy":
            cfg = load_controller_config(policy_path)
            rules = rules or load_rules(resolve(cfg.rules, root))
            policy = (cfg, load_remediation_config(resolve(cfg.remediation, root)), rules)
        engine = Engine(arm=arm, names=names, outages=outages, specs=specs, start=start, end=end,
                        rng=np.random.default_rng(args.seed + 1), params=params, policy=policy,
                        log_events=log_events(rules) if arm == "policy" else None,
                        db=args.db if arm == "policy" else ":memory:", verbose=args.verbose,
                        timelines=args.timelines)
        result = engine.run()
        arms[arm] = {**figures(result), "timelines": result.timelines, "series": result.series,
                     "recovery": [b["first_step"] - a["fault"] for j in result.jobs for a, b in zip(j.runs, j.runs[1:])
                                  if a.get("fault") is not None]}
        if result.absorbed:
            notes.append(f"{arm}: {len(result.absorbed)} faults hit a node already out of service (they joined its "
                         f"outage, lengthened by a repair by hand that ends later): {', '.join(result.absorbed[:3])}"
                         f"{' ...' if len(result.absorbed) > 3 else ''}")
    return {"nodes": args.nodes, "gpus_per_node": args.gpus_per_node, "accelerators": args.nodes * args.gpus_per_node,
            "days": args.days, "start": _iso(start), "seed": args.seed, "failures": args.failures,
            "outages_in_period": sum(1 for o in outages if start <= o.start < end), "model": model,
            "workload": {"jobs": len(specs), "nodes_per_job": sorted({s.nodes for s in specs}),
                         "source": args.jobs or "default"},
            "policy": policy_path, "notes": notes, "arms": arms}


def _failures(args, names):
    from sigma.simulate import infinitehbd
    from sigma.simulate.cli import POOLED_SYSTEMS, lanl_path
    from sigma.simulate.faults import generate
    from sigma.simulate.fit import pooled_model
    from sigma.simulate.trace import BadRows, read_lanl, read_plain

    notes: list[str] = []
    spec = args.failures
    start = _start(args.start) if args.start else None
    rng = np.random.default_rng(args.seed)
    bad = BadRows(skip=args.bad_rows == "skip")
    if spec == "lanl" or spec.startswith("lanl:"):
        chosen = POOLED_SYSTEMS if spec == "lanl" else [_system(spec)]
        systems = read_lanl(lanl_path(args.lanl), chosen, bad)
        model = pooled_model(spec, systems, chosen)
        if args.node_mtbf_h:  # the fitted shape, at the site's own failure rate
            model.uptime_h = model.uptime_h.scaled(args.node_mtbf_h / model.uptime_h.mean)
        start = start or _start(None)
        outages = generate(model, args.nodes, start, start + args.days * 86400.0, rng)
        return outages, model.to_dict(), start, _skipped(bad, notes)
    if spec.startswith("replay:"):
        system = _system(spec)
        outages = read_lanl(lanl_path(args.lanl), system, bad)[system]
    elif args.system is not None:
        outages = read_lanl(spec, args.system, bad)[args.system]
    elif infinitehbd.looks_like(spec):
        outages, ids = infinitehbd.read(spec, bad)
        if len(ids) > args.nodes:
            raise TraceError(f"{spec}: the trace has {len(ids)} nodes; the cluster has {args.nodes} (pass --nodes "
                             f"{len(ids)} or more)")
        start = start or infinitehbd.DAY0
    else:
        outages = read_plain(spec, names, bad)
        return (_checked(outages, args, notes), None,
                start or min((o.start for o in outages), default=_start(None)), _skipped(bad, notes))
    too_big = [o for o in outages if o.node >= args.nodes]
    if too_big:
        raise TraceError(f"{too_big[0].origin}: node {too_big[0].node} does not exist in a cluster of {args.nodes} "
                         f"nodes (the trace has nodes up to {max(o.node for o in outages)}; pass --nodes "
                         f"{max(o.node for o in outages) + 1})")
    outages = _checked(outages, args, notes)
    return outages, None, start or outages[0].start, _skipped(bad, notes)


def _skipped(bad, notes: list[str]) -> list[str]:
    if bad.skipped:
        notes.insert(0, f"skipped {len(bad.skipped)} unusable rows (--skip-bad): {'; '.join(bad.skipped[:3])}"
                        f"{' ...' if len(bad.skipped) > 3 else ''}")
    return notes


def _checked(outages, args, notes):
    from sigma.simulate.trace import check, merge_overlaps

    if args.overlaps == "merge":
        outages, folded = merge_overlaps(outages)
        if folded:
            notes.append(f"merged {len(folded)} overlapping outages into the one before: {', '.join(folded[:5])}"
                         f"{' ...' if len(folded) > 5 else ''}")
    return check(outages)


def _system(spec: str) -> int:
    try:
        return int(spec.split(":", 1)[1])
    except ValueError:
        raise TraceError(f"--failures {spec}: the system must be a number (a LANL system, 2-24)") from None


def _start(text: str | None) -> float:
    from sigma.simulate.cli import DEFAULT_START

    try:
        d = dt.datetime.fromisoformat(text or DEFAULT_START)
    except ValueError:
        raise TraceError(f"--start {text!r}: use an ISO date such as 2026-01-01") from None
    return (d if d.tzinfo else d.replace(tzinfo=dt.timezone.utc)).timestamp()


def _iso(ts: float) -> str:
    return dt.datetime.fromtimestamp(ts, dt.timezone.utc).strftime("%Y-%m-%d %H:%M")
