"""Requests the controller makes of a node's sidecar: after a repair, acknowledge the node's kernel log, so the
repaired fault's lines do not fail its validation (`sigma health log-ack` on the node).

They travel the way everything between the controller and a node travels, so the head never needs a shell on a
node: the node's sidecar pushes a batch, the ingest reply carries the node's open requests (`pending`), the sidecar
does what is asked and answers with a `node_request` event naming the request, which its next batch brings back.
A request nobody answers by its deadline (the sidecar is down, the node unreachable) is answered "no" by the
controller itself.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Callable

from sigma.controller.act.journal import NotYet

KINDS = ("log-ack",)  # what a sidecar knows how to do (sigma/telemetry/agent.py)


def pending(conn: sqlite3.Connection, node: str, now: float) -> list[dict]:
    """The node's open requests (what the ingest reply hands its sidecar); marks them delivered."""
    rows = conn.execute("SELECT id, kind FROM node_requests WHERE node = ? AND deadline > ? AND answered_at IS NULL",
                        (node, now)).fetchall()
    if rows:
        conn.execute(f"UPDATE node_requests SET delivered_at = ? WHERE delivered_at IS NULL AND id IN "
                     f"({','.join('?' * len(rows))})", (now, *[r[0] for r in rows]))
    return [{"id": r[0], "kind": r[1]} for r in rows]


class NodeRequests:
    """What the journal's `ask_node` executor uses: open a request once per action, then NotYet until the node
    answers or the deadline passes. Its result is JSON: {"ok": bool, "output": what the node said}."""

    def __init__(self, conn: sqlite3.Connection, clock: Callable[[], float] = time.time):
        self.conn = conn
        self.clock = clock

    def ask(self, node: str, kind: str, action_key: str, timeout_s: float) -> str:
        if kind not in KINDS:
            raise ValueError(f"no node request {kind!r}; known: {', '.join(KINDS)}")
        now = self.clock()
        with self.conn:
            self.conn.execute("INSERT INTO node_requests (node, kind, action_key, requested_at, deadline) VALUES"
                              " (?, ?, ?, ?, ?) ON CONFLICT (action_key) DO NOTHING",
                              (node, kind, action_key, now, now + timeout_s))
        rid, asked, deadline, delivered = self.conn.execute(
            "SELECT id, requested_at, deadline, delivered_at FROM node_requests WHERE action_key = ?",
            (action_key,)).fetchone()
        answer = self._answer(node, rid, asked)
        if answer is None and now < deadline:
            raise NotYet(f"waiting for {node}'s sidecar to {kind}" + ("" if delivered else " (not yet delivered)"))
        with self.conn:
            self.conn.execute("UPDATE node_requests SET answered_at = ? WHERE id = ?", (now, rid))
        if answer is None:
            how = "delivered" if delivered else "never delivered: it pushed nothing"
            return json.dumps({"ok": False, "output": f"no answer from {node}'s sidecar within {timeout_s:.0f} s "
                                                      f"({how}); is sigma-sidecar running there?"})
        return json.dumps({"ok": bool(answer.get("ok")), "output": str(answer.get("output", ""))[-400:]})

    def _answer(self, node: str, rid: int, since: float) -> dict | None:
        for (fields,) in self.conn.execute(
                "SELECT fields FROM events WHERE node = ? AND source = 'sidecar' AND kind = 'node_request'"
                " AND ts >= ? ORDER BY ts", (node, since - 60.0)):  # a node's clock may lag the head's a little
            data = json.loads(fields or "{}")
            if data.get("request") == rid:
                return data
        return None
