"""Chaos soak: train on the local cluster while a seeded schedule injects faults of every kind, one at a time.

    python bench/chaos_soak.py [--minutes 20] [--seed 0] [--state-dir DIR] [--kinds xid hang ...]
                               [--signatures all|N|NAME ...] [--shard I/N] [--no-jit | --compare] [--timeline]
                               [--trainer sigma|hf|both]

`--minutes 0 --kinds hang --timeline` is the quick form: one fault of each kind named, each followed by its
timeline (where its lost time went), a few minutes in all.

Uses only what a user or an admin could do: `sigma stack up`, `sigma train`, `sigma chaos` (its Python API),
`sbatch`, `sigma nodes --repaired`, `sigma report`; the controller database is read (read-only) for measurements.
One row per fault: kind, node, what detected it, detection latency, whether the right node was acted on, whether
the training job recovered, recovery time (fault -> first training step after the restart) and steps lost; then
false drains, lost jobs, effective training time, and the `sigma report` figures.

Just-in-time checkpoints (docs/train.md) are on, as shipped, with in-memory replicas every step
(checkpoint.replica_every=1, so that a hang is answered by the blocked ranks). --no-jit runs the soak as before them:
the controller requeues at once (jit_checkpoint_timeout_s=0), the trainer neither polls for requests nor saves its
last healthy step on a NaN, and keeps no replicas. --compare runs both, same seed, same machine, one after the other, and prints steps lost, time
lost and effective training time side by side.

--trainer hf trains a Hugging Face Trainer job instead of `sigma train` (sbatch/hf-trainer.sbatch: a tiny GPT-2 with
the sigma.integrations.hf callback, checkpoint every 20 steps, the same step delay, the NaN fault hook on); --trainer
both runs the Hugging Face soak and then the `sigma train` one, same seed, same machine, and prints steps lost, time
lost and effective training time side by side. The Hugging Face job answers just-in-time requests between steps but
not while a hung rank blocks it (no in-memory replicas), so a hang costs it the steps since its last checkpoint.

Fault kinds (each injected at its source by `sigma chaos`, on a node of the running training job unless noted):
  xid         an Xid 79 line in the node's kernel log
  hang        SIGSTOP of the job's processes on the node
  straggler   the node's ranks stopped 70 % of every second
  node-death  SIGKILL of the node's slurmd
  prolog      an Xid 119 line in an idle node's kernel log, then a job placed there: the node is out before the job
              runs (the catalogue's gpu-xid-reset rule or the prolog's kernel-log check, whichever is first)
  nan         the trainer's testing-only hook makes the next loss NaN
  log         a line of the fault catalogue (`sigma chaos log --signature RULE-ID`, as many lines as the rule needs)
              where it appears: the node's kernel log, its DCGM log or the job's output. It counts when that rule
              decided its action: a drain takes out that node only, a job restart or a record / notification
              takes out none. --signatures says which: all (default: the run lasts until every one ran), N per
              round (sampled), or names.

--shard I/N runs the I-th of N shares of the faults (the non-log kinds and the signatures, in one sorted list, every
N-th from the I-th), so that a full run can be split over several machines or sittings; the N shards together run
every kind and every signature once. Exit code 0 when every fault of the run (or shard) was detected, the right node
(and only it) acted on, the job recovered, every selected kind and signature ran, with no false drains and no lost
jobs.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

KINDS = ("xid", "hang", "straggler", "node-death", "prolog", "nan", "log")
NODE_KINDS = ("xid", "hang", "straggler", "node-death", "prolog")  # the node itself is at fault
DRAINS = ("drain", "drain+reboot", "drain+ticket")
CHECKPOINT_EVERY = 20
# The controller stops requeueing a job after CRASH_LOOP_RESTARTS job-level requeues within the window (the shipped
# restarts, a shorter window): the soak's faults are independent, so it spaces its job-level ones to stay under it.
CRASH_LOOP_RESTARTS = 3
LOST_GOAL_S = 15.0  # time lost per fault beyond its detection: checkpoint plus restart
CRASH_LOOP_WINDOW_S = 300.0
TRAINING_STATES = ("RUNNING", "PENDING", "CONFIGURING", "COMPLETING", "REQUEUED")


@dataclass
class FaultRow:
    kind: str
    node: str
    ts: float
    job_id: int | None
    detected_by: str = ""
    detected_ts: float | None = None
    acted_nodes: list[str] = field(default_factory=list)
    recovered_ts: float | None = None
    last_step_before: int | None = None
    first_step_after: int | None = None
    node_back_ts: float | None = None
    caught_up_ts: float | None = None  # first step beyond the pre-fault progress
    verdict_ts: float | None = None  # the incident whose decision acted (drained the node, requeued the job)
    restart_ts: float | None = None  # the new run's first start/resume event
    last_step_ts: float | None = None  # the old run's last step
    note: str = ""
    signature: str = ""  # log: the catalogue rule injected ...
    expected_action: str = ""  # ... and the action it must decide
    requeues: bool = True  # a drain of that rule requeues the node's jobs (requeue_jobs: false lets them finish)

    @property
    def label(self) -> str:
        return f"log:{self.signature}" if self.kind == "log" else self.kind

    @property
    def node_fault(self) -> bool:
        return self.kind in NODE_KINDS or (self.kind == "log" and self.expected_action in DRAINS)

    @property
    def detected(self) -> bool:
        return self.detected_ts is not None

    @property
    def latency(self) -> float | None:
        return None if self.detected_ts is None else self.detected_ts - self.ts

    @property
    def right_node(self) -> bool:
        if self.node_fault:
            return self.acted_nodes == [self.node]
        return self.acted_nodes == []  # a job fault (or a record / notification): no node may be taken out

    @property
    def job_affected(self) -> bool:
        if self.kind == "log":
            return self.expected_action == "requeue" or (self.expected_action in DRAINS and self.requeues)
        return self.kind != "prolog"

    @property
    def recovered(self) -> bool:
        return not self.job_affected or self.recovered_ts is not None

    @property
    def recovery_s(self) -> float | None:
        return None if self.recovered_ts is None else self.recovered_ts - self.ts

    @property
    def steps_lost(self) -> int | None:
        if self.last_step_before is None or self.first_step_after is None:
            return None
        return max(0, self.last_step_before - (self.first_step_after - 1))

    @property
    def window_end(self) -> float:
        return self.caught_up_ts or self.recovered_ts or self.detected_ts or self.ts

    @property
    def time_lost_s(self) -> float | None:
        """Fault -> training past the step it had reached (new work again)."""
        return None if self.caught_up_ts is None else self.caught_up_ts - self.ts

    @property
    def verdict_s(self) -> float | None:
        """Fault -> the incident that acted; the first incident when none did (or it is not known)."""
        return self.latency if self.verdict_ts is None else self.verdict_ts - self.ts

    @property
    def lost_after_detection_s(self) -> float | None:
        """Time lost beyond detection: what checkpoint and restart cost (the goal: at most LOST_GOAL_S). Detection
        is the incident whose decision acted, not an earlier notification that did nothing (a throughput drop
        before isolation names the node; another job-wide notification that happened to open meanwhile)."""
        lost, latency = self.time_lost_s, self.verdict_s
        return None if lost is None or latency is None else lost - latency


@dataclass
class SoakResult:
    rows: list[FaultRow]
    false_drains: list[str]
    lost_jobs: int
    wall_s: float
    effective: float
    effective_outside: float
    report: str
    job_ids: list[int]
    evaluations: list[tuple] = field(default_factory=list)  # (step, seconds): the configured evaluations

    def evaluated(self) -> str:
        secs = sum(s for _, s in self.evaluations)
        return (f"; {len(self.evaluations)} evaluation(s), {secs:.1f} s in all, counted as the job's own work"
                if self.evaluations else "")


def _sigma(env: dict, *args: str, check: bool = True) -> str:
    from sigma.paths import project_root

    # generous: on a machine at load 100+ `sigma train` (torch, submitit) took over two minutes to submit
    proc = subprocess.run([sys.executable, "-m", "sigma.cli", *args], env=env, capture_output=True, text=True,
                          timeout=600, cwd=project_root())
    if check and proc.returncode != 0:
        raise RuntimeError(f"`sigma {' '.join(args)}` failed: {proc.stderr.strip() or proc.stdout.strip()}")
    return proc.stdout


class Soak:
    def __init__(self, state_dir: Path | None, seed: int, hang_timeout: float, settle_s: float,
                 fault_timeout: float, throughput_window: float = 30.0, say=print,
                 signatures: list[str] | None = None, per_round: int | None = None, jit: bool = True,
                 timeline: bool = False, trainer: str = "sigma"):
        """signatures: the catalogue rules the log kind injects (default: every one that can run here);
        per_round: how many of them each round samples (default: all that have not run yet)."""
        from sigma.chaos.inject import Chaos
        from sigma.slurm.client import Slurm
        from sigma.slurm.cluster import LocalCluster
        from sigma.stack import Stack

        self.cluster = LocalCluster(state_dir)
        self.stack = Stack(self.cluster)
        self.rng = random.Random(seed)
        self.trainer = trainer  # sigma (`sigma train`) or hf (a Hugging Face Trainer job, sbatch/hf-trainer.sbatch)
        self.hang_timeout = hang_timeout
        self.show_timeline = timeline  # print each fault's timeline (Soak.timeline) once it is handled
        self.lost_outside: list[tuple] = []  # set by effective_time
        self.evaluations: list[tuple] = []  # (step, seconds) of the evaluations counted as training, likewise
        self.settle_s = settle_s
        self.fault_timeout = fault_timeout
        self.say = say
        self.state_args = ["--state-dir", str(state_dir)] if state_dir else []
        # a straggler is judged on the last throughput_window seconds against the job's earlier throughput, so the
        # first fault waits until the job has that baseline (baseline_s)
        self.baseline_s = 2 * throughput_window
        # every round injects a NaN loss and job-level catalogue faults: independent faults, not a job failing at
        # each restart, so a crash loop is counted over 5 minutes here and the soak spaces those faults (fault())
        # detection runs at the shipped defaults (configs/controller.yaml); --hang-timeout only where given
        self.up_args = [*(["--hang-timeout", str(hang_timeout)] if hang_timeout else []),
                        "--set", f"watchdog.crash_loop_window_s={CRASH_LOOP_WINDOW_S:.0f}",
                        # 4 nodes: the shipped global limit (half the cluster) would count the soak's own
                        # back-to-back faults, each repaired before the next, as one wave
                        "--set", "breaker.wave_max_fraction=0.75",
                        *([] if jit else ["--set", "jit_checkpoint_timeout_s=0"]), *self.state_args]
        # with: in-memory replicas every step too, so that a hung rank's state is kept by the others (docs/train.md)
        self.train_args = (["checkpoint.replica_every=1", f"checkpoint.replica_dir={self.cluster.state_dir}/shm"]
                           if jit else ["checkpoint.jit_poll_every=0", "checkpoint.nan_rollback=false"])
        self.env = {**os.environ, **self.cluster.env}
        self.chaos = Chaos(self.cluster)
        self.slurm = Slurm(self.cluster.conf)
        self.job_ids: list[int] = []
        self.lost_jobs = 0
        self.run_dir = self.cluster.state_dir / "soak"
        self.db = None
        self.signatures = signatures if signatures is not None else runnable_signatures(say)
        self.per_round = per_round
        self.rules = {r.id: r for r in _load_rules()}
        unknown = [s for s in self.signatures if s not in self.rules or not self.rules[s].examples]
        if unknown:
            raise ValueError(f"not catalogue signatures: {', '.join(unknown)}; see `sigma chaos log --help`")

    # ---------- platform and training ----------
    def up(self, port_base: int | None) -> None:
        if port_base is None:  # one port range per state directory, clear of the test clusters' 20000-29999
            digest = int(hashlib.sha1(str(self.cluster.state_dir).encode()).hexdigest()[:8], 16)
            port_base = 30000 + (digest % 200) * 25
        _sigma(self.env, "cluster", "up", "--port-base", str(port_base), *self.state_args)
        remediation = write_site_remediation(self.cluster.state_dir)
        _sigma(self.env, "stack", "up", *self.up_args, "--set", f"remediation={remediation}")
        shutil.rmtree(self.run_dir, ignore_errors=True)  # a new soak trains from step 0, not a previous one's checkpoint
        self.env = {**os.environ, **self.cluster.env}
        from sigma.controller.db import open_db

        self.db = open_db(self.stack.db, readonly=True)

    def submit_training(self) -> int:
        if self.trainer == "hf":
            return self._submit_hf()
        out = _sigma(self.env, "train", "--config", "configs/train/debug.yaml", "--nodes", "2", "--no-wait",
                     "name=soak", "parallel.ep=2", "steps=1000000", f"checkpoint.every={CHECKPOINT_EVERY}",
                     f"checkpoint.dir={self.run_dir}/checkpoints", f"launch.folder={self.run_dir}/submitit",
                     "fault.step_delay_s=0.05", "fault.nan_trigger=true", "kpi.progress_every=0", *self.train_args)
        match = re.search(r"job (\d+)", out)
        if not match:
            raise RuntimeError(f"no job id in `sigma train` output: {out!r}")
        job_id = int(match.group(1))
        self.job_ids.append(job_id)
        self.say(f"training job {job_id} submitted (2 nodes, checkpoint every {CHECKPOINT_EVERY} steps)")
        return job_id

    def _submit_hf(self) -> int:
        from sigma.paths import project_root

        sbatch = project_root() / "sbatch"
        env = (f"ALL,SIGMA_KPI_DIR={self.cluster.env['SIGMA_KPI_DIR']},SIGMA_PYTHON={sys.executable},"
               f"SIGMA_SBATCH_DIR={sbatch}")
        self.run_dir.mkdir(parents=True, exist_ok=True)
        job_id = self.slurm.submit(sbatch / "hf-trainer.sbatch", "-N2", "--ntasks-per-node=1", "-J", "soak-hf",
                                   f"--output={self.run_dir}/hf-%j.out", f"--export={env}",
                                   script_args=[str(self.run_dir / "hf"), "--steps", "1000000", "--save-steps",
                                                str(CHECKPOINT_EVERY), "--step-delay", "0.05", "--fault-hooks"])
        self.job_ids.append(job_id)
        self.say(f"Hugging Face Trainer job {job_id} submitted (2 nodes, checkpoint every {CHECKPOINT_EVERY} steps)")
        return job_id

    @property
    def job_id(self) -> int:
        return self.job_ids[-1]

    def last_step(self, job_id: int) -> tuple[float, int] | None:
        return self.db.execute("SELECT ts, step FROM kpis WHERE job_id = ? AND rank = 0 AND step IS NOT NULL "
                               "ORDER BY ts DESC LIMIT 1", (job_id,)).fetchone()

    def wait_steady(self, timeout: float) -> None:
        """Training runs and has advanced for settle_s since it (re)started, past a checkpoint, and for baseline_s
        since it first started."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            job = self.slurm.job(self.job_id)
            if job is None or job.state not in TRAINING_STATES:
                self.say(f"training job {self.job_id} ended ({job.state if job else 'gone'}): lost; resubmitting")
                self.lost_jobs += 1
                self.submit_training()
                continue
            restart = self.db.execute(
                "SELECT max(events.ts) FROM events, json_each(events.job_ids) AS j WHERE events.source = 'kpi' "
                "AND events.kind IN ('resume', 'start') AND j.value = ?", (self.job_id,)).fetchone()[0]
            last = self.last_step(self.job_id)
            first = self.db.execute("SELECT min(ts) FROM kpis WHERE job_id = ? AND step IS NOT NULL",
                                    (self.job_id,)).fetchone()[0]
            if (job.state == "RUNNING" and restart and last and last[0] > restart + self.settle_s
                    and time.time() - last[0] < 3 and last[1] > CHECKPOINT_EVERY
                    and last[0] - first >= self.baseline_s):
                return
            time.sleep(1)
        raise RuntimeError(f"training job {self.job_id} made no steady progress within {timeout:.0f}s")

    def healthy_nodes(self) -> list[str]:
        return [n.name for n in self.slurm.nodes() if n.available]

    # ---------- one fault ----------
    def inject(self, kind: str) -> tuple[FaultRow, object, int | None]:
        job = self.slurm.job(self.job_id)
        probe = None
        if kind == "prolog":
            # The node an earlier fault took out may still be on its way back: wait for an idle one.
            deadline = time.monotonic() + 180
            while not (idle := sorted(set(self.healthy_nodes()) - set(job.nodes))) and time.monotonic() < deadline:
                time.sleep(1)
                job = self.slurm.job(self.job_id)
            if not idle:
                raise RuntimeError("no idle node in service for the prolog fault within 180 s")
            node = self.rng.choice(idle)
            inj = self.chaos.inject("log", node, xid=119)
            probe = self.slurm.submit(None, "-w", node, "-J", "soak-probe", "-o", "/dev/null",
                                      wrap="sleep 1")
            self.say(f"  job {probe} placed on {node}")
        elif kind.startswith("log:"):
            signature = kind.split(":", 1)[1]
            rule = self.rules[signature]
            node = self.rng.choice(sorted(job.nodes))
            lines = rule.log.count if rule.log is not None else 1
            injections = [self.chaos.inject("log", node, signature=signature, job_id=self.job_id)
                          for _ in range(lines)]
            inj = injections[0]
            inj.params["all"] = [i.id for i in injections]
            row = FaultRow("log", node, inj.ts, self.job_id, signature=signature, expected_action=rule.action,
                           requeues=rule.requeue_jobs)
            return row, inj, None
        else:
            node = self.rng.choice(sorted(job.nodes))
            if kind == "xid":
                inj = self.chaos.inject("log", node, xid=79)
            elif kind == "straggler":
                inj = self.chaos.inject("straggler", node, job_id=self.job_id, percent=70)
            elif kind in ("hang", "nan"):
                inj = self.chaos.inject(kind, node, job_id=self.job_id)
            else:
                inj = self.chaos.inject(kind, node)
        row = FaultRow(kind, node, inj.ts, None if kind == "prolog" else self.job_id)
        return row, inj, probe

    def observe(self, row: FaultRow) -> None:
        since = row.ts - 1.0
        only = "AND rule_id = ?" if row.kind == "log" else "AND rule_id != 'watchdog-crash-loop'"
        inc = self.db.execute(
            f"SELECT opened_at, rule_id, source, node FROM incidents WHERE opened_at >= ? {only} "
            "AND (node = ? OR job_id = ?) ORDER BY opened_at LIMIT 1",
            (since, *([row.signature] if row.kind == "log" else []), row.node, row.job_id or -1)).fetchone()
        if inc:
            row.detected_ts = inc[0]
            row.detected_by = f"{inc[1]} ({inc[2]})"
        drains = drains_since(self.db, since)
        row.acted_nodes = sorted({d[0] for d in drains})
        verdict = self.db.execute(
            "SELECT min(i.opened_at) FROM actions a JOIN incidents i ON i.id = a.incident_id WHERE a.created_at >= ?"
            " AND i.opened_at >= ? AND ((a.kind = 'drain' AND a.target = ?) OR (a.kind = 'requeue' AND a.target = ?))",
            (since, since, row.node, str(row.job_id or -1))).fetchone()[0]
        row.verdict_ts = verdict
        acting = next((f"{d[1]} ({d[2]})" for d in drains if d[0] == row.node), None)
        if acting and inc and acting.split()[0] != inc[1]:
            row.detected_by += f" -> {acting}"  # e.g. a throughput drop, then isolation names the node
        if row.job_id is None:
            return
        restart = self.db.execute(
            "SELECT min(events.ts) FROM events, json_each(events.job_ids) AS j WHERE events.source = 'kpi' "
            "AND events.kind IN ('resume', 'start') AND events.ts > ? AND j.value = ?", (row.ts, row.job_id)).fetchone()[0]
        if restart is None:
            return
        row.restart_ts = restart
        row.last_step_before, row.last_step_ts = self.db.execute(
            "SELECT max(step), max(ts) FROM kpis WHERE job_id = ? AND ts < ? AND step IS NOT NULL",
            (row.job_id, restart)).fetchone()
        after = self.db.execute("SELECT ts, step FROM kpis WHERE job_id = ? AND ts > ? AND step IS NOT NULL "
                                "ORDER BY ts LIMIT 1", (row.job_id, restart)).fetchone()
        if after:
            row.recovered_ts, row.first_step_after = after
            # the fault's window closes when the redone steps are behind us: new work again
            row.caught_up_ts = self.db.execute("SELECT min(ts) FROM kpis WHERE job_id = ? AND ts > ? AND step > ?",
                                               (row.job_id, restart, row.last_step_before or 0)).fetchone()[0]

    def timeline(self, row: FaultRow) -> list[tuple[float, str]]:
        """(seconds after the fault, what happened) for one fault, from the controller's database and SLURM's
        accounting: detection, decisions, just-in-time request and answer, requeue, pending, start, the new run's
        start-up phases, first step, caught up. Where a fault's lost time goes."""
        since, until = row.ts - 1.0, (row.caught_up_ts or time.time()) + 1.0
        out: list[tuple[float, str]] = []
        for opened, rule, source, node, status in self.db.execute(
                "SELECT opened_at, rule_id, source, node, status FROM incidents WHERE opened_at BETWEEN ? AND ? "
                "AND (node = ? OR job_id = ?) ORDER BY opened_at", (since, until, row.node, row.job_id or -1)):
            out.append((opened, f"incident {rule} ({source}) on {node or '-'}: {status}"))
        for created, done, kind, target, state in self.db.execute(
                "SELECT created_at, done_at, kind, target, state FROM actions WHERE created_at BETWEEN ? AND ? "
                "ORDER BY created_at", (since, until)):
            out.append((created, f"action {kind} {target} planned"))
            if done is not None:
                out.append((done, f"action {kind} {target} {state}"))
        for node, asked, delivered, acked, step, deadline in self.db.execute(
                "SELECT node, requested_at, delivered_at, acked_at, ack_step, deadline FROM checkpoint_requests "
                "WHERE requested_at BETWEEN ? AND ? ORDER BY requested_at", (since, until)):
            out.append((asked, f"checkpoint request to {node} (deadline +{deadline - asked:.0f}s)"))
            if delivered is not None:
                out.append((delivered, f"checkpoint request delivered to {node}'s sidecar"))
            if acked is not None:
                out.append((acked, f"checkpoint request answered (step {step})"))
        if row.job_id is not None:
            for ts, node, kind, fields in self.db.execute(
                    "SELECT events.ts, events.node, events.kind, events.fields FROM events, json_each(events.job_ids)"
                    " AS j WHERE events.source = 'kpi' AND events.ts BETWEEN ? AND ? AND j.value = ? AND "
                    "events.kind IN ('checkpoint', 'resume', 'start', 'stop', 'nan_loss') ORDER BY events.ts",
                    (since, until, row.job_id)):
                f = json.loads(fields or "{}")
                detail = f.get("kind") or f.get("checkpoint_kind") or ""
                out.append((ts, f"kpi {kind} on {node}" + (f" ({detail})" if detail else "")
                            + (f" step {f['step']}" if f.get("step") is not None else "")))
                for phase, at in (f.get("startup") or {}).items() if kind == "start" else ():
                    if at:
                        out.append((at, f"  start-up on {node}: {phase}"))
            out += self.accounting(row.job_id, since, until)
            for label, ts in (("last step of the old run", row.last_step_ts), ("first step after", row.recovered_ts),
                              ("caught up (new work)", row.caught_up_ts)):
                if ts is not None:
                    out.append((ts, label))
        return sorted((ts - row.ts, what) for ts, what in out)

    def accounting(self, job_id: int, since: float, until: float) -> list[tuple[float, str]]:
        """SLURM's view of the job's runs between since and until (sacct, one record per run of a requeued job;
        whole seconds)."""
        out = []
        for rec in self.slurm.accounting([job_id], duplicates=True):
            for label, ts in (("submitted/eligible", rec.submit_time), ("started", rec.start_time),
                              ("ended", rec.end_time)):
                if ts and since - 1 <= ts <= until:
                    out.append((float(ts), f"slurm: run {label} ({rec.state}, {','.join(rec.nodes) or '-'})"))
        return out

    def handled(self, row: FaultRow) -> bool:
        self.observe(row)
        if not row.detected:
            return False
        if row.node_fault and row.node not in row.acted_nodes:
            return False
        return row.recovered

    def node_back(self, node: str) -> bool:
        n = self.slurm.node(node)
        state = self.db.execute("SELECT state FROM node_lifecycle WHERE node = ?", (node,)).fetchone()
        return (n.available and (state is None or state[0] in ("resumed", "returned")))

    def repair(self, node: str) -> None:
        """What an admin does for a node waiting for a person (manual playbook): mark it repaired."""
        from sigma.paths import project_root

        if waits_for_admin(self.db, node):
            proc = subprocess.run([sys.executable, "-m", "sigma.cli", "nodes", "--repaired", node, "--config",
                                   str(self.stack.controller_config)], env=self.env, capture_output=True, text=True,
                                  timeout=120, cwd=project_root())
            # the controller may have moved the node on between the read above and the command: said, not fatal
            self.say(f"  admin: `sigma nodes --repaired {node}`"
                     + ("" if proc.returncode == 0 else f": {proc.stderr.strip() or proc.stdout.strip()}"))

    def job_requeue_times(self) -> list[float]:
        """When the controller requeued the training job for a job-level fault (what its crash-loop guard counts)."""
        return [r[0] for r in self.db.execute(
            "SELECT a.created_at FROM actions a JOIN incidents i ON i.id = a.incident_id WHERE a.kind = 'requeue' "
            "AND a.target = ? AND a.state IN ('done', 'planned') AND i.scope = 'job'", (str(self.job_id),))]

    def requeues_at_job_level(self, kind: str) -> bool:
        if kind == "nan":
            return True
        rule = self.rules.get(kind.split(":", 1)[1]) if kind.startswith("log:") else None
        return rule is not None and rule.action == "requeue"

    def fault(self, kind: str) -> FaultRow:
        self.wait_steady(self.fault_timeout)
        if self.requeues_at_job_level(kind):
            wait = crash_loop_wait(self.job_requeue_times(), time.time())
            if wait > 0:
                self.say(f"  {kind}: waiting {wait:.0f}s, so that this job-level fault is not a crash loop with the "
                         f"ones before it ({CRASH_LOOP_RESTARTS} requeues in {CRASH_LOOP_WINDOW_S:.0f}s)")
                time.sleep(wait)
                self.wait_steady(self.fault_timeout)
        row, inj, probe = self.inject(kind)
        self.say(f"fault {row.label} on {row.node} (job {row.job_id or probe}) at step "
                 f"{(self.last_step(self.job_id) or (0, '?'))[1]}")
        deadline = time.monotonic() + self.fault_timeout
        while time.monotonic() < deadline and not self.handled(row):
            time.sleep(1)
        self.say(f"  {'handled' if self.handled(row) else 'NOT handled'}: detected by {row.detected_by or '-'}, "
                 f"drained {row.acted_nodes or '-'}, job {'recovered' if row.recovered else 'not recovered'}")
        if probe is not None:
            self.slurm.cancel(probe)
        for inj_id in inj.params.get("all", [inj.id]):
            self.chaos.undo(inj_id)
        self.say(f"  undone: `sigma chaos undo {' '.join(inj.params.get('all', [inj.id]))}`")
        deadline = time.monotonic() + self.fault_timeout
        while time.monotonic() < deadline and not self.node_back(row.node):
            self.repair(row.node)
            time.sleep(2)
        if self.node_back(row.node):
            row.node_back_ts = time.time()
            self.say(f"  {row.node} back in service after {row.node_back_ts - row.ts:.0f}s")
        else:
            row.note = "node not back"
            self.say(f"  {row.node} NOT back in service")
        self.observe(row)
        if self.show_timeline:
            for dt, what in self.timeline(row):
                self.say(f"    {dt:+7.2f}s  {what}")
        return row

    # ---------- totals ----------
    def false_drains(self, rows: list[FaultRow], t0: float) -> list[str]:
        """Drains of a node while no fault injected on it was being handled."""
        out = []
        for created, node in self.db.execute("SELECT created_at, target FROM actions WHERE kind = 'drain' AND "
                                             "state = 'done' AND created_at >= ?", (t0,)):
            if not any(r.node == node and r.ts - 1 <= created <= (r.node_back_ts or time.time()) for r in rows):
                out.append(f"{node}@{time.strftime('%H:%M:%S', time.localtime(created))}")
        return out

    def effective_time(self, rows: list[FaultRow], t0: float, t1: float) -> tuple[float, float]:
        """Share of wall time with steps progressing (new steps, not redone ones), overall and outside faults."""
        points = []
        for job_id in self.job_ids:
            points += [tuple(r) for r in self.db.execute(
                "SELECT ts, step, CASE WHEN json_valid(payload) THEN json_extract(payload, '$.eval_s') END FROM kpis"
                " WHERE job_id = ? AND rank = 0 AND step IS NOT NULL AND ts BETWEEN ? AND ?", (job_id, t0, t1))]
        share = effective_share(points, [(r.ts, r.window_end) for r in rows], t0, t1)
        self.lost_outside, self.evaluations = share.lost_outside, share.evaluations
        return share.overall, share.outside

    def print_lost_outside(self, rows: list[FaultRow]) -> None:
        """Each stretch outside the fault windows that did not count as training, with the job's KPI events in it:
        where the effective time outside the windows goes."""
        total = sum(lost for *_, lost in self.lost_outside)
        self.say(f"outside the fault windows, {total:.1f} s not counted as training in {len(self.lost_outside)} "
                 f"stretch(es):")
        for ta, tb, sa, sb, lost in self.lost_outside:
            events = [f"{kind}{' ' + json.loads(fields or '{}').get('kind', '') if kind == 'checkpoint' else ''}"
                      f" @{ts - ta:+.2f}s" for ts, kind, fields in self.db.execute(
                          "SELECT ts, kind, fields FROM events WHERE source = 'kpi' AND kind != 'heartbeat' AND ts BETWEEN ? AND ? "
                          "ORDER BY ts", (ta - 0.5, tb + 0.5))]
            after = min((r for r in rows if r.window_end <= ta), key=lambda r: ta - r.window_end, default=None)
            since = f"{ta - after.window_end:.1f} s after the {after.label} window" if after else "before any fault"
            self.say(f"  {time.strftime('%H:%M:%S', time.localtime(ta))} steps {sa} -> {sb}: {tb - ta:.2f} s "
                     f"({lost:.2f} s outside; {since}); events: {', '.join(events) or 'none'}")

    def run(self, minutes: float, kinds: list[str], port_base: int | None = None) -> SoakResult:
        self.up(port_base)
        t0 = time.time()
        self.submit_training()
        rows: list[FaultRow] = []
        end = time.monotonic() + minutes * 60
        schedule: list[str] = []
        pending = list(self.signatures) if "log" in kinds else []  # signatures not run yet
        self.rng.shuffle(pending)

        def done() -> bool:  # sampling (per_round) ends with the time; the full set runs every signature first
            return bool(rows) and time.monotonic() >= end and (not pending or self.per_round is not None)

        while True:
            if not schedule:
                if done():
                    break
                schedule = [k for k in kinds if k != "log"]
                if "log" in kinds:
                    take = len(pending) if self.per_round is None else self.per_round
                    if not pending:  # every signature ran: sample again
                        pending = list(self.signatures)
                        self.rng.shuffle(pending)
                    schedule += [f"log:{sig}" for sig in pending[:take]]
                    del pending[:take]
                self.rng.shuffle(schedule)
            rows.append(self.fault(schedule.pop(0)))
            if not schedule and done():
                break
        self.wait_steady(self.fault_timeout)
        t1 = time.time()
        job = self.slurm.job(self.job_id)
        if job is None or job.state not in TRAINING_STATES:
            self.lost_jobs += 1
        self.slurm.cancel(self.job_id)
        for row in rows:  # a fault still catching up when the next began: its window closes when it caught up
            if row.caught_up_ts is None and row.restart_ts is not None and row.last_step_before is not None:
                row.caught_up_ts = self.db.execute(
                    "SELECT min(ts) FROM kpis WHERE job_id = ? AND ts > ? AND step > ?",
                    (row.job_id, row.restart_ts, row.last_step_before)).fetchone()[0]
        eff, eff_out = self.effective_time(rows, t0, t1)
        if self.show_timeline:
            self.print_lost_outside(rows)
        report = _sigma(self.env, "report", "--config", str(self.stack.controller_config), "--since",
                        time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(t0 - 1)), check=False)  # this soak only
        return SoakResult(rows, self.false_drains(rows, t0), self.lost_jobs, t1 - t0, eff, eff_out, report,
                          list(self.job_ids), list(self.evaluations))

    def stop_platform(self, with_cluster: bool = False) -> None:
        _sigma(self.env, "stack", "down", *(["--with-cluster"] if with_cluster else []), *self.state_args,
               check=False)


STALL_S = 2.0  # a gap between two steps longer than this (and than 5 typical steps) is not a step but a stall


@dataclass
class Share:
    overall: float
    outside: float  # outside the fault windows
    lost_outside: list[tuple]  # (from, to, step, next step, seconds outside the windows): what `outside` lacks
    evaluations: list[tuple]  # (step, seconds) of the evaluations inside steps counted as training


def effective_share(points: list[tuple], windows: list[tuple[float, float]], t0: float, t1: float) -> Share:
    """Effective training time from rank 0's steps: (ts, step, eval_s or None) per step. A gap between two steps
    counts as training when it brings a new step (not a redone one) and, without the evaluation the trainer ran in
    it (`eval_s`, the `eval.every` the user configured), is no longer than a stall (STALL_S, or 5 typical steps).
    The evaluation itself counts as the job's own work, not as time a fault took: an evaluation of 1.7 s plus a
    0.3 s step is not a 2 s stall."""
    points = sorted(points)
    gaps = sorted(b[0] - a[0] for a, b in zip(points, points[1:]))
    typical = gaps[len(gaps) // 2] if gaps else 1.0

    def outside(a: float, b: float) -> float:
        span = b - a
        for w0, w1 in windows:
            span -= max(0.0, min(b, w1) - max(a, w0))
        return max(0.0, span)

    good = good_out = 0.0
    best = -1
    lost_outside, evaluations = [], []
    for (ta, sa, _), (tb, sb, eval_s) in zip(points, points[1:]):
        if sb > best and sb > sa and tb - ta - (eval_s or 0.0) <= max(STALL_S, 5 * typical):
            good += tb - ta
            good_out += outside(ta, tb)
            if eval_s:
                evaluations.append((sb, eval_s))
        elif outside(ta, tb) > 0:
            lost_outside.append((ta, tb, sa, sb, outside(ta, tb)))
        best = max(best, sb)
    start = points[0][0] if points else t0
    wall, wall_out = t1 - start, outside(start, t1)
    return Share(good / wall if wall > 0 else 0.0, good_out / wall_out if wall_out > 0 else 0.0, lost_outside,
                 evaluations)


def drains_since(db, since: float) -> list[tuple]:
    """(node, rule, source) of each drain done since `since` for an incident opened since then. A drain for an
    incident opened before is an earlier fault's remediation draining its node again after a failed validation:
    not a decision about a fault injected since."""
    return db.execute(
        "SELECT a.target, i.rule_id, i.source FROM actions a LEFT JOIN incidents i ON i.id = a.incident_id "
        "WHERE a.kind = 'drain' AND a.state = 'done' AND a.created_at >= ? AND "
        "COALESCE(i.opened_at, a.created_at) >= ? ORDER BY a.created_at", (since, since)).fetchall()


def waits_for_admin(db, node: str) -> bool:
    """The node waits for a person (manual or ticket playbook) and nobody has marked it repaired yet: marked once,
    not again while the controller has still to move it on (a second mark would find it validating)."""
    row = db.execute("SELECT state, playbook, data FROM node_lifecycle WHERE node = ?", (node,)).fetchone()
    return bool(row and row[0] == "remediating" and row[1] in ("manual", "nvlink-ticket")
                and "repaired_at" not in json.loads(row[2] or "{}"))


def crash_loop_wait(requeues: list[float], now: float, restarts: int = CRASH_LOOP_RESTARTS,
                    window_s: float = CRASH_LOOP_WINDOW_S) -> float:
    """Seconds until one more job-level requeue would leave the job under the crash-loop guard: fewer than `restarts`
    requeues within `window_s` before it (the guard refuses the requeue that finds `restarts` already there)."""
    recent = sorted(t for t in requeues if now - t < window_s)
    if len(recent) < restarts:
        return 0.0
    return recent[-restarts] + window_s - now + 1.0


def _load_rules():
    from sigma.paths import project_root
    from sigma.rules.loader import load_rules

    return load_rules(project_root() / "configs" / "rules")


# The site's own programs that command playbooks run, for the local cluster's emulated nodes, where the shipped
# path is not installed (an admin provides these on a real cluster: configs/remediation.yaml).
SITE_PROGRAMS = {
    "disk-cleanup": """#!/bin/sh
# clean-scratch NODE: empty the emulated node's local scratch directory (the soak's site program for the
# disk-cleanup playbook; a real site's script frees its nodes' scratch file systems)
set -eu
scratch="{state}/nodes/$1/scratch"
mkdir -p "$scratch"
find "$scratch" -mindepth 1 -delete
echo "cleaned $scratch"
""",
}


def write_site_remediation(state_dir: Path) -> Path:
    """The shipped playbooks, with validation logs in the state directory and each command playbook whose program
    is not installed here running the site program above: written under the state directory for `sigma stack up
    --set remediation=...`."""
    import yaml

    from sigma.paths import project_root

    site = state_dir / "site"
    site.mkdir(parents=True, exist_ok=True)
    config = yaml.safe_load((project_root() / "configs" / "remediation.yaml").read_text())
    config.setdefault("validation", {})["output_dir"] = str(state_dir / "log")
    for playbook in config.get("playbooks") or []:
        if playbook.get("kind") == "command" and not shutil.which(playbook["command"][0]) \
                and playbook["name"] in SITE_PROGRAMS:
            program = site / playbook["name"]
            program.write_text(SITE_PROGRAMS[playbook["name"]].replace("{state}", str(state_dir)))
            program.chmod(0o755)
            playbook["command"] = [str(program), "{node}"]
    path = site / "remediation.yaml"
    path.write_text("# written by bench/chaos_soak.py from configs/remediation.yaml\n"
                    + yaml.safe_dump(config, sort_keys=False))
    return path


def runnable_signatures(say=print) -> list[str]:
    """Every catalogue rule `sigma chaos log --signature` can inject, less those whose repair cannot run on the local
    cluster (a command playbook whose program is not installed here and that the soak has no site program for:
    the node would stay out for good)."""
    import shutil as _shutil

    from sigma.chaos.inject import ALIASES, SIGNATURES
    from sigma.controller.config import load_remediation_config
    from sigma.paths import project_root

    rules = {r.id: r for r in _load_rules()}
    remediation = load_remediation_config(project_root() / "configs" / "remediation.yaml")
    out = []
    for name in sorted(SIGNATURES):
        if name in ALIASES:
            continue
        rule = rules[name]
        if rule.action in DRAINS:
            playbook = remediation.playbook_for(rule.id, rule.category, rule.action)
            if (playbook.kind == "command" and not _shutil.which(playbook.command[0])
                    and playbook.name not in SITE_PROGRAMS):
                say(f"signature {name} skipped: its playbook {playbook.name} runs {playbook.command[0]}, "
                    f"not installed here")
                continue
        out.append(name)
    return out


def shard(kinds: list[str], signatures: list[str], spec: str) -> tuple[list[str], list[str]]:
    """The kinds and signatures of shard I of N (spec "I/N", 1-based): every N-th fault of one sorted list of the
    non-log kinds and the log signatures, so that the N shards together run each exactly once."""
    match = re.fullmatch(r"(\d+)/(\d+)", spec)
    if not match or not 1 <= int(match.group(1)) <= int(match.group(2)):
        raise ValueError(f"--shard {spec!r}: expected I/N with 1 <= I <= N, e.g. 2/4")
    i, n = int(match.group(1)), int(match.group(2))
    faults = sorted(k for k in kinds if k != "log") + sorted(f"log:{s}" for s in signatures if "log" in kinds)
    mine = faults[i - 1::n]
    sigs = [f.split(":", 1)[1] for f in mine if f.startswith("log:")]
    return [k for k in mine if not k.startswith("log:")] + (["log"] if sigs else []), sigs


def not_run(kinds: list[str], signatures: list[str], rows: list[FaultRow]) -> list[str]:
    """The selected kinds and signatures the run never injected (the exit condition covers every one)."""
    ran = {r.label for r in rows}
    expected = [k for k in kinds if k != "log"] + ([f"log:{s}" for s in signatures] if "log" in kinds else [])
    return sorted(set(expected) - ran)


def _fmt(v, spec: str = ".1f", unit: str = " s") -> str:
    return "-" if v is None else f"{v:{spec}}{unit}"


def _goal(r: FaultRow) -> str:
    extra = r.lost_after_detection_s
    return "-" if extra is None else f"{extra:.1f} s ({'met' if extra <= LOST_GOAL_S else 'NOT met'})"


def print_result(res: SoakResult) -> None:
    head = ("kind", "node", "detected by", "latency", "acted on", "right node", "job recovered", "recovery",
            "steps lost", "time lost", f"lost - acted on (goal <= {LOST_GOAL_S:.0f} s)")
    table = [head] + [(r.label, r.node, r.detected_by or "NOT DETECTED", _fmt(r.latency), _fmt(r.verdict_s),
                       "yes" if r.right_node else f"no ({','.join(r.acted_nodes) or 'none'})",
                       ("n/a (idle node)" if r.kind == "prolog" else "n/a (left running)" if not r.job_affected
                        else "yes" if r.recovered else "NO"),
                       _fmt(r.recovery_s), "-" if r.steps_lost is None else str(r.steps_lost),
                       _fmt(r.time_lost_s), _goal(r)) for r in res.rows]
    widths = [max(len(str(row[i])) for row in table) for i in range(len(head))]
    for i, row in enumerate(table):
        print("  ".join(str(c).ljust(w) for c, w in zip(row, widths)))
        if i == 0:
            print("  ".join("-" * w for w in widths))
    print()
    print(f"faults: {len(res.rows)}; detected {sum(r.detected for r in res.rows)}; right node "
          f"{sum(r.right_node for r in res.rows)}; job recovered {sum(r.recovered for r in res.rows)}")
    logs = [r for r in res.rows if r.kind == "log"]
    if logs:
        print(f"catalogue signatures: {len({r.signature for r in logs})} injected; decided as the catalogue says "
              f"{sum(r.detected and r.right_node and r.recovered for r in logs)} of {len(logs)}")
    print(f"false drains: {len(res.false_drains)} {res.false_drains or ''}")
    print(f"lost jobs: {res.lost_jobs}")
    print(f"effective training time: {100 * res.effective:.1f} % of {res.wall_s / 60:.1f} min overall, "
          f"{100 * res.effective_outside:.1f} % outside the fault windows{res.evaluated()}")
    print()
    print(res.report)


def print_comparison(before: SoakResult, after: SoakResult,
                     title: str = "without (before) and with (after) just-in-time checkpoints, same seed:",
                     names: tuple[str, str] = ("before", "after")) -> None:
    """Steps and time lost per fault kind, and effective training time, of two soaks (same seed, same machine):
    without and with just-in-time checkpoints, or `sigma train` and a Hugging Face Trainer job."""
    def per_kind(res: SoakResult) -> dict[str, list[FaultRow]]:
        out: dict[str, list[FaultRow]] = {}
        for r in res.rows:
            if r.job_affected:
                out.setdefault(r.label, []).append(r)
        return out

    def cell(rows: list[FaultRow], value) -> str:
        vals = [value(r) for r in rows]
        vals = [v for v in vals if v is not None]
        return "-" if not vals else "/".join(f"{v:.0f}" if isinstance(v, float) else str(v) for v in vals)

    b, a = per_kind(before), per_kind(after)
    x, y = names
    head = ("kind", f"steps lost {x}", y, f"time lost {x} (s)", y, f"detection {x} (s)", y, f"acted on {x} (s)", y,
            f"lost - acted on {x} (s)", y, f"goal ({y}: <= {LOST_GOAL_S:.0f} s)")
    table = [head]
    for kind in sorted(set(b) | set(a)):
        rb, ra = b.get(kind, []), a.get(kind, [])
        extra = [r.lost_after_detection_s for r in ra if r.lost_after_detection_s is not None]
        table.append((kind, cell(rb, lambda r: r.steps_lost), cell(ra, lambda r: r.steps_lost),
                      cell(rb, lambda r: r.time_lost_s), cell(ra, lambda r: r.time_lost_s),
                      cell(rb, lambda r: r.latency), cell(ra, lambda r: r.latency),
                      cell(rb, lambda r: r.verdict_s), cell(ra, lambda r: r.verdict_s),
                      cell(rb, lambda r: r.lost_after_detection_s), cell(ra, lambda r: r.lost_after_detection_s),
                      "-" if not extra else "met" if max(extra) <= LOST_GOAL_S else "NOT met"))
    widths = [max(len(str(row[i])) for row in table) for i in range(len(head))]
    print(title)
    for i, row in enumerate(table):
        print("  ".join(str(c).ljust(w) for c, w in zip(row, widths)))
        if i == 0:
            print("  ".join("-" * w for w in widths))
    for name, res in ((x, before), (y, after)):
        lost = [r.steps_lost for r in res.rows if r.steps_lost is not None]
        print(f"{name}: steps lost {sum(lost)} in {len(lost)} faults (max {max(lost, default=0)}); effective "
              f"training time {100 * res.effective:.1f} % overall, {100 * res.effective_outside:.1f} % outside the "
              f"fault windows ({res.wall_s / 60:.1f} min){res.evaluated()}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--minutes", type=float, default=20.0, help="soak length (at least one fault of each kind)")
    p.add_argument("--seed", type=int, default=0, help="seeds the fault order and the nodes hit")
    p.add_argument("--state-dir", type=Path, default=None, help="cluster state directory")
    p.add_argument("--port-base", type=int, default=None, help="cluster ports (default: derived from the state dir)")
    p.add_argument("--kinds", nargs="+", choices=KINDS, default=list(KINDS), help="fault kinds to inject")
    p.add_argument("--signatures", nargs="+", default=["all"],
                   help="log kind: 'all' (every catalogue signature, the run lasts until each ran), a number to "
                        "sample per round, or rule ids")
    p.add_argument("--shard", default=None, metavar="I/N",
                   help="run the I-th of N shares of the kinds and signatures (with --signatures all or names)")
    p.add_argument("--hang-timeout", type=float, default=None,
                   help="controller watchdog hang timeout (s; default: the shipped one)")
    p.add_argument("--throughput-window", type=float, default=30.0,
                   help="the controller's shipped watchdog.recent_window_s: the first fault waits twice this (s)")
    p.add_argument("--settle", type=float, default=15.0, help="healthy training seconds before each fault")
    p.add_argument("--fault-timeout", type=float, default=240.0, help="give up on one fault after this long")
    p.add_argument("--keep", action="store_true", help="leave the platform running at the end")
    p.add_argument("--json", type=Path, default=None, help="also write the rows and totals here")
    p.add_argument("--timeline", action="store_true",
                   help="print each fault's timeline (detection, decisions, checkpoint request and answer, SLURM's "
                        "runs, the new run's start-up, first step); with --minutes 0, one round of --kinds")
    p.add_argument("--trainer", choices=("sigma", "hf", "both"), default="sigma",
                   help="what trains: `sigma train`, a Hugging Face Trainer job, or both one after the other")
    jit = p.add_mutually_exclusive_group()
    jit.add_argument("--no-jit", action="store_true", help="as before just-in-time checkpoints (see above)")
    jit.add_argument("--compare", action="store_true", help="run without, then with just-in-time checkpoints")
    args = p.parse_args(argv)
    t = time.monotonic()
    say = lambda s: print(f"[{time.monotonic() - t:6.1f}s] {s}", flush=True)  # noqa: E731
    signatures, per_round = None, None
    if args.signatures != ["all"]:
        if len(args.signatures) == 1 and args.signatures[0].isdigit():
            per_round = int(args.signatures[0])
        else:
            signatures = args.signatures
    kinds = args.kinds
    if args.shard:
        if per_round is not None:
            p.error("--shard needs --signatures all or names, not a number per round")
        kinds, signatures = shard(kinds, signatures if signatures is not None else runnable_signatures(say),
                                  args.shard)
        say(f"shard {args.shard}: kinds {' '.join(k for k in kinds if k != 'log') or '-'}; "
            f"signatures {' '.join(signatures) or '-'}")

    def soak_once(jit: bool, keep: bool, trainer: str = args.trainer) -> tuple[Soak, SoakResult]:
        say(f"soak of {'`sigma train`' if trainer == 'sigma' else 'a Hugging Face Trainer job'} "
            f"{'with' if jit else 'without'} just-in-time checkpoints, seed {args.seed}")
        soak = Soak(args.state_dir, args.seed, args.hang_timeout, args.settle, args.fault_timeout,
                    args.throughput_window, say=say, signatures=signatures, per_round=per_round, jit=jit,
                    timeline=args.timeline, trainer=trainer)
        try:
            res = soak.run(args.minutes, kinds, args.port_base)
        finally:
            if not keep:
                soak.stop_platform(with_cluster=True)
        print_result(res)
        return soak, res

    if args.trainer == "both":
        if args.compare or args.no_jit:
            p.error("--trainer both compares the trainers, with just-in-time checkpoints: not with --compare/--no-jit")
        soak, res = soak_once(True, False, "hf")  # the newer one first: a problem shows before the long half
        _, ours = soak_once(True, args.keep, "sigma")
        print_comparison(ours, res, "`sigma train` and a Hugging Face Trainer job (sigma.integrations.hf), same "
                                    "seed, same machine:", ("sigma", "hf"))
    elif args.compare:
        _, before = soak_once(False, False)
        soak, res = soak_once(True, args.keep)
        print_comparison(before, res)
    else:
        soak, res = soak_once(not args.no_jit, args.keep)
    if args.json:
        args.json.write_text(json.dumps({"rows": [{**r.__dict__, "latency": r.latency, "recovery_s": r.recovery_s,
                                                   "steps_lost": r.steps_lost, "time_lost_s": r.time_lost_s,
                                                   "acted_on_s": r.verdict_s,
                                                   "lost_after_acted_on_s": r.lost_after_detection_s,
                                                   "right_node": r.right_node}
                                                  for r in res.rows],
                                         "false_drains": res.false_drains, "lost_jobs": res.lost_jobs,
                                         "effective": res.effective, "effective_outside": res.effective_outside},
                                        indent=2))
    missing = not_run(kinds, soak.signatures if soak.per_round is None else [], res.rows)
    if missing:
        print(f"never injected: {', '.join(missing)}")
    ok = (all(r.detected and r.right_node and r.recovered for r in res.rows) and not res.false_drains
          and not res.lost_jobs and not missing)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
