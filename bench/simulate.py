"""How fast `sigma simulate` runs: simulated days of a cluster per CPU second, on one core.

    python bench/simulate.py [--nodes 256] [--gpus-per-node 8] [--days 30 365] [--seed 0] [--node-mtbf-h H]

For each period it runs the bare command's work (failures from the model fitted to the LANL clusters, the default
workload, the packaged policy, the manual baseline beside it) and prints the CPU seconds of the whole run and of
the policy arm alone (the controller's real tick is most of it), with the counts that drive the cost. Goal: 30
simulated days of 2,048 accelerators in under 10 s, a year in under a minute.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("OMP_NUM_THREADS", "1")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nodes", type=int, default=256)
    p.add_argument("--gpus-per-node", type=int, default=8)
    p.add_argument("--days", type=float, nargs="+", default=[30.0, 365.0])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--node-mtbf-h", type=float, help="a faultier cluster: the fitted shape at this mean uptime")
    args = p.parse_args(argv)

    from sigma.cli import build_parser
    from sigma.simulate.cli import lanl_path
    from sigma.simulate.runner import simulate

    if not lanl_path(None).is_file():
        raise SystemExit(f"no LANL failure records at {lanl_path(None)}: set SIGMA_DATA to the shared data sets")

    print(f"{args.nodes} nodes x {args.gpus_per_node} = {args.nodes * args.gpus_per_node} accelerators, seed "
          f"{args.seed}, node MTBF {args.node_mtbf_h or 'as fitted'} h, one process (CPU seconds: time.process_time)")
    print(f"{'days':>6} {'cpu total s':>12} {'policy arm s':>13} {'manual arm s':>13} {'faults':>7} {'ticks':>7} "
          f"{'decisions':>9}  goal")
    for days in args.days:
        cli = build_parser().parse_args(["simulate", "--nodes", str(args.nodes), "--gpus-per-node",
                                         str(args.gpus_per_node), "--days", str(days), "--seed", str(args.seed)]
                                        + (["--node-mtbf-h", str(args.node_mtbf_h)] if args.node_mtbf_h else []))
        import sigma.simulate.engine as engine

        spent: dict[str, float] = {}
        run = engine.Engine.run

        def timed(self, _run=run):
            t = time.process_time()
            out = _run(self)
            spent[self.arm] = time.process_time() - t
            return out

        engine.Engine.run = timed
        t0 = time.process_time()
        out = simulate(cli)
        total = time.process_time() - t0
        engine.Engine.run = run
        pol = out["arms"]["policy"]
        goal = 10.0 if days <= 30 else 60.0
        decisions = sum(pol["incidents"].values())
        print(f"{days:>6g} {total:>12.1f} {spent['policy']:>13.1f} {spent['manual']:>13.1f} {pol['faults']:>7} "
              f"{pol['controller_ticks']:>7} {decisions:>9}  < {goal:g} s: {'met' if total < goal else 'NOT met'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
