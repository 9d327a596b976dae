"""Learning problems from the controller database: confirmed incidents and admin verdicts against healthy history.

Labels are (a) isolations and watchdog findings confirmed by recovery (incident status confirmed/resolved),
(b) admin verdicts recorded with `sigma rules label` (table rule_labels: a fault of a named cause on a node at a
time, or a window declared healthy). Rule hits are already known to the knowledge base and are only learned from
when asked for by id. Healthy windows are the same nodes at earlier times and their peers meanwhile, away from any
incident or fault label on that node.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections import defaultdict

from sigma.rules.learn import LearnError
from sigma.rules.learn.config import LearnConfig
from sigma.rules.learn.examples import Example, Problem, chronological_split
from sigma.rules.matcher import normalise
from sigma.store import Migration, migrate

LABEL_MIGRATIONS: list[Migration] = [
    ("0200_rule_labels", """
        -- Admin verdicts for rule learning: a fault of a named cause on a node at a time, or a healthy window.
        CREATE TABLE rule_labels (
            id INTEGER PRIMARY KEY, created_at REAL NOT NULL, node TEXT NOT NULL, fault_ts REAL NOT NULL,
            verdict TEXT NOT NULL,           -- fault healthy
            cause TEXT NOT NULL DEFAULT '', category TEXT NOT NULL DEFAULT '', action TEXT NOT NULL DEFAULT '',
            incident_id INTEGER, labelled_by TEXT NOT NULL DEFAULT '', note TEXT NOT NULL DEFAULT '');
        CREATE INDEX rule_labels_ts ON rule_labels (fault_ts);
    """),
]
LEARNED_FROM_STATUSES = ("confirmed", "resolved")  # the node came back healthy after the action: it was the fault
RULE_HIT_STATUSES = ("acted", "resolved", "confirmed")


def ensure_labels(conn: sqlite3.Connection) -> None:
    migrate(conn, LABEL_MIGRATIONS, owner=False)  # extra tables of the controller database, which checks itself


def add_label(conn: sqlite3.Connection, *, node: str, fault_ts: float, verdict: str, cause: str = "",
              category: str = "", action: str = "", incident_id: int | None = None, by: str = "",
              note: str = "") -> int:
    if verdict not in ("fault", "healthy"):
        raise LearnError(f"verdict must be 'fault' or 'healthy', not {verdict!r}")
    if verdict == "fault" and not cause:
        raise LearnError("a fault label needs a cause (--cause)")
    ensure_labels(conn)
    with conn:
        cur = conn.execute("INSERT INTO rule_labels (created_at, node, fault_ts, verdict, cause, category, action,"
                           " incident_id, labelled_by, note) VALUES (?,?,?,?,?,?,?,?,?,?)",
                           (time.time(), node, fault_ts, verdict, cause, category, action, incident_id, by, note))
    return cur.lastrowid


def problems(conn: sqlite3.Connection, cfg: LearnConfig, *, since: float, now: float | None = None,
             incident: int | None = None) -> list[Problem]:
    """One problem per cause; raises LearnError when there is nothing (or too little) to learn from."""
    now = now or time.time()
    faults = _faults(conn, since, incident)
    if not faults:
        what = f"incident {incident}" if incident is not None else "confirmed incident or fault label"
        raise LearnError(f"no {what} to learn from since {time.strftime('%Y-%m-%d %H:%M', time.localtime(since))} "
                         f"(label one with: sigma rules label --node NODE --at TIME --cause TEXT)")
    by_cause: dict[str, list[dict]] = defaultdict(list)
    for f in faults:
        by_cause[f["cause"]].append(f)
    fault_times = defaultdict(list)
    for f in _faults(conn, since - cfg.window_before_s, None, every=True):
        fault_times[f["node"]].append(f["ts"])
    out, skipped = [], []
    for cause, items in sorted(by_cause.items()):
        positives, notes = [], []
        for f in items:
            ex = _example(conn, f["node"], f["ts"] - cfg.window_before_s, f["ts"] + cfg.window_after_s, True,
                          f["source"])
            if ex.empty or not (ex.own_events() or ex.own_samples()):
                notes.append(f"{f['source']} ({f['node']}, {_t(ex.start)}..{_t(ex.end)}): no telemetry of the node "
                             f"in the controller database for that window (past retention, or its sidecar was down)")
                continue
            positives.append(ex)
        if len(positives) < cfg.min_incidents:
            skipped.append(f"{cause}: {len(positives)} confirmed incident(s) with data, min_incidents is "
                           f"{cfg.min_incidents}" + ("; " + "; ".join(notes) if notes else ""))
            continue
        negatives = _healthy(conn, cfg, positives, fault_times, since, now)
        if len(negatives) < cfg.min_normal_windows:
            skipped.append(f"{cause}: {len(negatives)} healthy window(s) of history, min_normal_windows is "
                           f"{cfg.min_normal_windows} (no false-positive estimate without healthy data)")
            continue
        train, test, in_sample = chronological_split(positives, negatives, cfg.test_fraction)
        label = next((f for f in items if f.get("category") or f.get("action")), {})
        out.append(Problem(cause, train, test, category=label.get("category") or "learned",
                           action=label.get("action") or cfg.action, in_sample=in_sample, notes=notes,
                           provenance={"sources": [p.source for p in positives],
                                       "fault_windows": [p.describe() for p in positives],
                                       "healthy_windows": len(negatives),
                                       "healthy_span": [_t(min(n.start for n in negatives)),
                                                        _t(max(n.end for n in negatives))],
                                       "since": _t(since)}))
    if not out:
        raise LearnError("nothing to learn: " + " | ".join(skipped))
    for p in out:
        p.notes += skipped
    return out


def _faults(conn, since: float, incident: int | None, every: bool = False) -> list[dict]:
    """Confirmed faults: admin fault labels and recovered isolations (every=True: any incident on a node)."""
    ensure_labels(conn)
    labels = {r["incident_id"]: r for r in conn.execute(
        "SELECT * FROM rule_labels WHERE verdict = 'fault' AND incident_id IS NOT NULL")}
    out = []
    sql = "SELECT * FROM incidents WHERE node IS NOT NULL AND "
    if incident is not None:
        rows = conn.execute(sql + "id = ?", (incident,)).fetchall()
        if not rows:
            raise LearnError(f"no incident {incident} with a node in the controller database")
    elif every:
        rows = conn.execute(sql + "fault_ts >= ?", (since,)).fetchall()
    else:
        rows = conn.execute(sql + "fault_ts >= ? AND ((source IN ('isolation', 'watchdog') AND status IN "
                            f"({','.join('?' * len(LEARNED_FROM_STATUSES))})) OR id IN (SELECT incident_id FROM "
                            "rule_labels WHERE verdict = 'fault'))", (since, *LEARNED_FROM_STATUSES)).fetchall()
    for r in rows:
        lab = labels.get(r["id"])
        out.append({"node": r["node"], "ts": r["fault_ts"], "source": f"incident {r['id']}",
                    "cause": lab["cause"] if lab else (r["category"] or r["rule_id"]),
                    "category": lab["category"] if lab else r["category"], "action": lab["action"] if lab else ""})
    if incident is None:
        q = "SELECT * FROM rule_labels WHERE incident_id IS NULL AND fault_ts >= ?"
        q += "" if every else " AND verdict = 'fault'"
        for r in conn.execute(q, (since,)):
            out.append({"node": r["node"], "ts": r["fault_ts"], "source": f"label {r['id']}", "cause": r["cause"],
                        "category": r["category"], "action": r["action"], "verdict": r["verdict"]})
    return out if not every else [f for f in out if f.get("verdict", "fault") == "fault"]


def _healthy(conn, cfg: LearnConfig, positives: list[Example], fault_times: dict, since: float,
             now: float) -> list[Example]:
    """Windows as long as the fault windows: each node, stepping back from every fault window (so peers
    meanwhile come first, then the same and other nodes earlier), none near a fault on that node."""
    span = cfg.window_before_s + cfg.window_after_s
    nodes = known_nodes(conn, since)
    wanted: list[tuple[str, float]] = []
    for step in range(0, 10_000):
        added = False
        for p in positives:
            end = p.end - step * span
            if end - span < since:
                continue
            added = True
            for node in nodes:
                if not any(end - span - cfg.window_after_s <= t <= end + cfg.window_before_s
                           for t in fault_times.get(node, ())):
                    wanted.append((node, end))
        if not added or len(wanted) >= 4 * cfg.max_normal_windows:
            break
    for r in conn.execute("SELECT * FROM rule_labels WHERE verdict = 'healthy' AND fault_ts >= ?", (since,)):
        wanted.append((r["node"], r["fault_ts"] + cfg.window_after_s))
    seen, out = set(), []
    stride = max(1, len(wanted) // cfg.max_normal_windows)
    for node, end in wanted[::stride]:
        if (node, end) in seen or end > now + cfg.window_after_s:
            continue
        seen.add((node, end))
        ex = _example(conn, node, end - span, end, False, "healthy")
        if ex.own_events() or ex.own_samples():
            out.append(ex)
    return out[:cfg.max_normal_windows]


# The samples table has one index, (node, ts): a window is read per node, entered at its start, never by a pass
# over the table.
_NODES_SQL = """WITH RECURSIVE nodes(node) AS (SELECT min(node) FROM samples
    UNION ALL SELECT (SELECT min(node) FROM samples WHERE node > nodes.node) FROM nodes WHERE node IS NOT NULL)
    SELECT node FROM nodes WHERE node IS NOT NULL"""


def known_nodes(conn, since: float) -> list[str]:
    """Nodes with samples (a skip scan of the index) or with events since `since`."""
    nodes = {r[0] for r in conn.execute(_NODES_SQL)}
    nodes |= {r[0] for r in conn.execute("SELECT DISTINCT node FROM events WHERE ts >= ?", (since,))}
    return sorted(nodes)


def _example(conn, node: str, start: float, end: float, positive: bool, source: str) -> Example:
    jobs = _jobs(conn, node, start, end)
    peers = set(jobs) | {node}
    marks = ",".join("?" * len(peers))
    events = [normalise(r) for r in conn.execute(
        f"SELECT * FROM events WHERE node IN ({marks}) AND ts >= ? AND ts <= ? ORDER BY ts",
        (*sorted(peers), start, end))]
    samples = [normalise(r) for r in conn.execute(
        f"SELECT * FROM samples WHERE node IN ({marks}) AND ts >= ? AND ts <= ? ORDER BY ts", (*sorted(peers), start, end))]
    job_ids = sorted({j for js in jobs.values() for j in js})
    kpis = [normalise(r) for r in conn.execute(
        f"SELECT * FROM kpis WHERE job_id IN ({','.join('?' * len(job_ids))}) AND ts >= ? AND ts <= ? ORDER BY ts",
        (*job_ids, start, end))] if job_ids else []
    return Example(node, start, end, positive, source, events=events, samples=samples, kpis=kpis, jobs_on_node=jobs)


def _jobs(conn, node: str, start: float, end: float) -> dict[str, list[int]]:
    """The jobs the node ran in the window and the other nodes of those jobs, through indexed reads only: what
    SLURM said (the node's snapshot in force at the start and its changes during the window), the job ids the
    sidecars stamp on the node's events; peers are the nodes that reported KPIs or events for those jobs."""
    mine: set[int] = set()
    for r in conn.execute("SELECT jobs FROM (SELECT jobs FROM node_snapshots WHERE node = ? AND ts <= ? ORDER BY ts"
                          " DESC LIMIT 1) UNION ALL SELECT jobs FROM node_snapshots WHERE node = ? AND ts > ? AND"
                          " ts <= ?", (node, start, node, start, end)):
        mine.update(int(j) for j in json.loads(r["jobs"]))
    for r in conn.execute("SELECT DISTINCT job_ids FROM events WHERE node = ? AND ts >= ? AND ts <= ? AND"
                          " job_ids != '[]'", (node, start, end)):
        mine.update(int(j) for j in json.loads(r["job_ids"]))
    if not mine:
        return {}
    out: dict[str, set[int]] = defaultdict(set)
    out[node] = set(mine)
    marks = ",".join("?" * len(mine))
    for r in conn.execute(f"SELECT DISTINCT node, job_id FROM kpis WHERE job_id IN ({marks}) AND ts >= ? AND ts <= ?",
                          (*sorted(mine), start, end)):
        out[r["node"]].add(int(r["job_id"]))
    for r in conn.execute("SELECT DISTINCT node, job_ids FROM events WHERE ts >= ? AND ts <= ? AND job_ids != '[]'",
                          (start, end)):
        out[r["node"]].update(int(j) for j in json.loads(r["job_ids"]) if int(j) in mine)
    return {n: sorted(js) for n, js in out.items() if js}


def _t(ts: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts))
