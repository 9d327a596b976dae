"""One controller tick: look at SLURM and the database, detect, decide, follow up, remediate, verify.

Detection is pure (sigma.rules.matcher, watchdog, isolation); this module only fetches rows and wires results.
"""

from __future__ import annotations

import json
import statistics
import time
from collections import Counter
from collections.abc import Callable, Iterable
from pathlib import Path

from sigma.controller.act.actions import HELD_REASONS, SlurmActions
from sigma.controller.act.jit import JitGate
from sigma.controller.act.noderequests import NodeRequests
from sigma.controller.report.detection import kernel_logs
from sigma.controller.report.losses import record_losses
from sigma.config import ConfigError
from sigma.controller.config import (ControllerConfig, RemediationConfig, load_controller_config,
                                     load_remediation_config, resolve, unknown_rule_ids)
from sigma.controller.db import KPI_COLUMNS, open_db
from sigma.controller.newest import NewestPerKey
from sigma.controller.act.decide import RUNNING_STATES, Decider
from sigma.controller.act.decisionlog import DecisionLog
from sigma.controller.detect.features import job_matrices
from sigma.findings import Finding
from sigma.controller.act.incidents import Incidents
from sigma.controller.detect.budget import Calibrator
from sigma.controller.detect.healthy import NODES_PER_TICK, SAVE_S, HealthyFeed
from sigma.controller.detect.explain import explain_nodes
from sigma.controller.detect.isolation import Scores, Streaks, Verdict, baseline, pick_outlier, score
from sigma.controller.detect.laggard import WINDOW_S as LAGGARD_WINDOW_S
from sigma.controller.detect.laggard import (behind_node, disk_stall_shares, heartbeats_settled, held_shares,
                                             silent_node, steady_window, waited_for_node)
from sigma.controller.act.journal import ActionRow, Journal
from sigma.controller.act.remediation import Remediator
from sigma.controller.detect.kpiwindow import KpiWindow
from sigma.controller.detect.samples import bucket_stats, recent_for_metrics
from sigma.controller.detect.series import SeriesWindows
from sigma.controller.detect.prochang import IDLE_CORES, judge_processes, proc_labels
from sigma.controller.detect.prochang import METRICS as PROC_METRICS
from sigma.controller.detect.watchdog import JobInfo, RowsView, judge, typical_throughput
from sigma.rules.loader import load_rules
from sigma.rules.matcher import (MAX_EVIDENCE_ROWS, EventWindows, evaluate_composites, evaluate_series,
                                 metric_findings, normalise)
from sigma.rules.schema import Rule
from sigma.slurm.client import Slurm
from sigma.slurm.types import Job, Node

WINDOW_BUCKETS = 6  # isolation window split in this many buckets (a counter's rate and jitter per bucket)
HISTORY_BUCKETS = 12  # each node's history before the window, in this many buckets (temporal score), each read
# for as long as one window bucket: a sample of the hour, comparable with the window's buckets
HISTORY_REFRESH_S = 300.0
MAX_NEW_EVENTS_PER_TICK = 50_000  # new events matched per tick at most; a burst beyond this is matched next tick
BACKFILL_EVENTS_PER_TICK = 10_000  # at start and after a reload, older events of the rule windows read per tick
INGEST_BEHIND_S = 5.0  # a job's newest data older than this: the watchdog says it judges the job as of then
PROC_JUDGE_S = 5.0  # a job without KPIs is judged from its processes at most this often
KERNEL_LOG_CHECK_S = 30.0  # how often the nodes' kernel-log reports are looked at
RESTART_KEYS = ("db", "listen", "ingest_secret_file", "log_dir", "slurm_conf")  # a reload keeps the running ones
BUDGET_KEY = "isolation.budget"  # detector_state: the false-drain budget's healthy tails (budget.Calibrator)
ASKS_ISOLATION = ("watchdog-hang", "watchdog-throughput-drop", "watchdog-straggler")  # the watchdog's anomalies


def job_shape(job: Job) -> str:
    """Jobs of the same name and size: their nodes differ from each other the same way in every run."""
    return f"{job.name or 'job'} x{len(job.nodes)}"


class Controller:
    def __init__(self, cfg: ControllerConfig, *, conn=None, slurm: Slurm | None = None,
                 rules: list[Rule] | None = None, remediation: RemediationConfig | None = None,
                 log: DecisionLog | None = None, clock: Callable[[], float] = time.time, root: Path | None = None):
        self.cfg = cfg
        self.clock = clock
        self.root = root
        self.conn = conn if conn is not None else open_db(cfg.db)
        self.slurm = slurm or Slurm(cfg.slurm_conf or None)
        self.rules = rules if rules is not None else load_rules(resolve(cfg.rules, root), overrides=self._overrides(cfg))
        # a knowledge base read from disk is re-read when its files change (a promoted learned rule, an edit, a site
        # override)
        self._rules_path = None if rules is not None else resolve(cfg.rules, root)
        self._rules_stamp = self._stamp()
        self.rcfg = remediation or load_remediation_config(resolve(cfg.remediation, root))
        self._remediation_from_disk = remediation is None  # a reload re-reads only what came from a file
        self.log = log or DecisionLog(cfg.log_dir)
        self.journal = Journal(self.conn, SlurmActions(self.slurm, adopt_reasons=tuple(cfg.adopt_drain_reasons),
                                                        jit_gate=JitGate(self.conn, clock),
                                                        node_requests=NodeRequests(self.conn, clock)),
                               clock=clock,
                               max_attempts=cfg.max_action_attempts, on_change=self._action_changed,
                               observed=self._observed)
        self.incidents = Incidents(self.conn, clock)
        self.remediator = Remediator(self.conn, self.journal, self.incidents, self.rcfg, self.log, self.slurm,
                                     clock=clock, root=root, adopt_reasons=tuple(cfg.adopt_drain_reasons))
        self.decider = Decider(self.conn, self.journal, self.incidents, self.remediator, cfg, self.rcfg, self.log,
                               clock)
        self.streaks = Streaks(self._state("isolation_streaks", {}))
        self.healthy = HealthyFeed(self.conn, cfg.isolation.window_s, clock)
        self.calibrator = self._calibrator(cfg)
        self._calibrated_at = clock()
        self.no_culprit_rounds: dict[int, int] = {}
        self._history_cache: dict[str, tuple[float, float | None]] = {}
        self._node_history: dict[tuple[str, ...], tuple[float, list[tuple]]] = {}
        self._last_snapshot: dict[str, tuple] = {}
        self._last_snapshot_ts = 0.0
        self.ticks = 0
        self._counts: Counter = Counter()  # bad input and guard-rail outcomes, exported on /metrics
        self.disabled: dict[str, dict] = {}  # rules that raised at run time: id -> error (until reload/restart)
        self._saved: dict[str, str] = {}  # detector_state as last written by this process
        self._save_state("disabled_rules", self.disabled)
        self.windows = EventWindows(self.rules)
        self.series = SeriesWindows(self.conn)
        self.kpi_window: KpiWindow | None = None  # the watchdog's rows, fed with the new ones each tick
        # evidence from before a node came back (or an admin took it over), or from before a job's requeue, is done
        self.node_back = NewestPerKey(self.conn, "SELECT node, MAX(ts) FROM lifecycle_transitions WHERE to_state IN"
                                      " ('resumed', 'returned', 'admin') AND ts >= ? GROUP BY node")
        self.job_requeued = NewestPerKey(self.conn, "SELECT target, MAX(created_at) FROM actions WHERE kind = 'requeue'"
                                         " AND state != 'shadow' AND created_at >= ? GROUP BY target")
        self._behind_logged = 0.0
        self._active: list[Rule] | None = None  # active_rules, listed again after a rule fails or a reload
        self._placed: tuple | None = None  # (squeue's answer, where jobs run, running jobs, node -> their job ids)
        self._nodes: tuple | None = None  # (sinfo's answer, name -> node, the silent ones)
        self._proc_judged: dict[int, float] = {}  # job -> when its processes were last judged
        self._proc_busy: set[tuple[int, float]] = set()  # (job, run start) whose processes were seen busy
        self._kpi_jobs: set[int] = set()  # running jobs known to write KPI lines
        self._judged_for: list[Job] | None = None  # the running jobs the three above were last pruned to
        self._stale: tuple = (None, None, 0.0)  # (rules, policy, when a passive incident is stale)
        self._since_job_cache: tuple = (-1, {})  # (job_requeued.version, job -> when last requeued)
        self._watched_cache: tuple = (None, -1, [])  # (running jobs, job_requeued.version, the jobs watched)
        self._last_event_id: int | None = None  # events matched so far (None: read the rule windows first)
        self._backfill: tuple[int, int, list[str] | None] | None = None  # (lowest id, next id down, rule ids)
        self.http_port: int | None = None
        self.last_tick_s = 0.0
        self._kernel_logs: dict[str, tuple] = {}  # node -> (reads its kernel log, source), as last said
        self._kernel_logs_at = float("-inf")

    def _observed(self, incident_id: int | None) -> bool:
        """In observe mode, whether an incident's actions are only recorded: all but those of act_rules."""
        if not self.cfg.observing:
            return False
        row = None if incident_id is None else self.conn.execute(
            "SELECT rule_id FROM incidents WHERE id = ?", (incident_id,)).fetchone()
        rule = next((r for r in self.rules if row and r.id == row[0]), None)
        return row is None or not self.cfg.rule_acts(row[0], rule.shadow if rule else False)

    def counts(self) -> Counter:
        """Everything counted for /metrics: guard trips, rule errors, reloads, capped evidence."""
        capped = Counter({("evidence_capped", rule): n for rule, n in self.windows.capped.items()})
        return self._counts + self.decider.counts + capped

    @property
    def windows_read(self) -> bool:
        """False while the rule windows' older events are still being read (after a start or a reload)."""
        return self._last_event_id is not None and self._backfill is None

    @property
    def active_rules(self) -> list[Rule]:
        """Read several times a tick; self.rules and self.disabled change only in reload and _rule_failed."""
        if self._active is None:
            self._active = [r for r in self.rules if r.enabled and r.id not in self.disabled]
        return self._active

    def _rule_failed(self, rule: Rule, exc: Exception) -> None:
        """A rule that raises is disabled alone (until the next reload or restart); the others keep working."""
        error = f"{type(exc).__name__}: {exc}"
        self.disabled[rule.id] = {"error": error, "version": rule.version, "origin": rule.origin, "ts": self.clock()}
        self._active = None
        self.windows.remove(rule.id)
        self._counts["rule_error", rule.id] += 1
        self._save_state("disabled_rules", self.disabled)
        self.log.event("rule_error", f"RULE_ERROR {rule.id} ({rule.origin or 'no file'}) disabled: {error}",
                       rule=rule.id, origin=rule.origin, error=error)

    def _warn_unknown_rule_ids(self, config_path: str | None) -> None:
        for problem in unknown_rule_ids(self.cfg, self.rcfg, {r.id for r in self.rules}, config_path):
            self._counts["config_warning", "unknown_rule_id"] += 1
            self.log.event("config_warning", f"WARNING {problem}", error=str(problem))

    # ---------- reload (SIGHUP) ----------
    def reload(self, config_path: str | None = None) -> bool:
        """Load the policy (config_path; None: keep the running one), its rules and remediation playbooks again and
        swap them in; if any is bad, keep the running set and say why."""
        try:
            cfg = load_controller_config(config_path) if config_path else self.cfg
            rules = load_rules(resolve(cfg.rules, self.root), overrides=self._overrides(cfg))
            rcfg = (load_remediation_config(resolve(cfg.remediation, self.root)) if self._remediation_from_disk
                    else self.rcfg)
        except (ConfigError, OSError) as exc:
            self._counts["reload", "rejected"] += 1
            self.log.event("reload", f"RELOAD rejected, running rules and policy kept: {exc}", result="rejected",
                           error=str(exc))
            return False
        kept = [k for k in RESTART_KEYS if getattr(cfg, k) != getattr(self.cfg, k)]
        for k in RESTART_KEYS:
            setattr(cfg, k, getattr(self.cfg, k))
        self.cfg = self.decider.cfg = cfg
        self.calibrator = self._calibrator(cfg, previous=self.calibrator)
        self.rcfg = self.decider.rcfg = self.remediator.cfg = rcfg
        self.remediator.adopt_reasons = self.journal.executor.adopt_reasons = tuple(cfg.adopt_drain_reasons)
        self.journal.max_attempts = cfg.max_action_attempts
        self.rules, self.disabled, self._active = rules, {}, None
        if self._rules_path is not None:
            self._rules_path = resolve(cfg.rules, self.root)
            self._rules_stamp = self._stamp()
        self._save_state("disabled_rules", self.disabled)
        old, self.windows = self.windows, EventWindows(self.rules)
        if self._backfill is not None and self._backfill[2] is None:
            self._last_event_id = self._backfill = None  # the windows were still being read: start over
        else:
            # unchanged rules keep their windows; new or changed ones (or ones still being read) read theirs
            fresh = self.windows.adopt(old, incomplete=self._backfill[2] if self._backfill else ())
            if fresh and self._last_event_id is not None:
                self._start_backfill(self._last_event_id, [r.id for r in fresh])
        for rule_id, n in old.capped.items():  # a counter never goes back
            if self.windows.capped.get(rule_id) != n:
                self._counts["evidence_capped", rule_id] += n
        self._warn_unknown_rule_ids(config_path)
        self._counts["reload", "applied"] += 1
        self.log.event("reload", f"RELOAD applied: {len(rules)} rules, policy {config_path or '(unchanged)'}"
                       + (f"; {', '.join(kept)} need a restart, running values kept" if kept else "")
                       + f"; {self.cfg.mode_line()}",
                       result="applied", rules=len(rules), restart_needed=kept, mode=self.cfg.mode)
        return True

    def _reload_rules(self) -> None:
        """A knowledge base on disk whose files changed (a promoted learned rule, an edit) is reloaded as SIGHUP
        would: a bad edit keeps the running rules."""
        if self._rules_path is None:
            return
        stamp = self._stamp()
        if stamp != self._rules_stamp:
            self._rules_stamp = stamp
            self.reload(None)

    def _overrides(self, cfg: ControllerConfig) -> Path | None:
        return resolve(cfg.rule_overrides, self.root) if cfg.rule_overrides else None

    def _stamp(self) -> tuple:
        if self._rules_path is None:
            return ()
        overrides = self._overrides(self.cfg)
        return rules_stamp(self._rules_path), rules_stamp(overrides if overrides and overrides.exists() else None)

    # ---------- lifecycle ----------
    def start(self) -> None:
        """After a restart: finish what the journal says was planned but never confirmed done."""
        self._warn_unknown_rule_ids(None)
        pending = self.journal.pending()
        self.log.event("start", f"START controller in {self.cfg.mode_line()}: {len(self.rules)} rules, "
                                f"{len(pending)} pending actions to replay",
                       rules=len(self.rules), pending=[p.key for p in pending], mode=self.cfg.mode,
                       act_rules=self.cfg.act_rules, shadow_rules=self.cfg.shadow_rules)
        self.journal.replay()

    def tick(self) -> list[Finding]:
        t0 = time.monotonic()
        now = self.clock()
        self._reload_rules()
        nodes = self._node_map(self.slurm.nodes())
        jobs = self.slurm.jobs()
        self._snapshot(nodes, jobs, now)
        early: list[Finding] = []
        # known faults (rules, dead nodes) are acted on before the job checks run: at 256 nodes the watchdog and
        # isolation take most of a tick, which an Xid should not wait for
        findings = self.detect(now, nodes, jobs, early=lambda found: (
            early.extend(found), self.decider.decide(found, nodes, jobs)))
        keys = {f.key for f in findings}
        self.decider.decide(findings[len(early):] + [f for f in self._unfinished() if f.key not in keys], nodes,
                            jobs)
        if self.windows_read:  # a window still being read has not said yet what is current
            shadow = {r.id for r in self.rules if r.shadow}
            self.decider.settle_observed(keys, lambda rule_id: rule_id in shadow)
        self.journal.replay()
        self.remediator.tick(nodes, jobs)
        self._release_held(jobs)
        self._verify(now)
        self._housekeeping(now, jobs)
        self._watch_kernel_logs(now)
        record_losses(self.conn, now)  # steps and time each requeue cost (report/losses.py)
        self.ticks += 1
        self.last_tick_s = time.monotonic() - t0
        return findings

    def _watch_kernel_logs(self, now: float) -> None:
        """Say in the controller's own log when a node's detection loses (or regains) its kernel log."""
        if now - self._kernel_logs_at < KERNEL_LOG_CHECK_S:
            return
        self._kernel_logs_at = now
        for node, state in sorted(kernel_logs(self.conn).items()):
            if self._kernel_logs.get(node, (None,))[0] == state["ok"]:
                continue
            if not state["ok"]:
                self.log.event("detection_degraded", f"DEGRADED {node}: kernel-log fault detection is OFF, its "
                               f"sidecar reads no kernel log ({state['detail']})", node=node, detail=state["detail"])
            elif node in self._kernel_logs:
                self.log.event("detection_restored", f"RESTORED {node}: kernel log from {state['source']}",
                               node=node, source=state["source"])
            self._kernel_logs[node] = (state["ok"], state["source"])

    # ---------- detection ----------
    def detect(self, now: float, nodes: dict[str, Node], jobs: list[Job],
               early: Callable[[list[Finding]], object] | None = None) -> list[Finding]:
        """Every finding of this tick; early(the rule findings) is called before the job checks start (they come
        after them in the list)."""
        since = self.node_back.read()
        since_job = self._since_job()
        running, jobs_on_node = self._placement(jobs)
        self._match_new_events(now)
        findings = self.windows.findings(now, since=since, jobs_on_node=jobs_on_node, since_job=since_job,
                                         on_error=self._rule_failed)
        for rule_id, node, count in self.windows.newly_capped:
            self.log.event("evidence_capped", f"NOISY {node} ({rule_id}): {count} matching events in the window; "
                           f"evidence keeps the newest {MAX_EVIDENCE_ROWS}, the count stays exact",
                           node=node, rule=rule_id, count=count)
        self.windows.newly_capped.clear()
        samples, kpis = self._samples(now), self._rule_kpis(now)
        findings += self._metric_rules(now, since)
        findings += evaluate_series([r for r in self.active_rules if not r.metric], now=now, kpis=kpis,
                                    since=since, since_job=since_job, on_error=self._rule_failed)
        findings += evaluate_composites(self.active_rules, now=now, events=self._composite_events(now),
                                        samples=samples, kpis=kpis, since=since, jobs_on_node=jobs_on_node,
                                        since_job=since_job, on_error=self._rule_failed)
        findings += self._not_responding(nodes, now)
        if early is not None:
            early(list(findings))
        if self.cfg.watchdog.enabled:
            self._update_kpi_window(now)
            behind = {}
            watched = self._watched(running, since_job)
            newest_by_node = self._newest_data(n for j in watched for n in j.nodes)
            for job in watched:  # not while a requeue is on its way
                newest = min(now, max([newest_by_node[n] for n in job.nodes if newest_by_node.get(n)],
                                      default=now)) if newest_by_node else now
                if now - newest > INGEST_BEHIND_S:
                    behind[job.job_id] = now - newest
                # judged as of its data, so that ingest running behind (a backlog in the sidecars or here) does
                # not look like a job that stopped stepping; at most hang_timeout_s behind now: a job whose
                # nodes all fell silent for longer is judged as before
                at = max(newest, now - self.cfg.watchdog.hang_timeout_s)
                findings += self._watch(job, at, findings, since_job)
                if self.cfg.watchdog.process_hang and job.state == "RUNNING":  # not SUSPENDED: SLURM stopped it
                    findings += self._watch_processes(job, at)
            if running is not self._judged_for:  # jobs that left: forgotten (the same jobs: nothing left)
                ids = {j.job_id for j in running}
                self._proc_judged = {j: t for j, t in self._proc_judged.items() if j in ids}
                self._proc_busy = {run for run in self._proc_busy if run[0] in ids}
                self._kpi_jobs &= ids
                self._judged_for = running
            if behind and now - self._behind_logged >= 60.0:
                self._behind_logged = now
                self.log.event("ingest_behind", f"INGEST BEHIND: the newest data of {len(behind)} job(s)' nodes is up "
                               f"to {max(behind.values()):.0f} s old; the watchdog judges them as of their data",
                               lag_s={str(j): round(v, 1) for j, v in sorted(behind.items())})
            if self.cfg.isolation.enabled:  # isolation's long memory of healthy behaviour (healthy.py)
                self.healthy.update(now, running, findings, self.remediator.active)
                self._calibration_rounds(now, running, findings)
        self._save_state("isolation_streaks", self.streaks.state)
        return findings

    def _since_job(self) -> dict[int, float]:
        """job -> when it was last requeued, rebuilt only after a new requeue (the map grows with every job)."""
        requeued = self.job_requeued.read()
        if self._since_job_cache[0] != self.job_requeued.version:
            self._since_job_cache = (self.job_requeued.version, {int(job): ts for job, ts in requeued.items()})
        return self._since_job_cache[1]

    def _watched(self, running: list[Job], since_job: dict[int, float]) -> list[Job]:
        """The running jobs the watchdog judges (not while a requeue is on its way): listed again only when the
        running jobs or the requeues changed."""
        cached, version, watched = self._watched_cache
        if cached is not running or version != self.job_requeued.version:
            watched = [j for j in running if since_job.get(j.job_id, 0.0) < j.start_time]
            self._watched_cache = (running, self.job_requeued.version, watched)
        return watched

    def _node_map(self, listed: list[Node]) -> dict[str, Node]:
        """name -> node; SLURM's answer handed back unchanged (a simulated cluster's between changes) is not
        mapped again."""
        if self._nodes is None or self._nodes[0] is not listed:
            self._nodes = (listed, {n.name: n for n in listed},
                           [n for n in listed if "NOT_RESPONDING" in n.flags and not n.rebooting])
        return self._nodes[1]

    def _placement(self, jobs: list[Job]) -> tuple[list[Job], dict[str, list[int]]]:
        """The running jobs, and node -> their job ids rebuilt only when where jobs run changed: on a quiet tick
        of a 1,000-node cluster building the mapping was a quarter of the tick."""
        if self._placed is not None and self._placed[0] is jobs:  # the same answer as last tick
            return self._placed[2], self._placed[3]
        running = [j for j in jobs if j.state in RUNNING_STATES]
        key = tuple((j.job_id, j.nodes) for j in running)
        if self._placed is None or self._placed[1] != key:
            jobs_on_node: dict[str, list[int]] = {}
            for j in running:
                for n in j.nodes:
                    if n in jobs_on_node:
                        jobs_on_node[n].append(j.job_id)
                    else:
                        jobs_on_node[n] = [j.job_id]
        else:
            jobs_on_node = self._placed[3]
        self._placed = (jobs, key, running, jobs_on_node)
        return running, jobs_on_node

    def _not_responding(self, nodes: dict[str, Node], now: float) -> list[Finding]:
        """A node whose slurmd stopped answering (dead host, crashed daemon): SLURM would mark it DOWN after
        SlurmdTimeout and requeue its jobs with a BeginTime; taking it out now (drain, requeue, then DOWN: decide.py)
        restarts them sooner."""
        out = []
        silent = self._nodes[2] if self._nodes is not None and self._nodes[1] is nodes else nodes.values()
        for n in silent:
            if "NOT_RESPONDING" not in n.flags or n.rebooting or self.remediator.active(n.name):
                continue  # our own reboots stop slurmd too
            out.append(Finding(rule_id="slurm-node-not-responding", source="slurm", scope="node", severity="error",
                               action="drain", summary="slurmd not responding", first_ts=now, last_ts=now,
                               node=n.name, category="node-down",
                               evidence={"state": n.state, "flags": list(n.flags), "reason": n.reason}))
        return out

    def _match_new_events(self, now: float) -> None:
        """Match the events that arrived since the last tick; each event is looked at once, so a tick's cost
        follows the ingest rate, not the window's size. At start (and for new rules after a reload) the windows'
        older events are read newest first, BACKFILL_EVENTS_PER_TICK per tick: a window full of one node's
        flood delays neither the first tick nor another node's fresh fault."""
        if self._last_event_id is None:
            top = self.conn.execute("SELECT COALESCE(MAX(id), 0) FROM events").fetchone()[0]
            self._last_event_id = top
            self._start_backfill(top, None)
        rows = self.conn.execute("SELECT * FROM events WHERE id > ? ORDER BY id LIMIT ?",
                                 (self._last_event_id, MAX_NEW_EVENTS_PER_TICK)).fetchall()
        if rows:
            self._last_event_id = rows[-1]["id"]
            self.windows.add(rows, on_error=self._rule_failed)
        if self._backfill is not None:
            low, high, only = self._backfill
            rows = self.conn.execute("SELECT * FROM events WHERE id BETWEEN ? AND ? ORDER BY id DESC LIMIT ?",
                                     (low, high, BACKFILL_EVENTS_PER_TICK)).fetchall()
            self.windows.add(rows, on_error=self._rule_failed, only=only)
            done = len(rows) < BACKFILL_EVENTS_PER_TICK or rows[-1]["id"] <= low
            self._backfill = None if done else (low, rows[-1]["id"] - 1, only)

    def _start_backfill(self, top: int, only: list[str] | None) -> None:
        rules = [r for r in self.windows.rules if only is None or r.id in only]
        if not rules or not top:
            self._backfill = None
            return
        lo = self.clock() - max(r.window_s for r in rules)
        low = self.conn.execute("SELECT MIN(id) FROM events WHERE ts >= ?", (lo,)).fetchone()[0]
        self._backfill = None if low is None or low > top else (low, top, only)

    def _composite_events(self, now: float) -> list[dict]:
        """Composite rules (learned ones) judge their whole event window each tick: the newest
        MAX_NEW_EVENTS_PER_TICK rows of it at most, so a flood cannot make the read unbounded."""
        windows = [r.composite.needs()["events"] for r in self.active_rules if r.composite]
        windows = [w for w in windows if w > 0]
        if not windows:
            return []
        rows = self.conn.execute("SELECT * FROM events WHERE ts >= ? ORDER BY id DESC LIMIT ?",
                                 (now - max(windows), MAX_NEW_EVENTS_PER_TICK)).fetchall()
        return [normalise(r) for r in reversed(rows)]

    def _metric_rules(self, now: float, since: dict[str, float]) -> list[Finding]:
        """Metric rules over their windows' series stats, kept up to date from the newest samples (series.py)."""
        rules = [r for r in self.active_rules if r.metric]
        windows: dict[str, float] = {}
        for r in rules:
            windows[r.metric.metric] = max(windows.get(r.metric.metric, 0.0), r.metric.window_s)
        self.series.update(windows, now)
        out = []
        for r in rules:
            try:
                out += metric_findings(r, r.metric, self.series.window(r.metric.metric, r.metric.window_s, now,
                                                                       since))
            except Exception as exc:  # noqa: BLE001 - one broken rule must not stop the others
                self._rule_failed(r, exc)
        return out

    def _samples(self, now: float) -> list[dict]:
        """Raw samples for the composite (learned) rules that read metrics."""
        wanted = {}
        for r in self.active_rules:
            if r.composite:
                for name, w in r.composite.needs()["metrics"].items():
                    wanted[name] = max(wanted.get(name, 0.0), w)
        if not wanted:
            return []
        names = sorted(wanted)
        window = max(wanted.values())
        return [normalise(r) for r in recent_for_metrics(self.conn, now - window, names)]

    def _rule_kpis(self, now: float) -> list[dict]:
        """The KPI rows the KPI rules can use, filtered by SQLite: for a non-finite rule only the rows whose value
        is NaN/Inf (a large job's healthy steps never reach Python), for the others the rows with the field."""
        rules = [r for r in self.active_rules if r.kpi]
        composite = [w for w in (r.composite.needs()["kpis"] for r in self.active_rules if r.composite) if w > 0]
        if not rules and not composite:
            return []
        wanted = {_kpi_filter(r.kpi.field, r.kpi.nonfinite) for r in rules} | ({"1"} if composite else set())
        window = max([r.window_s for r in rules] + composite)  # composite (learned) rules judge every row
        return [normalise(r) for r in self.conn.execute(
            f"SELECT {KPI_COLUMNS} FROM kpis WHERE ts >= ? AND ({' OR '.join(sorted(wanted))})", (now - window,))]

    def _update_kpi_window(self, now: float) -> None:
        # the watchdog's lookback, from a judging time up to hang_timeout_s behind now
        keep = self._lookback() + self.cfg.watchdog.hang_timeout_s
        if self.kpi_window is None or self.kpi_window.keep_s != keep:  # first tick, or a reload changed it
            self.kpi_window = KpiWindow(self.conn, keep)
        self.kpi_window.update(now)

    def _lookback(self) -> float:
        """How far back the watchdog reads a job's KPI rows: its hang and throughput windows."""
        w = self.cfg.watchdog
        return max(2 * w.hang_timeout_s, w.recent_window_s + w.baseline_window_s)

    def _newest_data(self, nodes: Iterable[str]) -> dict[str, float | None]:
        """The newest sample time each node has delivered (None: none yet): one statement, an index seek per node
        inside it. A statement per node handed the interpreter lock back and forth 512 times a tick at 256 nodes,
        each time waiting behind the ingest threads: 14 % of the tick."""
        names = sorted(set(nodes))
        if not names:
            return {}
        rows = self.conn.execute(
            "WITH n(node) AS (VALUES " + ", ".join(["(?)"] * len(names)) + ") "
            "SELECT node, (SELECT MAX(ts) FROM samples WHERE samples.node = n.node) FROM n", names).fetchall()
        return {r[0]: r[1] for r in rows}

    def _watch(self, job: Job, now: float, rule_findings: list[Finding], since_job: dict[int, float]) -> list[Finding]:
        w = self.cfg.watchdog
        start = float(job.start_time or 0)
        # the job's rows with their running figures: a tick costs the rows that arrived, not the window (kpiwindow)
        view = self.kpi_window.view(job.job_id, max(start, now - self._lookback()))
        if not view.last(1):
            last = self.conn.execute(f"SELECT {KPI_COLUMNS} FROM kpis WHERE job_id = ? AND ts >= ? ORDER BY ts DESC"
                                     " LIMIT 1",
                                     (job.job_id, start)).fetchone()
            view = RowsView([dict(last)] if last else [])
        ever = view.last(1) != [] or self.conn.execute("SELECT 1 FROM kpis WHERE job_id = ? LIMIT 1",
                                                    (job.job_id,)).fetchone() is not None
        if not ever:
            return []  # a job that does not report KPIs is not watched
        starts = [r[0] for r in self.conn.execute(
            "SELECT ts FROM events WHERE source='kpi' AND kind IN ('start','resume') AND ts >= ? AND"
            " EXISTS (SELECT 1 FROM json_each(events.job_ids) WHERE value = ?)",
            (now - w.crash_loop_window_s, job.job_id))]
        # restarts that followed our own requeues are not the job restarting by itself: those for a node fault are
        # the platform's, those for a job fault are counted by their signature where they are decided (decide.py)
        our_requeues = [r[0] for r in self.conn.execute(
            "SELECT created_at FROM actions WHERE kind='requeue' AND target=? AND state='done' AND created_at >= ?",
            (str(job.job_id), now - w.crash_loop_window_s))]
        info = JobInfo(job.job_id, job.nodes, start, job.name, job.restarts)
        found = judge(info, view, now, w, ever_reported=ever, history_median=self._history(job, view.last(5), now),
                      start_times=own_restarts(distinct_starts(starts), our_requeues),
                      pause=self._pause(job.job_id, start))
        out = []
        for f in found:
            if f.rule_id in ASKS_ISOLATION \
                    and self.cfg.isolation.enabled:
                f = self._isolate(f, job, view.rows, now, rule_findings)
            if f is not None:
                out.append(f)
        return out

    def _watch_processes(self, job: Job, now: float) -> list[Finding]:
        """A job that writes no KPI lines, judged from what its processes do on its nodes (detect/prochang.py), at
        most once per PROC_JUDGE_S (the sidecars sample them every 5 s)."""
        w, start = self.cfg.watchdog, float(job.start_time or 0)
        if job.job_id in self._kpi_jobs:
            return []  # it wrote KPI lines: the KPI watchdog judges it (not asked again every tick while it runs)
        if now - self._proc_judged.get(job.job_id, 0.0) < PROC_JUDGE_S or now - w.hang_timeout_s < start:
            return []
        self._proc_judged[job.job_id] = now
        if self.conn.execute("SELECT 1 FROM kpis WHERE job_id = ? LIMIT 1", (job.job_id,)).fetchone():
            self._kpi_jobs.add(job.job_id)
            return []  # the KPI watchdog judges it
        nodes, label = list(job.nodes), proc_labels(job.job_id)
        marks = ",".join("?" * len(nodes))
        lo = now - w.hang_timeout_s
        for ts, job_ids in self.conn.execute(f"SELECT ts, job_ids FROM events WHERE node IN ({marks}) AND ts >= ?"
                                             f" AND source = 'kpi'", (*nodes, lo)):
            if job.job_id in json.loads(job_ids or "[]"):
                return []  # a heartbeat, a pause, any KPI event: the job speaks for itself
        rows = [dict(r) for r in self.conn.execute(
            f"SELECT node, ts, metric, value FROM samples WHERE node IN ({marks}) AND metric IN"
            f" ({','.join('?' * len(PROC_METRICS))}) AND ts >= ? AND labels = ?", (*nodes, *PROC_METRICS, lo, label))]
        run = (job.job_id, start)
        if run not in self._proc_busy and self.conn.execute(
                f"SELECT 1 FROM samples WHERE node IN ({marks}) AND metric = 'job.procs.cpu' AND ts >= ? AND"
                f" labels = ? AND value > ? LIMIT 1", (*nodes, max(start, now - 3600.0), label, IDLE_CORES)).fetchone():
            self._proc_busy.add(run)
        found = judge_processes(job.job_id, nodes, rows, now, w.hang_timeout_s, run in self._proc_busy)
        return [found] if found else []

    def _pause(self, job_id: int, since: float) -> tuple[float, float] | None:
        """(when, until when) of the job's newest `pause` / `pause_end` KPI event of this run (sigma.kpi's paused()):
        an open pause holds off the hang verdict for its max_s."""
        row = self.conn.execute(
            "SELECT ts, kind, fields FROM events WHERE source='kpi' AND kind IN ('pause','pause_end') AND ts >= ? AND"
            " EXISTS (SELECT 1 FROM json_each(events.job_ids) WHERE value = ?) ORDER BY ts DESC LIMIT 1",
            (since, job_id)).fetchone()
        if row is None:
            return None
        try:
            max_s = float(json.loads(row[2] or "{}").get("max_s") or 0.0) if row[1] == "pause" else 0.0
        except (TypeError, ValueError):
            max_s = 0.0
        return float(row[0]), float(row[0]) + max_s

    def _isolate(self, f: Finding, job: Job, rows: list[dict], now: float,
                 rule_findings: list[Finding]) -> Finding | None:
        """An anomalous job no rule explains: find its culprit node, first from what the ranks say directly
        (silent heartbeats, the ranks left behind, the node the others wait for), else by scoring its nodes
        against their peers and their own history; act on the same culprit in `rounds` consecutive rounds."""
        iso = self.cfg.isolation
        # a rule that only observes (observe mode, or the rule in shadow) handles nothing: its culprit is still isolated
        named = {x.node for x in rule_findings if x.node in job.nodes and x.action not in ("record", "notify")
                 and self.cfg.rule_acts(x.rule_id, x.shadow)}
        named |= {n for n in job.nodes if self.remediator.active(n)}
        if named:
            return None if f.rule_id == "watchdog-hang" else f  # a rule already names the culprit
        current = bucket_stats(self.conn, job.nodes, now - iso.window_s, now + 1e-6, WINDOW_BUCKETS)
        direct, beats = self._direct_evidence(f, job, rows, now, current)
        names, scores, cur, base = self._score_round(job, now, rows, current)
        shape = job_shape(job)
        self.calibrator.asked(str(job.job_id), len(job.nodes), now)
        cal, tail = self.calibrator.for_shape(shape)
        threshold = cal.threshold if cal.acts else iso.min_score
        verdict = pick_outlier(list(job.nodes), scores.total, threshold, iso.dominance,
                               hint=direct[0] if direct else None)
        if direct:  # the ranks' own word outranks the telemetry scores: the culprit heads the ranking
            culprit = direct[0]
            ranked = [(culprit, dict(verdict.ranked).get(culprit))] + [r for r in verdict.ranked if r[0] != culprit]
            verdict = Verdict(culprit, ranked, direct[1])
        # a verdict from the telemetry scores needs `rounds` windows that do not overlap; the ranks' own word, rounds
        streak = self.streaks.update(str(job.job_id), verdict.culprit, now, 0.0 if direct else iso.window_s)
        top = {n: scores.top_metrics(i, names) for i, n in enumerate(job.nodes) if scores.total[i] > 0}
        evidence = {**f.evidence, "isolation": {
            "ranked": verdict.ranked, "reason": verdict.reason, "top_metrics": top, "features": names,
            "streak": streak, "threshold": round(threshold, 3),
            "budget": {**cal.as_dict(), "tail": tail, "per_1000_node_days": iso.budget_per_1000_node_days},
            "explained": explain_nodes(scores, names, cur, base, [verdict.culprit] if verdict.culprit else
                                       [n for n, _ in verdict.ranked[:1]], list(job.nodes))}}
        if verdict.culprit and streak >= iso.rounds and not direct and not cal.acts:
            # the scores name a node, but the history does not support the budget yet: a person decides (a hang
            # goes on to restart the job alone, as without a culprit)
            evidence["isolation"]["notified"] = verdict.culprit
            if f.rule_id != "watchdog-hang":
                return Finding(rule_id="isolation-outlier", source="isolation", scope="node", severity="error",
                               action="notify", summary=f"{f.summary}; {verdict.culprit} stands out (notify: "
                               f"{cal.method})"[:100], first_ts=f.first_ts, last_ts=now, node=verdict.culprit,
                               job_id=job.job_id, category="isolation", evidence=evidence)
            verdict = Verdict(None, verdict.ranked, f"{verdict.reason}; notify only: {cal.method}")
        if verdict.culprit and streak >= iso.rounds:
            self.no_culprit_rounds.pop(job.job_id, None)
            rule_id = "watchdog-hang" if f.rule_id == "watchdog-hang" else "isolation-outlier"
            return Finding(rule_id=rule_id, source="isolation", scope="node", severity="error", action="drain",
                           summary=f"{f.summary}; {verdict.culprit} is the culprit"[:100],
                           first_ts=f.first_ts, last_ts=now, node=verdict.culprit, job_id=job.job_id,
                           category="hang" if rule_id == "watchdog-hang" else "isolation",
                           evidence={**evidence, "verify": {"job_id": job.job_id, "kind": f.rule_id,
                                                            "baseline": self._baseline(f, rows)}})
        if verdict.ambiguous and f.rule_id != "watchdog-hang":
            # several outliers the data cannot tell apart: say so to a person rather than pick one
            return Finding(rule_id="isolation-ambiguous", source="isolation", scope="job", severity="error",
                           action="notify", summary=f"{f.summary}; {verdict.reason}: escalated"[:100],
                           first_ts=f.first_ts, last_ts=now, job_id=job.job_id, category="isolation",
                           evidence=evidence)
        if f.rule_id == "watchdog-hang":
            # no culprit yet: give isolation its rounds and the heartbeats time to tell, then restart the job alone
            n = self.no_culprit_rounds[job.job_id] = self.no_culprit_rounds.get(job.job_id, 0) + 1
            settled = (heartbeats_settled(job.nodes, beats, now)
                       or now - f.first_ts > 2 * self.cfg.watchdog.hang_timeout_s)
            if verdict.culprit is None and n > iso.rounds and settled:
                f.evidence = evidence
                return f
            return None
        f.evidence = evidence
        return f

    def _score_round(self, job: Job, now: float, rows: list[dict], current: list[tuple]
                     ) -> tuple[list[str], Scores, object, object]:
        """One isolation round of a job: (feature names, scores, the window [nodes, features], the history's
        baseline or None)."""
        iso = self.cfg.isolation
        names, cur, hist, jitter = job_matrices(list(job.nodes), now, iso.window_s, rows, current,
                                                self._history_buckets(job.nodes, now))
        base = baseline(hist, iso.comparable_ratio) if hist is not None and hist.shape[1] >= 3 else None
        scores = score(list(job.nodes), cur, base=base, jitter=jitter,
                       lone=lambda b: self.healthy.weights(job.nodes, names, b),
                       position=lambda deviation: self.healthy.positions(job.nodes, names, deviation))
        return names, scores, cur, base

    def _calibrator(self, cfg: ControllerConfig, previous: Calibrator | None = None) -> Calibrator:
        """The budget's calibration: its tails from the database (or the running one's), unless the statistic
        they hold changed (rounds, window_s)."""
        iso = cfg.isolation
        cal = Calibrator(iso.budget_per_1000_node_days / 1000, iso.window_s, iso.rounds, iso.min_score)
        if previous is not None:
            text = previous.dumps()
        else:
            row = self.conn.execute("SELECT value FROM detector_state WHERE key = ?", (BUDGET_KEY,)).fetchone()
            text = row[0] if row else None
        if text:
            try:
                cal.load(text, (iso.rounds, iso.window_s))
            except (ValueError, KeyError, TypeError) as exc:
                self.log.event("config_warning", f"WARNING isolation budget state unreadable ({exc}): calibrated "
                               f"again from new rounds", error=str(exc))
        return cal

    def _calibration_rounds(self, now: float, running: list[Job], findings: list[Finding]) -> None:
        """The budget's history: every running job's node time, and rounds of jobs nothing flagged, scored as
        `_isolate` scores them (each job once per window_s, NODES_PER_TICK nodes a tick at most)."""
        iso = self.cfg.isolation
        self.calibrator.exposure(sum(len(j.nodes) for j in running), now)
        # a job the watchdog found anomalous, or isolation judged, is not healthy; a notice about its throughput's
        # jitter is not an anomaly (on a busy host it would keep every job out of the budget's history)
        suspect_jobs = {f.job_id for f in findings if f.job_id is not None and (
            f.rule_id in ASKS_ISOLATION or f.source == "isolation" or f.action not in ("notify", "record"))}
        suspects = {f.node for f in findings if f.node}
        spent = 0
        for job in sorted(running, key=lambda j: self.calibrator.last_round(str(j.job_id))):
            if not self.calibrator.due(str(job.job_id), now):
                continue
            if spent and spent + len(job.nodes) > NODES_PER_TICK:
                break  # the next tick reads it (at least one job a tick, however large)
            spent += len(job.nodes)
            healthy = (job.job_id not in suspect_jobs and not suspects & set(job.nodes)
                       and not any(self.remediator.active(n) for n in job.nodes))
            if not healthy:
                self.calibrator.observe(str(job.job_id), job_shape(job), job.nodes, [], False, now)
                continue
            view = self.kpi_window.view(job.job_id, max(float(job.start_time or 0), now - iso.window_s))
            current = bucket_stats(self.conn, job.nodes, now - iso.window_s, now + 1e-6, WINDOW_BUCKETS)
            if not current:
                continue  # no telemetry of the job's nodes yet: nothing to learn from
            _, scores, _, _ = self._score_round(job, now, view.rows, current)
            self.calibrator.observe(str(job.job_id), job_shape(job), job.nodes, scores.total, True, now)
        if now - self._calibrated_at >= SAVE_S:
            self._save_state(BUDGET_KEY, self.calibrator.dumps(), raw=True)
            self._calibrated_at = now

    @staticmethod
    def _baseline(f: Finding, rows: list[dict]) -> float | None:
        """The job's throughput before the fault (what a recovered job gets back to)."""
        if f.evidence.get("baseline"):
            return f.evidence["baseline"]  # the throughput drop measured it
        return typical_throughput([r for r in rows if r["ts"] < f.first_ts])

    def _history_buckets(self, nodes: tuple[str, ...], now: float) -> list[tuple]:
        """The nodes' healthy history before the window, re-read at most every HISTORY_REFRESH_S (it moves
        slowly)."""
        iso = self.cfg.isolation
        key = tuple(sorted(nodes))
        cached = self._node_history.get(key)
        if cached is None or now - cached[0] > HISTORY_REFRESH_S:
            cached = self._node_history[key] = (now, bucket_stats(
                self.conn, nodes, now - iso.history_s, now - iso.window_s, HISTORY_BUCKETS,
                sample_s=iso.window_s / WINDOW_BUCKETS))
        return cached[1]

    def _direct_evidence(self, f: Finding, job: Job, rows: list[dict], now: float, current: list[tuple]
                         ) -> tuple[tuple[str, str] | None, dict[str, float]]:
        """((culprit, reason) or None, last heartbeat per node) from what the job's ranks report themselves
        (current: the window's telemetry buckets, for the share of time each node's disk stalled)."""
        nodes = list(job.nodes)
        if f.rule_id != "watchdog-hang":
            recent = steady_window(rows, now)  # the run's start-up steps say nothing about a straggler
            stalled = disk_stall_shares(current, now - LAGGARD_WINDOW_S)
            node, shares = waited_for_node(nodes, recent, stalled)
            held = held_shares(recent)
            reason = (f"the other ranks wait for {node} (share of the step waiting: "
                      f"{', '.join(f'{n} {v:.0%}' for n, v in sorted(shares.items()))}"
                      + (f"; held off the CPU: {', '.join(f'{n} {v:.0%}' for n, v in sorted(held.items()))}"
                         if set(held) == set(nodes) else "")
                      + (f"; disk stalled: {', '.join(f'{n} {v:.0%}' for n, v in sorted(stalled.items()))}"
                         if any(stalled.values()) else "") + ")")
            return ((node, reason) if node else None), {}
        beats = dict(self.conn.execute(
            "SELECT node, MAX(ts) FROM events WHERE source='kpi' AND kind='heartbeat' AND ts >= ? AND"
            " EXISTS (SELECT 1 FROM json_each(events.job_ids) WHERE value = ?) GROUP BY node",
            (float(job.start_time or 0), job.job_id)).fetchall())
        if node := silent_node(nodes, beats, now):
            return (node, f"{node} stopped its heartbeats; the other ranks are alive, waiting"), beats
        if node := behind_node(f.evidence.get("laggards") or {}, f.evidence.get("ranks") or {}):
            return (node, f"only {node}'s ranks are behind step {f.evidence.get('max_step')}"), beats
        return None, beats

    def _history(self, job: Job, rows: list[dict], now: float) -> float | None:
        """Median throughput of earlier jobs with the same model config (payload 'model', else the job name)."""
        model = None
        for r in rows[-5:]:
            payload = json.loads(r.get("payload") or "{}") if isinstance(r.get("payload"), str) else {}
            model = payload.get("model") or model
        key = model or job.name
        cached = self._history_cache.get(key)
        if cached and now - cached[0] < 300:
            return cached[1]
        if model:
            q = ("SELECT job_id, tokens_per_s FROM kpis WHERE job_id != ? AND tokens_per_s IS NOT NULL"
                 " AND json_extract(payload, '$.model') = ? ORDER BY ts DESC LIMIT 20000")
            got = self.conn.execute(q, (job.job_id, model)).fetchall()
        else:
            got = []
        per_job: dict[int, list[float]] = {}
        for job_id, tps in got:
            per_job.setdefault(job_id, []).append(tps)
        medians = [statistics.median(v) for v in list(per_job.values())[: self.cfg.watchdog.history_jobs] if len(v) >= 5]
        value = statistics.median(medians) if medians else None
        self._history_cache[key] = (now, value)
        return value

    def _unfinished(self) -> list[Finding]:
        """Decisions a crash interrupted (incident still 'open'): decided again even if their evidence is gone."""
        rules = {r.id: r for r in self.rules}
        out = []
        for inc in self.incidents.query(status="open", open_only=True):
            rule = rules.get(inc.rule_id)
            out.append(Finding(rule_id=inc.rule_id, source=inc.source, scope=inc.scope, severity=inc.severity,
                               action=inc.action, summary=inc.summary, first_ts=inc.fault_ts,
                               last_ts=inc.evidence.get("last_ts", inc.fault_ts), node=inc.node, job_id=inc.job_id,
                               rule_version=inc.rule_version, category=inc.category,
                               requeue_jobs=rule.requeue_jobs if rule else True,
                               shadow=rule.shadow if rule else False, evidence=inc.evidence))
        return out

    # ---------- follow-ups ----------
    def _release_held(self, jobs: list[Job]) -> None:
        for j in jobs:
            if j.state == "PENDING" and any(h in j.reason for h in HELD_REASONS):
                self.journal.run(f"release:{j.job_id}:r{j.restarts}", "release", str(j.job_id),
                                 reason="held after a node failure")

    def _verify(self, now: float) -> None:
        """Isolation decisions are checked: the requeued job recovered -> confirmed; else misdiagnosed."""
        iso = self.cfg.isolation
        for inc in self.incidents.query(source="isolation", status=("acted", "resolved")):
            verify = inc.evidence.get("verify")
            if not verify or inc.evidence.get("verification"):
                continue
            # only the run after the decision counts: steps of the old run (on the culprit) say nothing; nor does
            # a run that isolation found another culprit in (the job landed on a second faulty node): the run
            # after that decision does
            later = self.conn.execute(
                "SELECT MAX(opened_at) FROM incidents WHERE source='isolation' AND job_id = ? AND opened_at > ? AND"
                " status IN ('acted', 'resolved', 'confirmed')", (verify["job_id"], inc.opened_at)).fetchone()[0]
            restart = self.conn.execute(
                "SELECT MIN(ts) FROM events WHERE source='kpi' AND kind IN ('start','resume') AND ts > ? AND"
                " EXISTS (SELECT 1 FROM json_each(events.job_ids) WHERE value = ?)",
                (later or inc.opened_at, verify["job_id"])).fetchone()[0]
            rows = [] if restart is None else [dict(r) for r in self.conn.execute(
                f"SELECT {KPI_COLUMNS} FROM kpis WHERE job_id = ? AND ts > ? AND step IS NOT NULL ORDER BY ts",
                (verify["job_id"], restart))]
            recovered = recovered_after_move(verify, rows, self.cfg.watchdog.min_points, iso.recover_fraction)
            if recovered:
                note = f"job {verify['job_id']} recovered after the node left ({len(rows)} steps since)"
                self.incidents.add_evidence(inc.id, verification={"ts": now, "result": "confirmed", "note": note})
                self.incidents.set_status(inc.id, "confirmed", note, close=inc.status == "resolved")
                self.log.event("verify", f"CONFIRMED {inc.node} (incident {inc.id}): {note}", incident=inc.id)
            elif (since := self._verify_since(inc, restart)) is not None and now - since > iso.verify_after_s:
                note = (f"job {verify['job_id']} did not recover within {iso.verify_after_s:.0f}s of "
                        f"{'its restart' if since == restart else 'the decision'}; node returned")
                self.incidents.add_evidence(inc.id, verification={"ts": now, "result": "misdiagnosed", "note": note})
                self.incidents.set_status(inc.id, "misdiagnosed", note, close=True)
                self.remediator.return_node(inc.node, f"misdiagnosed by isolation (incident {inc.id})")
                self.log.event("verify", f"MISDIAGNOSED {inc.node} (incident {inc.id}): {note}", incident=inc.id)

    def _verify_since(self, inc, restart: float | None) -> float | None:
        """When the time to recover starts: the job's restart (its trainer's start or resume event after the
        decision) for a job that announces its starts (a start event before the decision), since loading a large
        checkpoint can outlast verify_after_s and a job not restarted yet is no evidence; for a job that announces
        nothing, the decision."""
        announces = self.conn.execute(
            "SELECT 1 FROM events WHERE source='kpi' AND kind IN ('start','resume') AND ts <= ? AND"
            " EXISTS (SELECT 1 FROM json_each(events.job_ids) WHERE value = ?) LIMIT 1",
            (inc.opened_at, inc.evidence["verify"]["job_id"])).fetchone()
        return restart if announces else inc.opened_at

    def _housekeeping(self, now: float, jobs: list[Job]) -> None:
        """Passive incidents close once their evidence has aged out of every rule window, or once the job run they
        were about has ended (a requeued job's new run starts with a clean slate; a crash loop spans runs)."""
        passive = "status IN ('recorded','notified','shadow','escalated')"
        if self._stale[0] is not self.rules or self._stale[1] is not self.cfg:  # a reload changed them
            self._stale = (self.rules, self.cfg,
                           max([r.window_s for r in self.rules] + [self.cfg.watchdog.recent_window_s, 60.0]) + 60.0)
        stale = self._stale[2]
        with self.conn:
            self.conn.execute(f"UPDATE incidents SET closed_at = ? WHERE closed_at IS NULL AND updated_at < ? AND"
                              f" {passive}", (now, now - stale))
            # one statement per job with such an incident open, not per running job (a thousand-node cluster's
            # hundred jobs, every tick)
            about = {r[0] for r in self.conn.execute(f"SELECT DISTINCT job_id FROM incidents WHERE closed_at IS NULL"
                                                     f" AND job_id IS NOT NULL AND {passive}")}
            self.conn.executemany(f"UPDATE incidents SET closed_at = ? WHERE closed_at IS NULL AND job_id = ? AND"
                                  f" updated_at < ? AND rule_id != 'watchdog-crash-loop' AND {passive}",
                                  [(now, j.job_id, j.start_time) for j in jobs if j.start_time and j.job_id in about])

    def _snapshot(self, nodes: dict[str, Node], jobs: list[Job], now: float) -> None:
        periodic = now - self._last_snapshot_ts >= self.cfg.snapshot_every_s
        rows = []
        for n in nodes.values():
            on = sorted(j.job_id for j in jobs if n.name in j.nodes and j.state in RUNNING_STATES)
            sig = (n.state, ",".join(n.flags), n.alloc_cpus, n.reason, tuple(on))
            if periodic or self._last_snapshot.get(n.name) != sig:
                rows.append((now, n.name, n.state, ",".join(n.flags), n.alloc_cpus, n.cpus, n.reason, json.dumps(on)))
                self._last_snapshot[n.name] = sig
        if periodic:
            self._last_snapshot_ts = now
        if rows:
            with self.conn:
                self.conn.executemany("INSERT INTO node_snapshots (ts, node, state, flags, alloc_cpus, cpus, reason,"
                                      " jobs) VALUES (?,?,?,?,?,?,?,?)", rows)

    def _action_changed(self, row: ActionRow) -> None:
        self.log.event("action", f"{row.kind.upper()} {row.target}: {row.state} ({row.result})" if row.state in
                       ("done", "failed") and row.kind not in ("notify",) else None, key=row.key, kind=row.kind,
                       target=row.target, state=row.state, result=row.result, incident=row.incident_id)

    def _state(self, key: str, default):
        row = self.conn.execute("SELECT value FROM detector_state WHERE key = ?", (key,)).fetchone()
        return json.loads(row[0]) if row else default

    def _save_state(self, key: str, value, raw: bool = False) -> None:
        text = value if raw else json.dumps(value)
        if self._saved.get(key) == text:  # unchanged: no write transaction (each waits its turn behind ingest)
            return
        with self.conn:
            self.conn.execute("INSERT OR REPLACE INTO detector_state (key, value, updated_at) VALUES (?,?,?)",
                              (key, text, self.clock()))
        self._saved[key] = text


def recovered_after_move(verify: dict, rows: list[dict], min_points: int, fraction: float) -> bool:
    """Evidence that the job recovered once the node left: it steps again (min_points steps) at `fraction` of
    its throughput before the fault. Nothing measured is no evidence: a slowdown without a measured baseline is
    never confirmed; a hung job that never stepped before confirms by stepping."""
    if len(rows) < min_points:
        return False
    tps, baseline = typical_throughput(rows), verify.get("baseline")
    if not baseline:
        return verify.get("kind") == "watchdog-hang"
    return bool(tps and tps >= fraction * baseline)


def rules_stamp(path: Path | None) -> tuple:
    """What changes when a rule file is written, added or removed (cheap enough to check every tick)."""
    if path is None:
        return ()
    files = sorted([*path.glob("*.yaml"), *path.glob("*.yml")]) if path.is_dir() else [path]
    out = []
    for f in files:
        try:
            st = f.stat()
        except OSError:
            continue
        out.append((f.name, st.st_mtime_ns, st.st_size))
    return tuple(out)


def _kpi_filter(field: str, nonfinite: bool) -> str:
    """SQL condition for the kpis rows a KPI rule on `field` (a kpis column, from the schema's fixed list) can use.
    NaN/Inf never reach the REAL column: ingest stores NULL there and the value in payload.nonfinite."""
    in_payload = (f"(CASE WHEN json_valid(payload) THEN COALESCE(json_extract(payload, '$.nonfinite.{field}'),"
                  f" json_extract(payload, '$.{field}')) END IS NOT NULL)")
    if nonfinite:
        return f"(({field} IS NULL AND {in_payload}) OR abs({field}) > 1.7976931348623157e308)"
    return f"({field} IS NOT NULL OR {in_payload})"


def distinct_starts(times: list[float], gap_s: float = 60.0) -> list[float]:
    """Every rank reports its own start: start events closer than gap_s belong to the same (re)start."""
    out: list[float] = []
    for t in sorted(times):
        if not out or t - out[-1] > gap_s:
            out.append(t)
    return out


def own_restarts(starts: list[float], our_requeues: list[float]) -> list[float]:
    """Starts minus the restart that followed each of our requeues (the job did not restart by itself)."""
    out = sorted(starts)
    for r in sorted(our_requeues):
        after = [t for t in out if t > r]
        if after:
            out.remove(after[0])
    return out
