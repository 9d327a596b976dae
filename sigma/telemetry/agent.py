"""The sidecar: runs the enabled collectors when due on one scheduler thread (a heap of deadlines), times each run,
stores what they produced (tagged with the node's running job ids) in the node store, enforces the store's bounds
and pushes.

- One thread for all collectors: at 1 Hz the collectors due together run back to back and their records are
  written right after them, one thread wake-up and one transaction a second instead of one per collector.
- A collector that raises is recorded (sidecar.collector.success=0 and an event on each ok->failing change); the
  others keep running. A run that takes longer than STALL_S (a hung NFS statvfs, a stuck driver) is reported
  (event 'collector_hung'); that collector goes on in a thread of its own and the others on a new scheduler thread.
- SIGHUP reloads the config; a bad config is logged with file:line [key] and the running one is kept.
- SIGTERM/SIGINT stop collection, store what was collected, push the backlog for up to push.drain_on_exit_s.
"""

from __future__ import annotations

import heapq
import logging
import signal
import subprocess
import sys
import threading
import time
from collections import deque

from sigma.config import ConfigError
from sigma.telemetry.base import REGISTRY, CollectorUnavailable, Context, Output
from sigma.telemetry.config import Loaded, load
from sigma.telemetry.jobs import JobTracker
from sigma.telemetry.control import write_checkpoint_requests
from sigma.telemetry.push import Pusher
from sigma.telemetry.store import NodeStore
from sigma.security.keys import KeyFileError, read_node_key

log = logging.getLogger("sigma.telemetry.agent")

UNAVAILABLE_RETRY_S = 300.0
STALL_S = 30.0  # a collector run longer than this is moved off the shared scheduler thread
WATCHDOG_S = 5.0  # how often the main thread looks for a stalled run


class CollectorRunner:
    """One collector: run it, time it, label the result."""

    def __init__(self, section: str, collector, interval_s: float):
        self.section = section
        self.collector = collector
        self.interval_s = interval_s
        self.labels = {"collector": section}

    def run_once(self) -> tuple[tuple, float]:
        """((section, status, error, Output), seconds until the next run)."""
        out = Output()
        started = time.perf_counter()
        cpu_started = time.thread_time()
        status, error = "ok", ""
        try:
            self.collector.collect(out)
        except CollectorUnavailable as exc:
            status, error = "unavailable", str(exc)
        except Exception as exc:  # one collector's failure never stops the others
            status, error = "error", f"{type(exc).__name__}: {exc}"
        n = len(out)
        labels = self.labels
        out.sample("sidecar.collector.duration_s", round(time.perf_counter() - started, 6), labels)
        out.sample("sidecar.collector.cpu_s", round(time.thread_time() - cpu_started, 6), labels)
        out.sample("sidecar.collector.success", 1 if status == "ok" else 0, labels)
        out.sample("sidecar.collector.records", n, labels)
        return (self.section, status, error, out), (UNAVAILABLE_RETRY_S if status == "unavailable"
                                                    else self.interval_s)

    def close(self) -> None:
        try:
            self.collector.close()
        except Exception:
            log.exception("closing collector %s", self.section)


class Scheduler:
    """Runs its collectors when due, on one thread; collected outputs go to the sidecar's sink. The main scheduler
    (writer=True) also writes the sink to the store, refreshes the job ids and prunes, on their own cadences, right
    after the collectors due at the same time. A scheduler whose run stalled becomes that collector's own thread
    (writer=False) once the run returns."""

    def __init__(self, sidecar: "Sidecar", runners: list[CollectorRunner], writer: bool):
        self.sidecar = sidecar
        self.runners = list(runners)
        self.writer = writer
        self.stop_event = threading.Event()
        self.current: tuple | None = None  # (runner, monotonic start) of the run in progress
        self.superseded: CollectorRunner | None = None  # set by the watchdog: from now on only run this one
        name = "collect" if writer else f"collector-{self.runners[0].section}"
        self.thread = threading.Thread(target=self._loop, name=name, daemon=True)

    def start(self) -> None:
        self.thread.start()

    def stop(self, timeout: float = 5.0) -> bool:
        self.stop_event.set()
        self.thread.join(timeout)
        if self.thread.is_alive():
            section = self.current[0].section if self.current else "?"
            log.error("collector %s did not stop within %.0f s; abandoning its thread", section, timeout)
            return False
        for runner in self.runners:
            runner.close()
        return True

    def _loop(self) -> None:
        sidecar = self.sidecar
        now = time.monotonic()
        heap = [(now, i, r) for i, r in enumerate(self.runners)]
        heapq.heapify(heap)
        cfg = sidecar.loaded.config
        # writing, job ids and pruning follow their own cadences, from the same origin as the collectors, so
        # that at equal intervals they are due in the same wake-up, after the collectors
        next_write, next_jobs, next_prune = now + cfg.store.write_every_s, now + cfg.jobs.refresh_s, now
        sink = sidecar.sink
        while True:
            due_at = heap[0][0] if heap else now + 3600.0
            if self.writer:
                due_at = min(due_at, next_write, next_jobs, next_prune)
            if self.stop_event.wait(max(0.0, due_at - time.monotonic())):
                break
            now = time.monotonic()
            while heap and heap[0][0] <= now:
                due, i, runner = heapq.heappop(heap)
                self.current = (runner, time.monotonic())
                item, delay = runner.run_once()
                self.current = None
                sink.append(item)
                if self.superseded is not None and self.writer:  # stalled: now the stalled collector's own thread
                    self.runners, self.writer = [self.superseded], False
                    heap = [] if runner is self.superseded else [(now, 0, self.superseded)]
                    self.thread.name = f"collector-{self.superseded.section}"
                    if runner is not self.superseded:
                        continue
                due += delay
                if due < now:  # overran its interval: skip the missed runs instead of bursting
                    due = now + delay
                heapq.heappush(heap, (due, i, runner))
            if not self.writer or self.superseded is not None:
                continue
            if now >= next_write:
                next_write = max(next_write + cfg.store.write_every_s, now)
                sidecar._drain_sink()
            if now >= next_jobs:
                next_jobs = max(next_jobs + cfg.jobs.refresh_s, now)
                sidecar.jobs.refresh()
            if now >= next_prune:
                next_prune = max(next_prune + cfg.store.prune_every_s, now)
                sidecar._prune()


class Sidecar:
    def __init__(self, config_path: str, *, node: str | None = None, node_dir: str | None = None,
                 overrides: list[str] = (), proc_root: str = "/proc"):
        self.config_path = config_path
        self.node_arg = node
        self.node_dir_arg = node_dir
        self.overrides = list(overrides)
        self.proc_root = proc_root
        self.loaded: Loaded = load(config_path, node, node_dir, self.overrides)
        cfg = self.loaded.config
        self.node = cfg.node
        self.store = NodeStore(cfg.store.path, self.node)
        self.sink: deque = deque()  # (section, status, error, Output) waiting to be written; any thread appends
        self.runners: dict[str, CollectorRunner] = {}
        self.scheduler: Scheduler | None = None
        self.isolated: list[Scheduler] = []  # schedulers left running one stalled collector each
        self.status: dict[str, str] = {}
        self.pusher: Pusher | None = None
        self.jobs: JobTracker | None = None
        self._stop = threading.Event()
        self._reload = threading.Event()
        self._wake = threading.Event()
        self._pending: list[Output] = []
        self._requests_seen: set = set()  # node requests already taken on (they ride on every ack until answered)
        self._build_pusher(cfg)  # fails early on a bad secret file

    # ---------- setup ----------
    def _build_pusher(self, cfg) -> None:
        if self.pusher is not None:
            self.pusher.stop()
            self.pusher = None
        if not cfg.push.url:
            log.warning("push.url is empty: keeping data in %s only", cfg.store.path)
            return
        key = read_node_key(cfg.push.secret_file)
        self.pusher = Pusher(self.store, self.node, cfg.push.url, key, key_file=cfg.push.secret_file,
                             interval_s=cfg.push.interval_s,
                             max_records=cfg.push.max_records, timeout_s=cfg.push.timeout_s,
                             max_backoff_s=cfg.push.max_backoff_s, report=self.report,
                             on_requests=self._checkpoint_requests, on_node_requests=self._node_requests)

    def _checkpoint_requests(self, requests: list[dict]) -> None:
        """The controller asks this node's trainer ranks for a just-in-time checkpoint: hand it on as the control
        file they poll between steps (sigma/telemetry/control.py)."""
        for problem in write_checkpoint_requests(self.loaded.variables["kpi_dir"], self.node, requests):
            self.report("control_error", problem, "warning", {})

    def _node_requests(self, requests: list[dict]) -> None:
        """The controller asks this node to do something (sigma/controller/act/noderequests.py); each request
        rides on every ack until answered, so each runs once, in its own thread (the push goes on)."""
        for req in requests:
            rid = req.get("id")
            if rid in self._requests_seen:
                continue
            self._requests_seen.add(rid)
            threading.Thread(target=self._answer, args=(rid, req.get("kind")), name=f"request-{rid}",
                             daemon=True).start()

    def _answer(self, rid, kind) -> None:
        """log-ack: acknowledge the kernel log after a repair, exactly as an admin would on this node."""
        if kind != "log-ack":
            return self.report("node_request", f"request {rid}: unknown kind {kind!r}", "warning",
                               {"request": rid, "ok": False, "output": f"this sidecar cannot {kind!r}"})
        argv = [sys.executable, "-m", "sigma.cli", "health", "log-ack", "--node", self.node]
        try:
            proc = subprocess.run(argv, capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
            ok, output = proc.returncode == 0, (proc.stdout + proc.stderr).strip()
        except (OSError, subprocess.TimeoutExpired) as exc:
            ok, output = False, f"sigma health log-ack did not run: {exc}"
        self.report("node_request", f"request {rid} ({kind}): {'done' if ok else 'failed'}: {output[-300:]}",
                    "info" if ok else "error", {"request": rid, "kind": kind, "ok": ok, "output": output[-2000:]})

    def _start_collectors(self) -> None:
        cfg = self.loaded.config
        ctx = Context(node=self.node, node_dir=self.loaded.variables["node_dir"], host_root=cfg.host_root,
                      positions=self.store.positions(),
                      job_owner=lambda job_id: self.jobs.owner(job_id) if self.jobs else None,
                      active_jobs=lambda: sorted(self.jobs.slurm_jobs) if self.jobs else [])
        kpi_collectors = []
        for section, (kind, params) in self.loaded.collectors.items():
            if not params.enabled:
                continue
            try:
                collector = REGISTRY[kind](section, params, ctx)
            except Exception as exc:
                log.error("collector %s (%s) cannot start: %s", section, kind, exc)
                self.report("collector_error", f"{section}: cannot start: {exc}", "error", {"collector": section})
                continue
            if kind == "kpi":
                kpi_collectors.append(collector)
            self.runners[section] = CollectorRunner(section, collector, params.interval_s)
        jobs = cfg.jobs

        def kpi_jobs(within_s: float) -> set[int]:
            found = set()
            for c in kpi_collectors:
                for _ in range(3):  # the collector thread may be updating its table
                    try:
                        found |= c.active_jobs(within_s)
                        break
                    except RuntimeError:
                        continue
            return found

        self.jobs = JobTracker(self.node, jobs.sources, proc_root=self.proc_root, kpi_jobs=kpi_jobs,
                               kpi_active_s=jobs.kpi_active_s, squeue_refresh_s=jobs.squeue_refresh_s,
                               spool_dir=jobs.slurmd_spool_dir, proc_rescan_s=jobs.proc_rescan_s)
        self.jobs.refresh()
        self.scheduler = Scheduler(self, list(self.runners.values()), writer=True)
        self.scheduler.start()
        log.info("node %s: collectors %s; store %s; push %s", self.node, ", ".join(self.runners) or "none",
                 cfg.store.path, cfg.push.url or "off")

    def _stop_collectors(self) -> None:
        for scheduler in [self.scheduler, *self.isolated]:
            if scheduler is not None:
                scheduler.stop()
        self.scheduler, self.isolated = None, []
        self.runners = {}
        self._drain_sink()

    def _watchdog(self) -> None:
        """A collector run that stalls the scheduler: report it, leave that thread to it, go on without it."""
        scheduler = self.scheduler
        current = scheduler.current if scheduler is not None else None
        if current is None or time.monotonic() - current[1] < STALL_S:
            return
        runner = current[0]
        if scheduler.current is not current:
            return  # it just finished
        scheduler.superseded = runner
        self.isolated.append(scheduler)
        message = (f"{runner.section}: a run has taken more than {STALL_S:.0f} s; it goes on in a thread of its "
                   f"own, the other collectors on a new one")
        log.error("collector %s", message)
        self.report("collector_hung", message, "error", {"collector": runner.section})
        self.scheduler = Scheduler(self, [r for r in scheduler.runners if r is not runner], writer=True)
        self.scheduler.start()

    # ---------- self reports ----------
    def report(self, kind: str, message: str, severity: str = "info", fields: dict | None = None) -> None:
        """A sidecar event (source 'sidecar'); thread-safe: goes through the writer queue."""
        out = Output()
        out.event("sidecar", kind, message, severity, fields)
        self.sink.append(("sidecar", "ok", "", out))

    # ---------- main loop ----------
    def run(self) -> int:
        signal.signal(signal.SIGHUP, lambda *_: self._request(self._reload))
        signal.signal(signal.SIGTERM, lambda *_: self._request(self._stop))
        signal.signal(signal.SIGINT, lambda *_: self._request(self._stop))
        self._start_collectors()
        if self.pusher:
            self.pusher.start()
        while not self._stop.is_set():
            # the scheduler thread collects, writes and prunes; this one handles signals and watches for stalls
            self._wake.wait(WATCHDOG_S)
            self._wake.clear()
            if self._reload.is_set():
                self._reload.clear()
                self.reload()
            self._watchdog()
        log.info("stopping: flushing collected data")
        self._stop_collectors()
        if self.pusher:
            self.pusher.stop(drain_s=self.loaded.config.push.drain_on_exit_s)
            self._drain_sink()
        self.store.close()
        return 0

    def _request(self, flag: threading.Event) -> None:
        flag.set()
        self._wake.set()

    def stop(self) -> None:
        self._request(self._stop)

    def _take_all(self) -> list:
        items = []
        sink = self.sink
        while sink:
            items.append(sink.popleft())
        return items

    def _drain_sink(self) -> None:
        items = self._take_all()
        if items or self._pending:
            self._handle(items)

    def _handle(self, items: list) -> None:
        if not items and not self._pending:
            return
        outputs = self._pending
        for section, status, error, out in items:
            self._track_status(section, status, error, out)
            outputs.append(out)
        try:
            self.store.write(outputs, self.jobs.jobs_json if self.jobs else "[]")
            self._pending = []
        except Exception as exc:  # disk full, locked: keep the outputs and retry with the next ones
            log.error("cannot write to the node store: %s (%d outputs waiting)", exc, len(outputs))
            self._pending = outputs[-1000:]

    def _track_status(self, section: str, status: str, error: str, out: Output) -> None:
        if section == "sidecar":
            return
        previous = self.status.get(section)
        self.status[section] = status
        if status == previous:
            return
        if status == "error":
            log.error("collector %s failed: %s", section, error)
            out.event("sidecar", "collector_error", f"{section}: {error}", "error", {"collector": section})
        elif status == "unavailable":
            log.warning("collector %s unavailable: %s", section, error)
            out.event("sidecar", "collector_unavailable", f"{section}: {error}", "warning", {"collector": section})
        elif previous in ("error", "unavailable"):
            log.info("collector %s recovered", section)
            out.event("sidecar", "collector_recovered", f"{section} works again", "info", {"collector": section})

    def _prune(self) -> None:
        cfg = self.loaded.config.store
        try:
            dropped = self.store.prune(cfg.max_age_s, cfg.max_bytes)
        except Exception as exc:
            log.error("pruning the node store failed: %s", exc)
            return
        if dropped:
            lost = dropped["unpushed"]
            kind, severity = ("dropped", "warning") if lost else ("store_pruned", "info")
            message = (f"deleted {dropped['samples']} samples, {dropped['events']} events, {dropped['kpis']} kpis "
                       f"({dropped['reason']} bound); {lost} of them never reached the controller")
            (log.warning if lost else log.info)(message)
            self.report(kind, message, severity, dropped)

    # ---------- reload ----------
    def reload(self) -> bool:
        try:
            new = load(self.config_path, self.node_arg, self.node_dir_arg, self.overrides)
        except ConfigError as exc:
            log.error("config reload failed, keeping the running config: %s", exc)
            self.report("config_error", f"reload failed, running config kept: {exc}", "error",
                        {"file": self.config_path})
            return False
        old = self.loaded.config
        if new.config.node != self.node or new.config.store.path != old.store.path:
            log.error("config reload: node and store.path cannot change while running; restart the sidecar")
            self.report("config_error", "node and store.path cannot change on reload; restart to apply", "error",
                        {"file": self.config_path})
            return False
        if new.config.push != old.push:
            try:
                read_node_key(new.config.push.secret_file)
            except KeyFileError as exc:
                log.error("config reload failed, keeping the running config: %s", exc)
                self.report("config_error", f"reload failed, running config kept: {exc}", "error",
                            {"file": self.config_path})
                return False
        self._stop_collectors()
        self.loaded = new
        if new.config.push != old.push:
            self._build_pusher(new.config)
            if self.pusher:
                self.pusher.start()
        elif self.pusher:
            self.pusher.reload_key(force=True)  # a rotated key file, also when the config did not change
        self._start_collectors()
        log.info("config reloaded from %s", self.config_path)
        self.report("config_reloaded", f"reloaded {self.config_path}", "info", {"file": self.config_path})
        return True
