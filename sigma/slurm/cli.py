"""`sigma cluster up|down|status|env`: a real SLURM cluster on this machine."""

from __future__ import annotations

import argparse
import json
import shlex
import time
from pathlib import Path


def register(sub: argparse._SubParsersAction) -> None:
    cluster = sub.add_parser("cluster", help="bring a local SLURM cluster up or down",
                             description="A real SLURM cluster on one machine (munge, MariaDB, slurmdbd, "
                                         "slurmctld, N slurmd) under a state directory.")
    csub = cluster.add_subparsers(dest="action", metavar="ACTION", required=True)

    def add(name: str, func, help: str) -> argparse.ArgumentParser:
        p = csub.add_parser(name, help=help, description=help)
        p.add_argument("--state-dir", type=Path, default=None,
                       help="state directory (default $SIGMA_CLUSTER_DIR, else "
                            "~/.local/state/sigma/cluster-<id of this checkout>)")
        p.set_defaults(func=func)
        return p

    up = add("up", _up, "start the cluster (idempotent) and wait until every node is idle")
    up.add_argument("--nodes", type=int, default=None, help="number of emulated nodes (default 4)")
    up.add_argument("--port-base", type=int, default=None, help="first TCP port used (default: derived from this checkout's path, 10000-19975)")
    up.add_argument("--timeout", type=float, default=90.0, help="seconds to wait for idle nodes")
    add("down", _down, "stop the daemons `up` started; keep the state directory")
    status = add("status", _status, "show daemons and node states")
    status.add_argument("--json", action="store_true", help="machine-readable output")
    add("env", _env, "print export lines that point SLURM commands at this cluster")


def _cluster(args):
    from sigma.slurm.cluster import LocalCluster

    return LocalCluster(args.state_dir)


def _env_lines(cluster) -> str:
    # The controller config `sigma stack up` writes: `sigma nodes|incidents|explain|report` read it by default.
    env = {**cluster.env, "SIGMA_CONTROLLER_CONFIG": str(cluster.state_dir / "etc" / "controller.yaml")}
    return "\n".join(f"export {k}={shlex.quote(v)}" for k, v in env.items())


def _up(args) -> int:
    from sigma.slurm.cluster import ClusterSpec

    cluster = _cluster(args)
    saved = cluster.load_spec()
    spec = None
    if args.nodes is not None or args.port_base is not None:
        base = saved or ClusterSpec()
        spec = ClusterSpec(nodes=args.nodes or base.nodes, port_base=args.port_base or base.port_base)
    t0 = time.monotonic()
    spec, already = cluster.up(spec, timeout=args.timeout)
    if already:
        print(f"cluster '{spec.name}' is already running with {spec.nodes} nodes (state in {cluster.state_dir})")
    else:
        print(f"cluster '{spec.name}' up with {spec.nodes} nodes in {time.monotonic() - t0:.1f}s "
              f"(state in {cluster.state_dir})")
    print(f"point SLURM commands at it with:\n  eval \"$(sigma cluster env{_state_arg(args)})\"")
    return 0


def _down(args) -> int:
    stopped = _cluster(args).down()
    print(f"stopped: {', '.join(stopped) if stopped else 'nothing was running'}")
    return 0


def _status(args) -> int:
    from sigma.slurm.client import Slurm

    cluster = _cluster(args)
    info = cluster.status()
    nodes = []
    if info["daemons"].get("slurmctld"):
        nodes = [{"name": n.name, "state": n.state, "flags": list(n.flags), "reason": n.reason}
                 for n in Slurm(cluster.conf).nodes()]
    info["nodes"] = nodes
    if args.json:
        print(json.dumps(info, indent=2))
        return 0 if info["configured"] else 1
    if not info["configured"]:
        print(f"no cluster under {info['state_dir']} (run `sigma cluster up`)")
        return 1
    print(f"cluster '{info['name']}' under {info['state_dir']}")
    for daemon, alive in info["daemons"].items():
        print(f"  {daemon:14} {'running' if alive else 'stopped'}")
    if info["metrics"]:
        print(f"  slurmctld OpenMetrics: {info['metrics']}{{jobs,nodes,partitions,scheduler}}")
    for n in nodes:
        flags = f" [{','.join(n['flags'])}]" if n["flags"] else ""
        reason = f"  reason: {n['reason']}" if n["reason"] else ""
        print(f"  {n['name']:14} {n['state']}{flags}{reason}")
    return 0


def _env(args) -> int:
    print(_env_lines(_cluster(args)))
    return 0


def _state_arg(args) -> str:
    return f" --state-dir {shlex.quote(str(args.state_dir))}" if args.state_dir else ""
