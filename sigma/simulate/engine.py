"""The discrete-event simulation: a virtual clock, simulated nodes, jobs and SLURM, and either the controller's
own code deciding (arm "policy") or a person noticing and acting after a delay (arm "manual").

Under the policy the real `sigma.controller.loop.Controller` ticks against `SimSlurm` with the virtual clock: its
rules match the events the real sidecar makes of each fault's log line, it sees dead nodes through SLURM's flags,
and it decides, journals, drains, requeues, reboots, validates and resumes through the real decide / guards /
journal / remediation code and the real SLURM executors. Two things are not simulated step by step and come
from the fault model instead: the KPI stream of the jobs (the watchdog's and isolation's culprit arrives after the
soak-measured delay as the Finding isolation would make) and the people (tickets and manual playbooks are
repaired after the fault's repair time, escalations handled like the manual baseline).
"""

from __future__ import annotations

import heapq
import json
import math
from dataclasses import dataclass, field

import numpy as np

from sigma.controller.act.actions import SlurmActions
from sigma.controller.act.decisionlog import DecisionLog
from sigma.controller.act.remediation import REBOOT_SETTLE_S, TERMINAL
from sigma.controller.loop import Controller
from sigma.findings import Finding
from sigma.simulate.faults import KINDS
from sigma.simulate.slurm import KILL_WAIT_S, REQUEUE_BEGIN_S, SLURMD_TIMEOUT_S, SimJob, SimSlurm
from sigma.simulate.timeline import Timelines, duration
from sigma.simulate.trace import Outage
from sigma.simulate.workload import JobSpec

WATCH_S = 900.0  # while remediation is under way, tick at least this often (its timeouts are minutes long)
TOKENS_PER_S = 1000.0  # what a healthy simulated job reports after a restart (isolation verification reads it)


@dataclass
class Params:
    reboot_s: float = 600.0  # a GPU server's reboot until slurmd registers again
    validation_s: float = 900.0  # the comprehensive validation job
    human_median_min: float = 30.0  # a person notices a fault / picks up an escalation: lognormal, this median
    human_sigma: float = 1.08  # ... and this log-spread (90th percentile about 4x the median)
    poll_s: float = 1.0  # the controller's tick period when something is happening


@dataclass
class Fault:
    outage: Outage
    kind: str
    start: float
    detected_at: float | None = None
    noticed_at: float | None = None  # manual arm: the person saw it
    repaired_at: float | None = None
    repair_start: float | None = None
    due: float | None = None  # a fault that arrived while its node was out: its repair is done no sooner than this


@dataclass
class Result:
    arm: str
    start: float
    end: float
    nodes: int
    faults: int = 0
    absorbed: list[str] = field(default_factory=list)  # faults on a node already out of service
    jobs: list[SimJob] = field(default_factory=list)
    node_s: dict = field(default_factory=lambda: {"available": 0.0, "allocated": 0.0})
    series: list[tuple] = field(default_factory=list)  # (t, available, allocated, training) node counts
    recycle: list[dict] = field(default_factory=list)
    automation: dict = field(default_factory=dict)
    incidents: dict = field(default_factory=dict)
    escalations: int = 0
    detect_s: list[float] = field(default_factory=list)  # fault -> the controller has what names the node
    timelines: list[dict] = field(default_factory=list)  # the slowest faults, step by step
    episodes: list = field(default_factory=list)  # every fault's Episode (sigma.simulate.timeline)
    latent: int = 0  # faults seen only through a job that no job met before the end (on idle nodes)
    ticks: int = 0
    events: int = 0


class SimActions(SlurmActions):
    """The real SLURM executors against SimSlurm; a playbook command or the node's kernel-log acknowledgment
    succeeds on the simulated node, and a ticket goes to the simulated people."""

    def __init__(self, slurm, engine, adopt_reasons):
        super().__init__(slurm, adopt_reasons=adopt_reasons)
        self.engine = engine

    def _command(self, node, params, key):
        return json.dumps({"ok": True, "returncode": 0, "output": "simulated"})

    def _ask_node(self, node, params, key):
        return json.dumps({"ok": True, "output": "simulated"})

    def _ticket(self, node, params, key):
        self.engine.ticket(node, key)
        return "ticket to the simulated admins"


class SimLog(DecisionLog):
    """Keeps nothing on disk; counts events (a tick that logged something may have more to do next tick) and
    hands "waiting for an admin" to the simulated people."""

    def __init__(self, engine):
        super().__init__(None, keep=50)
        self.engine = engine
        self.count = 0
        self.next_step = False  # a decision or a move to a state whose handler runs on the next tick

    def event(self, what, human=None, **fields):
        self.count += 1
        if what == "decision" or (what == "lifecycle" and fields.get("to_state") not in TERMINAL):
            self.next_step = True
        tl = self.engine.tl
        node = fields.get("node") or fields.get("target")
        if node:
            if what == "lifecycle":
                tl.state(node, fields["to_state"], fields["to_state"] in TERMINAL)
            if human:
                tl.note(node, f"controller: {human}")
        if what == "waiting_for_admin":
            self.engine.ticket(fields["node"], f"manual:{fields['node']}")
        if self.engine.verbose and human:
            print(f"{self.engine.stamp()} {human}")


class SimController(Controller):
    """The controller with the KPI stream replaced by the fault model's watchdog/isolation outcomes."""

    engine: "Engine"

    def _watch(self, job, now, rule_findings, since_job):
        if job.job_id not in self.engine.pending_outcomes:
            return []
        return self.engine.outcomes_for(job, now)

    def _node_map(self, listed):
        """The same name -> node map and silent nodes as the controller's, from SimSlurm's own: its map copied (the
        tick's view stays as asked) and the few flagged nodes, not a thousand looked at after every change."""
        if self._nodes is None or self._nodes[0] is not listed:
            s = self.engine.slurm
            nodes = dict(s.node_map)
            silent = [nodes[n] for n in sorted(s.not_responding, key=s.position.__getitem__)]
            self._nodes = (listed, nodes, [n for n in silent if not n.rebooting])
        return self._nodes[1]

    def _snapshot(self, nodes, jobs, now):
        """Node snapshots feed `sigma report`'s utilisation; the simulation integrates utilisation exactly."""

    def _newest_data(self, nodes):
        """No node sends telemetry samples in the simulation: the answer the real query gives here, without it
        (nor listing the nodes)."""
        return {}


class Engine:
    def __init__(self, *, arm: str, names: list[str], outages: list[Outage], specs: list[JobSpec], start: float,
                 end: float, rng: np.random.Generator, params: Params, policy=None, log_events=None,
                 db: str = ":memory:", verbose: bool = False, timelines: int = 3):
        self.arm, self.names, self.start, self.end = arm, names, start, end
        self.rng, self.p, self.verbose = rng, params, verbose
        self.now = start
        self.tl = Timelines(lambda: self.now)
        self.timelines = timelines
        self.heap: list = []
        self.seq = 0
        self.dirty = False
        self._wake_at: float | None = None
        self.slurm = SimSlurm(names, self)
        self.faults: dict[str, Fault] = {}
        self.repairing: set[str] = set()  # nodes a person is repairing
        self.joined: dict[str, list[Outage]] = {}  # faults that arrived while their node was out (hands-on)
        self.pending_outcomes: dict[int, list[tuple[float, Finding]]] = {}
        self.verifying: set[int] = set()  # jobs isolation named a culprit in: their restarts are verified
        self.result = Result(arm, start, end, len(names))
        self._last_account = start
        self.user_jobs: list[SimJob] = []
        self._training = (-1, 0.0)  # (jobs' version, node-equivalents training): recounted only after a change
        self._jobs_version = 0  # bumped when a job starts, reaches its first step, slows, or stops
        self.log_events = log_events or {}
        for o in outages:
            if start <= o.start < end:
                self.at(o.start, self.fault, o)
        for spec in specs:
            self.at(start + spec.submit_h * 3600.0, self.submit, spec)
        self.ctrl = None
        if arm == "policy":
            cfg, rcfg, rules = policy
            from sigma.controller.db import open_db
            from sigma.paths import project_root

            self.ctrl = SimController(cfg, conn=open_db(db), slurm=self.slurm, rules=rules, remediation=rcfg,
                                      log=SimLog(self), clock=lambda: self.now, root=project_root())
            self.ctrl.engine = self
            self.ctrl.journal.executor = SimActions(self.slurm, self, tuple(cfg.adopt_drain_reasons))
            self.ctrl.start()

    # ---------- the event loop ----------
    def at(self, t: float, fn, *args) -> None:
        self.seq += 1
        heapq.heappush(self.heap, (t, self.seq, fn, args))

    def changed(self) -> None:
        self.dirty = True

    def due(self) -> None:
        """A time SLURM's scheduler looks again (a BeginTime passes): the loop schedules after every event; the
        controller ticks only if a job starts."""

    def run(self) -> Result:
        while self.heap and self.heap[0][0] <= self.end:
            t = self.heap[0][0]
            self._account(t)
            self.now = t
            while self.heap and self.heap[0][0] == t:
                _, _, fn, args = heapq.heappop(self.heap)
                self.result.events += 1
                fn(*args)
            self.schedule()
            if self.ctrl is not None and self.dirty:
                self.tick()
        self._account(self.end)
        if self.result.series:
            self.result.series.append((self.end, *self.result.series[-1][1:]))  # the plot runs to the end
        self.now = self.end
        for j in self.slurm.job_map.values():
            if j.state == "RUNNING" and j.validation_of is None:
                self._end_run(j, "end of simulation")
        self.result.jobs = [j for j in self.slurm.job_map.values() if j.validation_of is None]
        self.result.timelines = self.tl.slowest(self.timelines, self.end)
        self.result.episodes = self.tl.all
        self.result.latent = sum(1 for f in self.faults.values() if KINDS[f.kind].job_only and f.detected_at is None
                                 and f.noticed_at is None)
        if self.ctrl is not None:
            from sigma.controller.report.metrics import automation, recycling

            self.result.recycle = recycling(self.ctrl.conn, self.start)
            self.result.automation = automation(self.ctrl.conn, self.start)
            self.result.incidents = {f"{r[0]} {r[1]}": r[2] for r in self.ctrl.conn.execute(
                "SELECT rule_id, status, COUNT(*) FROM incidents GROUP BY rule_id, status ORDER BY 1, 2")}
        return self.result

    def tick(self) -> None:
        self.dirty = False
        self.ctrl.log.next_step = False
        self.ctrl.tick()
        self.result.ticks += 1
        self.schedule()
        if self.ctrl.log.next_step:
            self._wake(self.now + self.p.poll_s)  # one state-machine step per tick: tick again
        elif self._timers_running():
            self._wake(self.now + WATCH_S, again=True)  # timeouts and retries, minutes long: WATCH_S after this tick
        else:
            self._wake_at = None  # nothing can time out: a wake-up still pending has nothing to do
        self.dirty = False

    def _timers_running(self) -> bool:
        """Something in the controller may time out or retry: a planned action, or a remediation step other than
        waiting for a person (a manual or ticket playbook waits without a deadline; the repair wakes it)."""
        if self.ctrl.journal.pending():
            return True
        rem = self.ctrl.remediator
        return any(not (lc.state == "remediating" and rem._playbook(lc).kind in ("manual", "ticket"))
                   for lc in rem.unfinished())

    def _wake(self, t: float, again: bool = False) -> None:
        """One pending wake-up at a time: an earlier one already due covers a later request, unless the tick just
        done looked at what the earlier one was for (`again`)."""
        if not again and self._wake_at is not None and self.now < self._wake_at <= t:
            return
        self._wake_at = t
        self.at(t, self._woken, t)

    def _woken(self, t: float) -> None:
        if self._wake_at == t:  # not one a later tick replaced or cancelled
            self._wake_at = None
            self.changed()

    def stamp(self) -> str:
        import datetime as dt

        return dt.datetime.fromtimestamp(self.now, dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S")

    # ---------- utilisation (integrated exactly between events) ----------
    def _account(self, t: float) -> None:
        dt = t - self._last_account
        if dt <= 0:
            return
        avail, alloc = self.slurm.available, self.slurm.allocated
        if self._training[0] != self._jobs_version:
            self._training = (self._jobs_version, sum(
                len(j.nodes) * (j.runs[-1]["speed"] if j.runs[-1]["first_step"] <= self._last_account else 0)
                for j in self.user_jobs if j.state == "RUNNING"))
        training = self._training[1]
        self.result.node_s["available"] += avail * dt
        self.result.node_s["allocated"] += alloc * dt
        series = self.result.series
        point = (self._last_account, avail, alloc, training)
        if not series or series[-1][1:] != point[1:]:
            series.append(point)
        self._last_account = t

    # ---------- jobs ----------
    def submit(self, spec: JobSpec) -> None:
        self.user_jobs.append(self.slurm.new_job(spec.name, spec.nodes, spec.hours * 3600.0 if spec.hours else None,
                           spec.checkpoint_min * 60.0, spec.restart_min * 60.0))
        self.changed()

    def schedule(self) -> None:
        """SLURM's scheduler: pending jobs in submission order onto free, available nodes outside reservations;
        a validation job onto its node inside its reservation."""
        s = self.slurm
        pending = [j for j in s.live.values() if j.state == "PENDING" and j.begin_at <= self.now
                   and j.reason in ("None", "BeginTime", "Priority", "Resources")]
        if not pending:
            return
        free = sorted(s.free)  # names sort as the nodes are numbered
        for j in pending:
            if j.validation_of is not None:
                node = j.validation_of
                if node in free and s.reserved.get(node) == j.reservation:
                    free.remove(node)
                    self._start(j, (node,))
                continue
            usable = [n for n in free if n not in s.reserved]
            if len(usable) >= j.nodes_needed:
                chosen = tuple(usable[:j.nodes_needed])
                for n in chosen:
                    free.remove(n)
                self._start(j, chosen)
            elif j.reason != "Resources":
                j.reason = "Resources"
                s.jobs_changed(j)

    def _start(self, j: SimJob, nodes: tuple[str, ...]) -> None:
        s = self.slurm
        j.state, j.reason, j.nodes, j.start_time = "RUNNING", "None", nodes, self.now
        j.run += 1
        self._jobs_version += 1
        s.jobs_changed(j)
        for n in nodes:
            s.set_node(n, state="allocated", alloc_cpus=s.node_map[n].cpus)
        if j.validation_of is not None:
            self.tl.note(j.validation_of, f"validation job {j.job_id} starts ({duration(self.p.validation_s)})")
            self.at(self.now + self.p.validation_s, self._validation_done, j, j.run)
            return
        run = {"start": self.now, "first_step": self.now + j.restart_s, "fault": None, "speed": 1.0,
               "nodes": len(nodes), "restart": j.restarts}
        j.runs.append(run)
        for n in nodes:
            f = self.faults.get(n)
            if f is not None:  # an undetected fault: the job stalls on it from the start
                self._degrade(j, f)
        if j.work_s is not None and run["fault"] is None:
            self.at(run["first_step"] + (j.work_s - j.saved_s), self._complete, j, j.run)
        self.at(run["first_step"], self._first_step, j, j.run)

    def _first_step(self, j: SimJob, run: int) -> None:
        """The trainer's first KPIs after a (re)start: a start event and a few steps (isolation verifies on them);
        on a node with a fault only a job shows (a hang, a slow part) the trainer starts, then hangs or crawls."""
        self._jobs_version += 1  # training starts now
        if self.ctrl is None or j.run != run or j.state != "RUNNING":
            return
        faulted = j.runs[-1]["fault"] is not None
        if faulted and not KINDS[j.runs[-1]["fault_kind"]].job_only:
            return
        conn, jid = self.ctrl.conn, json.dumps([j.job_id])
        with conn:
            conn.execute("INSERT INTO events (node, ts, source, kind, job_ids) VALUES (?,?,'kpi','start',?)",
                         (j.nodes[0], self.now, jid))
            if not faulted:
                conn.executemany("INSERT INTO kpis (node, ts, job_id, rank, step, step_time_s, tokens_per_s) VALUES "
                                 "(?,?,?,0,?,10.0,?)", [(j.nodes[0], self.now + 10.0 * (i + 1), j.job_id, i + 1,
                                                         TOKENS_PER_S) for i in range(6)])
        if j.job_id in self.verifying:  # isolation's verification reads these steps on a tick, or its deadline passes
            self.at(self.now + 61.0, self.changed)
            self.at(self.now + self.ctrl.cfg.isolation.verify_after_s + 1.0, self.changed)

    def _degrade(self, j: SimJob, f: Fault) -> None:
        run = j.runs[-1]
        kind = KINDS[f.kind]
        if kind.speed >= 1.0:
            return  # the job does not feel it (a fan or power supply alarm)
        self._jobs_version += 1
        if run["fault"] is None:
            run["fault"] = max(self.now, run["first_step"]) if kind.speed else self.now
            run["fault_kind"] = f.kind
        run["speed"] = min(run["speed"], kind.speed)
        if kind.job_only:
            node = self.names[f.outage.node]
            if self.now > f.start:
                self.tl.note(node, f"job {j.job_id} starts on the node: the fault shows")
            self.tl.shown(node)
            if self.arm == "policy":  # the watchdog and isolation read the job's steps: none before its first
                self.at(max(self.now, run["first_step"]) + self._delay(kind), self._outcome, j, j.run, f)
            else:
                self._notice(node, f)

    def _end_run(self, j: SimJob, why: str, completed: bool = False) -> None:
        run = j.runs[-1]
        end = self.now
        fault = run["fault"] if run["fault"] is not None else end
        healthy = max(0.0, min(fault, end) - run["first_step"])
        slow = run["speed"] * max(0.0, end - max(fault, run["first_step"])) if run["fault"] is not None else 0.0
        progress = healthy + slow
        kept = progress if completed else math.floor(progress / j.checkpoint_s) * j.checkpoint_s
        if j.work_s is not None:
            kept = min(kept, j.work_s - j.saved_s)
        run.update(end=end, why=why, progress=progress, kept=kept)
        j.saved_s += kept
        self._jobs_version += 1

    def _complete(self, j: SimJob, run: int) -> None:
        if j.run != run or j.state != "RUNNING" or j.runs[-1]["fault"] is not None:
            return
        self._end_run(j, "completed", completed=True)
        j.state, j.end_time = "COMPLETED", self.now
        self.slurm.jobs_changed(j)
        self.changed()
        self._free(j.nodes)
        j.nodes = ()

    def requeue(self, j: SimJob, hold: bool = False) -> None:
        """scontrol requeue (or SLURM's own after a node failure): the run ends, the old processes get KillWait,
        the job waits on its BeginTime."""
        self._end_run(j, "requeued")
        nodes = j.nodes
        j.state, j.reason, j.nodes = "PENDING", "JobHeldAdmin" if hold else "BeginTime", ()
        self.slurm.jobs_changed(j)
        j.restarts += 1
        j.requeued_at = self.now
        j.begin_at = self.now + REQUEUE_BEGIN_S
        self.at(self.now + KILL_WAIT_S, self._free, nodes)
        self.at(j.begin_at, self.due)
        self.changed()

    def cancel(self, j: SimJob) -> None:
        if j.state == "RUNNING":
            if j.validation_of is None:
                self._end_run(j, "cancelled")
            self._free(j.nodes)
        j.state, j.nodes = "CANCELLED", ()
        self.slurm.jobs_changed(j)
        if j.validation_of is not None:
            self._record(j, "CANCELLED", 0)
        self.changed()

    def _free(self, nodes) -> None:
        """Jobs' processes left these nodes. The controller ticks if one is out of service (it may be waiting for
        the node to empty); the scheduler looks at the others after this event anyway."""
        s = self.slurm
        for n in nodes:
            if not s.node_map[n].alloc_cpus or any(n in j.nodes and j.state == "RUNNING" for j in s.live.values()):
                continue  # freed already (set DOWN), or another job runs there
            s.set_node(n, alloc_cpus=0, state="down" if s.node_map[n].state == "down" else "idle")
            if "REBOOT_REQUESTED" in s.node_map[n].flags:
                self._reboot(n)
            node = s.node_map[n]
            if not node.available or n in s.reserved or node.flags:
                self.changed()

    def _validation_done(self, j: SimJob, run: int) -> None:
        if j.run != run or j.state != "RUNNING":
            return
        healthy = j.validation_of not in self.faults
        j.state = "COMPLETED" if healthy else "FAILED"
        self.slurm.jobs_changed(j)
        self.tl.note(j.validation_of, f"validation job {j.job_id} "
                                      f"{'passes' if healthy else 'fails: the fault is still there'}")
        self._record(j, j.state, 0 if healthy else 1)
        self._free(j.nodes)
        j.nodes = ()
        self.slurm.retire(j)

    def _record(self, j: SimJob, state: str, rc: int) -> None:
        from sigma.slurm.types import AccountingRecord

        self.slurm.record(AccountingRecord(job_id=j.job_id, name=j.name, state=state, nodes=(j.validation_of,),
                                           start_time=int(j.start_time), end_time=int(self.now), return_code=rc))

    # ---------- faults ----------
    def fault(self, o: Outage) -> None:
        node = self.names[o.node]
        n = self.slurm.node_map[node]
        self.result.faults += 1
        what = f"{o.kind}{f' ({o.detail})' if o.detail else ''} [{o.origin}]"
        if node in self.faults or node in self.repairing or not n.responding:
            # already down or under repair: one outage, which a fault needing hands lengthens if its own repair
            # ends later (the people at the node fix both; neither arm loses the second fault's repair)
            self.result.absorbed.append(o.origin)
            hands = not KINDS[o.kind].reboot_fixes and o.end is not None
            if hands:
                self.joined.setdefault(node, []).append(o)
                self.tl.hands_on(node, o.end)
            self.tl.note(node, f"another fault on the node before it is repaired, joins this outage: {what}"
                               f"{'; its repair ends ' + duration(o.end - self.now) + ' from now' if hands else ''}")
            return
        f = self.faults[node] = Fault(o, o.kind, self.now)
        kind = KINDS[o.kind]
        on = [j for j in self.slurm.live.values()
              if j.state == "RUNNING" and node in j.nodes and j.validation_of is None]
        hands = 0.0 if kind.reboot_fixes else self._hands_on(f)
        self.tl.fault(node, o.kind, o.detail, o.origin, f"fault: {what}; "
                      f"{'jobs ' + str([j.job_id for j in on]) + ' on the node' if on else 'the node is idle'}; "
                      f"{'a reboot fixes it' if kind.reboot_fixes else 'hands-on repair: ' + duration(hands)}", hands)
        for j in on:
            self._degrade(j, f)
        if kind.detect == "slurm":
            self.at(self.now + self._delay(kind), self._not_responding, node, f)
        elif self.arm == "policy" and kind.detect in ("log", "health"):
            self.at(self.now + self._delay(kind), self._ingest, node, f)
        if kind.detect == "people" or (self.arm == "manual" and not kind.job_only):
            self._notice(node, f)  # job-only faults: noticed once a job shows them (_degrade)

    def _notice(self, node: str, f: Fault) -> None:
        """A person will notice the fault after their delay (nothing Sigma reads shows a `people` fault, so they do
        in both arms; in the manual arm they notice every fault)."""
        if f.noticed_at is None:
            f.noticed_at = self.now + self._human()
            self.at(f.noticed_at, self.human_repair, node, f)

    def _delay(self, kind) -> float:
        lo, hi = kind.delay_s
        if kind.detect == "watchdog":
            extra = self.ctrl.cfg.watchdog.hang_timeout_s if self.ctrl else 120.0
            lo, hi = lo + extra, hi + extra
        return float(self.rng.uniform(lo, hi))

    def _human(self) -> float:
        return float(self.rng.lognormal(math.log(self.p.human_median_min * 60.0), self.p.human_sigma))

    def _ingest(self, node: str, f: Fault) -> None:
        """The fault's log line or health verdict, as the real sidecar turns it into an event, arrives in the
        controller database."""
        if self.faults.get(node) is not f:
            return
        e = self.log_events[f.kind]
        jobs = [j.job_id for j in self.slurm.live.values() if node in j.nodes and j.state == "RUNNING"]
        fields = e["fields"] if isinstance(e["fields"], str) else json.dumps(e["fields"])
        with self.ctrl.conn:
            self.ctrl.conn.execute("INSERT INTO events (node, ts, source, kind, severity, message, fields, job_ids)"
                                   " VALUES (?,?,?,?,?,?,?,?)", (node, f.start, e["source"], e["kind"], e["severity"],
                                                                 e["message"], fields, json.dumps(jobs)))
        self._detected(node, f, f"the sidecar's {e['source']} event reaches the controller: {str(e['message'])[:80]}")
        self.changed()

    def _detected(self, node: str, f: Fault, how: str) -> None:
        f.detected_at = self.now
        self.result.detect_s.append(self.now - f.start)
        self.tl.detected(node, f"detected: {how}")

    def _not_responding(self, node: str, f: Fault) -> None:
        if self.faults.get(node) is not f:
            return
        self.slurm.add_flag(node, "NOT_RESPONDING")
        if self.arm == "policy":
            self._detected(node, f, "SLURM flags the node NOT_RESPONDING")
        self.at(self.now + SLURMD_TIMEOUT_S - (self.now - f.start), self._slurmd_timeout, node, f)
        self.changed()

    def _slurmd_timeout(self, node: str, f: Fault) -> None:
        """SLURM sets the silent node DOWN and requeues what still runs there."""
        n = self.slurm.node_map[node]
        if self.faults.get(node) is not f or n.state == "down":
            return  # repaired, or already DOWN (the controller's set_down): nothing left for SLURM to do
        self.slurm.set_node(node, state="down", reason=n.reason or "Not responding")
        self.tl.note(node, "SLURM sets the node DOWN (SlurmdTimeout)")
        self.node_down(node)

    def node_down(self, node: str) -> None:
        """A node set DOWN (SlurmdTimeout, or the controller's `scontrol update State=DOWN`): what still runs there
        is requeued, a validation job cancelled, and its old processes are gone at once."""
        for j in list(self.slurm.live.values()):
            if j.state == "RUNNING" and node in j.nodes:
                if j.validation_of is None:
                    self.requeue(j)  # these tell the controller (changed)
                else:
                    self.cancel(j)
        self._free([node])

    def _outcome(self, j: SimJob, run: int, f: Fault) -> None:
        """The watchdog / isolation outcome (the culprit), after the measured delay, for the controller's next
        tick: the Finding loop.Controller._isolate makes."""
        node = self.names[f.outage.node]
        if j.run != run or j.state != "RUNNING" or self.faults.get(node) is not f:
            return
        kind = KINDS[f.kind]
        hang = kind.detect == "watchdog"
        rule_id = "watchdog-hang" if hang else "isolation-outlier"
        summary = (f"job {j.job_id} made no progress; {node} stopped its heartbeats" if hang else
                   f"job {j.job_id} throughput dropped; the other ranks wait for {node}")
        finding = Finding(rule_id=rule_id, source="isolation", scope="node", severity="error", action="drain",
                          summary=f"{summary}; {node} is the culprit"[:100], first_ts=f.start, last_ts=self.now,
                          node=node, job_id=j.job_id, category="hang" if hang else "isolation",
                          evidence={"verify": {"job_id": j.job_id, "kind": "watchdog-hang" if hang else
                                               "watchdog-throughput-drop", "baseline": None if hang else
                                               TOKENS_PER_S}})
        self.pending_outcomes.setdefault(j.job_id, []).append((self.now, finding))
        self.verifying.add(j.job_id)
        self._detected(node, f, f"{rule_id}: {summary}")
        self.changed()

    def outcomes_for(self, job, now: float) -> list[Finding]:
        waiting = self.pending_outcomes.pop(job.job_id, [])
        return [f for t, f in waiting if t <= now and f.node in job.nodes]

    # ---------- repairs ----------
    def reboot_requested(self, node: str) -> None:
        if not self.slurm.node_map[node].alloc_cpus:
            self._reboot(node)

    def _reboot(self, node: str) -> None:
        self.slurm.drop_flag(node, "REBOOT_REQUESTED")
        self.slurm.add_flag(node, "REBOOT_ISSUED")
        self.tl.note(node, f"reboot starts ({duration(self.p.reboot_s)})")
        self.at(self.now + self.p.reboot_s, self._booted, node)

    def _booted(self, node: str) -> None:
        f = self.faults.get(node)
        fixed = f is not None and KINDS[f.kind].reboot_fixes
        self.tl.note(node, "rebooted: " + ("the fault is gone" if fixed else "no fault left" if f is None else
                                           f"the fault is still there ({f.kind}: a reboot does not fix it)"))
        if fixed:
            self._fixed(node, f)
        n = self.slurm.node_map[node]
        flags = tuple(x for x in n.flags if x not in ("REBOOT_ISSUED", "REBOOT_REQUESTED", "NOT_RESPONDING"))
        left = self.faults.get(node)
        if left is not None and left.kind == "node-death":
            flags += ("NOT_RESPONDING",)  # a dead host does not come back from a reboot
        self.slurm.set_node(node, state="down", flags=tuple(sorted(set(flags) | {"DRAIN"})),
                            slurmd_start_time=int(self.now), boot_time=int(self.now))
        self.at(self.now + REBOOT_SETTLE_S + 0.5, self.changed)  # the controller resumes no sooner (no tick now)

    def _fixed(self, node: str, f: Fault) -> Fault | None:
        """The fault is repaired; a fault that joined the outage and is not repaired yet is now the node's
        (returned: the people at the node go on with it)."""
        f.repaired_at = self.now
        self.faults.pop(node, None)
        self.slurm.drop_flag(node, "NOT_RESPONDING")
        left = [o for o in self.joined.pop(node, []) if o.end > self.now]
        if not left:
            return None
        o = max(left, key=lambda o: o.end)
        nf = self.faults[node] = Fault(o, o.kind, o.start, detected_at=f.detected_at, noticed_at=f.noticed_at,
                                       due=o.end)
        if o.kind == "node-death":
            self.slurm.add_flag(node, "NOT_RESPONDING")
        self.tl.note(node, f"still faulty: the fault that joined ({o.kind} [{o.origin}]) is repaired in "
                           f"{duration(o.end - self.now)}")
        return nf

    def ticket(self, node: str, key: str) -> None:
        """A ticket or a manual playbook reaches the people: a remediation one is repaired after the fault's
        repair time and marked repaired (`sigma nodes --repaired`); an escalation is handled by hand."""
        if key.startswith("escalate:"):
            self.result.escalations += 1
            self.tl.note(node, "escalated to people: they repair it by hand")
            self.at(self.now + self._human(), self.human_repair, node, self.faults.get(node))
            return
        f = self.faults.get(node)
        took = self._repair_time(f)
        self.tl.note(node, f"ticket to people: repaired in {duration(took)}"
                           f"{' (the recorded repair)' if f is not None and not KINDS[f.kind].reboot_fixes else ''}")
        self.at(self.now + took, self._repaired, node, f)

    def _repair_time(self, f: Fault | None) -> float:
        """A ticket's time to repaired: a reboot-fixable fault waits for someone, then a reboot; a hardware fault
        takes its recorded (or modelled) outage time, which already includes waiting for people."""
        if f is None or KINDS[f.kind].reboot_fixes:
            return self._human() + self.p.reboot_s
        return self._hands_on(f)

    def _hands_on(self, f: Fault | None) -> float:
        if f is None or KINDS[f.kind].reboot_fixes or not f.outage.repair_s:
            return self.p.reboot_s
        if f.due is not None:  # joined an outage: repaired by its own recorded end
            return max(60.0, f.due - self.now)
        return f.outage.repair_s

    def _repaired(self, node: str, f: Fault | None) -> None:
        if f is not None and self.faults.get(node) is f:
            left = self._fixed(node, f)
            if left is not None:  # the people go on with the fault that joined before they call it repaired
                self.at(self.now + self._hands_on(left), self._repaired, node, left)
                return
        self.slurm.set_node(node, slurmd_start_time=int(self.now))
        try:
            self.ctrl.remediator.mark_repaired(node, by="admin")
            self.tl.note(node, "people mark it repaired (sigma nodes --repaired)")
        except ValueError:
            lc = self.ctrl.remediator.get(node)
            if lc is not None and lc.state in ("drained", "waiting_jobs"):
                self.at(self.now + 60.0, self._repaired, node, None)  # not waiting for it yet: try again
        self.changed()

    def human_repair(self, node: str, f: Fault | None) -> None:
        """What a person does without automation (and with an escalation): drain the node with their own reason,
        requeue its jobs, repair it (a reboot, or the fault's hands-on repair time), resume it."""
        if node in self.repairing or (f is not None and self.faults.get(node) is not f):
            return
        self.repairing.add(node)
        n = self.slurm.node_map[node]
        if not n.drained or n.drained_by_sigma:
            self.slurm.admin_drain(node, "admin: repair")
        requeued = []
        for j in list(self.slurm.live.values()):
            if j.state == "RUNNING" and node in j.nodes and j.validation_of is None:
                self.requeue(j)
                requeued.append(j.job_id)
        if f is not None:
            f.repair_start = self.now
        took = self._hands_on(f)
        kind = KINDS[f.kind] if f is not None else None
        first = kind is not None and kind.tried_first and not kind.reboot_fixes
        if first:  # they do what the symptom says first, as the policy does: a reboot that does not fix it
            took += self.p.reboot_s
        if f is not None and f.detected_at is None:
            self.tl.detected(node, "a person notices")
        self.tl.note(node, f"a person drains it, requeues {requeued or 'no jobs'} and repairs it "
                           f"({'a reboot' if took == self.p.reboot_s else 'hands-on'}"
                           f"{' after a reboot that did not fix it' if first else ''}: {duration(took)})")
        self.at(self.now + took, self._human_done, node, f)

    def _human_done(self, node: str, f: Fault | None) -> None:
        if f is not None and self.faults.get(node) is f:
            left = self._fixed(node, f)
            if left is not None:  # a fault that joined the outage: the person goes on with it
                left.repair_start = f.repair_start
                self.at(self.now + self._hands_on(left), self._human_done, node, left)
                return
        self.repairing.discard(node)
        self.tl.note(node, "the person resumes it")
        self.slurm.set_node(node, state="down" if node in self.faults else "idle")
        self.slurm.resume([node], force=True)
        self.result.recycle.append({"node": node, "detect_s": (f.noticed_at or self.now) - f.start if f else None,
                                    "repair_s": self.now - (f.repair_start or self.now) if f else None,
                                    "total_s": self.now - f.start if f else None})
        self.changed()
