"""Just-in-time checkpoints before a requeue: ask the job's healthy nodes to save the current step, wait a bounded
time, then let the requeue run.

The request travels the way everything between the controller and a node travels: the node's sidecar pushes a
batch, the ingest reply carries the node's open requests (`pending_for_node`), and the sidecar writes the trainer's
control file (`<kpi dir>/job-<id>/checkpoint-request.<node>.json`), which every rank polls between steps. The
trainer answers with a KPI `checkpoint` event naming the request, which comes back through the same pipeline. No
node is waited for beyond the deadline: a hung rank or a dead node simply never answers, and the requeue goes on.

A hung job (no step within the timeout) is asked too when its trainer says it can answer while blocked (its start
event carries `jit_when_blocked`: in-memory replicas on, sigma/train/jit.py BlockedAnswer): each healthy rank,
stuck in a collective with the hung one, keeps the last finished step on the checkpoint filesystem, with the hung
rank's state taken from the peer replica its node holds. Such answers (`blocked: true`) come one per node, each
with the ranks it kept, so the requeue waits for every asked node (or the deadline), not for the first.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Callable

from sigma.controller.act.journal import NotYet


def request(conn: sqlite3.Connection, job_id: int, nodes: list[str], incident_id: int | None, timeout_s: float,
            now: float) -> list[int]:
    """Open one request per healthy node of the job; return their ids (all sharing one deadline)."""
    ids = []
    for node in nodes:
        cur = conn.execute("INSERT INTO checkpoint_requests (job_id, node, incident_id, requested_at, deadline)"
                           " VALUES (?, ?, ?, ?, ?)", (job_id, node, incident_id, now, now + timeout_s))
        ids.append(cur.lastrowid)
    conn.commit()
    return ids


def pending_for_node(conn: sqlite3.Connection, node: str, now: float) -> list[dict]:
    """Open requests for node (what the ingest reply hands its sidecar); marks them delivered."""
    rows = conn.execute("SELECT id, job_id, deadline FROM checkpoint_requests WHERE node = ? AND deadline > ?"
                        " AND acked_at IS NULL", (node, now)).fetchall()
    if rows:
        conn.execute(f"UPDATE checkpoint_requests SET delivered_at = ? WHERE delivered_at IS NULL AND id IN "
                     f"({','.join('?' * len(rows))})", (now, *[r[0] for r in rows]))
    return [{"id": r[0], "job_id": r[1], "deadline": r[2]} for r in rows]


def _job_events(conn: sqlite3.Connection, job_id: int, kind: str, since: float,
                nodes: list[str] | None = None) -> list[tuple]:
    """(ts, fields) of the job's KPI events of one kind since `since` (on `nodes`, or any node), oldest first."""
    where, args = "", []
    if nodes is not None:
        where, args = f" AND node IN ({','.join('?' * len(nodes))})", list(nodes)
    out = []
    for ts, fields, job_ids in conn.execute(
            f"SELECT ts, fields, job_ids FROM events WHERE ts >= ? AND source = 'kpi' AND kind = ?{where}"
            f" ORDER BY ts", (since, kind, *args)):
        if job_id in json.loads(job_ids or "[]"):
            out.append((ts, json.loads(fields or "{}")))
    return out


def answers_requests(conn: sqlite3.Connection, job_id: int, nodes: list[str], since: float) -> bool:
    """Whether the job's current run said it polls the control file (its trainer's start event carries
    `jit_poll_every` > 0): a trainer that cannot answer is not waited for."""
    return any(int(f.get("jit_poll_every") or 0) > 0 for _, f in _job_events(conn, job_id, "start", since, nodes))


def answers_when_blocked(conn: sqlite3.Connection, job_id: int, nodes: list[str], since: float) -> bool:
    """Whether the job's current run can answer while a hung rank blocks the others (`jit_when_blocked`)."""
    return any(f.get("jit_when_blocked") for _, f in _job_events(conn, job_id, "start", since, nodes))


def trainer_stopped(conn: sqlite3.Connection, job_id: int, since: float) -> bool:
    """Whether the job's trainer said it stopped (a `nan_loss` or `stop` KPI event) since `since`: it saves its own
    last healthy step on a NaN and answers no request after that."""
    return any(_job_events(conn, job_id, kind, since) for kind in ("nan_loss", "stop"))


def stepping(conn: sqlite3.Connection, job_id: int, since: float) -> bool:
    """Whether the job reported a training step since `since`: a hung job cannot reach the end of a step to save."""
    return conn.execute("SELECT 1 FROM kpis WHERE job_id = ? AND ts >= ? AND step IS NOT NULL LIMIT 1",
                        (job_id, since)).fetchone() is not None


def acknowledge(conn: sqlite3.Connection, ids: list[int]) -> tuple[int, float] | None:
    """(step, time) of the trainer's checkpoint event answering any of the request ids, recorded on the requests;
    None while no rank has answered."""
    if not ids:
        return None
    marks = ",".join("?" * len(ids))
    done = conn.execute(f"SELECT MIN(acked_at), MAX(ack_step) FROM checkpoint_requests WHERE id IN ({marks})"
                        " AND acked_at IS NOT NULL", ids).fetchone()
    if done[0] is not None:
        return int(done[1]), float(done[0])
    job_id, since = conn.execute(f"SELECT MIN(job_id), MIN(requested_at) FROM checkpoint_requests WHERE id IN"
                                 f" ({marks})", ids).fetchone()
    if job_id is None:
        return None
    # any rank may answer, on any node of the job (the bad node's rank learns the request from the others);
    # answers given while blocked count once every asked node has given one
    asked = {r[0] for r in conn.execute(f"SELECT node FROM checkpoint_requests WHERE id IN ({marks})", ids)}
    blocked: dict[str, tuple[float, int]] = {}
    for ts, node, fields in _answers(conn, job_id, since - 5.0):
        if fields.get("request") not in ids:
            continue
        step = int(fields.get("step") or 0)
        if fields.get("blocked"):
            blocked.setdefault(node, (ts, step))
            if not asked <= set(blocked):
                continue
            ts, step = max(t for t, _ in blocked.values()), min(s for _, s in blocked.values())
        conn.execute(f"UPDATE checkpoint_requests SET acked_at = ?, ack_step = ? WHERE id IN ({marks})",
                     (ts, step, *ids))
        conn.commit()
        return step, float(ts)
    return None


def _answers(conn: sqlite3.Connection, job_id: int, since: float) -> list[tuple[float, str, dict]]:
    """(ts, node, fields) of the job's `checkpoint` KPI events since `since`, oldest first."""
    rows = conn.execute("SELECT ts, node, fields, job_ids FROM events WHERE ts >= ? AND source = 'kpi' AND"
                        " kind = 'checkpoint' ORDER BY ts", (since,)).fetchall()
    return [(ts, node, json.loads(fields or "{}")) for ts, node, fields, job_ids in rows
            if job_id in json.loads(job_ids or "[]")]


def blocked_detail(conn: sqlite3.Connection, ids: list[int]) -> str:
    """What the answers given while blocked kept: every rank on disk, or which ranks come from elsewhere."""
    job_id, since = conn.execute(f"SELECT MIN(job_id), MIN(requested_at) FROM checkpoint_requests WHERE id IN"
                                 f" ({','.join('?' * len(ids))})", ids).fetchone()
    if job_id is None:
        return ""
    kept, missing = set(), set()
    for _, _, fields in _answers(conn, job_id, since - 5.0):
        if fields.get("request") in ids and fields.get("blocked"):
            kept.update(fields.get("ranks") or [])
            missing.update(fields.get("missing") or [])
    missing -= kept
    if not kept:
        return ""
    if not missing:
        return (f" while the job was blocked by a hung rank: every rank's state on the checkpoint filesystem "
                f"(the hung rank's from its peer replica)")
    return (f" while the job was blocked by a hung rank: rank(s) {', '.join(map(str, sorted(missing)))} not kept; "
            f"the resume takes the newest complete replica set or the periodic checkpoint")


class JitGate:
    """What the requeue executor asks before it requeues: NotYet while the checkpoint may still come."""

    def __init__(self, conn: sqlite3.Connection, clock: Callable[[], float] = time.time):
        self.conn = conn
        self.clock = clock

    def check(self, params: dict) -> str:
        """'' when no checkpoint was asked for, else what happened (saved at step N / no answer in T s);
        raises NotYet while the requests are open and no rank has answered."""
        ids = params.get("jit_requests") or []
        if not ids:
            return ""
        ack = acknowledge(self.conn, ids)
        if ack is not None:
            return f"just-in-time checkpoint of step {ack[0]} saved" + blocked_detail(self.conn, ids)
        job_id, since = self.conn.execute(f"SELECT MIN(job_id), MIN(requested_at) FROM checkpoint_requests WHERE id"
                                          f" IN ({','.join('?' * len(ids))})", ids).fetchone()
        if job_id is not None and trainer_stopped(self.conn, job_id, since - 5.0):
            return "the trainer stopped by itself (NaN loss or end of run): requeued without waiting"
        if self.clock() < float(params.get("jit_deadline", 0)):
            raise NotYet("waiting for the just-in-time checkpoint")
        partial = blocked_detail(self.conn, ids)
        return (f"no just-in-time checkpoint within {params.get('jit_timeout_s', '?')}s"
                + (f" from every asked node; some answered{partial}" if partial else "")
                + "; the job resumes from its newest checkpoint or replica")
