"""`sigma controller run|rules`, `sigma nodes`, `sigma incidents`, `sigma explain`, `sigma report`, `sigma noise`, `sigma jobs`."""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

from sigma.cli import parse_since
from sigma.paths import ETC
from sigma.store import is_url

SITE_CONFIG = ETC / "controller.yaml"  # where a real cluster's admin installs the controller config


def register(sub: argparse._SubParsersAction) -> None:
    def common(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
        p.add_argument("--config", default=None,
                       help="controller config (default: $SIGMA_CONTROLLER_CONFIG, else this checkout's local "
                            f"stack, else {SITE_CONFIG}, else the shipped one)")
        p.add_argument("--db", default=None, help="controller database (overrides the config's db)")
        return p

    ctl = sub.add_parser("controller", help="run the controller daemon; inspect its knowledge base",
                         description="Detect faults, drain and requeue, remediate and revalidate nodes.")
    csub = ctl.add_subparsers(dest="action", metavar="ACTION", required=True)
    run = common(csub.add_parser("run", help="run the controller (ingest + detection + remediation + /metrics)"))
    run.add_argument("--once", action="store_true", help="one tick, then exit (no HTTP server)")
    run.set_defaults(func=_run)
    rules = common(csub.add_parser(
        "rules", help="load and list the failure-signature rules (validates them)",
        description="Every rule with its effective action and where that action comes from: the shipped rule file "
                    "or the site's override (rule_overrides, default /etc/sigma/rules.d)."))
    rules.add_argument("--rules", default=None, help="rules directory or file (default: the config's)")
    rules.add_argument("--overrides", default=None, help="site overrides directory or file (default: the config's "
                                                         "rule_overrides)")
    rules.add_argument("--check", action="store_true",
                       help="only validate (the rules, the playbooks, and rule ids the policy or playbooks name): "
                            "report every problem, exit 1 on any (or on an empty knowledge base)")
    rules.add_argument("--json", action="store_true", help="machine-readable output")
    rules.set_defaults(func=_rules)

    nodes = common(sub.add_parser(
        "nodes", help="nodes the controller manages and their remediation state",
        description="Every node the controller took out of service and where it is in remediation (drained, "
                    "rebooting, validating, waiting for a person, resumed); --repaired tells it a person fixed one."))
    nodes.add_argument("--repaired", metavar="NODE", help="mark NODE repaired (manual / ticket playbooks)")
    nodes.add_argument("--json", action="store_true", help="machine-readable output")
    nodes.set_defaults(func=_nodes)

    inc = common(sub.add_parser(
        "incidents", help="incidents: what was detected and what was done",
        description="One row per incident: the rule or detector that fired, the node or job, what the controller "
                    "did (drain, requeue, notify, shadow) and its status. `sigma explain ID` has the evidence."))
    inc.add_argument("--node", help="only this node")
    inc.add_argument("--job", type=int, help="only this job")
    inc.add_argument("--open", action="store_true", help="only open incidents")
    inc.add_argument("--since", help="only since (e.g. 2h, 30m, 2026-11-21T10:00)")
    inc.add_argument("--json", action="store_true", help="machine-readable output")
    inc.set_defaults(func=_incidents)

    explain = common(sub.add_parser(
        "explain", help="why an incident happened and every action it caused",
        description="The whole story of one incident: its evidence (log lines, KPIs, isolation scores, the culprit "
                    "rank or host a job's line names), the full drain reason, every journaled action and the node's "
                    "remediation steps, with times, and the lines on that node that read like faults but were not "
                    "acted on because their writer was not established. --node NODE shows those lines for a node "
                    "without an incident (why was this line not acted on?)."))
    explain.add_argument("incident", type=int, nargs="?", help="incident id (see sigma incidents)")
    explain.add_argument("--node", help="without an incident: the node's log lines that were not acted on")
    explain.add_argument("--since", help="with --node: since (default 24h)")
    explain.add_argument("--json", action="store_true", help="machine-readable output")
    explain.set_defaults(func=_explain)

    jobs = common(sub.add_parser(
        "jobs", help="whether the platform watches each job: its ranks' KPIs and heartbeats, refused lines",
        description="Per job: which ranks' steps and heartbeats reach the controller and when the last came, the "
                    "trainer and whether it answers just-in-time checkpoint requests, the KPI lines the sidecars "
                    "refused and why (timestamp units, file name, owner, ...), and the checkpoint requests made."))
    jobs.add_argument("--job", type=int, help="only this job")
    jobs.add_argument("--since", default="24h", help="look back this far (default 24h)")
    jobs.add_argument("--json", action="store_true", help="machine-readable output")
    jobs.set_defaults(func=_jobs)

    noise = common(sub.add_parser(
        "noise", help="why a job's step times jitter: the likely local cause per rank",
        description="Throughput stability of a job (min/peak, mean/peak, std of step throughput) and, per rank, the "
                    "likely local cause of its slow steps: page-cache reclaim, GC pauses, CPU contention from other "
                    "processes, I/O stalls, throttling; from the ranks' KPI counters and their nodes' telemetry."))
    noise.add_argument("--job", type=int, required=True, help="SLURM job id")
    noise.add_argument("--since", help="only steps since (e.g. 30m, 2026-11-21T10:00; default: the whole job)")
    noise.add_argument("--json", action="store_true", help="machine-readable output")
    noise.set_defaults(func=_noise)

    rep = common(sub.add_parser(
        "report", help="utilisation, MTBF, recovery and recycling times, automation",
        description="The figures that matter over a window: utilisation, job interruptions and recovery time, "
                    "node recycle time (detect, triage, repair, validate), automation ratio, incidents per rule. "
                    "--html FILE writes them as one self-contained page with plots."))
    rep.add_argument("--since", help="window start (e.g. 24h, 7d, 2026-11-21T10:00; default: all data)")
    rep.add_argument("--json", action="store_true", help="machine-readable output")
    rep.add_argument("--html", metavar="FILE", help="write a self-contained HTML page with plots to FILE")
    rep.set_defaults(func=_report)


# ---------- helpers ----------

def config_path(explicit: str | None = None) -> Path:
    """The controller config a command reads: --config, $SIGMA_CONTROLLER_CONFIG, the config `sigma stack up`
    recorded in this checkout's local cluster state directory, the site's /etc/sigma, else the packaged one."""
    from sigma.paths import configs_dir, default_cluster_dir

    for candidate in (explicit, os.environ.get("SIGMA_CONTROLLER_CONFIG")):
        if candidate:
            return Path(candidate)
    local = default_cluster_dir() / "etc" / "controller.yaml"
    for candidate in (local, SITE_CONFIG):
        if candidate.exists():
            return candidate
    return configs_dir() / "controller.yaml"


def _config(args):
    from sigma.cli import CommandError
    from sigma.controller.config import load_controller_config

    path = config_path(args.config)
    if not path.exists():
        raise CommandError(f"no controller config at {path}; start the local platform with `sigma stack up` "
                           f"(or `make demo`), or pass --config")
    cfg = load_controller_config(path)
    cfg.source = path
    if args.db:
        cfg.db = args.db
    return cfg


def _conn(args, readonly: bool = True):
    from sigma.cli import CommandError
    from sigma.controller.db import open_db

    cfg = _config(args)
    if readonly and not is_url(cfg.db) and not Path(cfg.db).exists():
        raise CommandError(f"no controller database at {cfg.db} (from {cfg.source}): the controller has not run "
                           f"yet; start it with `sigma stack up` (local cluster) or `sigma controller run`, "
                           f"or pass --config / --db")
    return open_db(cfg.db, readonly=readonly)


def _ts(t: float | None) -> str:
    return time.strftime("%m-%d %H:%M:%S", time.localtime(t)) if t else "-"


def _console():
    from sigma.cli import console

    return console()


# ---------- handlers ----------

def _run(args) -> int:
    from sigma.controller.daemon import run

    path = config_path(args.config)  # the file SIGHUP re-reads: the one the other commands read too
    return run(_config(args), once=args.once, config_path=str(path) if path.exists() else None)


def _rules(args) -> int:
    from rich.table import Table

    from sigma.config import ConfigError
    from sigma.controller.config import resolve
    from sigma.rules.loader import load_rules

    cfg = _config(args)
    location = resolve(args.rules or cfg.rules)
    overrides = args.overrides if args.overrides is not None else cfg.rule_overrides
    overrides = resolve(overrides) if overrides else None
    if args.check:
        errors: list[ConfigError] = []
        try:
            rules = load_rules(location, errors, overrides=overrides)
        except ConfigError as exc:  # no files at all: nothing else to report
            rules, errors = [], [exc]
        if rules:  # the policy's and the playbooks' references to rule ids
            from sigma.controller.config import load_remediation_config, unknown_rule_ids

            try:
                rcfg = load_remediation_config(resolve(cfg.remediation))
                errors += unknown_rule_ids(cfg, rcfg, {r.id for r in rules}, config_path(args.config))
            except ConfigError as exc:
                errors.append(exc)
        for exc in errors:
            print(f"error: {exc}")
        print(f"{location}: {len(rules)} valid rules, {len(errors)} problem(s)")
        return 1 if errors else 0
    rules = load_rules(location, overrides=overrides)
    disabled = _disabled_rules(cfg.db)
    rows = []
    for r in rules:
        off = disabled.get(r.id)
        status = (f"disabled at run time: {off['error']}" if off and off.get("version") == r.version
                  else "disabled" if not r.enabled else "ok")
        rows.append({"id": r.id, "version": r.version, "scope": r.scope, "match": r.match_kind,
                     "severity": r.severity, "action": r.action, "acts": cfg.rule_acts(r.id, r.shadow),
                     "action_from": f"override {r.overridden}" if r.overridden else r.origin.split(" [")[0],
                     "shipped_action": r.shipped_action or r.action, "description": r.description, "status": status})
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    n_over = sum(1 for r in rules if r.overridden)
    table = Table(title=f"{len(rules)} rules" + (f", {n_over} with the site's action" if n_over else "")
                  + f"; controller in {cfg.mode_line()}")
    for col in ("id", "v", "scope", "match", "severity", "action", "action from", "description", "status"):
        table.add_column(col)
    for row in rows:
        action = row["action"] + ("" if row["acts"] or row["action"] in ("record", "notify") else " (observe)")
        if row["shipped_action"] != row["action"]:
            action += f" (shipped: {row['shipped_action']})"
        table.add_row(row["id"], str(row["version"]), row["scope"], row["match"], row["severity"], action,
                      row["action_from"], row["description"], row["status"])
    _console().print(table)
    return 0


def _disabled_rules(db: str) -> dict:
    """Rules the running controller disabled because they raised (kept in its database for this listing)."""
    from sigma.controller.db import open_db

    if not is_url(db) and not Path(db).exists():
        return {}
    conn = open_db(db, readonly=True)
    try:
        row = conn.execute("SELECT value FROM detector_state WHERE key = 'disabled_rules'").fetchone()
    except Exception:  # a database from before this table: nothing disabled
        return {}
    finally:
        conn.close()
    return json.loads(row[0]) if row else {}


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
    from sigma.controller.report.detection import describe, kernel_logs

    cfg = _config(args)
    conn = _conn(args)
    lifecycle = {r["node"]: dict(r) for r in conn.execute("SELECT * FROM node_lifecycle ORDER BY node")}
    kernel = kernel_logs(conn)
    rows = [{**lifecycle.get(node, {"node": node, "state": "in service"}), "kernel_log": kernel.get(node),
             "detection": "degraded" if node in kernel and not kernel[node]["ok"] else
             "ok" if node in kernel else "unknown"} for node in sorted(set(lifecycle) | set(kernel))]
    if args.json:
        print(json.dumps({"mode": cfg.mode, "act_rules": cfg.act_rules, "shadow_rules": cfg.shadow_rules,
                          "nodes": rows}, indent=2))
        return 0
    table = Table(title=f"nodes: controller in {cfg.mode_line()}")
    for col in ("node", "state", "since", "cycle", "failures", "rule", "playbook", "incident", "detection"):
        table.add_column(col)
    for r in rows:
        out = r["state"] != "in service"
        table.add_row(r["node"], r["state"], _ts(r["entered_at"]) if out else "", str(r["cycle"]) if out else "",
                      str(r["failures"]) if out else "", r.get("rule_id", ""), r.get("playbook", ""),
                      str(r.get("incident_id") or ""), describe(r["kernel_log"]))
    c = _console()
    c.print(table if rows else f"controller in {cfg.mode_line()}\nno node has reported or been taken out of service")
    degraded = [r["node"] for r in rows if r["detection"] == "degraded"]
    if degraded:
        c.print(f"[bold red]kernel-log fault detection is OFF on {', '.join(degraded)}[/]: their sidecars can read "
                f"no kernel log (docs/telemetry.md, Kernel log)")
    return 0


def _incidents(args) -> int:
    from rich.table import Table

    from sigma.controller.act.incidents import Incidents

    conn = _conn(args)
    found = Incidents(conn).query(node=args.node, job_id=args.job, since=parse_since(args.since),
                                  open_only=args.open)
    if not found and args.node:
        _check_known_node(conn, args.node)
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
                      i.status_note or i.summary)
    _console().print(table)
    return 0


def _check_known_node(conn, node: str) -> None:
    """A node the controller has never seen is a typo, not a node without incidents."""
    from sigma.cli import CommandError

    known = {r[0] for r in conn.execute(
        "SELECT DISTINCT node FROM node_snapshots WHERE ts >= (SELECT MAX(ts) - 600 FROM node_snapshots) "
        "UNION SELECT node FROM node_lifecycle")}
    if known and node not in known:
        raise CommandError(f"no node {node!r} known to the controller; its nodes: {', '.join(sorted(known))}")


def _explain(args) -> int:
    from rich.table import Table

    from sigma.cli import CommandError
    from sigma.controller.act.incidents import Incidents
    from sigma.slurm.client import sigma_reason

    if (args.incident is None) == (args.node is None):
        raise CommandError("give an incident id, or --node NODE for the lines a node did not act on")
    conn = _conn(args)
    if args.incident is None:
        return _explain_node(conn, args)
    inc = Incidents(conn).get(args.incident)
    if inc is None:
        raise CommandError(f"no incident {args.incident}")
    acts = [dict(r) for r in conn.execute("SELECT * FROM actions WHERE incident_id = ? ORDER BY id", (inc.id,))]
    moves = [dict(r) for r in conn.execute("SELECT * FROM lifecycle_transitions WHERE incident_id = ? ORDER BY id",
                                           (inc.id,))]
    costs = [dict(r) for r in conn.execute("SELECT * FROM job_losses WHERE incident_id = ?", (inc.id,))]
    unattributed = _unattributed(conn, inc.node, inc.fault_ts - 3600.0, max(inc.updated_at, inc.opened_at) + 600.0) \
        if inc.node else []
    if args.json:
        print(json.dumps({"incident": inc.__dict__, "actions": acts, "lifecycle": moves, "job_losses": costs,
                          "unattributed": unattributed}, indent=2, default=str))
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
            c.print(f"    {_ts(e.get('ts'))} {e.get('node')} {e.get('source')}/{e.get('kind')}: {e.get('message')}",
                    markup=False, highlight=False)  # log text: its brackets are not rich markup
            culprit = _culprit(e.get("fields") or {})
            if culprit:
                c.print(f"      named in the line: {culprit}", markup=False, highlight=False)
    if ev.get("isolation"):
        iso = ev["isolation"]
        c.print(f"  isolation: {iso.get('reason')}; ranked: "
                + ", ".join(f"{n}={s}" for n, s in iso.get("ranked", [])))
    for a in acts:
        if a["kind"] == "drain" and json.loads(a["params"] or "{}").get("reason"):
            c.print(f"  drain reason (`sinfo -R` shows its first 20 characters): "
                    f"{sigma_reason(json.loads(a['params'])['reason'])}", highlight=False)
    for key in ("series", "kpis", "laggards", "condition", "value", "verification", "jobs", "conditions"):
        if key in ev:
            c.print(f"  {key}: {json.dumps(ev[key], default=str)[:300]}")
    for cost in costs:  # what the requeue cost the job, and which checkpoint it resumed from (report/losses.py)
        c.print(f"  job {cost['job_id']}: {cost['steps_lost']} step(s) lost (reached {cost['step_reached']}, resumed "
                f"from a {cost['source']} checkpoint of step {cost['resume_step']}), back after "
                f"{cost['time_lost_s']:.1f}s", highlight=False)
    if inc.job_id and inc.category in ("performance", "isolation", "noise"):
        _explain_noise(conn, inc, c)
    if unattributed:
        _print_unattributed(c, unattributed, f"on {inc.node} around the incident")
    if acts:
        table = Table(title="actions (journal)")
        for col in ("planned", "kind", "target", "state", "result"):
            table.add_column(col)
        for a in acts:
            table.add_row(_ts(a["created_at"]), a["kind"], a["target"], a["state"], a["result"])
        c.print(table)
    if moves:
        table = Table(title="node lifecycle")
        for col in ("at", "from", "to", "note"):
            table.add_column(col)
        for m in moves:
            table.add_row(_ts(m["ts"]), m["from_state"] or "", m["to_state"], m["note"])
        c.print(table)
    return 0


CULPRIT_FIELDS = (("rank", "rank"), ("host", "host"), ("device", "device"), ("peer", "peer"),
                  ("peer_rank", "peer rank"), ("process", "process"), ("pid", "pid"), ("gpu_instance", "MIG instance"))


def _culprit(fields: dict) -> str:
    """Who a log line names: the rank, host and peer of a job's line, the process or MIG instance of an Xid."""
    return ", ".join(f"{label} {fields[key]}" for key, label in CULPRIT_FIELDS if key in fields)


def _unattributed(conn, node: str, since: float, until: float, limit: int = 20) -> list[dict]:
    """Lines on the node that a pattern matched but that were not acted on: their writer was not established."""
    rows = conn.execute("SELECT ts, message, fields FROM events WHERE node = ? AND source = 'sidecar' AND "
                        "kind = 'log_unattributed' AND ts >= ? AND ts <= ? ORDER BY ts DESC LIMIT ?",
                        (node, since, until, limit)).fetchall()
    return [{"ts": r[0], "line": r[1], **{k: v for k, v in json.loads(r[2] or "{}").items()
                                         if k in ("reason", "pattern", "source", "suppressed")}}
            for r in reversed(rows)]


def _print_unattributed(c, rows: list[dict], where: str = "") -> None:
    c.print(f"  not acted on{' ' + where if where else ''} (the writer of each line was not established):")
    for r in rows:
        if "suppressed" in r:
            c.print(f"    {_ts(r['ts'])} {r['suppressed']} more such lines, counted only", highlight=False)
        else:
            c.print(f"    {_ts(r['ts'])} [{r.get('reason')}; would be {r.get('pattern')}] {r['line']}", markup=False,
                    highlight=False, soft_wrap=True)


def _explain_node(conn, args) -> int:
    since = parse_since(args.since or "24h")
    rows = _unattributed(conn, args.node, since, time.time() + 60.0, limit=200)
    if args.json:
        print(json.dumps({"node": args.node, "since": since, "unattributed": rows}, indent=2, default=str))
        return 0
    c = _console()
    if not rows:
        _check_known_node(conn, args.node)
        c.print(f"{args.node}: every log line that read like a fault since {_ts(since)} came from a known writer")
        return 0
    by_reason: dict[str, int] = {}
    for r in rows:
        by_reason[r.get("reason", "?")] = by_reason.get(r.get("reason", "?"), 0) + 1
    c.print(f"[bold]{args.node}[/bold]: {len(rows)} line(s) since {_ts(since)} read like faults but were not acted on "
            f"({', '.join(f'{n} {reason}' for reason, n in sorted(by_reason.items()))})")
    _print_unattributed(c, rows)
    return 0


def _print_losses(c, lost: dict) -> None:
    """Steps and time each fault cost, per job and in total (report/losses.py)."""
    from rich.table import Table

    t = Table(title="steps lost per fault")
    for col in ("job", "faults", "steps lost", "time lost", "per fault (rule: steps, seconds, resumed from)"):
        t.add_column(col, justify="right" if col != "per fault (rule: steps, seconds, resumed from)" else "left")
    for j in lost["jobs"]:
        mine = [f for f in lost["faults"] if f["job_id"] == j["job_id"]]
        t.add_row(str(j["job_id"]), str(j["faults"]), str(j["steps_lost"]), f"{j['time_lost_s']:.1f}s",
                  "; ".join(f"{f['rule']}: {f['steps_lost']}, {f['time_lost_s']:.1f}s, {f['source']}" for f in mine))
    tot = lost["total"]
    t.add_row("total", str(tot["faults"]), str(tot["steps_lost"]), f"{tot['time_lost_s']:.1f}s",
              f"at most {tot['steps_lost_max']} step(s) per fault" if tot["faults"] else "")
    c.print(t)


def _explain_noise(conn, inc, c) -> None:
    """A slow or jittery job's incident: what its ranks waited for around the fault."""
    from sigma.controller.report.noise import NoJobData, job_noise, render

    try:
        noise = job_noise(conn, inc.job_id, since=inc.fault_ts - 600.0, until=max(inc.updated_at, inc.opened_at))
    except NoJobData:
        return
    c.print("  noise attribution:")
    render(noise, c, indent="    ")


def _jobs(args) -> int:
    from sigma.controller.report.jobs import job_ids, watch

    conn = _conn(args)
    now = time.time()
    since = parse_since(args.since) or 0.0
    found = [watch(conn, j, since, now) for j in ([args.job] if args.job is not None else job_ids(conn, since))]
    if args.json:
        print(json.dumps(found, indent=2))
        return 0
    if not found:
        print(f"no job reported a KPI line or had one refused since {_ts(since)}")
    for w in found:
        print(f"job {w['job_id']}: {w['verdict']}")
        if w["trainer"] or w["fault_hooks"]:
            print(f"  trainer: {w['trainer'] or '-'}" + (f"; fault hooks: {', '.join(w['fault_hooks'])}"
                                                         if w["fault_hooks"] else ""))
        for r in w["ranks"]:
            beat = w["heartbeats"].get(r["node"])
            print(f"  rank {r['rank']:<4} {r['node']:<10} step {r['last_step']:<8} last {_ts(r['last_ts'])} "
                  f"({now - r['last_ts']:.0f} s ago)  heartbeat "
                  + (f"{_ts(beat)} ({now - beat:.0f} s ago)" if beat else "none"))
        for node, beat in sorted(w["heartbeats"].items()):
            if node not in {r["node"] for r in w["ranks"]}:
                print(f"  heartbeats only from {node}: last {_ts(beat)}")
        for r in w["refused"]:
            print(f"  refused on {r['node']}: {r['kind']} ({r['reason']}) x{r['reports']}: {r['example']}")
        for q in w["checkpoint_requests"]:
            state = (f"answered at step {q['ack_step']}" if q["acked_at"] else
                     "open" if q["deadline"] > now else "never answered (the requeue went on at its deadline)")
            print(f"  checkpoint request {q['id']} to {q['node']} at {_ts(q['requested_at'])}: {state}")
    return 0


def _noise(args) -> int:
    from sigma.cli import CommandError
    from sigma.controller.report.noise import NoJobData, job_noise, render

    conn = _conn(args)
    try:
        noise = job_noise(conn, args.job, since=parse_since(args.since))
    except NoJobData as exc:
        raise CommandError(str(exc)) from None
    if args.json:
        print(json.dumps(noise.to_dict(), indent=2))
        return 0
    render(noise, _console())
    return 0


def _report(args) -> int:
    from rich.table import Table

    from sigma.controller.report.metrics import report

    conn = _conn(args)
    rep = report(conn, since=parse_since(args.since))
    auth = conn.execute("SELECT value FROM detector_state WHERE key = 'ingest.auth'").fetchone()
    rep["ingest_auth"] = json.loads(auth[0]) if auth else None
    if args.html:
        from sigma.controller.report.html import render

        Path(args.html).write_text(render(conn, rep))
        print(f"wrote {args.html}: open it in a browser, or mail it (one self-contained file)")
        return 0
    if args.json:
        print(json.dumps(rep, indent=2, default=str))
        return 0
    c = _console()
    if rep["ingest_auth"] and rep["ingest_auth"]["shared_key"]:
        c.print("[bold yellow]ingest: a shared secret is accepted: any node holding it can post as any other node "
                "(issue per-node keys: sigma keys issue; docs/security.md)[/]")
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
    _print_losses(c, rep["losses"])
    a = rep["automation"]
    c.print(f"automation ratio: {a['ratio'] if a['ratio'] is not None else '-'} "
            f"({a['automatic']} automatic, {a['manual']} needed a person)")
    for h in rep["shadow_hits"]:
        c.print(f"shadow hits: {h['rule']} would have acted on {', '.join(h['targets'])} ({h['hits']} hits, "
                f"last {_ts(h['last'])})", soft_wrap=True)
    if rep["stability"]:
        t = Table(title="throughput stability per job (step tokens/s; sigma noise --job J says why)")
        for col in ("job", "steps", "peak", "min/peak", "mean/peak", "std", "cv"):
            t.add_column(col, justify="right")
        for s in rep["stability"]:
            t.add_row(str(s["job_id"]), str(s["steps"]), f"{s['peak']:.4g}", f"{s['min_over_peak']:.3f}",
                      f"{s['mean_over_peak']:.3f}", f"{s['std']:.4g}", f"{s['cv']:.3f}")
        c.print(t)
    t = Table(title="incidents")
    for col in ("rule", "status", "count", "detect latency"):
        t.add_column(col)
    for i in rep["incidents"]:
        t.add_row(i["rule"], i["status"], str(i["count"]),
                  f"{i['detect_latency_s']:.1f}s" if i["detect_latency_s"] is not None else "-")
    c.print(t)
    return 0
