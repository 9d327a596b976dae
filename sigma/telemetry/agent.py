"""The sidecar: runs each enabled collector in its own thread on its own interval, times it, stores what it
produced (tagged with the node's running job ids) in the node store, enforces the store's bounds and pushes.

- A collector that raises is recorded (sidecar.collector.success=0 and an event on each ok->failing change); the
  others keep running. A collector that hangs only stalls its own thread.
- SIGHUP reloads the config; a bad config is logged with file:line [key] and the running one is kept.
- SIGTERM/SIGINT stop collection, store what was collected, push the backlog for up to push.drain_on_exit_s.
"""

from __future__ import annotations

import logging
import queue
import signal
import threading
import time

from sigma.config import ConfigError
from sigma.telemetry.base import REGISTRY, CollectorUnavailable, Context, Output
from sigma.telemetry.config import Loaded, load
from sigma.telemetry.jobs import JobTracker
from sigma.telemetry.push import Pusher
from sigma.telemetry.store import NodeStore
from sigma.telemetry.wire import SecretError, read_secret

log = logging.getLogger("sigma.telemetry.agent")

UNAVAILABLE_RETRY_S = 300.0


class CollectorRunner:
    """One collector on its own thread: run, time, hand the Output to the writer."""

    def __init__(self, section: str, collector, interval_s: float, sink: queue.Queue):
        self.section = section
        self.collector = collector
        self.interval_s = interval_s
        self.sink = sink
        self.stop_event = threading.Event()
        self.thread = threading.Thread(target=self._loop, name=f"collector-{section}", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def stop(self, timeout: float = 5.0) -> bool:
        self.stop_event.set()
        self.thread.join(timeout)
        if self.thread.is_alive():
            log.error("collector %s did not stop within %.0f s; abandoning its thread", self.section, timeout)
            return False
        try:
            self.collector.close()
        except Exception:
            log.exception("closing collector %s", self.section)
        return True

    def _loop(self) -> None:
        due = time.monotonic()
        labels = {"collector": self.section}
        while not self.stop_event.wait(max(0.0, due - time.monotonic())):
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
            out.sample("sidecar.collector.duration_s", round(time.perf_counter() - started, 6), labels)
            out.sample("sidecar.collector.cpu_s", round(time.thread_time() - cpu_started, 6), labels)
            out.sample("sidecar.collector.success", 1 if status == "ok" else 0, labels)
            out.sample("sidecar.collector.records", n, labels)
            self.sink.put((self.section, status, error, out))
            now = time.monotonic()
            due += UNAVAILABLE_RETRY_S if status == "unavailable" else self.interval_s
            if due < now:  # overran its interval: skip the missed runs instead of bursting
                due = now + (self.interval_s if status != "unavailable" else UNAVAILABLE_RETRY_S)


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
        self.sink: queue.Queue = queue.Queue()
        self.runners: dict[str, CollectorRunner] = {}
        self.status: dict[str, str] = {}
        self.pusher: Pusher | None = None
        self.jobs: JobTracker | None = None
        self._stop = threading.Event()
        self._reload = threading.Event()
        self._wake = threading.Event()
        self._pending: list[Output] = []
        self._build_pusher(cfg)  # fails early on a bad secret file

    # ---------- setup ----------
    def _build_pusher(self, cfg) -> None:
        if self.pusher is not None:
            self.pusher.stop()
            self.pusher = None
        if not cfg.push.url:
            log.warning("push.url is empty: keeping data in %s only", cfg.store.path)
            return
        secret = read_secret(cfg.push.secret_file)
        self.pusher = Pusher(self.store, self.node, cfg.push.url, secret, interval_s=cfg.push.interval_s,
                             max_records=cfg.push.max_records, timeout_s=cfg.push.timeout_s,
                             max_backoff_s=cfg.push.max_backoff_s, report=self.report)

    def _start_collectors(self) -> None:
        cfg = self.loaded.config
        ctx = Context(node=self.node, node_dir=self.loaded.variables["node_dir"], host_root=cfg.host_root,
                      positions=self.store.positions())
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
            runner = self.runners[section] = CollectorRunner(section, collector, params.interval_s, self.sink)
            runner.start()
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
        log.info("node %s: collectors %s; store %s; push %s", self.node, ", ".join(self.runners) or "none",
                 cfg.store.path, cfg.push.url or "off")

    def _stop_collectors(self) -> None:
        for runner in self.runners.values():
            runner.stop()
        self.runners = {}
        self._drain_sink()

    # ---------- self reports ----------
    def report(self, kind: str, message: str, severity: str = "info", fields: dict | None = None) -> None:
        """A sidecar event (source 'sidecar'); thread-safe: goes through the writer queue."""
        out = Output()
        out.event("sidecar", kind, message, severity, fields)
        self.sink.put(("sidecar", "ok", "", out))

    # ---------- main loop ----------
    def run(self) -> int:
        signal.signal(signal.SIGHUP, lambda *_: self._request(self._reload))
        signal.signal(signal.SIGTERM, lambda *_: self._request(self._stop))
        signal.signal(signal.SIGINT, lambda *_: self._request(self._stop))
        self._start_collectors()
        if self.pusher:
            self.pusher.start()
        cfg = self.loaded.config
        next_jobs = time.monotonic() + cfg.jobs.refresh_s
        next_prune = time.monotonic()
        next_write = time.monotonic() + cfg.store.write_every_s
        while not self._stop.is_set():
            # sleep until the next write is due (collector outputs wait in the queue meanwhile: one wake-up per
            # write, not one per collector run); a stop or reload request wakes us early
            self._wake.wait(max(0.0, min(next_write, next_jobs, next_prune) - time.monotonic()))
            self._wake.clear()
            now = time.monotonic()
            if now >= next_write:
                next_write = now + cfg.store.write_every_s
                self._drain_sink()
            if self._reload.is_set():
                self._reload.clear()
                self._drain_sink()
                self.reload()
                cfg = self.loaded.config
            if now >= next_jobs:
                next_jobs = now + cfg.jobs.refresh_s
                self.jobs.refresh()
            if now >= next_prune:
                next_prune = now + cfg.store.prune_every_s
                self._prune()
        self._drain_sink()
        log.info("stopping: flushing collected data")
        self._stop_collectors()
        if self.pusher:
            self.pusher.stop(drain_s=cfg.push.drain_on_exit_s)
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
        while True:
            try:
                items.append(self.sink.get_nowait())
            except queue.Empty:
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
                read_secret(new.config.push.secret_file)
            except SecretError as exc:
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
        self._start_collectors()
        log.info("config reloaded from %s", self.config_path)
        self.report("config_reloaded", f"reloaded {self.config_path}", "info", {"file": self.config_path})
        return True
