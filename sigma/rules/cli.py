"""`sigma rules learn|candidates|show|promote|reject|label`: learn rules from confirmed incidents (cron), review
the candidates, promote them into the knowledge base (shadow first, then live), label faults by hand."""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

from sigma.cli import parse_since


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("rules", help="learn failure-signature rules from confirmed incidents; review and promote them",
                       description="Learn rules from the controller's confirmed incidents and admin labels "
                                   "(deterministic, or with an LLM), review candidates, promote them (shadow, "
                                   "then live).")
    rsub = p.add_subparsers(dest="action", metavar="ACTION", required=True)

    def common(q: argparse.ArgumentParser) -> argparse.ArgumentParser:
        q.add_argument("--config", default=os.environ.get("SIGMA_CONTROLLER_CONFIG") or None,
                       help="controller config: its db, rules and breaker (default $SIGMA_CONTROLLER_CONFIG or "
                            "configs/controller.yaml)")
        q.add_argument("--db", default=None, help="controller database (overrides the config's db)")
        q.add_argument("--rules", default=None, help="knowledge-base directory (overrides the config's rules)")
        q.add_argument("--learn-config", default=None, help="learning settings (default configs/learn.yaml)")
        q.add_argument("--json", action="store_true", help="machine-readable output")
        return q

    learn = common(rsub.add_parser("learn", help="learn candidate rules from confirmed incidents (run it from cron)"))
    learn.add_argument("--since", default=None, help="incidents and history since (e.g. 7d, 24h; default: config)")
    learn.add_argument("--incident", type=int, default=None, help="learn from this incident only")
    learn.add_argument("--proposer", choices=("deterministic", "llm"), default=None,
                       help="only this proposer (its failure fails the run); default: the configured ones")
    learn.set_defaults(func=_learn)
    cands = common(rsub.add_parser("candidates", help="list learned candidates and their scores"))
    cands.add_argument("--all", action="store_true", help="also promoted and rejected ones")
    cands.set_defaults(func=_candidates)
    show = common(rsub.add_parser("show", help="a candidate: its rule, provenance, scores, examples right and wrong"))
    show.add_argument("id", help="candidate id (a unique prefix is enough)")
    show.set_defaults(func=_show)
    promote = common(rsub.add_parser("promote", help="put a candidate into the knowledge base (shadow mode first)"))
    promote.add_argument("id", help="candidate id")
    promote.add_argument("--live", action="store_true", help="act on its matches (leave shadow mode)")
    promote.set_defaults(func=_promote)
    reject = common(rsub.add_parser("reject", help="reject a candidate"))
    reject.add_argument("id", help="candidate id")
    reject.add_argument("--reason", default="", help="why (kept in the candidate file)")
    reject.set_defaults(func=_reject)
    label = common(rsub.add_parser("label", help="record an admin verdict: a fault of a cause on a node, or healthy"))
    label.add_argument("--node", required=True, help="the node")
    label.add_argument("--at", default=None, help="fault time: epoch seconds, an ISO time, or ago (90s, 5m)")
    label.add_argument("--incident", type=int, default=None, help="the incident this verdict is about")
    label.add_argument("--cause", default="", help="the fault's cause, in a few words (rules are learned per cause)")
    label.add_argument("--category", default="", help="remediation category of the learned rule (playbooks)")
    label.add_argument("--action", default="", help="action of the learned rule (default: the learn config's)")
    label.add_argument("--healthy", action="store_true", help="the window was healthy (a counter-example)")
    label.set_defaults(func=_label)


# ---------- settings (read as plain YAML: sigma.rules does not depend on the controller package) ----------

def _settings(args) -> dict:
    from sigma.config import load_yaml
    from sigma.paths import config_file, project_root

    path = Path(args.config) if args.config else config_file("controller.yaml")
    data = (load_yaml(path)[0] or {}) if path.exists() else {}
    if args.config and not path.exists():
        from sigma.cli import CommandError

        raise CommandError(f"no controller config at {path}")
    resolve = lambda p: Path(p).expanduser() if Path(p).expanduser().is_absolute() else project_root() / p
    return {"db": Path(args.db) if args.db else resolve(data.get("db", "/var/lib/sigma/controller.db")),
            "rules": Path(args.rules) if args.rules else resolve(data.get("rules", "configs/rules")),
            "breaker": data.get("breaker") or {}}


def _learn_config(args):
    from sigma.paths import config_file
    from sigma.rules.learn.config import LearnConfig, load_learn_config

    path = Path(args.learn_config) if args.learn_config else config_file("learn.yaml")
    return load_learn_config(path) if path.exists() or args.learn_config else LearnConfig()


def _conn(settings: dict, readonly: bool = False):
    from sigma.cli import CommandError
    from sigma.store import connect

    if not settings["db"].exists():
        raise CommandError(f"no controller database at {settings['db']} (use --db or --config)")
    return connect(settings["db"], readonly=readonly)


def _store(args, settings: dict):
    from sigma.rules.learn.store import Candidates

    cfg = _learn_config(args)
    return Candidates(settings["rules"], cfg.candidates_dir or None)


def _errors(fn):
    """Learning failures are user-facing messages, not tracebacks."""
    def wrapped(args):
        from sigma.cli import CommandError
        from sigma.rules.learn import LearnError

        try:
            return fn(args)
        except LearnError as exc:
            raise CommandError(str(exc)) from None
    return wrapped


# ---------- handlers ----------

@_errors
def _learn(args) -> int:
    from sigma.rules.learn.history import known_nodes
    from sigma.rules.learn.run import Breaker, run
    from sigma.rules.loader import load_rules

    settings = _settings(args)
    cfg = _learn_config(args)
    conn = _conn(settings)
    since = parse_since(args.since or cfg.since)
    kb = load_rules(settings["rules"])
    b = settings["breaker"]
    breaker = Breaker(**{k: b[k] for k in ("max_nodes", "max_fraction", "window_s") if k in b})
    total = len(known_nodes(conn, since))
    result = run(conn, cfg, kb, _store(args, settings), since=since, breaker=breaker, total_nodes=max(1, total),
                 incident=args.incident, only=args.proposer)
    if args.json:
        print(json.dumps(result, indent=2, default=str))
        return 0
    for note in result["notes"]:
        print(f"note: {note}")
    for c in result["causes"]:
        print(f"cause {c['cause']!r}: {c['proposed']} proposed, {c['accepted']} accepted in {c['rounds']} round(s), "
              f"{c['wall_s']:.2f}s")
        for m in c["messages"] + c["notes"]:
            print(f"  note: {m}")
        for r in c["rejected"]:
            print(f"  rejected {r['rule']} ({r['proposer']}): {'; '.join(r['reasons'])}")
            for e in r["evidence"]:
                print(f"    evidence: {e['node']} {e['label']} window ending "
                      f"{time.strftime('%m-%d %H:%M:%S', time.localtime(e['end']))}: {e.get('lines', [])[:1]}")
    for path in result["candidates"]:
        print(f"candidate written: {path}")
    if not result["candidates"]:
        print("no candidate accepted; the knowledge base is unchanged")
    return 0


@_errors
def _candidates(args) -> int:
    settings = _settings(args)
    records = _store(args, settings).all()
    if not args.all:
        records = [r for r in records if r["candidate"].get("status") in ("candidate", "shadow")]
    if args.json:
        print(json.dumps(records, indent=2, default=str))
        return 0
    if not records:
        print("no candidates (sigma rules learn writes them)")
        return 0
    from rich.console import Console
    from rich.table import Table

    t = Table(title=f"{len(records)} candidates")
    for col in ("id", "status", "cause", "proposer", "test P/R/F1", "healthy FP", "kind"):
        t.add_column(col)
    for r in records:
        c, test = r["candidate"], r["candidate"].get("scores", {}).get("test", {})
        kind = next((k for k in ("log", "metric", "composite") if k in r["rule"]), "?")
        t.add_row(c["id"], c.get("status", ""), c.get("cause", ""), c.get("proposer", ""),
                  f"{test.get('precision', 0):.2f}/{test.get('recall', 0):.2f}/{test.get('f1', 0):.2f}",
                  f"{test.get('fp', 0)}/{test.get('fp', 0) + test.get('tn', 0)}", kind)
    Console().print(t)
    return 0


@_errors
def _show(args) -> int:
    import yaml

    record = _store(args, _settings(args)).get(args.id)
    print(json.dumps(record, indent=2, default=str) if args.json else yaml.safe_dump(record, sort_keys=False,
                                                                                      width=120))
    return 0


@_errors
def _promote(args) -> int:
    settings = _settings(args)
    record = _store(args, settings).promote(args.id, live=args.live)
    c = record["candidate"]
    if args.json:
        print(json.dumps(record, indent=2, default=str))
    else:
        mode = ("live: it acts on its matches" if args.live else
                "shadow mode: the controller records what it would do; sigma report shows its shadow hits")
        print(f"{c['id']} is in {c['promoted_to']} ({mode}); the controller reloads the knowledge base by itself")
        if not args.live:
            print(f"make it act with: sigma rules promote {c['id']} --live")
    return 0


@_errors
def _reject(args) -> int:
    record = _store(args, _settings(args)).set_status(args.id, "rejected", reason=args.reason)
    print(f"{record['candidate']['id']} rejected")
    return 0


@_errors
def _label(args) -> int:
    from sigma.cli import CommandError
    from sigma.rules.learn.history import add_label

    settings = _settings(args)
    conn = _conn(settings)
    if args.at is None and args.incident is None:
        raise CommandError("label needs --at TIME or --incident ID")
    if args.at is not None:
        ts = parse_since(args.at, option="--at")
    else:
        row = conn.execute("SELECT fault_ts, node FROM incidents WHERE id = ?", (args.incident,)).fetchone()
        if row is None:
            raise CommandError(f"no incident {args.incident}")
        ts = row["fault_ts"]
    verdict = "healthy" if args.healthy else "fault"
    lid = add_label(conn, node=args.node, fault_ts=ts, verdict=verdict, cause=args.cause, category=args.category,
                    action=args.action, incident_id=args.incident,
                    by=os.environ.get("SUDO_USER") or os.environ.get("USER") or "admin")
    print(json.dumps({"label": lid, "node": args.node, "ts": ts, "verdict": verdict}) if args.json else
          f"label {lid}: {args.node} at {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(ts))} is "
          f"{'healthy' if args.healthy else f'a fault: {args.cause}'}")
    return 0


