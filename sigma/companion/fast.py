"""The fast tier: a catalogue of parameterised questions, no language model. Each intent has the words that select
it, a query built from the question's slots (sigma.companion.slots), and a sentence built from the result.
An intent whose words match but whose slots are missing or unknown answers with what it needs instead of guessing.
"""

from __future__ import annotations

import re
import sqlite3
from collections.abc import Callable
from dataclasses import dataclass

from sigma.companion.answer import Answer
from sigma.companion.safe_sql import QueryResult, run_select
from sigma.companion.slots import Slots


@dataclass
class Intent:
    name: str
    words: str                                        # regex over the lower-cased question
    build: Callable[[Slots], tuple[str, list] | str]  # (sql, params), or a clarifying question
    say: Callable[[QueryResult, Slots], str]
    example: str


def _where(s: Slots, *, node_col: str | None = "node", job_col: str | None = "job_id",
           ts_col: str = "opened_at", rule_col: str | None = "rule_id") -> tuple[str, list]:
    clauses, params = [], []
    if node_col and s.nodes:
        clauses.append(f"{node_col} IN ({','.join('?' * len(s.nodes))})")
        params += s.nodes
    if job_col and s.jobs:
        clauses.append(f"{job_col} IN ({','.join('?' * len(s.jobs))})")
        params += s.jobs
    if rule_col and s.rules:
        clauses.append("(" + " OR ".join(f"{rule_col} LIKE ?" for _ in s.rules) + ")")
        params += s.rules
    if s.since is not None:
        clauses.append(f"{ts_col} >= ?")
        params.append(s.since)
    if s.until is not None:
        clauses.append(f"{ts_col} < ?")
        params.append(s.until)
    return (" WHERE " + " AND ".join(clauses)) if clauses else "", params


def _scope(s: Slots) -> str:
    bits = []
    if s.rules:
        bits.append("for " + " or ".join(r.replace("%", "*") for r in s.rules))
    if s.nodes:
        bits.append("on " + ", ".join(s.nodes))
    if s.jobs:
        bits.append("for job " + ", ".join(map(str, s.jobs)))
    if s.period:
        bits.append(s.period)
    return (" " + " ".join(bits)) if bits else ""


def _dur(seconds) -> str:
    if seconds is None:
        return "not yet"
    seconds = float(seconds)
    if seconds < 120:
        return f"{seconds:.1f} s"
    if seconds < 7200:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


# ---------- intents ----------

def _drained_nodes(s: Slots):
    where, params = _where(s, node_col="i.node", job_col="i.job_id", ts_col="a.done_at", rule_col="i.rule_id")
    sql = ("SELECT a.target AS node, i.rule_id AS rule, datetime(a.done_at, 'unixepoch') AS drained_at, "
           "(SELECT MIN(t.ts) FROM lifecycle_transitions t WHERE t.node = a.target AND t.to_state = 'resumed' "
           "AND t.ts > a.done_at) - a.done_at AS back_after_s, i.id AS incident "
           "FROM actions a JOIN incidents i ON i.id = a.incident_id"
           + (where + " AND" if where else " WHERE") + " a.kind = 'drain' AND a.state = 'done' ORDER BY a.done_at")
    return sql, params


def _say_drained(r: QueryResult, s: Slots) -> str:
    if not r.rows:
        return f"No node was drained{_scope(s)}."
    parts = [f"{row[0]} ({row[1]}, back after {_dur(row[3])})" for row in r.rows[:8]]
    more = f" and {len(r.rows) - 8} more" if len(r.rows) > 8 else ""
    return f"{len(r.rows)} drain(s){_scope(s)}: " + "; ".join(parts) + more + "."


def _incidents(s: Slots):
    where, params = _where(s)
    return ("SELECT id, datetime(opened_at, 'unixepoch') AS opened, rule_id AS rule, node, job_id AS job, "
            "action, status, summary FROM incidents" + where + " ORDER BY opened_at"), params


def _say_incidents(r: QueryResult, s: Slots) -> str:
    if not r.rows:
        return f"No incident{_scope(s)}."
    rules = sorted({row[2] for row in r.rows})
    return f"{len(r.rows)} incident(s){_scope(s)}, from {', '.join(rules)}."


def _count_incidents(s: Slots):
    where, params = _where(s)
    return "SELECT COUNT(*) AS incidents FROM incidents" + where, params


def _say_count(r: QueryResult, s: Slots) -> str:
    return f"{r.rows[0][0]} incident(s){_scope(s)}."


def _job_restarts(s: Slots):
    if not s.jobs:
        return "Which job? Give its SLURM job id, e.g. 'why did job 42 restart?'"
    # A node-scope incident (an Xid on one of the job's nodes) names no job: its requeue action does. Recovery is
    # fault -> first training step of the new run (after its start/resume KPI event, as `sigma report` counts it);
    # steps redone are those the old run had reached that the new one trained again.
    where, params = _where(s, node_col=None, job_col=None, ts_col="i.opened_at", rule_col=None)
    sql = ("WITH x AS (SELECT i.id, i.opened_at, i.rule_id, i.node, i.status, i.summary, i.fault_ts, "
           "(SELECT MIN(a.done_at) FROM actions a WHERE a.incident_id = i.id AND a.kind = 'requeue' "
           "AND a.state = 'done') AS requeued_at FROM incidents i "
           "WHERE (i.job_id = :job OR i.id IN (SELECT incident_id FROM actions WHERE kind = 'requeue' "
           "AND target = CAST(:job AS TEXT)))" + where.replace(" WHERE ", " AND ", 1).replace("?", ":since", 1)
           + "), y AS (SELECT x.*, (SELECT MIN(e.ts) FROM events e WHERE e.source = 'kpi' AND e.kind IN "
           "('start', 'resume') AND e.ts > x.requeued_at AND EXISTS (SELECT 1 FROM json_each(e.job_ids) j "
           "WHERE j.value = :job)) AS resumed_at FROM x), z AS (SELECT y.*, (SELECT MIN(k.ts) FROM kpis k "
           "WHERE k.job_id = :job AND k.step IS NOT NULL AND k.ts > COALESCE(y.resumed_at, y.requeued_at)) "
           "AS first_step_at FROM y) "
           "SELECT z.id AS incident, datetime(z.opened_at, 'unixepoch') AS detected, z.rule_id AS rule, z.node, "
           "z.status, z.summary, z.requeued_at IS NOT NULL AS requeued, "
           "ROUND(z.first_step_at - z.fault_ts, 1) AS recovery_s, "
           "(SELECT MAX(k.step) FROM kpis k WHERE k.job_id = :job AND k.ts <= z.requeued_at) - "
           "(SELECT k.step FROM kpis k WHERE k.job_id = :job AND k.ts = z.first_step_at LIMIT 1) + 1 AS steps_redone "
           "FROM z ORDER BY z.opened_at")
    named = {"job": s.jobs[0]}
    if params:
        named["since"] = params[0]
    return sql, named


def _say_job_restarts(r: QueryResult, s: Slots) -> str:
    from sigma.companion.words import plain

    job = s.jobs[0]
    if not r.rows:
        return f"No incident touched job {job}: the controller never requeued it."
    requeued = [row for row in r.rows if row[6]]
    parts = []
    for row in requeued:
        where = f" on {row[3]}" if row[3] else ""
        rec = f", training again {_dur(row[7])} after the fault" if row[7] is not None else ", not training again yet"
        redo = f", {row[8]} step(s) redone" if row[8] is not None and row[8] > 0 else ""
        parts.append(f"{row[1]}: {plain(row[2])}{where} ({row[2]}){rec}{redo}")
    head = f"Job {job} was requeued {len(requeued)} time(s) by the controller"
    others = len(r.rows) - len(requeued)
    tail = (f" {others} other incident(s) only notified." if others else "") + " `sigma explain ID` shows the evidence."
    return head + (": " + "; ".join(parts) + "." if parts else ".") + tail


def _node_state(s: Slots):
    if not s.nodes:
        return "Which node? e.g. 'what state is node3 in?'"
    marks = ",".join("?" * len(s.nodes))
    sql = ("SELECT n.node, n.state || CASE WHEN n.flags != '' THEN '+' || lower(n.flags) ELSE '' END "
           "AS slurm_state, n.reason, datetime(n.ts, 'unixepoch') AS since, "
           "l.state AS remediation "
           "FROM node_snapshots n LEFT JOIN node_lifecycle l ON l.node = n.node "
           f"WHERE n.node IN ({marks}) AND n.ts = (SELECT MAX(ts) FROM node_snapshots m WHERE m.node = n.node)")
    return sql, list(s.nodes)


def _say_node_state(r: QueryResult, s: Slots) -> str:
    if not r.rows:
        return f"The controller has no record of {', '.join(s.nodes)}."
    return " ".join(f"{row[0]} is {row[1]}" + (f" ({row[2]})" if row[2] else "") + f" since {row[3]}"
                    + (f"; remediation: {row[4]}" if row[4] else "") + "." for row in r.rows)


def _out_of_service(s: Slots):
    return ("SELECT node, state, flags, reason, datetime(ts, 'unixepoch') AS since FROM node_snapshots n "
            "WHERE ts = (SELECT MAX(ts) FROM node_snapshots m WHERE m.node = n.node) "
            "AND (state IN ('down', 'fail', 'failing') OR flags LIKE '%DRAIN%' OR flags LIKE '%NOT_RESPONDING%' "
            "OR flags LIKE '%MAINTENANCE%') ORDER BY node"), []


def _say_out(r: QueryResult, s: Slots) -> str:
    if not r.rows:
        return "Every node the controller sees is in service."
    return f"{len(r.rows)} node(s) out of service: " + ", ".join(
        f"{x[0]} ({x[1]}{'+' + x[2].lower() if x[2] else ''}{': ' + x[3] if x[3] else ''})" for x in r.rows) + "."


def _detect_latency(s: Slots):
    where, params = _where(s)
    return ("SELECT rule_id AS rule, COUNT(*) AS incidents, ROUND(AVG(opened_at - fault_ts), 1) AS mean_s, "
            "ROUND(MAX(opened_at - fault_ts), 1) AS max_s FROM incidents" + where
            + " GROUP BY rule_id ORDER BY mean_s DESC"), params


def _say_latency(r: QueryResult, s: Slots) -> str:
    if not r.rows:
        return f"No incident{_scope(s)}."
    return "Detection latency" + _scope(s) + ": " + "; ".join(
        f"{x[0]} {x[2]} s mean over {x[1]}" for x in r.rows[:6]) + "."


def _recycle(s: Slots):
    where, params = _where(s, node_col="d.node", job_col=None, ts_col="d.ts", rule_col=None)
    sql = ("SELECT d.node, d.cycle, datetime(d.ts, 'unixepoch') AS drained_at, "
           "(SELECT MIN(r.ts) FROM lifecycle_transitions r WHERE r.node = d.node AND r.cycle = d.cycle "
           "AND r.to_state = 'resumed') - d.ts AS out_of_service_s "
           "FROM lifecycle_transitions d" + (where + " AND" if where else " WHERE")
           + " d.to_state = 'drained' ORDER BY d.ts")
    return sql, params


def _say_recycle(r: QueryResult, s: Slots) -> str:
    done = [x[3] for x in r.rows if x[3] is not None]
    if not r.rows:
        return f"No node was taken out of service{_scope(s)}."
    mean = sum(done) / len(done) if done else None
    return (f"{len(r.rows)} time(s) out of service{_scope(s)}; back in service after {_dur(mean)} on average"
            + (f" ({len(r.rows) - len(done)} not back yet)" if len(done) < len(r.rows) else "") + ".")


def _manual(s: Slots):
    where, params = _where(s, node_col=None, job_col=None, ts_col="created_at", rule_col=None)
    return ("SELECT id, datetime(created_at, 'unixepoch') AS at, kind, target, reason FROM actions"
            + (where + " AND" if where else " WHERE") + " automatic = 0 ORDER BY created_at"), params


def _say_manual(r: QueryResult, s: Slots) -> str:
    if not r.rows:
        return f"No action needed a person{_scope(s)}."
    return f"{len(r.rows)} action(s) needed a person{_scope(s)}: " + ", ".join(f"{x[2]} {x[3]}" for x in r.rows[:8])


def _top_nodes(s: Slots):
    where, params = _where(s, node_col=None)
    return ("SELECT node, COUNT(*) AS incidents FROM incidents" + (where + " AND" if where else " WHERE")
            + " node IS NOT NULL GROUP BY node ORDER BY incidents DESC, node LIMIT ?"), params + [s.top or 5]


def _say_top_nodes(r: QueryResult, s: Slots) -> str:
    if not r.rows:
        return f"No node had an incident{_scope(s)}."
    return f"Most incidents{_scope(s)}: " + ", ".join(f"{x[0]} ({x[1]})" for x in r.rows) + "."


def _rules_fired(s: Slots):
    where, params = _where(s, rule_col=None)
    return ("SELECT rule_id AS rule, COUNT(*) AS incidents, MAX(datetime(opened_at, 'unixepoch')) AS last "
            "FROM incidents" + where + " GROUP BY rule_id ORDER BY incidents DESC, rule_id"), params


def _say_rules(r: QueryResult, s: Slots) -> str:
    if not r.rows:
        return f"No rule fired{_scope(s)}."
    return f"{len(r.rows)} rule(s) fired{_scope(s)}: " + ", ".join(f"{x[0]} ×{x[1]}" for x in r.rows) + "."


def _job_kpi(s: Slots):
    if not s.jobs:
        return "Which job? e.g. 'what is the loss of job 42?'"
    marks = ",".join("?" * len(s.jobs))
    return ("SELECT job_id AS job, MAX(step) AS last_step, "
            "(SELECT k2.loss FROM kpis k2 WHERE k2.job_id = k.job_id ORDER BY k2.ts DESC LIMIT 1) AS last_loss, "
            "ROUND(AVG(tokens_per_s), 1) AS mean_tokens_per_s, ROUND(AVG(step_time_s), 3) AS mean_step_time_s "
            f"FROM kpis k WHERE job_id IN ({marks}) GROUP BY job_id"), list(s.jobs)


def _say_kpi(r: QueryResult, s: Slots) -> str:
    if not r.rows:
        return f"No training KPIs from job {', '.join(map(str, s.jobs))}."
    return " ".join(f"Job {x[0]} reached step {x[1]}, last loss {x[2]:.4g}, {x[3]} tokens/s on average "
                    f"({x[4]} s per step)." if x[2] is not None else f"Job {x[0]} reached step {x[1]}."
                    for x in r.rows)


def _events(s: Slots):
    where, params = _where(s, job_col=None, ts_col="ts", rule_col=None)
    return ("SELECT id, datetime(ts, 'unixepoch') AS at, node, source, kind, severity, message FROM events"
            + (where + " AND" if where else " WHERE")
            + " severity NOT IN ('info', 'ok', 'pass') ORDER BY ts DESC LIMIT 50"), params


def _say_events(r: QueryResult, s: Slots) -> str:
    if not r.rows:
        return f"No warning or error event{_scope(s)}."
    return f"{len(r.rows)} warning/error event(s){_scope(s)}, the latest: {r.rows[0][4]} on {r.rows[0][2]} at {r.rows[0][1]}."


def _automation(s: Slots):
    where, params = _where(s, node_col=None, job_col=None, ts_col="created_at", rule_col=None)
    return ("SELECT SUM(automatic) AS automatic, SUM(1 - automatic) AS manual, "
            "ROUND(1.0 * SUM(automatic) / COUNT(*), 3) AS ratio FROM actions"
            + (where + " AND" if where else " WHERE") + " state = 'done'"), params


def _say_automation(r: QueryResult, s: Slots) -> str:
    a, m, ratio = r.rows[0]
    if not a and not m:
        return "The controller has taken no action yet."
    return f"{a} action(s) ran automatically and {m} needed a person{_scope(s)}: automation ratio {ratio}."


def _last_incident(s: Slots):
    where, params = _where(s)
    return ("SELECT id, datetime(opened_at, 'unixepoch') AS opened, rule_id AS rule, node, job_id AS job, status, "
            "summary FROM incidents" + where + " ORDER BY opened_at DESC LIMIT 1"), params


def _say_last(r: QueryResult, s: Slots) -> str:
    if not r.rows:
        return f"No incident{_scope(s)}."
    x = r.rows[0]
    return f"The last incident{_scope(s)} was {x[0]}: {x[2]}" + (f" on {x[3]}" if x[3] else "") + \
        (f" (job {x[4]})" if x[4] else "") + f" at {x[1]}, {x[5]}."


# Order matters: the first intent whose words match wins, so specific ones come first.
INTENTS: tuple[Intent, ...] = (
    Intent("automation", r"\bautomat(ion|ed|ic)\b|\bby hand\b|\bmanual(ly)?\b.*\bratio\b", _automation,
           _say_automation, "what is the automation ratio?"),
    Intent("manual_actions", r"\b(needed|need|required) a (person|human)\b|\bmanual\b|\bby an admin\b", _manual,
           _say_manual, "which actions needed a person?"),
    Intent("job_restarts", r"\bwhy\b.*\bjob\b|\bjob\b.*\b(restart|requeue|interrupt|fail)", _job_restarts,
           _say_job_restarts, "why did job 42 restart?"),
    Intent("job_kpi", r"\b(loss|throughput|tokens|step time|mfu|progress|which step)\b.*\bjob\b|\bjob\b.*"
           r"\b(loss|throughput|tokens|step time|mfu|progress)\b", _job_kpi, _say_kpi, "what is the loss of job 42?"),
    Intent("detect_latency", r"\b(detect|detection)\b.*\b(latency|long|fast|time)\b|\b(long|fast)\b.*\bdetect",
           _detect_latency, _say_latency, "how long did detection take for xid errors?"),
    Intent("recycle", r"\bout of service\b.*\b(long|time)\b|\b(long|time)\b.*\bout of service\b|\brecycl"
           r"|\bback in service\b|\bhow long\b.*\bnode\b", _recycle, _say_recycle,
           "how long was node2 out of service?"),
    Intent("drained_nodes", r"\bdrain(ed|s)?\b|\btaken out\b|\bremoved from service\b", _drained_nodes, _say_drained,
           "which nodes were drained for Xid errors this week?"),
    Intent("out_of_service", r"\b(out of service|down|unavailable)\b.*\b(now|currently|right now)\b|"
           r"\bwhich nodes are (down|out|drained|unavailable)\b", _out_of_service, _say_out,
           "which nodes are out of service now?"),
    Intent("node_state", r"\b(state|status)\b|\bis node\S* (up|down|ok|healthy|in service)\b", _node_state,
           _say_node_state, "what state is node3 in?"),
    Intent("top_nodes", r"\b(most|top \d+|worst)\b.*\bnodes?\b|\bnodes?\b.*\b(most|top)\b", _top_nodes,
           _say_top_nodes, "which node had the most incidents?"),
    Intent("rules_fired", r"\bwhich rules?\b|\brules? (fired|triggered|matched)\b|\bwhat (kinds?|types?) of "
           r"(faults?|incidents?)\b", _rules_fired, _say_rules, "which rules fired today?"),
    Intent("last_incident", r"\b(last|latest|most recent)\b.*\b(incident|fault|failure|problem)\b", _last_incident,
           _say_last, "what was the last incident?"),
    Intent("count_incidents", r"\bhow many\b.*\b(incidents?|faults?|failures?|errors?|problems?)\b",
           _count_incidents, _say_count, "how many incidents were there yesterday?"),
    Intent("events", r"\b(events?|log(ged)?|errors? on|warnings?)\b", _events, _say_events,
           "what errors did node2 log today?"),
    Intent("incidents", r"\b(incidents?|faults?|failures?|problems?|what happened)\b", _incidents,
           _say_incidents, "what incidents were there on node2?"),
)


def match(question: str) -> Intent | None:
    q = question.lower()
    for intent in INTENTS:
        if re.search(intent.words, q):
            return intent
    return None


def answer(conn: sqlite3.Connection, question: str, slots: Slots) -> Answer | None:
    """The fast tier's answer, or None when no intent matches."""
    intent = match(question)
    if intent is None:
        return None
    if slots.unknown_nodes and not slots.nodes:
        return Answer(text=f"I know no node named {', '.join(slots.unknown_nodes)}; ask about one the controller "
                           "has seen (see `sigma nodes` or `sinfo`).", tier="fast", intent=intent.name,
                      clarify=True)
    built = intent.build(slots)
    if isinstance(built, str):
        return Answer(text=built, tier="fast", intent=intent.name, clarify=True)
    sql, params = built
    result = run_select(conn, sql, params if isinstance(params, dict) else tuple(params))
    return Answer(text=intent.say(result, slots), columns=result.columns, rows=result.rows, sql=sql,
                  params=params if isinstance(params, dict) else list(params), tier="fast", intent=intent.name, truncated=result.truncated)
