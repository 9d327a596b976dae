"""Findings -> incidents -> journaled actions, through the guard rails (shadow mode, circuit breaker,
admin drains, crash loops). Nothing here runs a command directly: the journal does."""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Callable

from sigma.controller.config import ControllerConfig, RemediationConfig
from sigma.controller.act import jit
from sigma.controller.act.decisionlog import DecisionLog
from sigma.findings import Finding
from sigma.controller.act.guards import (NODE_FAULT_S, admin_hold, breaker_limit, breaker_trips, own_failures,
                                         wave_trips)
from sigma.controller.act.incidents import Incident, Incidents
from sigma.controller.act.journal import Journal
from sigma.controller.act.reason import drain_reason
from sigma.controller.act.remediation import TERMINAL, Remediator
from sigma.rules.schema import DRAIN_ACTIONS
from sigma.slurm.types import Job, Node

RUNNING_STATES = ("RUNNING", "CONFIGURING", "COMPLETING", "SUSPENDED", "STOPPED")
DRAINED_STATUSES = ("acted", "resolved", "confirmed", "misdiagnosed")  # the rule really took the node out
RESTARTABLE_ENDED_STATES = ("FAILED",)  # job-scope faults (NaN loss) restart a job that already stopped
REQUEUE_FOLLOWUP_S = 900.0  # how long start_now keeps waiting for a requeued job to be pending


class Decider:
    def __init__(self, conn, journal: Journal, incidents: Incidents, remediator: Remediator, cfg: ControllerConfig,
                 rcfg: RemediationConfig, log: DecisionLog, clock: Callable[[], float] = time.time):
        self.conn = conn
        self.journal = journal
        self.incidents = incidents
        self.remediator = remediator
        self.cfg = cfg
        self.rcfg = rcfg
        self.log = log
        self.clock = clock
        self.counts: Counter = Counter()  # guard-rail outcomes, exported on /metrics

    def decide(self, findings: list[Finding], nodes: dict[str, Node], jobs: list[Job]) -> list[Incident]:
        opened = []
        for f in findings:
            existing = self.incidents.find_open(f.key)
            shadow = not self.cfg.rule_acts(f.rule_id, f.shadow)
            observed = existing if existing and existing.status == "shadow" and not shadow else None
            if existing and existing.status != "open" and observed is None:
                self.incidents.touch(existing, f)
                continue
            # 'open' = decided but not finished (the controller died in between): decide again; every action key
            # contains the incident id, so what was already planned is found, not planned twice
            self._inc = (existing if observed is None else None) or self.incidents.open(f, "open")
            if observed is not None:
                self._redecide(observed, f)
            if f.action in DRAIN_ACTIONS:
                inc = self._drain(f, shadow, nodes, jobs)
            elif f.action == "requeue":
                inc = self._requeue_job(f, shadow, jobs)
            else:
                status = "recorded" if f.action == "record" else "notified"
                inc = self._status(status)
                self._say(inc, f"{f.action.upper()} {self._target(f)} ({f.rule_id}): {f.summary}")
            opened.append(inc)
        return opened

    def _redecide(self, observed: Incident, f: Finding) -> None:
        """A fault only observed (observe mode, or its rule in shadow) whose rule acts now (the switch to act, or
        the rule enabled) and that is still current (its evidence in the rule's window, the node not back since):
        decided again as a new incident, as if it had just been seen. The observed incident is closed as the
        record of what observe mode would have done."""
        self.incidents.set_status(observed.id, "shadow", f"observed only; its rule acts now and the fault is still "
                                                         f"current: decided again as incident {self._inc.id}",
                                  close=True)
        self.incidents.add_evidence(self._inc.id, observed_incident=observed.id, observed_at=observed.opened_at)
        self.log.event("redecide", f"REDECIDE {self._target(f)} ({f.rule_id}): observed as incident {observed.id} "
                                   f"while its rule did not act; still current, decided now as incident "
                                   f"{self._inc.id}", incident=self._inc.id, observed_incident=observed.id,
                       rule=f.rule_id, node=f.node, job=f.job_id)

    def settle_observed(self, current: set[str], rule_shadow: Callable[[str], bool]) -> None:
        """Close the incidents only observed whose rule acts now but whose fault is no longer current (not among
        this tick's findings: its evidence left the rule's window, the node came back, the job moved on), with a
        note saying so: they are not acted on. rule_shadow(rule_id): the rule's own `shadow: true`."""
        for inc in self.incidents.query(status="shadow", open_only=True):
            if inc.key in current or not self.cfg.rule_acts(inc.rule_id, rule_shadow(inc.rule_id)):
                continue
            note = ("observed only; its rule acts now but the fault is no longer current (its evidence left the "
                    "rule's window, or the node or job moved on): not acted on")
            self.incidents.set_status(inc.id, "shadow", note, close=True)
            target = inc.node if inc.scope == "node" and inc.node else f"job {inc.job_id}"
            self.log.event("decision", f"CLOSED {target} ({inc.rule_id}): incident {inc.id} {note}", incident=inc.id,
                           rule=inc.rule_id, node=inc.node, job=inc.job_id, status="shadow")

    def _status(self, status: str, note: str = "", close: bool = False) -> Incident:
        """Settle the incident being decided."""
        self.incidents.set_status(self._inc.id, status, note, close=close)
        return self.incidents.get(self._inc.id)

    # ---------- drains ----------
    def _drain(self, f: Finding, shadow: bool, nodes: dict[str, Node], jobs: list[Job]) -> Incident:
        node = f.node
        n = nodes.get(node)
        on_node = [j for j in jobs if node in j.nodes and j.state in RUNNING_STATES]
        if n is None:
            inc = self._status("notified", f"node {node!r} unknown to SLURM")
            self._say(inc, f"NOTIFY {node} ({f.rule_id}): {f.summary}; node unknown to SLURM")
            return inc
        held = admin_hold(n, self.cfg.adopt_drain_reasons)
        if held is not None:
            self.counts["guard", "admin_hold"] += 1
            inc = self._status("notified", f"taken out by someone else ({n.state}, {held!r}); left alone")
            how = "FAIL" if "FAIL" in n.flags else "DRAIN" if n.drained else n.state.upper()
            self._say(inc, f"NOTIFY {node} ({f.rule_id}): {f.summary}; left alone, taken out by admin ({how}: {held})")
            return inc
        inc = self._inc
        lc = self.remediator.get(node)
        if lc and lc.state not in TERMINAL and lc.incident_id != inc.id:
            inc = self._status("acted", "node already out of service")
            self._say(inc, f"NOTED {node} ({f.rule_id}): {f.summary}; node already in remediation")
            return inc
        if shadow:
            self.journal.plan(f"drain:{node}:i{inc.id}", "drain", node, incident_id=inc.id, shadow=True,
                              params={"reason": self._reason(f)})
            for job in on_node if f.requeue_jobs else ():
                self.journal.plan(f"requeue:{job.job_id}:i{inc.id}", "requeue", str(job.job_id), incident_id=inc.id,
                                  shadow=True, params={"restarts_before": job.restarts})
            if n.silent and on_node:
                self.journal.plan(f"set_down:{node}:i{inc.id}", "set_down", node, incident_id=inc.id, shadow=True,
                                  params={"reason": self._reason(f)})
            inc = self._status("shadow", self._observed_note())
            self._say(inc, f"SHADOW {node} ({f.rule_id}): would drain ({f.summary})"
                           f"{' and requeue ' + str([j.job_id for j in on_node]) if on_node and f.requeue_jobs else ''}")
            return inc
        tripped = self._guard(f, node, len(nodes))
        if tripped is not None:
            return self._escalate(f, node, *tripped)
        # plan everything first, then run it: a crash in between leaves planned rows the restart replays
        drain = self.journal.plan(f"drain:{node}:i{inc.id}", "drain", node, incident_id=inc.id,
                                  params={"reason": self._reason(f)})
        row = self.journal.execute(drain)
        if row.state == "skipped":
            inc = self._status("notified", row.result)
            self._say(inc, f"NOTIFY {node} ({f.rule_id}): {f.summary}; {row.result}")
            return inc
        playbook = self.rcfg.playbook_for(f.rule_id, f.category, f.action)
        self.remediator.start(node, inc.id, f.rule_id, playbook.name)
        requeued = []
        if f.requeue_jobs:
            for job in on_node:
                if job.requeue:  # a job submitted with --no-requeue is left to its owner
                    self._requeue(job, inc, avoid=[node], crash_guard=False)
                    requeued.append(job.job_id)
        self._ensure_start_now(inc, avoid=[node])
        down = self._down_when_requeued(f, inc, n, on_node, requeued)
        if on_node:
            self.incidents.add_evidence(inc.id, jobs=[{"job_id": j.job_id, "start_time": j.start_time,
                                                       "nodes": list(j.nodes), "restarts": j.restarts}
                                                      for j in on_node])
        inc = self._status("acted")
        self._say(inc, f"DRAIN {node} ({f.rule_id}): {f.summary}; requeued {requeued or 'no jobs'}{down}; "
                       f"playbook {playbook.name}")
        return inc

    def _down_when_requeued(self, f: Finding, inc: Incident, n: Node, on_node: list[Job],
                            requeued: list[int]) -> str:
        """A node SLURM itself reports NOT_RESPONDING is set DOWN once its jobs are requeued (act/actions.py
        _set_down), as slurmctld would after SlurmdTimeout (300 s by default): their steps there end now and the
        requeued job can start elsewhere; our drain stays, so the node returns through validation. Not while a job
        that is not requeued still runs there: whether that one is lost stays SLURM's timeout's decision."""
        if not on_node or not n.silent:
            return ""
        left = [j.job_id for j in on_node if j.job_id not in requeued and j.state != "COMPLETING"]
        if left:
            return f"; not set DOWN, job(s) {left} not requeued"
        self.journal.run(f"set_down:{n.name}:i{inc.id}", "set_down", n.name, incident_id=inc.id,
                         params={"reason": self._reason(f), "expires_at": self.clock() + REQUEUE_FOLLOWUP_S,
                                 "requeued": {str(j.job_id): j.restarts for j in on_node if j.job_id in requeued}})
        return "; set DOWN once requeued (slurmd not responding)"

    def _guard(self, f: Finding, node: str, total: int) -> tuple[str, str, list[str]] | None:
        """(guard, note, nodes already out) when taking `node` out would break a limit: the per-rule circuit
        breaker, or the global limit on nodes out of service across every rule, the watchdog and isolation."""
        b = self.cfg.breaker
        window_start = self.clock() - b.window_s
        same_rule = self.incidents.nodes_with_rule(f.rule_id, window_start, DRAINED_STATUSES)
        if breaker_trips(node, same_rule, total, b.max_nodes, b.max_fraction):
            limit = breaker_limit(total, b.max_nodes, b.max_fraction)
            return ("rule", f"circuit breaker: {len(same_rule | {node})} nodes with {f.rule_id} in "
                            f"{b.window_s:.0f}s exceeds {limit}; escalated instead of draining", sorted(same_rule))
        # a wave is nodes taken out inside the window; nodes still in a long hands-on repair from before are not
        # one (on a large cluster there are always some), but they count against the share of the cluster out
        recent = self.incidents.nodes_out(window_start, DRAINED_STATUSES)
        if wave_trips(node, recent, total, b.wave_max_nodes, b.wave_max_fraction):
            limit = breaker_limit(total, b.wave_max_nodes, b.wave_max_fraction)
            return ("wave", f"global limit: {len(recent | {node})} nodes out of service in {b.window_s:.0f}s (all "
                            f"rules, watchdog, isolation) exceeds {limit}; escalated instead of draining",
                    sorted(recent))
        out = recent | self.remediator.nodes_out()
        if wave_trips(node, out, total, total, b.wave_max_fraction):
            limit = breaker_limit(total, total, b.wave_max_fraction)
            return ("wave", f"global limit: {len(out | {node})} nodes out of service (in remediation or taken out "
                            f"in {b.window_s:.0f}s) exceeds {limit}, {b.wave_max_fraction:.0%} of the cluster; "
                            f"escalated instead of draining", sorted(out))
        return None

    def _escalate(self, f: Finding, node: str, guard: str, note: str, nodes_out: list[str]) -> Incident:
        """A guard tripped: nothing is done to the node; a person gets the incident, the evidence and the nodes
        already out (ticket to escalation_webhook, decision log, `sigma incidents` / `sigma explain`)."""
        inc = self._inc
        self.counts["guard", guard] += 1
        self.incidents.add_evidence(inc.id, guard={"guard": guard, "note": note, "nodes_out": nodes_out})
        key = f"escalate:{f.rule_id}:{node}:i{inc.id}"
        self.journal.plan(key, "ticket", node, incident_id=inc.id,
                          params={"url": self.rcfg.escalation_webhook,
                                  "payload": {"node": node, "rule": f.rule_id, "summary": f.summary, "guard": guard,
                                              "reason": note, "nodes_out": nodes_out, "evidence": f.evidence,
                                              "incident": inc.id}})
        inc = self._status("escalated", note)
        self.journal.execute(self.journal.get(key))
        self._say(inc, f"{'BREAKER' if guard == 'rule' else 'WAVE'} {node} ({f.rule_id}): {note}")
        return inc

    # ---------- job restarts ----------
    def _requeue_job(self, f: Finding, shadow: bool, jobs: list[Job]) -> Incident:
        inc = self._inc
        job = next((j for j in jobs if j.job_id == f.job_id), None)
        if not shadow and self.conn.execute("SELECT 1 FROM actions WHERE incident_id = ? AND kind = 'requeue'",
                                            (inc.id,)).fetchone():
            self._ensure_start_now(inc, avoid=[])  # decided before a crash: finish it
            inc = self._status("acted", "job requeued", close=True)
            self._say(inc, f"REQUEUE job {f.job_id} ({f.rule_id}): {f.summary}")
            return inc
        # A trainer that stops on a NaN loss has usually exited before the rule sees its last KPIs: a failed
        # batch job is requeued all the same and resumes from its last good checkpoint.
        if job is None or job.state not in RUNNING_STATES + RESTARTABLE_ENDED_STATES:
            inc = self._status("notified", "job not running")
            self._say(inc, f"NOTIFY job {f.job_id} ({f.rule_id}): {f.summary}; job not running")
            return inc
        if not job.requeue:  # submitted with --no-requeue: its owner restarts it, we only tell
            inc = self._status("notified", "job opted out of requeue (--no-requeue)")
            self._say(inc, f"NOTIFY job {f.job_id} ({f.rule_id}): {f.summary}; job opted out of requeue")
            return inc
        if shadow:
            self.journal.plan(f"requeue:{job.job_id}:i{inc.id}", "requeue", str(job.job_id), incident_id=inc.id,
                              shadow=True, params={"restarts_before": job.restarts})
            inc = self._status("shadow", self._observed_note())
            self._say(inc, f"SHADOW job {job.job_id} ({f.rule_id}): would requeue ({f.summary})")
            return inc
        self.incidents.add_evidence(inc.id, jobs=[{"job_id": job.job_id, "start_time": job.start_time,
                                                   "nodes": list(job.nodes), "restarts": job.restarts}])
        if self._requeue(job, inc, avoid=[], restart_failed=True):
            # the evidence stays behind (since_job): a new occurrence after the restart is a new incident
            inc = self._status("acted", "job requeued", close=True)
            self._say(inc, f"REQUEUE job {job.job_id} ({f.rule_id}): {f.summary}")
        else:
            w = self.cfg.watchdog
            inc = self._status("escalated", f"job {job.job_id} requeued {w.crash_loop_restarts} times in "
                                            f"{w.crash_loop_window_s:.0f}s for {f.rule_id}: crash loop, left for a "
                                            f"human")
            self._say(inc, f"ESCALATE job {job.job_id} ({f.rule_id}): {f.summary}; crash loop, not requeued")
        return inc

    def _requeue(self, job: Job, inc: Incident, avoid: list[str], restart_failed: bool = False,
                 crash_guard: bool = True) -> bool:
        """Requeue + start_now, unless this run was already requeued or the job is crash-looping (False). A job
        on a node being taken out is moved regardless (crash_guard=False): left there it would make no progress,
        and node faults do not repeat without bound (each drains a node, under the breaker)."""
        w = self.cfg.watchdog
        other = "kind='requeue' AND target=? AND state != 'shadow' AND COALESCE(incident_id, -1) != ?"
        last = self.conn.execute(f"SELECT MAX(created_at) FROM actions WHERE {other}",
                                 (str(job.job_id), inc.id)).fetchone()[0]
        if last is not None and last >= job.start_time:
            return True  # another incident already requeued this run; SLURM has not restarted it yet
        # A crash loop is the job failing by itself, the same way each time: requeues because a bad node was taken
        # out, and earlier faults of other kinds, do not count (guards.own_failures)
        since = self.clock() - w.crash_loop_window_s
        requeues = [(r[0], r[1], _run_nodes(r[2], job.job_id)) for r in self.conn.execute(
            "SELECT a.created_at, i.rule_id, i.evidence FROM actions a JOIN incidents i ON i.id = a.incident_id"
            " WHERE a.kind='requeue' AND a.target=? AND a.state IN ('done','planned') AND a.created_at >= ? AND"
            " i.scope = 'job' AND a.incident_id != ?", (str(job.job_id), since, inc.id))]
        node_faults = self.conn.execute(
            "SELECT i.opened_at, i.node FROM incidents i JOIN actions a ON a.incident_id = i.id WHERE"
            " i.scope = 'node' AND a.kind = 'drain' AND a.state = 'done' AND i.opened_at >= ?",
            (since - NODE_FAULT_S,)).fetchall() if requeues else []
        recent = own_failures(requeues, inc.rule_id, [(r[0], r[1]) for r in node_faults])
        if crash_guard and recent >= w.crash_loop_restarts:
            return False
        params = {"restarts_before": job.restarts, **({"restart_failed": True} if restart_failed else {})}
        key = f"requeue:{job.job_id}:i{inc.id}"
        if self.journal.get(key) is None:  # a replay after a crash keeps the requests it already opened
            params.update(self._ask_for_checkpoint(job, inc, avoid))
        requeue = self.journal.plan(f"requeue:{job.job_id}:i{inc.id}", "requeue", str(job.job_id),
                                    incident_id=inc.id, params=params)
        start = self.journal.plan(f"start_now:{job.job_id}:i{inc.id}", "start_now", str(job.job_id),
                                  incident_id=inc.id, params={**requeue.params, "avoid_nodes": avoid,
                                                              "expires_at": self.clock() + REQUEUE_FOLLOWUP_S})
        self.journal.execute(requeue)
        self.journal.execute(start)
        return True

    def _ask_for_checkpoint(self, job: Job, inc: Incident, avoid: list[str]) -> dict:
        """Before a running job is requeued, ask its healthy nodes for a just-in-time checkpoint of the current
        step; the requeue waits for the answer up to jit_checkpoint_timeout_s (act/jit.py). A job that already
        stopped (NaN: the trainer saved its last healthy step itself), whose trainer does not poll the control
        file (no `jit_poll_every` in its start event), or that made no step within the timeout (hung: its ranks
        are stuck in a collective and cannot reach the poll) unless its trainer answers while blocked
        (`jit_when_blocked`), is requeued at once."""
        timeout = self.cfg.jit_checkpoint_timeout_s
        healthy = [n for n in job.nodes if n not in avoid]
        nodes = list(job.nodes)
        if (timeout <= 0 or job.state != "RUNNING" or not healthy
                or not jit.answers_requests(self.conn, job.job_id, nodes, job.start_time)
                or jit.trainer_stopped(self.conn, job.job_id, job.start_time)
                or not (jit.stepping(self.conn, job.job_id, self.clock() - timeout)
                        or jit.answers_when_blocked(self.conn, job.job_id, nodes, job.start_time))):
            return {}
        ids = jit.request(self.conn, job.job_id, healthy, inc.id, timeout, self.clock())
        return {"jit_requests": ids, "jit_deadline": self.clock() + timeout, "jit_timeout_s": timeout}

    def _ensure_start_now(self, inc: Incident, avoid: list[str]) -> None:
        """After a crash between planning a requeue and its start_now, the job is no longer on the node:
        plan the missing start_now from the requeue row."""
        for row in self.conn.execute("SELECT target, params FROM actions WHERE incident_id = ? AND kind = 'requeue'"
                                     " AND state != 'shadow'", (inc.id,)).fetchall():
            key = f"start_now:{row['target']}:i{inc.id}"
            if self.journal.get(key) is None:
                params = json.loads(row["params"])
                self.journal.execute(self.journal.plan(key, "start_now", row["target"], incident_id=inc.id, params={
                    **params, "avoid_nodes": avoid, "expires_at": self.clock() + REQUEUE_FOLLOWUP_S}))

    # ---------- helpers ----------
    def _observed_note(self) -> str:
        return "observe mode: nothing done" if self.cfg.observing else "rule in shadow: nothing done"

    @staticmethod
    def _reason(f: Finding) -> str:
        return drain_reason(f.rule_id, f.summary)

    @staticmethod
    def _target(f: Finding) -> str:
        return f.node if f.scope == "node" and f.node else f"job {f.job_id}"

    def _say(self, inc: Incident, human: str) -> None:
        self.log.event("decision", human, incident=inc.id, rule=inc.rule_id, node=inc.node, job=inc.job_id,
                       status=self.incidents.get(inc.id).status, severity=inc.severity)


def _run_nodes(evidence: str, job_id: int) -> list[str]:
    """The nodes the requeued run had, from its incident's evidence (jobs: [...], or the watchdog's nodes)."""
    try:
        ev = json.loads(evidence or "{}")
    except ValueError:
        return []
    for j in ev.get("jobs") or ():
        if isinstance(j, dict) and j.get("job_id") == job_id:
            return list(j.get("nodes") or ())
    return list(ev.get("nodes") or ())
