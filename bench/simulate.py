"""`sigma simulate` on real fleets' own fault traces, and how fast it runs, on one core.

    python bench/simulate.py [--traces DIR] [--only NAME ...] [--speed-days 30] [--seed 0]

For each trace (StepFun's InfiniteHBD GPU cluster; LANL systems 18 and 20 from the LANL file with every system) it
replays the real failure sequence through the controller's policy and through the manual baseline, and prints both
arms side by side: availability, effective utilisation, job recovery and each fault's time until its node is back
in service (median and p99), detection, escalations to people, and the CPU seconds per simulated year
(`time.process_time`, one process). Then the bare command's month (256 nodes x 8 = 2,048 accelerators, the pooled
LANL model). Goals: a 1,024-node trace over three years, both arms, under 60 s; the month under 2 s.

The traces are not in the repository (docs/simulate.md, Real traces): DIR (default: traces/ beside bench/) holds
`infinitehbd-fault_trace.json` (github.com/stepfun-ai/InfiniteHBD-Trace, Apache-2.0) and
`LA-UR-05-7318-failure-data-1996-2005.csv` (the LANL failure data as published, all systems).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("OMP_NUM_THREADS", "1")

LANL_ALL = "LA-UR-05-7318-failure-data-1996-2005.csv"
# name -> (file, arguments): each trace over its own period (a LANL system: three years of it at most)
TRACES = {
    "infinitehbd": ("infinitehbd-fault_trace.json", ["--nodes", "400", "--days", "349"]),
    "lanl-18": (LANL_ALL, ["--system", "18", "--nodes", "1024", "--days", "1096"]),
    "lanl-20": (LANL_ALL, ["--system", "20", "--nodes", "512", "--days", "1096"]),
}


def run(cli_args: list[str]) -> tuple[dict, dict[str, float], float]:
    """One `sigma simulate` in this process: its output, the CPU seconds of each arm, of the whole run."""
    import sigma.simulate.engine as engine
    from sigma.cli import build_parser
    from sigma.simulate.runner import simulate

    spent: dict[str, float] = {}
    original = engine.Engine.run

    def timed(self):
        t = time.process_time()
        out = original(self)
        spent[self.arm] = time.process_time() - t
        return out

    engine.Engine.run = timed
    try:
        t0 = time.process_time()
        out = simulate(build_parser().parse_args(["simulate", *cli_args]))
        return out, spent, time.process_time() - t0
    finally:
        engine.Engine.run = original


def side_by_side(name: str, out: dict, spent: dict[str, float], total: float) -> None:
    pol, man = out["arms"]["policy"], out["arms"]["manual"]
    years = out["days"] / 365.25
    stat = lambda a, key, s: a[key].get(s)  # noqa: E731
    rows = [
        ("availability", lambda a: f"{100 * a['utilisation']['available']:.2f} %"),
        ("effective utilisation", lambda a: f"{100 * a['utilisation']['effective']:.2f} %"),
        ("job interruptions", lambda a: str(a["job_interruptions"])),
        ("job recovery median s", lambda a: _n(stat(a, "job_recovery_s", "median"))),
        ("job recovery p99 s", lambda a: _n(stat(a, "job_recovery_s", "p99"))),
        ("fault -> back in service median s", lambda a: _n(stat(a, "fault_out_of_service_s", "median"))),
        ("fault -> back in service p99 s", lambda a: _n(stat(a, "fault_out_of_service_s", "p99"))),
        ("  beyond the repair by hand median s", lambda a: _n(stat(a, "fault_overhead_s", "median"))),
        ("  beyond the repair by hand p99 s", lambda a: _n(stat(a, "fault_overhead_s", "p99"))),
        ("detected median s", lambda a: _n(stat(a, "fault_detect_s", "median"))),
        ("detected p99 s", lambda a: _n(stat(a, "fault_detect_s", "p99"))),
        ("escalations to people", lambda a: str(a["escalations"])),
        ("cpu s (per simulated year)", None),
    ]
    print(f"\n{name}: {out['nodes']} nodes x {out['gpus_per_node']}, {out['days']:g} days from {out['start']}, "
          f"{out['outages_in_period']} faults")
    print(f"  {'':36} {'sigma policy':>16} {'manual':>16}")
    for label, fn in rows:
        if fn is None:
            cells = [f"{spent[a]:.1f} ({spent[a] / years:.1f})" for a in ("policy", "manual")]
        else:
            cells = [fn(pol), fn(man)]
        print(f"  {label:36} {cells[0]:>16} {cells[1]:>16}")
    goal = " (goal < 60 s: " + ("met" if total < 60 else "NOT met") + ")" if out["nodes"] >= 1024 else ""
    print(f"  both arms: {total:.1f} s cpu, {total / years:.1f} s per simulated year{goal}; "
          f"controller ticks {pol['controller_ticks']}")
    for note in out["notes"]:
        print(f"  note: {note[:160]}")


def _n(v) -> str:
    return "-" if v is None else f"{v:,.0f}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--traces", type=Path, default=Path(__file__).resolve().parent.parent / "traces")
    p.add_argument("--only", nargs="+", choices=sorted(TRACES) + ["speed"], help="run only these")
    p.add_argument("--speed-days", type=float, default=30.0)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    load = os.getloadavg()[0]
    print(f"one process, CPU seconds (time.process_time); load average {load:.1f} on {os.cpu_count()} cores; "
          f"seed {args.seed}")
    for name, (file, extra) in TRACES.items():
        if args.only and name not in args.only:
            continue
        path = args.traces / file
        if not path.is_file():
            print(f"\n{name}: no {path}; docs/simulate.md (Real traces) says where to get it")
            continue
        out, spent, total = run(["--failures", str(path), *extra, "--overlaps", "merge", "--seed", str(args.seed),
                                 "--timelines", "0"])
        side_by_side(name, out, spent, total)
    if not args.only or "speed" in args.only:
        from sigma.simulate.cli import lanl_path

        if not lanl_path(None).is_file():
            raise SystemExit(f"no LANL failure records at {lanl_path(None)}: set SIGMA_DATA to the shared data sets")
        out, spent, total = run(["--nodes", "256", "--days", str(args.speed_days), "--seed", str(args.seed),
                                 "--timelines", "0"])
        print(f"\nbare command: 256 nodes x 8 = 2048 accelerators, {args.speed_days:g} days, pooled LANL model: "
              f"{total:.2f} s cpu (policy {spent['policy']:.2f}, manual {spent['manual']:.2f}), "
              f"{out['arms']['policy']['faults']} faults, {out['arms']['policy']['controller_ticks']} ticks"
              + (f" (goal < 2 s: {'met' if total < 2 else 'NOT met'})" if args.speed_days <= 30 else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
