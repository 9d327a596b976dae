"""The controller database: what nodes pushed (ingest tables) and what the controller decided.

Schema changes are named migrations appended to MIGRATIONS, never edits of applied ones.
`job_ids` columns hold a JSON list of the SLURM job ids running on the node at that time.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

from sigma.store import Migration, connect, migrate

INGEST_MIGRATIONS: list[Migration] = [
    ("0001_ingest", """
        -- One row per accepted push batch: (node, seq) makes ingest idempotent under at-least-once delivery.
        CREATE TABLE batches (
            node TEXT NOT NULL, seq INTEGER NOT NULL, received_at REAL NOT NULL, records INTEGER NOT NULL,
            PRIMARY KEY (node, seq)) WITHOUT ROWID;
        -- Numeric metrics: host, accelerator (labels {"gpu": "0"}), sysfs counters, collector self-timing.
        CREATE TABLE samples (
            node TEXT NOT NULL, ts REAL NOT NULL, metric TEXT NOT NULL, value REAL,
            labels TEXT NOT NULL DEFAULT '{}', job_ids TEXT NOT NULL DEFAULT '[]');
        CREATE INDEX samples_node_metric_ts ON samples (node, metric, ts);
        CREATE INDEX samples_ts ON samples (ts);
        -- Discrete events: log-pattern matches (source 'log'), health-check results (source 'health'),
        -- NVML events such as Xid (source 'nvml'), sidecar self-reports like dropped records (source 'sidecar').
        CREATE TABLE events (
            id INTEGER PRIMARY KEY, node TEXT NOT NULL, ts REAL NOT NULL, source TEXT NOT NULL,
            kind TEXT NOT NULL, severity TEXT NOT NULL DEFAULT 'info', message TEXT NOT NULL DEFAULT '',
            fields TEXT NOT NULL DEFAULT '{}', job_ids TEXT NOT NULL DEFAULT '[]');
        CREATE INDEX events_ts ON events (ts);
        CREATE INDEX events_node_ts ON events (node, ts);
        -- Job KPIs, one row per rank per reported step (the KPI JSON-lines protocol).
        CREATE TABLE kpis (
            node TEXT NOT NULL, ts REAL NOT NULL, job_id INTEGER NOT NULL, rank INTEGER NOT NULL DEFAULT 0,
            step INTEGER, loss REAL, step_time_s REAL, tokens_per_s REAL, mfu REAL, grad_norm REAL,
            payload TEXT NOT NULL DEFAULT '{}');
        CREATE INDEX kpis_job_ts ON kpis (job_id, ts);
    """),
]

MIGRATIONS: list[Migration] = INGEST_MIGRATIONS


def open_db(path: str | Path, *, readonly: bool = False) -> sqlite3.Connection:
    conn = connect(path, readonly=readonly)
    if not readonly:
        migrate(conn, MIGRATIONS)
    return conn
