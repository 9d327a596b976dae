"""The ingest's part of /metrics (requests refused, rows dropped, connections) and its key ring from the config."""

from __future__ import annotations

import logging
from pathlib import Path

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from sigma.security.keys import KeyFileError, KeyRing, read_node_key

log = logging.getLogger("sigma.controller.ingest")


def key_ring(cfg) -> KeyRing:
    """Per-node keys from ingest_keys_file and/or the shared ingest_secret_file. A key table that does not exist
    yet is allowed beside a shared secret (the step before `sigma keys issue`); it is loaded once it appears."""
    shared = read_node_key(cfg.ingest_secret_file).secret if cfg.ingest_secret_file else None
    table = cfg.ingest_keys_file or None
    if table and not Path(table).exists():
        if shared is None:
            raise KeyFileError(f"{table}: no ingest key table; create it with `sigma keys issue NODE... --table "
                               f"{table}` (or set ingest_secret_file for a shared secret)")
        log.warning("%s does not exist yet: accepting the shared secret only until it does", table)
        ring = KeyRing(None, shared)
        ring.table_path = Path(table)  # picked up when `sigma keys issue` creates it
        return ring
    return KeyRing(table, shared)


class IngestCollector(Collector):
    """sigma_ingest_rejected_total{reason}, sigma_ingest_dropped_rows_total{reason}, the refusals and unattributed log
    lines sidecars reported, stored records, connections."""

    def __init__(self, server):
        self.server = server

    def collect(self):
        ingest = self.server.ingest
        rejected = CounterMetricFamily("sigma_ingest_rejected", "Ingest requests or connections refused, by reason",
                                       labels=["reason"])
        for reason, n in sorted((self.server.rejections + ingest.rejections).items()):
            rejected.add_metric([reason], n)
        yield rejected
        dropped = CounterMetricFamily("sigma_ingest_dropped_rows", "Rows dropped from stored batches, by reason",
                                      labels=["reason"])
        for reason, n in sorted(ingest.dropped_rows.items()):
            dropped.add_metric([reason], n)
        yield dropped
        node_refused = CounterMetricFamily("sigma_node_refusals", "Refusals sidecars reported (kpi_refused: a KPI "
                                           "file of another user or a world-writable one)", labels=["node", "kind"])
        for (node, kind), n in sorted(ingest.node_refusals.items()):
            node_refused.add_metric([node, kind], n)
        yield node_refused
        unattributed = CounterMetricFamily(
            "sigma_log_unattributed_lines", "Log lines sidecars matched no writer for and did not act on (no known "
            "envelope, another program or facility, a journal field missing), by node and reason",
            labels=["node", "reason"])
        for (node, reason), n in sorted(ingest.unattributed_lines.items()):
            unattributed.add_metric([node, reason], n)
        yield unattributed
        stored = CounterMetricFamily("sigma_ingest_records", "Records stored, by kind", labels=["kind"])
        for kind in ("batches", "duplicates", "samples", "events", "kpis"):
            stored.add_metric([kind], ingest.stats[kind])
        yield stored
        conns = GaugeMetricFamily("sigma_ingest_connections", "Open HTTP connections", labels=["state"])
        authenticated, unauthenticated = self.server.connection_counts()
        conns.add_metric(["authenticated"], authenticated)
        conns.add_metric(["unauthenticated"], unauthenticated)
        yield conns
        shared = GaugeMetricFamily("sigma_ingest_shared_key", "1 when a secret shared by all nodes is accepted")
        shared.add_metric([], 1 if ingest.keys.shared else 0)
        yield shared
