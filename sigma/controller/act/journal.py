"""The action journal: every action is a row before it is a command.

    planned --run ok--> done          (or skipped: nothing to do, e.g. the job already left)
       |  \\--NotYet--> planned        (precondition not met yet: retried on a later tick, until expires_at)
       |   \\--error--> planned/failed (retried until max_attempts)
    shadow                             (observe mode, or a rule in shadow: recorded, never run)

A crash between "planned" and "done" leaves a planned row; `replay()` on restart runs it again. Executors are
idempotent (they look at SLURM's state first), so an action that did run before the crash is recognised and not
repeated. Keys are deterministic (e.g. `drain:node3:incident-7`), so re-deciding the same thing after a restart
finds the existing row instead of adding a second one.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Callable
from dataclasses import dataclass


class NotYet(Exception):
    """The action cannot run yet (e.g. the requeued job is not pending); keep it planned and retry later."""


class Skip(Exception):
    """Nothing to do (already true, or no longer applicable); recorded as skipped with the reason."""


Executor = Callable[[str, str, dict, str], str]  # (kind, target, params, key) -> result text


@dataclass
class ActionRow:
    id: int
    key: str
    incident_id: int | None
    kind: str
    target: str
    params: dict
    reason: str
    state: str
    attempts: int
    result: str
    created_at: float
    done_at: float | None

    @classmethod
    def from_row(cls, r: sqlite3.Row) -> "ActionRow":
        return cls(id=r["id"], key=r["key"], incident_id=r["incident_id"], kind=r["kind"], target=r["target"],
                   params=json.loads(r["params"]), reason=r["reason"], state=r["state"], attempts=r["attempts"],
                   result=r["result"], created_at=r["created_at"], done_at=r["done_at"])


class Journal:
    def __init__(self, conn: sqlite3.Connection, executor: Executor, *, clock: Callable[[], float] = time.time,
                 max_attempts: int = 5, on_change: Callable[[ActionRow], None] | None = None,
                 observed: Callable[[int | None], bool] | None = None):
        """observed(incident_id): True when the controller only observes that incident (observe mode): every
        automatic action planned for it is recorded as shadow and never run, whichever code path plans it."""
        self.conn = conn
        self.executor = executor
        self.clock = clock
        self.max_attempts = max_attempts
        self.on_change = on_change or (lambda row: None)
        self.observed = observed or (lambda incident_id: False)

    def plan(self, key: str, kind: str, target: str, *, params: dict | None = None, reason: str = "",
             incident_id: int | None = None, shadow: bool = False, automatic: bool = True) -> ActionRow:
        """Record the intent (committed before anything runs); an existing key is returned unchanged, except a row
        only observed before (shadow), which is planned now that it may run (the controller left observe mode)."""
        row = self.get(key)
        if row is not None and row.state != "shadow":
            return row  # planned before: a read, not a write transaction (a tick re-runs every step of a cycle)
        shadow = shadow or (automatic and self.observed(incident_id))
        now = self.clock()
        with self.conn:
            self.conn.execute(
                "INSERT OR IGNORE INTO actions (key, incident_id, kind, target, params, reason, state, created_at,"
                " updated_at, automatic) VALUES (?,?,?,?,?,?,?,?,?,?)",
                (key, incident_id, kind, target, json.dumps(params or {}), reason, "shadow" if shadow else "planned",
                 now, now, int(automatic)))
            if not shadow:
                self.conn.execute("UPDATE actions SET state = 'planned', updated_at = ? WHERE key = ? AND"
                                  " state = 'shadow'", (now, key))
        return self.get(key)

    def get(self, key: str) -> ActionRow | None:
        row = self.conn.execute("SELECT * FROM actions WHERE key = ?", (key,)).fetchone()
        return ActionRow.from_row(row) if row else None

    def run(self, key: str, kind: str, target: str, **plan_args) -> ActionRow:
        """Plan (once) and execute unless already finished."""
        row = self.plan(key, kind, target, **plan_args)
        return self.execute(row)

    def execute(self, row: ActionRow) -> ActionRow:
        if row.state != "planned":
            return row
        expires = row.params.get("expires_at")
        if expires is not None and self.clock() > expires:
            return self._finish(row, "skipped", f"expired before it could run; last: {row.result}")
        try:
            result = self.executor(row.kind, row.target, row.params, row.key)
        except NotYet as exc:
            return self._update(row, "planned", f"waiting: {exc}", count_attempt=False)
        except Skip as exc:
            return self._finish(row, "skipped", str(exc))
        except Exception as exc:  # SlurmError, OSError, ...: retried until max_attempts
            state = "failed" if row.attempts + 1 >= self.max_attempts else "planned"
            return self._update(row, state, f"error: {exc}", count_attempt=True)
        return self._finish(row, "done", result or "ok")

    def pending(self) -> list[ActionRow]:
        return [ActionRow.from_row(r) for r in
                self.conn.execute("SELECT * FROM actions WHERE state = 'planned' ORDER BY id")]

    def replay(self) -> list[ActionRow]:
        """Run every planned action again (after a restart, and on each tick for the waiting ones)."""
        return [self.execute(row) for row in self.pending()]

    def _finish(self, row: ActionRow, state: str, result: str) -> ActionRow:
        now = self.clock()
        with self.conn:
            self.conn.execute("UPDATE actions SET state=?, result=?, updated_at=?, done_at=?, attempts=attempts+1"
                              " WHERE id=?", (state, result, now, now, row.id))
        new = self.get(row.key)
        self.on_change(new)
        return new

    def _update(self, row: ActionRow, state: str, result: str, count_attempt: bool) -> ActionRow:
        with self.conn:
            self.conn.execute("UPDATE actions SET state=?, result=?, updated_at=?, attempts=attempts+? WHERE id=?",
                              (state, result, self.clock(), int(count_attempt), row.id))
        new = self.get(row.key)
        if new.result != row.result or new.state != row.state:
            self.on_change(new)
        return new
