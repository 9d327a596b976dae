"""`sigma controller run`: the ingest HTTP server, GET /metrics and the detection/remediation loop in one process.

The ingest API (POST /v1/ingest) is sigma.controller.ingest.server + sigma.controller.ingest.batch; the controller adds its
own route (GET /metrics) beside it and runs its loop in the main thread.
"""

from __future__ import annotations

import gc
import signal
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector

from sigma.controller.config import ControllerConfig
from sigma.controller.loop import Controller
from sigma.controller.retention import RetentionThread
from sigma.controller.report.prometheus import registry


# Controller.counts() keys (family, label value) -> exported counter
COUNTERS = {
    "guard": ("sigma_controller_guard", "Drains a guard rail stopped (rule, wave, admin_hold)", "guard"),
    "rule_error": ("sigma_controller_rule_errors", "Rules that raised at run time and were disabled", "rule"),
    "reload": ("sigma_controller_reloads", "SIGHUP reloads of rules and policy, by result", "result"),
    "evidence_capped": ("sigma_controller_evidence_capped", "Findings whose evidence rows were capped", "rule"),
    "config_warning": ("sigma_controller_config_warnings", "Config problems that do not stop the controller",
                       "kind"),
}


class CountsCollector(Collector):
    """The controller's in-process counters (bad input, guard rails) beside the database figures."""

    def __init__(self, ctl: Controller):
        self.ctl = ctl

    def collect(self):
        counts = self.ctl.counts()
        for family, (name, doc, label) in COUNTERS.items():
            metric = CounterMetricFamily(name, doc, labels=[label])
            for (fam, value), n in sorted(counts.items()):
                if fam == family:
                    metric.add_metric([value], n)
            yield metric


def parse_listen(listen: str) -> tuple[str, int]:
    host, _, port = listen.rpartition(":")
    if not port.isdigit():
        raise ValueError(f"listen must be host:port, not {listen!r}")
    return host or "0.0.0.0", int(port)


class MetricsServer:
    """Serves GET /metrics and GET /healthz (used when the ingest server is not available)."""

    def __init__(self, listen: str, metrics_body):
        host, port = parse_listen(listen)

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                if self.path == "/metrics":
                    body, ctype = metrics_body(), CONTENT_TYPE_LATEST
                elif self.path == "/healthz":
                    body, ctype = b"ok\n", "text/plain"
                else:
                    self.send_error(404)
                    return
                self.send_response(200)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):  # requests are not decisions; keep the log readable
                pass

        self.httpd = ThreadingHTTPServer((host, port), Handler)
        self.port = self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever, name="sigma-metrics", daemon=True)

    def start(self):
        self.thread.start()

    def stop(self):
        self.httpd.shutdown()
        self.httpd.server_close()


def start_http(cfg: ControllerConfig, metrics_body, reg=None):
    """The ingest server (POST /v1/ingest, GET /healthz) with GET /metrics added; without ingest keys or secret
    configured, a metrics-only server (nodes cannot push then)."""
    if not cfg.ingest_keys_file and not cfg.ingest_secret_file:
        server = MetricsServer(cfg.listen, metrics_body)
        server.start()
        return server
    from sigma.controller.ingest.batch import Ingest
    from sigma.controller.ingest.metrics import IngestCollector, key_ring
    from sigma.controller.ingest.server import ControllerServer

    limits = cfg.ingest
    server = ControllerServer(parse_listen(cfg.listen), Ingest(cfg.db, key_ring(cfg)),
                              max_body_bytes=limits.max_body_bytes, max_connections=limits.max_connections,
                              max_unauthenticated=limits.max_unauthenticated,
                              header_timeout_s=limits.header_timeout_s, idle_timeout_s=limits.idle_timeout_s,
                              body_timeout_s=limits.body_timeout_s)
    server.add_route("GET", "/metrics", lambda req: (200, {"Content-Type": CONTENT_TYPE_LATEST}, metrics_body()))
    from sigma.companion.http import ask_route

    server.add_route("POST", "/v1/ask", ask_route(cfg.db, server.ingest), before_body=server._authenticate)
    if reg is not None:
        reg.register(IngestCollector(server))
    server.start()
    return server


GC_THRESHOLD0 = 100_000  # allocations between young collections (Python's default: 700)


def tune_gc() -> None:
    """After start-up: what is loaded so far (modules, rules, config) leaves the collector's generations, and young
    collections run every GC_THRESHOLD0 allocations instead of 700. Ingest makes and drops short-lived rows by the
    hundred thousand a second, mostly freed by reference counting: at the default thresholds bench/scale.py at 256
    nodes stopped every thread for 24 s of a 240 s run (103 full collections, the longest 0.8 s); with these, 0.8 s
    (10 young collections)."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(GC_THRESHOLD0, *gc.get_threshold()[1:])


def wait_next(stop: threading.Event, wake: threading.Event | None, seconds: float) -> None:
    """Wait for the next tick: `seconds`, or less when stop is set or ingest stored an event worth a look now
    (wake: an Xid line waits for no period; a flood of them makes the ticks back-to-back, as a slow tick does)."""
    if wake is None:
        stop.wait(seconds)
        return
    end = time.monotonic() + seconds
    while not stop.is_set() and (left := end - time.monotonic()) > 0:
        if wake.wait(min(left, 0.1)):
            wake.clear()
            return


def detection_reads_s(ctl: Controller) -> float:
    """How far back detection reads raw samples: retention keeps at least this much."""
    return max([r.window_s for r in ctl.rules] + [ctl.cfg.isolation.history_s + ctl.cfg.isolation.window_s])


def run(cfg: ControllerConfig, *, once: bool = False, stop: threading.Event | None = None,
        config_path: str | None = None) -> int:
    """config_path: the policy file SIGHUP reloads (with its rules and playbooks); None: rules and playbooks only."""
    ctl = Controller(cfg)
    stop = stop or threading.Event()
    reload = threading.Event()
    reg = registry(cfg.db, stats=lambda: {"ticks_total": ctl.ticks, "tick_seconds": ctl.last_tick_s})
    reg.register(CountsCollector(ctl))
    http = None if once else start_http(cfg, lambda: generate_latest(reg), reg)
    pruner = None if once else RetentionThread(cfg.db, cfg.retention, on_pass=lambda deleted, took: ctl.log.event(
        "retention", None, deleted=deleted, seconds=round(took, 3)), floor_s=detection_reads_s(ctl))
    if pruner is not None:
        pruner.start()
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: stop.set())
        signal.signal(signal.SIGHUP, lambda *_: reload.set())  # applied between two ticks
    ctl.start()
    tune_gc()
    if http is not None:
        ingest = cfg.ingest_keys_file or cfg.ingest_secret_file
        ctl.log.event("listening", f"LISTEN {cfg.listen}: {'/v1/ingest, ' if ingest else ''}/metrics, /healthz",
                      listen=cfg.listen, port=http.port)
        if cfg.ingest_secret_file:
            ctl.log.event("shared_key", f"WARNING ingest accepts the shared secret {cfg.ingest_secret_file}: any "
                          f"node holding it can post as any other; issue per-node keys (sigma keys issue)",
                          file=cfg.ingest_secret_file)
        ctl.http_port = http.port
    try:
        while not stop.is_set():
            t0 = time.monotonic()
            if reload.is_set():
                reload.clear()
                ctl.reload(config_path)
            try:
                ctl.tick()
            except Exception as exc:  # one bad tick (slurmctld restarting, ...) must not stop the controller
                ctl.log.event("tick_error", f"ERROR tick failed: {exc}", error=repr(exc))
            if once:
                break
            wait_next(stop, getattr(getattr(http, "ingest", None), "wake", None),
                      max(0.0, cfg.poll_s - (time.monotonic() - t0)))
    finally:
        if http is not None:
            http.stop()
        if pruner is not None:
            pruner.stop()
        ctl.log.event("stop", "STOP controller")
    return 0
