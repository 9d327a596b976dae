"""`sigma controller run|rules`, `sigma nodes`, `sigma incidents`, `sigma explain`, `sigma report`."""

from __future__ import annotations

import argparse
import json
import os
import re
import time
from pathlib import Path

DEFAULT_CONFIG = os.environ.get("SIGMA_CONTROLLER_CONFIG", "")


def register(sub: argparse._SubParsersAction) -> None:
    def common(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
        p.add_argument("--config", default=DEFAULT_CONFIG or None,
                       help="controller config (default $SIGMA_CONTROLLER_CONFIG or configs/controller.yaml)")
        p.add_argument("--db", default=None, help="controller database (overrides the config's db)")
        return p

    ctl = sub.add_parser("controller", help="run the controller daemon; inspect its knowledge base",
                         description="Detect faults, drain and requeue, remediate and revalidate nodes.")
    csub = ctl.add_subparsers(dest="action", metavar="ACTION", required=True)
    run = common(csub.add_parser("run", help="run the controller (ingest + detection + remediation + /metrics)"))
    run.add_argument("--once", action="store_true", help="one tick, then exit (no HTTP server)")
    run.set_defaults(func=_run)
    rules = common(csub.add_parser("rules", help="load and list the failure-signature rules (validates them)"))
    rules.add_argument("--rules", default=None, help="rules directory or file (default: the config's)")
    rules.set_defaults(func=_rules)

    nodes = common(sub.add_parser("nodes", help="nodes the controller manages and their remediation state"))
    nodes.add_argument("--repaired", metavar="NODE", help="mark NODE repaired (manual / ticket playbooks)")
    nodes.add_argument("--json", action="store_true", help="machine-readable output")
    nodes.set_defaults(func=_nodes)

    inc = common(sub.add_parser("incidents", help="incidents: what was detected and what was done"))
    inc.add_argument("--node", help="only this node")
    inc.add_argument("--job", type=int, help="only this job")
    inc.add_argument("--open", action="store_true", help="only open incidents")
    inc.add_argument("--since", help="only since (e.g. 2h, 30m, 2026-11-21T10:00)")
    inc.add_argument("--json", action="store_true", help="machine-readable output")
    inc.set_defaults(func=_incidents)

    explain = common(sub.add_parser("explain", help="why an incident happened and every action it caused"))
    explain.add_argument("incident", type=int, help="incident id (see sigma incidents)")
    explain.add_argument("--json", action="store_true", help="machine-readable output")
    explain.set_defaults(func=_explain)

    rep = common(sub.add_parser("report", help="utilisation, MTBF, recovery and recycling times, automation"))
    rep.add_argument("--since", help="window start (e.g. 24h, 7d, 2026-11-21T10:00; default: all data)")
    rep.add_argument("--json", action="store_true", help="machine-readable output")
    rep.set_defaults(func=_report)


# ---------- helpers ----------

def _config(args):
    from sigma.controller.config import ControllerConfig, load_controller_config
    from sigma.paths import configs_dir

    path = args.config or configs_dir() / "controller.yaml"
    cfg = load_controller_config(path) if Path(path).exists() or args.config else ControllerConfig()
    if args.db:
        cfg.db = args.db
    return cfg


def _conn(args, readonly: bool = True):
    from sigma.cli import CommandError
    from sigma.controller.db import open_db

    cfg = _config(args)
    if readonly and not Path(cfg.db).exists():
        raise CommandError(f"no controller database at {cfg.db} (use --db or --config)")
    return open_db(cfg.db, readonly=readonly)


def parse_since(text: str | None, now: float | None = None) -> float | None:
    """'90s', '30m', '2h', '7d' ago, or an ISO date/time."""
    from sigma.cli import CommandError

    if not text:
        return None
    now = now or time.time()
    m = re.fullmatch(r"(\d+(?:\.\d+)?)([smhd])", text.strip())
    if m:
        return now - float(m.group(1)) * {"s": 1, "m": 60, "h": 3600, "d": 86400}[m.group(2)]
    for fmt in ("%Y-%m-%dT%H:%M:%S", "%Y-%m-%dT%H:%M", "%Y-%m-%d"):
        try:
            return time.mktime(time.strptime(text, fmt))
        except ValueError:
            continue
    raise CommandError(f"--since {text!r}: use e.g. 30m, 2h, 7d or 2026-11-21T10:00")


def _ts(t: float | None) -> str:
    return time.strftime("%m-%d %H:%M:%S", time.localtime(t)) if t else "-"


def _console():
    from rich.console import Console

    return Console()


# ---------- handlers ----------

def _run(args) -> int:
    from sigma.controller.daemon import run

    return run(_config(args), once=args.once)


def _rules(args) -> int:
    from rich.table import Table

    from sigma.controller.config import resolve
    from sigma.rules.loader import load_rules

    cfg = _config(args)
    rules = load_rules(resolve(args.rules or cfg.rules))
    table = Table(title=f"{len(rules)} rules")
    for col in ("id", "v", "scope", "match", "severity", "action", "description"):
        table.add_column(col)
    for r in rules:
        shadow = " (shadow)" if r.shadow or r.id in cfg.shadow_rules else ""
        table.add_row(r.id, str(r.version), r.scope, r.match_kind, r.severity, r.action + shadow, r.description)
    _console().print(table)
    return 0


def _nodes(args) -> int:
    from rich.table import Table

    from sigma.controller.config import load_remediation_config, resolve
    from sigma.controller.act.decisionlog import DecisionLog
    from sigma.controller.act.incidents import Incidents
    from sigma.controller.act.journal import Journal
    from sigma.controller.act.remediation import Remediator

    if args.repaired:
        from sigma.cli import CommandError

        conn = _conn(args, readonly=False)
        cfg = _config(args)
        rem = Remediator(conn, Journal(conn, lambda *a: ""), Incidents(conn), load_remediation_config(
            resolve(cfg.remediation)), DecisionLog(None), slurm=None)
        try:
            rem.mark_repaired(args.repaired, by=os.environ.get("SUDO_USER") or os.environ.get("USER") or "admin")
        except ValueError as exc:
            raise CommandError(str(exc)) from None
        print(f"{args.repaired} marked repaired; the controller validates it next")
        return 0
    conn = _conn(args)
    rows = [dict(r) for r in conn.execute("SELECT * FROM node_lifecycle ORDER BY node")]
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    table = Table(title="nodes managed by the controller")
    for col in ("node", "state", "since", "cycle", "failures", "rule", "playbook", "incident"):
        table.add_column(col)
    for r in rows:
        table.add_row(r["node"], r["state"], _ts(r["entered_at"]), str(r["cycle"]), str(r["failures"]),
                      r["rule_id"], r["playbook"], str(r["incident_id"] or ""))
    _console().print(table if rows else "no node has been taken out of service")
    return 0


def _incidents(args) -> int:
    from rich.table import Table

    from sigma.controller.act.incidents import Incidents

    conn = _conn(args)
    found = Incidents(conn).query(node=args.node, job_id=args.job, since=parse_since(args.since),
                                  open_only=args.open)
    if args.json:
        print(json.dumps([{**i.__dict__} for i in found], indent=2, default=str))
        return 0
    table = Table(title=f"{len(found)} incidents")
    for col in ("id", "opened", "rule", "target", "severity", "action", "status", "summary"):
        table.add_column(col)
    for i in found:
        target = i.node or ""
        if i.job_id:
            target += f"{' ' if target else ''}job {i.job_id}"
        table.add_row(str(i.id), _ts(i.opened_at), i.rule_id, target, i.severity, i.action, i.status,
                      (i.status_note or i.summary)[:80])
    _console().print(table)
    return 0


def _explain(args) -> int:
    from rich.table import Table

    from sigma.cli import CommandError
    from sigma.controller.act.incidents import Incidents

    conn = _conn(args)
    inc = Incidents(conn).get(args.incident)
    if inc is None:
        raise CommandError(f"no incident {args.incident}")
    acts = [dict(r) for r in conn.execute("SELECT * FROM actions WHERE incident_id = ? ORDER BY id", (inc.id,))]
    moves = [dict(r) for r in conn.execute("SELECT * FROM lifecycle_transitions WHERE incident_id = ? ORDER BY id",
                                           (inc.id,))]
    if args.json:
        print(json.dumps({"incident": inc.__dict__, "actions": acts, "lifecycle": moves}, indent=2, default=str))
        return 0
    c = _console()
    target = " ".join(x for x in (inc.node or "", f"job {inc.job_id}" if inc.job_id else "") if x)
    c.print(f"[bold]incident {inc.id}[/bold]: {inc.rule_id} (v{inc.rule_version}, {inc.source}) on {target}")
    c.print(f"  {inc.summary}")
    c.print(f"  severity {inc.severity}, action {inc.action}, status [bold]{inc.status}[/bold] {inc.status_note}")
    c.print(f"  fault at {_ts(inc.fault_ts)}, detected {_ts(inc.opened_at)} "
            f"({inc.opened_at - inc.fault_ts:.1f}s later)")
    ev = inc.evidence
    if ev.get("events"):
        c.print("  evidence (events):")
        for e in ev["events"][-5:]:
            c.print(f"    {_ts(e.get('ts'))} {e.get('node')} {e.get('source')}/{e.get('kind')}: {e.get('message')}")
    if ev.get("isolation"):
        iso = ev["isolation"]
        c.print(f"  isolation: {iso.get('reason')}; ranked: "
                + ", ".join(f"{n}={s}" for n, s in iso.get("ranked", [])))
    for key in ("series", "kpis", "laggards", "condition", "value", "verification", "jobs", "conditions"):
        if key in ev:
            c.print(f"  {key}: {json.dumps(ev[key], default=str)[:300]}")
    if acts:
        table = Table(title="actions (journal)")
        for col in ("planned", "kind", "target", "state", "result"):
            table.add_column(col)
        for a in acts:
            table.add_row(_ts(a["created_at"]), a["kind"], a["target"], a["state"], a["result"][:80])
        c.print(table)
    if moves:
        table = Table(title="node lifecycle")
        for col in ("at", "from", "to", "note"):
            table.add_column(col)
        for m in moves:
            table.add_row(_ts(m["ts"]), m["from_state"] or "", m["to_state"], m["note"][:80])
        c.print(table)
    return 0


def _report(args) -> int:
    from rich.table import Table

    from sigma.controller.report.metrics import report

    rep = report(_conn(args), since=parse_since(args.since))
    if args.json:
        print(json.dumps(rep, indent=2, default=str))
        return 0
    c = _console()
    u = rep["utilisation"]
    t = Table(title=f"utilisation {_ts(rep['since'])} .. {_ts(rep['until'])}")
    for col in ("available", "allocated", "effective", "node-hours"):
        t.add_column(col, justify="right")
    pct = lambda k: f"{100 * u[k]:.1f}%" if k in u else "-"
    t.add_row(pct("available"), pct("allocated"), pct("effective"), f"{u.get('node_seconds', 0) / 3600:.2f}")
    c.print(t)
    j = rep["jobs"]
    t = Table(title="jobs")
    for col in ("interruptions", "MTBF", "time to failure (median)", "recovery (median)", "after decision (median)"):
        t.add_column(col, justify="right")
    sec = lambda d: f"{d['median']:.1f}s" if d.get("count") else "-"
    t.add_row(str(j["interruptions"]), f"{j['mtbf_s']:.0f}s" if j["mtbf_s"] else "-", sec(j["time_to_failure_s"]),
              sec(j["recovery_s"]), sec(j["recovery_after_decision_s"]))
    c.print(t)
    r = rep["recycling"]
    t = Table(title="node recycling (mean seconds)")
    for col in ("cycles", "detect", "triage", "repair", "validate", "total"):
        t.add_column(col, justify="right")
    mean = lambda d: f"{d['mean']:.1f}" if d.get("count") else "-"
    t.add_row(str(len(r["cycles"])), mean(r["detect_s"]), mean(r["triage_s"]), mean(r["repair_s"]),
              mean(r["validate_s"]), mean(r["total_s"]))
    c.print(t)
    a = rep["automation"]
    c.print(f"automation ratio: {a['ratio'] if a['ratio'] is not None else '-'} "
            f"({a['automatic']} automatic, {a['manual']} needed a person)")
    for h in rep["shadow_hits"]:
        c.print(f"shadow hits: {h['rule']} would have acted on {', '.join(h['targets'])} ({h['hits']} hits, "
                f"last {_ts(h['last'])})", soft_wrap=True)
    t = Table(title="incidents")
    for col in ("rule", "status", "count", "detect latency"):
        t.add_column(col)
    for i in rep["incidents"]:
        t.add_row(i["rule"], i["status"], str(i["count"]),
                  f"{i['detect_latency_s']:.1f}s" if i["detect_latency_s"] is not None else "-")
    c.print(t)
    return 0
