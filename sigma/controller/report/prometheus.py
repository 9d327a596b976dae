"""GET /metrics: the report's figures and the controller's own counters, computed from the database per scrape."""

from __future__ import annotations

import time
from collections.abc import Callable

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector, CollectorRegistry

from sigma.controller.db import open_db
from sigma.controller.report.detection import kernel_logs


class ControllerCollector(Collector):
    def __init__(self, db_path: str, window_s: float = 86400.0, stats: Callable[[], dict] | None = None):
        self.db_path = db_path
        self.window_s = window_s
        self.stats = stats or (lambda: {})

    def collect(self):
        from sigma.controller.report.metrics import report

        conn = open_db(self.db_path, readonly=True)
        try:
            now = time.time()
            rep = report(conn, since=now - self.window_s, now=now)
            incidents = CounterMetricFamily("sigma_incidents", "Incidents opened, by rule and status",
                                            labels=["rule", "status"])
            for r in conn.execute("SELECT rule_id, status, COUNT(*) FROM incidents GROUP BY rule_id, status"):
                incidents.add_metric([r[0], r[1]], r[2])
            actions = CounterMetricFamily("sigma_actions", "Journaled actions, by kind and state",
                                          labels=["kind", "state"])
            for r in conn.execute("SELECT kind, state, COUNT(*) FROM actions GROUP BY kind, state"):
                actions.add_metric([r[0], r[1]], r[2])
            lifecycle = GaugeMetricFamily("sigma_nodes_lifecycle", "Nodes per remediation state", labels=["state"])
            for r in conn.execute("SELECT state, COUNT(*) FROM node_lifecycle GROUP BY state"):
                lifecycle.add_metric([r[0]], r[1])
            kernel = GaugeMetricFamily("sigma_node_kernel_log_ok", "1 while the node's sidecar reads its kernel log, "
                                       "0 while it reads none (kernel-log fault detection off there)",
                                       labels=["node", "source"])
            for node, state in sorted(kernel_logs(conn).items()):
                kernel.add_metric([node, state["source"]], 1 if state["ok"] else 0)
            yield from (incidents, actions, lifecycle, kernel)
        finally:
            conn.close()
        util = GaugeMetricFamily("sigma_utilisation_ratio", "Node-time utilisation over the window",
                                 labels=["kind"])
        for kind in ("available", "allocated", "effective"):
            if kind in rep["utilisation"]:
                util.add_metric([kind], rep["utilisation"][kind])
        yield util
        jobs = rep["jobs"]
        yield _gauge("sigma_job_mtbf_seconds", "Job run time per interruption over the window", jobs["mtbf_s"])
        yield _gauge("sigma_job_interruptions", "Job interruptions acted on over the window", jobs["interruptions"])
        for name, key, doc in (("sigma_job_recovery_seconds", "recovery_s", "Fault -> first step after resume"),
                               ("sigma_job_time_to_failure_seconds", "time_to_failure_s", "Run start -> fault")):
            g = GaugeMetricFamily(name, doc, labels=["stat"])
            for stat in ("mean", "median", "max"):
                if stat in jobs[key]:
                    g.add_metric([stat], jobs[key][stat])
            yield g
        recycle = GaugeMetricFamily("sigma_node_recycle_seconds", "Node recycling time by phase (mean)",
                                    labels=["phase"])
        for phase in ("detect", "triage", "repair", "validate", "total"):
            s = rep["recycling"][f"{phase}_s"]
            if "mean" in s:
                recycle.add_metric([phase], s["mean"])
        yield recycle
        yield _gauge("sigma_automation_ratio", "Incidents handled without a person / all handled",
                     rep["automation"]["ratio"])
        for key, value in self.stats().items():
            yield _gauge(f"sigma_controller_{key}", f"controller {key.replace('_', ' ')}", value)


def _gauge(name: str, doc: str, value) -> GaugeMetricFamily:
    g = GaugeMetricFamily(name, doc)
    if value is not None:
        g.add_metric([], value)
    return g


def registry(db_path: str, stats: Callable[[], dict] | None = None) -> CollectorRegistry:
    reg = CollectorRegistry()
    reg.register(ControllerCollector(db_path, stats=stats))
    return reg
