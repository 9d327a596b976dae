"""`sigma chaos KIND --node NODE ...`, `sigma chaos list`, `sigma chaos undo ID|--all`."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from sigma.chaos.inject import KINDS, SIGNATURES


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("chaos", help="inject a fault at its source on a local-cluster node (and undo it)",
                       description="Inject faults where they really arise: a kernel-log line, stopped or slowed "
                                   "job processes, a killed slurmd, a NaN loss, and throughput noise (a CPU hog, page-cache "
                                   "reclaim, an I/O stall, GC pressure). Every injection is journaled.")
    p.add_argument("kind", choices=KINDS + ("list", "undo"), help="what to inject, or list / undo")
    p.add_argument("target", nargs="?", help="with undo: the injection id")
    p.add_argument("--node", help="emulated node to hit (e.g. node3)")
    p.add_argument("--job", type=int, default=None, help="only this job's processes (every kind but log and node-death)")
    p.add_argument("--xid", type=int, default=None, help="log: an NVIDIA Xid code (79, 48, 74, ...)")
    p.add_argument("--signature", choices=sorted(SIGNATURES), default=None, help="log: a named signature")
    p.add_argument("--line", default=None, help="log: this text as the kernel message (a new signature)")
    p.add_argument("--percent", type=float, default=50.0,
                   help="straggler: share of time the ranks are stopped; cpu-hog: share of time the hog is busy")
    p.add_argument("--period", type=float, default=1.0,
                   help="straggler, cpu-hog: duty-cycle period; page-cache, io-stall: seconds between evictions")
    p.add_argument("--workers", type=int, default=1, help="cpu-hog: busy processes to start")
    p.add_argument("--size-mb", type=int, default=256, help="page-cache: filler file size; io-stall: MiB per pass")
    p.add_argument("--objects", type=int, default=20000, help="gc-pressure: objects the trainer churns per step")
    p.add_argument("--all", action="store_true", help="undo: every injection not yet undone")
    p.add_argument("--force", action="store_true",
                   help="inject even when no sidecar or controller watches the node (nothing will react)")
    p.add_argument("--json", action="store_true", help="print the journal record (list: the journal) as JSON")
    p.add_argument("--state-dir", type=Path, default=None, help="cluster state directory")
    p.set_defaults(func=_run)


def _run(args) -> int:
    from dataclasses import asdict

    from sigma.chaos.inject import Chaos, ChaosError
    from sigma.cli import CommandError
    from sigma.slurm.cluster import LocalCluster

    chaos = Chaos(LocalCluster(args.state_dir))
    try:
        if args.kind == "list":
            records = chaos.injections()
            states = injection_states(chaos.cluster, records)
            if args.json:
                print(json.dumps([{**asdict(r), "state": states[r.id]} for r in records], indent=2))
            for r in records if not args.json else ():
                print(f"{r.id}  {time.strftime('%H:%M:%S', time.localtime(r.ts))}  {r.kind:10} {r.node:8} "
                      f"job={r.job_id or '-'}  {states[r.id]}  {_summary(r)}")
            return 0
        if args.kind == "undo":
            if args.all:
                targets = [r.id for r in chaos.injections() if r.undone_ts is None]
            elif args.target:
                targets = [args.target]
            else:
                raise CommandError("undo needs an injection id or --all")
            for t in targets:
                print(f"undone {chaos.undo(t).id}")
            return 0
        if not args.node:
            raise CommandError(f"{args.kind} needs --node")
        if args.node in chaos.cluster.node_names() and not args.force:
            missing = unwatched(chaos.cluster, args.node)
            if missing:
                raise CommandError(f"nothing would notice: {' and '.join(missing)} not running; start the platform "
                                   f"with `sigma stack up`, or inject anyway with --force")
        inj = chaos.inject(args.kind, args.node, job_id=args.job, xid=args.xid, signature=args.signature,
                           percent=args.percent, period_s=args.period, line=args.line, workers=args.workers,
                           size_mb=args.size_mb, objects=args.objects)
    except ChaosError as exc:
        raise CommandError(str(exc)) from None
    print(json.dumps(asdict(inj)) if args.json else f"injected {inj.kind} on {inj.node} as {inj.id} "
          f"({_summary(inj)}); undo with: sigma chaos undo {inj.id}")
    return 0


def unwatched(cluster, node: str) -> list[str]:
    """What of the platform that reacts to a fault on node is not running (its sidecar, the controller)."""
    from sigma.stack import Stack

    alive = Stack(cluster).status()
    return [f"{'the ' if name == 'controller' else ''}{name}" for name in ("controller", f"sidecar-{node}")
            if not alive.get(name)]


def injection_states(cluster, records) -> dict[str, str]:
    """undone, or what the platform made of it so far (from the local stack's controller database): a fault
    whose node is back in service is handled, not active, even while its log line stays in kern.log."""
    from sigma.chaos.timeline import observe
    from sigma.stack import Stack

    db_path = Stack(cluster).db
    conn = None
    if db_path.exists():
        from sigma.controller.db import open_db

        conn = open_db(db_path, readonly=True)
    states = {}
    for r in records:
        if r.undone_ts:
            states[r.id] = "undone"
            continue
        t = observe(conn, r.node, r.job_id, r.ts) if conn is not None else None
        if t is not None and t.node_back_ts:
            states[r.id] = f"handled (incident {t.incident_id}; {t.node} back in service)"
        elif t is not None and t.detected_ts:
            states[r.id] = f"active, detected (incident {t.incident_id})"
        else:
            states[r.id] = "active"
    return states


def _summary(r) -> str:
    if r.kind == "log":
        if r.params.get("xid") is not None:
            return f"xid {r.params['xid']}"
        return r.params.get("signature") or repr(r.params.get("text") or "")
    if r.kind == "straggler":
        return f"{r.params['percent']:.0f}% stopped, pids {r.params['pids']}"
    if r.kind == "hang":
        return f"pids {r.params['pids']}"
    if r.kind == "cpu-hog":
        return f"{r.params['workers']} process(es) busy {r.params['percent']:.0f}% of the time on CPUs {r.params['cpus']}"
    if r.kind in ("page-cache", "io-stall"):
        return f"{r.params['size_mb']} MiB, evicting every {r.params['period_s']}s"
    if r.kind == "gc-pressure":
        return f"{r.params['objects']} objects per step"
    return ""
