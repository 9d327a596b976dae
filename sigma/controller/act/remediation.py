"""Per-node remediation state machine, persisted in node_lifecycle (timers are journal timestamps).

    drained -> waiting_jobs -> remediating -> validating -> resumed
                                   ^              |
                                   +-- failure ---+   (failures >= K: escalated, left drained for admins)

remediating runs the node's playbook (reboot via `scontrol reboot ASAP nextstate=DOWN`, a command, a ticket, or
manual: an admin marks the node repaired). validating puts the node in a maintenance reservation, resumes it
(user jobs cannot land there), runs the validation job on it and waits for its sacct verdict. Terminal states:
resumed, escalated, admin (somebody else drained the node: we never touch it again), returned (misdiagnosis).
Every SLURM step is a journaled action whose key names node, cycle and attempt, so a restart resumes where it
stopped and never repeats a step.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from sigma.controller.config import Playbook, RemediationConfig, resolve
from sigma.controller.act.decisionlog import DecisionLog
from sigma.controller.act.guards import admin_hold
from sigma.controller.act.incidents import Incidents
from sigma.controller.act.journal import Journal
from sigma.slurm.types import Job, Node

TERMINAL = ("resumed", "escalated", "admin", "returned")
# A node back from a reboot is resumed no sooner than this after its slurmd started: resumed within the second of
# its first registration, a re-registration can read as one more, unexpected, reboot (SLURM then downs the node).
REBOOT_SETTLE_S = 2.0
BUSY_JOB_STATES = ("RUNNING", "COMPLETING", "CONFIGURING", "SUSPENDED", "STOPPED", "SIGNALING")
# cycles under way, as literals: the same condition as the node_lifecycle_unfinished index, which the planner uses
# only for these very terms (with bound parameters a tick walked every node ever remediated)
UNFINISHED = f"state NOT IN ({', '.join(repr(s) for s in TERMINAL)})"
VALIDATION_FAIL_STATES = ("FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE",
                          "PREEMPTED")


@dataclass
class Lifecycle:
    node: str
    state: str
    cycle: int
    incident_id: int | None
    rule_id: str
    playbook: str
    failures: int
    entered_at: float
    data: dict

    @classmethod
    def from_row(cls, r: sqlite3.Row) -> "Lifecycle":
        return cls(node=r["node"], state=r["state"], cycle=r["cycle"], incident_id=r["incident_id"],
                   rule_id=r["rule_id"], playbook=r["playbook"], failures=r["failures"], entered_at=r["entered_at"],
                   data=json.loads(r["data"] or "{}"))

    @property
    def attempt(self) -> str:
        return f"{self.node}:c{self.cycle}:f{self.failures}"


class Remediator:
    def __init__(self, conn: sqlite3.Connection, journal: Journal, incidents: Incidents, cfg: RemediationConfig,
                 log: DecisionLog, slurm, *, clock: Callable[[], float] = time.time, root: Path | None = None,
                 adopt_reasons: tuple[str, ...] = ()):
        self.adopt_reasons = adopt_reasons  # SLURM's own drains after our health hooks: not an admin's
        self.conn = conn
        self.slurm = slurm  # queries only (sacct verdicts); every action goes through the journal
        self.journal = journal
        self.incidents = incidents
        self.cfg = cfg
        self.log = log
        self.clock = clock
        self.root = root

    # ---------- entry points ----------
    def get(self, node: str) -> Lifecycle | None:
        row = self.conn.execute("SELECT * FROM node_lifecycle WHERE node = ?", (node,)).fetchone()
        return Lifecycle.from_row(row) if row else None

    def all(self) -> list[Lifecycle]:
        return [Lifecycle.from_row(r) for r in self.conn.execute("SELECT * FROM node_lifecycle ORDER BY node")]

    def active(self, node: str) -> bool:
        lc = self.get(node)
        return lc is not None and lc.state not in TERMINAL

    def nodes_out(self) -> set[str]:
        """Nodes held out of service by a remediation cycle right now."""
        return {r[0] for r in self.conn.execute(f"SELECT node FROM node_lifecycle WHERE {UNFINISHED}")}

    def start(self, node: str, incident_id: int, rule_id: str, playbook: str) -> bool:
        """Begin a cycle for a node we just drained; False if one is already running."""
        current = self.get(node)
        if current and current.state not in TERMINAL:
            return False
        now = self.clock()
        cycle = current.cycle + 1 if current else 1
        with self.conn:
            self.conn.execute(
                "INSERT OR REPLACE INTO node_lifecycle (node, state, cycle, incident_id, rule_id, playbook, failures,"
                " entered_at, data, updated_at) VALUES (?, 'drained', ?, ?, ?, ?, 0, ?, '{}', ?)",
                (node, cycle, incident_id, rule_id, playbook, now, now))
            self.conn.execute("INSERT INTO lifecycle_transitions (node, cycle, ts, from_state, to_state, incident_id,"
                              " note) VALUES (?,?,?,?,?,?,?)",
                              (node, cycle, now, current.state if current else None, "drained", incident_id,
                               f"{rule_id}; playbook {playbook}"))
        return True

    def mark_repaired(self, node: str, by: str = "admin") -> None:
        lc = self.get(node)
        if lc is None or lc.state != "remediating":
            raise ValueError(f"{node} is not waiting for a repair (state: {lc.state if lc else 'not managed'})")
        self._set_data(lc, repaired_at=self.clock(), repaired_by=by)

    def return_node(self, node: str, note: str) -> None:
        """A misdiagnosis: give the node back (resume it if we still hold it) and end its cycle."""
        lc = self.get(node)
        if lc and lc.state in ("resumed", "admin", "returned"):
            return
        if lc:
            self.journal.run(f"resume:{lc.attempt}:return", "resume", node, reason=note,
                             incident_id=lc.incident_id)
            self.journal.run(f"delete_reservation:{lc.attempt}:return", "delete_reservation",
                             self._reservation(lc), incident_id=lc.incident_id)
            self._move(lc, "returned", note)

    def unfinished(self) -> list[Lifecycle]:
        """Cycles still under way (a tick reads only these: finished ones pile up over months)."""
        return [Lifecycle.from_row(r) for r in self.conn.execute(
            f"SELECT * FROM node_lifecycle WHERE {UNFINISHED} ORDER BY node")]

    def tick(self, nodes: dict[str, Node], jobs: list[Job]) -> None:
        for lc in self.unfinished():
            n = nodes.get(lc.node)
            if n is None:
                continue
            held = admin_hold(n, self.adopt_reasons)
            if held is not None:  # DOWN, DRAIN or FAIL by someone else: no reboot, no resume from here on
                self._move(lc, "admin", f"taken out by someone else ({n.state}, {held!r}); never touched by sigma")
                if lc.incident_id:
                    self.incidents.set_status(lc.incident_id, "closed", "node taken over by an admin", close=True)
                continue
            if lc.state in ("waiting_jobs", "remediating") and n.available:
                # sigma keeps the node drained until validation: in service now means someone resumed it
                self._move(lc, "admin", "returned to service by someone else (resumed outside sigma); "
                                        "remediation stopped")
                if lc.incident_id:
                    self.incidents.set_status(lc.incident_id, "closed", "node resumed by an admin", close=True)
                continue
            getattr(self, f"_{lc.state}")(lc, n, jobs)

    # ---------- states ----------
    def _drained(self, lc: Lifecycle, n: Node, jobs: list[Job]) -> None:
        if n.drained or n.state == "down":
            self._move(lc, "waiting_jobs", "node out of service")

    def _waiting_jobs(self, lc: Lifecycle, n: Node, jobs: list[Job]) -> None:
        busy = [j.job_id for j in jobs if lc.node in j.nodes and j.state in BUSY_JOB_STATES]
        if not busy and n.alloc_cpus == 0:
            self._move(lc, "remediating", "no jobs left on the node")

    def _remediating(self, lc: Lifecycle, n: Node, jobs: list[Job]) -> None:
        playbook = self._playbook(lc)
        now = self.clock()
        if playbook.kind == "manual":
            if not lc.data.get("announced"):
                self.log.event("waiting_for_admin", f"MANUAL {lc.node}: waiting for an admin "
                               f"(sigma nodes --repaired {lc.node})", node=lc.node, rule=lc.rule_id)
                self._set_data(lc, announced=True)
            if lc.data.get("repaired_at"):
                self._move(lc, "validating", f"marked repaired by {lc.data.get('repaired_by', 'admin')}")
            return
        key = f"{playbook.kind}:{lc.attempt}"
        if playbook.kind == "reboot":
            row = self.journal.run(key, "reboot", lc.node, incident_id=lc.incident_id, automatic=True,
                                   params={"planned_at": now, "reason": f"{lc.rule_id} remediation reboot"})
            if row.state == "done":
                back = not {"REBOOT_REQUESTED", "REBOOT_ISSUED", "NOT_RESPONDING"} & set(n.flags)
                if n.started_since(row.params["planned_at"]) and back \
                        and now - n.slurmd_start_time >= REBOOT_SETTLE_S:
                    self._move(lc, "validating", "rebooted")
                    return
            self._fail_if_late(lc, row, playbook.timeout_s, "reboot did not complete")
        elif playbook.kind == "command":
            row = self.journal.run(key, "command", lc.node, incident_id=lc.incident_id,
                                   params={"argv": playbook.command})
            if row.state == "done":
                result = json.loads(row.result)
                if result.get("ok"):
                    self._move(lc, "validating", "playbook command succeeded")
                else:
                    self._failure(lc, f"playbook command exited {result.get('returncode')}: {result.get('output')}")
            else:
                self._fail_if_late(lc, row, playbook.timeout_s, "playbook command did not run")
        elif playbook.kind == "ticket":
            self.journal.run(key, "ticket", lc.node, incident_id=lc.incident_id,
                             params={"url": playbook.webhook, "payload": self._ticket_payload(lc, playbook.name)})
            if lc.data.get("repaired_at"):
                self._move(lc, "validating", f"ticket closed; marked repaired by {lc.data.get('repaired_by')}")

    def _validating(self, lc: Lifecycle, n: Node, jobs: list[Job]) -> None:
        res = self._reservation(lc)
        if self.cfg.ack_kernel_log:
            step = self.journal.run(f"ack_kernel_log:{lc.attempt}", "ask_node", lc.node, incident_id=lc.incident_id,
                                    params={"request": "log-ack", "timeout_s": self.cfg.ack_timeout_s})
            if step.state == "skipped":
                return self._failure(lc, f"kernel log not acknowledged: {step.result}")
            if step.state != "done":
                return self._fail_if_late(lc, step, self.cfg.ack_timeout_s + 60, "kernel log not acknowledged")
            if not json.loads(step.result).get("ok"):
                return self._failure(lc, f"kernel log not acknowledged: {json.loads(step.result).get('output')}")
        if self.cfg.after_repair:
            step = self.journal.run(f"after_repair:{lc.attempt}", "command", lc.node, incident_id=lc.incident_id,
                                    params={"argv": self.cfg.after_repair})
            if step.state != "done":
                return self._fail_if_late(lc, step, 300, "after-repair command did not run")
            if not json.loads(step.result).get("ok"):
                return self._failure(lc, f"after-repair command failed: {json.loads(step.result).get('output')}")
        step = self.journal.run(f"create_reservation:{lc.attempt}", "create_reservation", res,
                                incident_id=lc.incident_id,
                                params={"node": lc.node, "duration_min": self.cfg.validation.reservation_minutes})
        if step.state != "done":
            return self._fail_if_late(lc, step, 300, f"could not create reservation: {step.result}")
        step = self.journal.run(f"resume:{lc.attempt}:validate", "resume", lc.node, incident_id=lc.incident_id)
        if step.state == "skipped":
            return self._move(lc, "admin", step.result)
        if step.state != "done":
            return self._fail_if_late(lc, step, 300, f"could not resume into the reservation: {step.result}")
        script = resolve(self.cfg.validation.script, self.root)
        out = self.cfg.validation.output_dir
        submit = self.journal.run(
            f"submit_validation:{lc.attempt}", "submit_validation", lc.node, incident_id=lc.incident_id,
            params={"job_name": f"sigma-validate-{lc.node}-c{lc.cycle}-f{lc.failures}", "reservation": res,
                    "args": self.cfg.validation.args,
                    "script": str(script), "since_date": time.strftime("%Y-%m-%dT%H:%M:%S",
                                                                        time.localtime(self.clock() - 3600)),
                    "not_before": self.clock() - 5,  # same name from another controller database: not ours
                    "output": str(Path(out) / f"validate-{lc.node}-%j.out") if out else ""})
        if submit.state == "skipped":
            return self._failure(lc, f"validation not submitted: {submit.result}")
        if submit.state != "done":
            return self._fail_if_late(lc, submit, 300, f"validation not submitted: {submit.result}")
        job_id = json.loads(submit.result)["job_id"]
        if lc.data.get("validation_job") != job_id:
            self._set_data(lc, validation_job=job_id)
        verdict = self._validation_verdict(job_id)
        if verdict is None:
            if self.clock() - submit.done_at > self.cfg.validation.timeout_s:
                self.journal.run(f"cancel_validation:{lc.attempt}", "cancel", str(job_id), incident_id=lc.incident_id)
                self._failure(lc, f"validation job {job_id} did not finish in {self.cfg.validation.timeout_s:.0f}s")
            return
        ok, detail = verdict
        if ok:
            self.journal.run(f"delete_reservation:{lc.attempt}", "delete_reservation", res, incident_id=lc.incident_id)
            self._move(lc, "resumed", f"validation job {job_id} passed")
            for inc in self.incidents.query(node=lc.node, open_only=True):
                if inc.status in ("acted", "open"):
                    self.incidents.set_status(inc.id, "resolved", f"node validated (job {job_id}) and resumed",
                                              close=True)
                elif inc.status == "confirmed":  # isolation verified before the node came back: done too
                    self.incidents.set_status(inc.id, "confirmed", inc.status_note, close=True)
        else:
            self._failure(lc, f"validation job {job_id} failed: {detail}")

    # ---------- helpers ----------
    def _validation_verdict(self, job_id: int) -> tuple[bool, str] | None:
        records = [r for r in self.slurm.accounting([job_id]) if r.job_id == job_id]
        if not records:
            return None
        rec = records[-1]
        if rec.state == "COMPLETED":
            return (rec.return_code == 0, f"exit {rec.return_code}")
        if rec.state in VALIDATION_FAIL_STATES:
            return (False, f"{rec.state} exit {rec.return_code}")
        return None

    def _failure(self, lc: Lifecycle, note: str) -> None:
        """A failed repair or validation: drain again, then retry the playbook or escalate after K failures."""
        self.journal.run(f"drain:{lc.attempt}:failed", "drain", lc.node, incident_id=lc.incident_id,
                         params={"reason": f"{lc.rule_id} remediation failed"})
        self.journal.run(f"delete_reservation:{lc.attempt}:failed", "delete_reservation", self._reservation(lc),
                         incident_id=lc.incident_id)
        failures = lc.failures + 1
        with self.conn:
            self.conn.execute("UPDATE node_lifecycle SET failures=?, data=? WHERE node=?",
                              (failures, json.dumps({}), lc.node))
        lc.failures, lc.data = failures, {}
        if failures >= self.cfg.max_failures:
            self.journal.run(f"escalate:{lc.node}:c{lc.cycle}", "ticket", lc.node, incident_id=lc.incident_id,
                             params={"url": self.cfg.escalation_webhook,
                                     "payload": {**self._ticket_payload(lc, "escalation"), "failures": failures,
                                                 "last_failure": note}})
            self._move(lc, "escalated", f"{note}; {failures} failures: escalated to admins")
            if lc.incident_id:
                self.incidents.set_status(lc.incident_id, "escalated", note)
        else:
            then = self._playbook(lc).then
            if then and then != lc.playbook:  # what this playbook can do did not help: the next one's turn
                with self.conn:
                    self.conn.execute("UPDATE node_lifecycle SET playbook=? WHERE node=?", (then, lc.node))
                lc.playbook = then
            self._move(lc, "remediating", f"{note}; retry {failures}/{self.cfg.max_failures}"
                                          f"{f' with playbook {then}' if then else ''}")

    def _fail_if_late(self, lc: Lifecycle, row, timeout_s: float, note: str) -> None:
        if row.state == "failed" or self.clock() - row.created_at > timeout_s:
            self._failure(lc, f"{note} ({row.result})")

    def _playbook(self, lc: Lifecycle) -> Playbook:
        found = next((p for p in self.cfg.playbooks if p.name == lc.playbook), None)
        if found:
            return found
        kind = lc.playbook if lc.playbook in ("reboot", "command", "ticket") else "manual"
        return Playbook(name=lc.playbook, kind=kind)

    def _reservation(self, lc: Lifecycle) -> str:
        return f"sigma-maint-{lc.node}-c{lc.cycle}-f{lc.failures}"

    def _ticket_payload(self, lc: Lifecycle, playbook: str) -> dict:
        inc = self.incidents.get(lc.incident_id) if lc.incident_id else None
        return {"node": lc.node, "rule": lc.rule_id, "playbook": playbook, "cycle": lc.cycle,
                "summary": inc.summary if inc else "", "incident": lc.incident_id,
                "evidence": inc.evidence if inc else {}}

    def _set_data(self, lc: Lifecycle, **values) -> None:
        lc.data.update(values)
        with self.conn:
            self.conn.execute("UPDATE node_lifecycle SET data=?, updated_at=? WHERE node=?",
                              (json.dumps(lc.data), self.clock(), lc.node))

    def _move(self, lc: Lifecycle, to: str, note: str) -> None:
        now = self.clock()
        with self.conn:
            self.conn.execute("UPDATE node_lifecycle SET state=?, entered_at=?, updated_at=? WHERE node=?",
                              (to, now, now, lc.node))
            self.conn.execute("INSERT INTO lifecycle_transitions (node, cycle, ts, from_state, to_state, incident_id,"
                              " note) VALUES (?,?,?,?,?,?,?)", (lc.node, lc.cycle, now, lc.state, to,
                                                                lc.incident_id, note))
        self.log.event("lifecycle", f"{to.upper()} {lc.node}: {note}", node=lc.node, from_state=lc.state,
                       to_state=to, cycle=lc.cycle, incident=lc.incident_id)
        lc.state, lc.entered_at = to, now
