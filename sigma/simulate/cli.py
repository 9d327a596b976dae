"""`sigma simulate`: the controller's decisions on a simulated cluster, beside a no-automation baseline."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

DEFAULT_START = "2026-01-01"
POOLED_SYSTEMS = [2, 3, 4, 5, 6, 8, 9, 10]  # the LANL clusters (system 7 is a single SMP machine)


def register(sub) -> None:
    p = sub.add_parser("simulate", help="simulate the cluster on a virtual clock: the controller's own decisions "
                                        "against a no-automation baseline, failures from a trace or a fitted model")
    p.add_argument("--nodes", type=int, default=256, help="nodes in the simulated cluster (default 256)")
    p.add_argument("--gpus-per-node", type=int, default=8, help="accelerators per node, for the figures (default 8)")
    p.add_argument("--days", type=float, default=30.0, help="simulated days (default 30)")
    p.add_argument("--failures", default="lanl",
                   help="lanl (model fitted to the pooled LANL clusters), lanl:SYSTEM (fitted to one system), "
                        "replay:SYSTEM (that system's real failure sequence), or a trace file: CSV node,start,end,"
                        "kind, the LANL layout with --system, or InfiniteHBD's fault_trace.json")
    p.add_argument("--node-mtbf-h", type=float, default=None,
                   help="with a fitted model: keep its shape, scale the time between a node's failures to this mean "
                        "(a site's own rate; the rate differs tenfold between LANL systems, the shape much less)")
    p.add_argument("--system", type=int, help="with a LANL-layout trace file: the system to replay")
    p.add_argument("--lanl", default=None, help="the LANL failure records (default: $SIGMA_DATA/lanl, else ../shared/data/lanl)")
    bad = p.add_mutually_exclusive_group()
    bad.add_argument("--strict", dest="bad_rows", action="store_const", const="strict",
                     help="a trace row that cannot be used is an error naming file, line and field (default)")
    bad.add_argument("--skip-bad", dest="bad_rows", action="store_const", const="skip",
                     help="skip such rows; the output says how many and which")
    p.set_defaults(bad_rows="strict")
    p.add_argument("--overlaps", choices=("error", "merge"), default="error",
                   help="overlapping outages of one node in a trace: an error naming both rows, or merged")
    p.add_argument("--jobs", help="workload CSV (name,nodes,count,hours,checkpoint_min,restart_min,submit_h); "
                                  "default: 8-node jobs on 7/8 of the nodes for the whole period")
    p.add_argument("--policy", default=None, help="controller config (default: the packaged configs/controller.yaml)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--compare", choices=("manual", "none"), default="manual",
                   help="baseline run side by side: manual (a person notices, drains, requeues, repairs) or none")
    p.add_argument("--start", default=None, help="simulated start date (default 2026-01-01; replay: the trace's)")
    p.add_argument("--human-median-min", type=float, default=30.0,
                   help="median minutes until a person notices a fault or picks up an escalation (lognormal)")
    p.add_argument("--reboot-min", type=float, default=10.0, help="reboot until slurmd is back (default 10)")
    p.add_argument("--validation-min", type=float, default=15.0, help="validation job length (default 15)")
    p.add_argument("--timelines", type=int, default=3, metavar="N",
                   help="print (and put in --json) the step-by-step timeline of the N faults longest out of "
                        "service in each arm, and of its slowest detection and longest validation (default 3)")
    p.add_argument("--json", action="store_true", help="print the figures as JSON")
    p.add_argument("--plots", metavar="DIR", help="write utilisation.png and recovery.png there")
    p.add_argument("--db", default=":memory:", help="keep the simulated controller database here (sigma incidents "
                                                    "--db / sigma explain --db read it); default in memory")
    p.add_argument("--fit", action="store_true",
                   help="print the LANL fits (per system, pooled, held-out) and exit; with --failures "
                        "fault_trace.json also the model checked across fleets, both ways")
    p.add_argument("--verbose", action="store_true", help="print the controller's decision lines as they happen")
    p.set_defaults(func=run)


def lanl_path(arg: str | None) -> Path:
    if arg:
        return Path(arg)
    import os

    from sigma.paths import project_root

    data = os.environ.get("SIGMA_DATA") or project_root().parent / "shared" / "data"  # the shared data sets
    return Path(data) / "lanl" / "failures-systems-2-10.csv"


def fits(args: argparse.Namespace) -> dict:
    """The LANL fits (per system, pooled, leave one system out) and, with a trace file in --failures, the model
    checked across fleets both ways."""
    from sigma.simulate import infinitehbd
    from sigma.simulate.fit import across_fleets, fit_systems
    from sigma.simulate.trace import BadRows, TraceError, read_lanl

    bad = BadRows(skip=args.bad_rows == "skip")
    systems = read_lanl(lanl_path(args.lanl), POOLED_SYSTEMS + [7], bad)
    out = fit_systems(systems, POOLED_SYSTEMS)
    if args.failures not in ("lanl",) and not args.failures.startswith(("lanl:", "replay:")):
        if not infinitehbd.looks_like(args.failures):
            raise TraceError(f"{args.failures}: --fit checks the model across fleets on InfiniteHBD's "
                             f"fault_trace.json; a CSV trace is not read here")
        other, _ = infinitehbd.read(args.failures, bad)
        out["across_fleets"] = across_fleets(systems, POOLED_SYSTEMS, "infinitehbd", other)
    if bad.skipped:
        out["skipped_rows"] = bad.skipped
    return out


def run(args: argparse.Namespace) -> int:
    from sigma.simulate.runner import simulate

    if args.fit:
        print(json.dumps(fits(args), indent=1))
        return 0
    t0 = time.process_time()
    out = simulate(args)
    out["cpu_s"] = round(time.process_time() - t0, 2)
    if args.json:
        print(json.dumps(out, indent=1, default=str))
    else:
        from sigma.simulate.output import table

        table(out)
    if args.plots:
        from sigma.simulate.output import plots

        for path in plots(out, Path(args.plots)):
            print(f"wrote {path}")
    return 0
