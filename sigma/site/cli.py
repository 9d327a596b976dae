"""`sigma site init|check`: deploy sigma on a cluster (docs/deploy.md)."""

from __future__ import annotations

import argparse
from pathlib import Path


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("site", help="a cluster's deployment: generate its files, check a host",
                       description="Deploy sigma on a real cluster (docs/deploy.md): `init` writes the site's "
                                   "configs, units, keys and one bundle per node from a few answers; `check` says "
                                   "what this host still lacks.")
    ss = p.add_subparsers(dest="site_action", metavar="ACTION", required=True)
    init = ss.add_parser("init", help="write the site's configs, units, slurm.conf lines, keys and node bundles",
                         description="Write the site's files under --out, laid out as they go onto the hosts: "
                                     "head/ (copy onto the head node), nodes/<node>.tar (unpack on each node), "
                                     "slurm.conf (lines for the site's slurm.conf). Run it again with a longer "
                                     "hostlist to add nodes: their keys are issued, the others' kept.")
    init.add_argument("--controller", required=True, help="host name of the head node the sidecars push to")
    init.add_argument("--nodes", required=True, help="the compute nodes, a SLURM hostlist, e.g. gpu[001-064]")
    init.add_argument("--gpus", type=int, required=True, help="accelerators per node (0: none)")
    init.add_argument("--port", type=int, default=8470, help="the controller's port (default 8470)")
    init.add_argument("--act", action="store_true",
                      help="let the controller act from the start (default: observe mode, the first rollout)")
    init.add_argument("--out", type=Path, default=Path("sigma-site"), help="where to write (default ./sigma-site)")
    init.set_defaults(func=_init)
    chk = ss.add_parser("check", help="what this host lacks: tool, configs, keys, units, kernel log, slurm.conf, "
                                      "controller", description="Check this host's part of the deployment; exit 1 "
                                                                "when something is missing or wrong.")
    chk.add_argument("--role", choices=("head", "node"), default=None,
                     help="default: head where /etc/sigma/controller.yaml exists, else node")
    chk.add_argument("--node", default=None, help="this node's name (default $SLURMD_NODENAME, else the hostname)")
    chk.add_argument("--root", type=Path, default=Path("/"), help="check the files under this root (a node image)")
    chk.set_defaults(func=_check)


def _init(args) -> int:
    from sigma.cli import CommandError
    from sigma.security.keys import KeyFileError
    from sigma.site.generate import Answers, generate

    try:
        answers = Answers(controller=args.controller, nodes=args.nodes, gpus=args.gpus, port=args.port,
                          observe=not args.act)
        done = generate(answers, args.out)
    except (ValueError, KeyError, KeyFileError) as exc:
        raise CommandError(str(exc)) from None
    for line in done:
        print(line)
    print(f"next: docs/deploy.md, from 'Head node' on (cp -a {args.out}/head/. / on {args.controller}; "
          f"tar -xpf {args.out}/nodes/NODE.tar -C / on each node)")
    return 0


def _check(args) -> int:
    from sigma.site.check import Host, check, role

    host = Host(args.root)
    which = args.role or role(host)
    findings = check(host, which, args.node)
    width = max(len(f.what) for f in findings)
    for f in findings:
        print(f"{f.status:<8} {f.what:<{width}}  {f.detail}")
    failed = [f for f in findings if f.failed]
    print(f"{which}: " + (f"{len(failed)} thing(s) to do" if failed else "ready"))
    return 1 if failed else 0
