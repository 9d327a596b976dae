"""`sigma keys issue|rotate|revoke|list`: per-node ingest keys (see docs/security.md).

The key table (controller side) is edited in place, atomically, mode 0600; the running controller re-reads it
within a second. Each issued or rotated key is also written as <out>/<node>.key (mode 0600): install it as the
node's push.secret_file; the sidecar picks a changed file up by itself (or on SIGHUP).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from sigma.cli import CommandError
from sigma.security.keys import (DEFAULT_GRACE_S, DEFAULT_KEY_DIR, DEFAULT_TABLE, KeyFileError, KeyTable,
                                 node_key_text, write_private)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("keys", help="per-node ingest keys: issue, rotate, revoke, list",
                       description=__doc__.splitlines()[0])
    ks = p.add_subparsers(dest="keys_action", metavar="ACTION", required=True)

    def common(q: argparse.ArgumentParser) -> argparse.ArgumentParser:
        q.add_argument("--table", type=Path, default=Path(DEFAULT_TABLE), help=f"key table (default {DEFAULT_TABLE})")
        return q

    issue = common(ks.add_parser("issue", help="a first key for each node; writes <out>/<node>.key"))
    issue.add_argument("nodes", nargs="+", metavar="NODE", help="node names or SLURM hostlists (gpu[003-005])")
    issue.add_argument("--out", type=Path, default=Path(DEFAULT_KEY_DIR), help=f"where node key files go "
                                                                             f"(default {DEFAULT_KEY_DIR})")
    rotate = common(ks.add_parser("rotate", help="a new key per node; the old one stays valid for --grace seconds"))
    rotate.add_argument("nodes", nargs="+", metavar="NODE", help="node names or SLURM hostlists")
    rotate.add_argument("--out", type=Path, default=Path(DEFAULT_KEY_DIR), help="where node key files go")
    rotate.add_argument("--grace", type=float, default=DEFAULT_GRACE_S,
                        help=f"seconds the old key is still accepted (default {DEFAULT_GRACE_S:.0f})")
    revoke = common(ks.add_parser("revoke", help="remove a key (by id) or every key of a node, at once"))
    revoke.add_argument("names", nargs="+", metavar="NODE_OR_KEY_ID", help="key ids, node names or hostlists")
    listing = common(ks.add_parser("list", help="keys in the table (never their secrets)"))
    listing.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=_run)


def _run(args) -> int:
    try:
        return _act(args)
    except KeyFileError as exc:
        raise CommandError(str(exc)) from None


def nodes_of(names: list[str]) -> list[str]:
    """Node names from names and SLURM hostlists (gpu[003-005] is three nodes), in order, each once."""
    from sigma.slurm.types import expand_hostlist

    try:
        return list(dict.fromkeys(n for name in names for n in expand_hostlist(name)))
    except ValueError as exc:
        raise CommandError(str(exc)) from None


def _act(args) -> int:
    action = args.keys_action
    table = KeyTable(args.table).load(missing_ok=action == "issue")
    now = time.time()
    if action == "list":
        keys = sorted(table.keys, key=lambda k: (k.node, k.created))
        if args.json:
            print(json.dumps([{"id": k.id, "node": k.node, "created": k.created, "expires": k.expires,
                               "active": k.active(now)} for k in keys], indent=2))
            return 0
        print(f"{'key id':24} {'node':16} {'created':20} expires")
        for k in keys:
            expires = "-" if k.expires is None else _ts(k.expires) + ("" if k.active(now) else " (expired)")
            print(f"{k.id:24} {k.node:16} {_ts(k.created):20} {expires}")
        return 0
    if action == "revoke":
        gone = [k for name in nodes_of(args.names) for k in table.revoke(name)]
        table.save()
        print(f"revoked {', '.join(k.id for k in gone)} in {args.table}")
        return 0
    pruned = table.prune(now)
    new = [table.issue(n, now) if action == "issue" else table.rotate(n, args.grace, now) for n in nodes_of(args.nodes)]
    table.save()  # the table first: a node key file the controller does not know yet would be refused
    for key in new:
        write_private(args.out / f"{key.node}.key", node_key_text(key))
        print(f"{key.node}: key {key.id} -> {args.out / (key.node + '.key')}")
    if action == "rotate":
        print(f"old keys accepted until {_ts(now + args.grace)}; install each new key file on its node (the sidecar "
              f"loads it when the file changes)")
    if pruned:
        print(f"dropped expired keys: {', '.join(k.id for k in pruned)}")
    return 0


def _ts(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))
