"""The controller database: what nodes pushed (ingest tables) and what the controller decided.

Schema changes are named migrations appended to MIGRATIONS, never edits of applied ones.
`job_ids` columns hold a JSON list of the SLURM job ids running on the node at that time.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

from sigma.store import Migration, migrate, open_store, refuse_newer

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
    ("0002_samples_without_ts_index", """
        -- Every sample insert paid for two indexes; time-window reads now go per node through
        -- samples_node_metric_ts (sigma.controller.detect.samples), which makes this one redundant.
        DROP INDEX IF EXISTS samples_ts;
    """),
    ("0003_samples_rollup", """
        -- Raw samples past retention.samples_raw_s, folded per series into buckets of retention.rollup_s
        -- (sigma.controller.retention): mean = vsum / n over the n non-null values.
        CREATE TABLE samples_rollup (
            node TEXT NOT NULL, metric TEXT NOT NULL, labels TEXT NOT NULL DEFAULT '{}', bucket REAL NOT NULL,
            span_s REAL NOT NULL, n INTEGER NOT NULL, vmin REAL, vmax REAL, vsum REAL,
            PRIMARY KEY (node, metric, labels, bucket));
        CREATE INDEX samples_rollup_bucket ON samples_rollup (bucket);
    """),
    ("0004_events_source_kind_ts", """
        -- The watchdog looks up a job's start/resume events (and heartbeats) every tick: without this index each
        -- lookup walked every event of the hour (a heartbeat per node every 5 s: 2.6 s a tick at 256 nodes).
        CREATE INDEX events_source_kind_ts ON events (source, kind, ts);
    """),
    ("0005_kpis_ts", """
        -- KPI rules read every job's rows of their window each tick: without this index that read scanned the
        -- whole table, which retention lets grow to kpis_keep_s (90 days) of every rank's steps.
        CREATE INDEX kpis_ts ON kpis (ts);
    """),
    ("0006_samples_node_ts", """
        -- Keyed by (node, metric, ts), every push added an entry at the end of each of its series: at 256 nodes x
        -- 200 metrics a commit rewrote a page per series (2.5 KB written per stored sample at 64 nodes). Keyed by
        -- (node, ts), a node's samples of one push land side by side; windows are read per node
        -- (sigma.controller.detect.samples), which is how detection reads them anyway.
        DROP INDEX IF EXISTS samples_node_metric_ts;
        CREATE INDEX samples_node_ts ON samples (node, ts);
    """),
]

CONTROLLER_MIGRATIONS: list[Migration] = [
    ("0100_controller_decisions", """
        -- One incident per (rule, node, job) while it stays open; key = rule_id|node|job_id plus an opening stamp.
        CREATE TABLE incidents (
            id INTEGER PRIMARY KEY, key TEXT NOT NULL, opened_at REAL NOT NULL, updated_at REAL NOT NULL,
            rule_id TEXT NOT NULL, rule_version INTEGER NOT NULL DEFAULT 1, source TEXT NOT NULL,
            scope TEXT NOT NULL, node TEXT, job_id INTEGER, severity TEXT NOT NULL, action TEXT NOT NULL,
            category TEXT NOT NULL DEFAULT '', summary TEXT NOT NULL DEFAULT '',
            fault_ts REAL NOT NULL,          -- earliest evidence: detection latency = opened_at - fault_ts
            status TEXT NOT NULL,            -- open acted shadow escalated recorded notified resolved confirmed misdiagnosed closed
            status_note TEXT NOT NULL DEFAULT '', evidence TEXT NOT NULL DEFAULT '{}', closed_at REAL);
        CREATE INDEX incidents_key ON incidents (key, closed_at);
        CREATE INDEX incidents_node ON incidents (node, opened_at);
        CREATE INDEX incidents_job ON incidents (job_id, opened_at);
        -- The action journal: a row is written (planned) before the command runs, then marked done.
        CREATE TABLE actions (
            id INTEGER PRIMARY KEY, key TEXT NOT NULL UNIQUE, incident_id INTEGER, kind TEXT NOT NULL,
            target TEXT NOT NULL, params TEXT NOT NULL DEFAULT '{}', reason TEXT NOT NULL DEFAULT '',
            state TEXT NOT NULL,             -- planned done skipped failed shadow
            created_at REAL NOT NULL, updated_at REAL NOT NULL, done_at REAL, attempts INTEGER NOT NULL DEFAULT 0,
            result TEXT NOT NULL DEFAULT '', automatic INTEGER NOT NULL DEFAULT 1);
        CREATE INDEX actions_state ON actions (state);
        CREATE INDEX actions_incident ON actions (incident_id);
        -- Remediation state machine, one row per node we took out of service.
        CREATE TABLE node_lifecycle (
            node TEXT PRIMARY KEY, state TEXT NOT NULL, cycle INTEGER NOT NULL DEFAULT 1, incident_id INTEGER,
            rule_id TEXT NOT NULL DEFAULT '', playbook TEXT NOT NULL DEFAULT '', failures INTEGER NOT NULL DEFAULT 0,
            entered_at REAL NOT NULL, deadline REAL, data TEXT NOT NULL DEFAULT '{}', updated_at REAL NOT NULL);
        CREATE TABLE lifecycle_transitions (
            id INTEGER PRIMARY KEY, node TEXT NOT NULL, cycle INTEGER NOT NULL, ts REAL NOT NULL,
            from_state TEXT, to_state TEXT NOT NULL, incident_id INTEGER, note TEXT NOT NULL DEFAULT '');
        CREATE INDEX lifecycle_transitions_node ON lifecycle_transitions (node, ts);
        -- What SLURM said each tick (changes only), for utilisation.
        CREATE TABLE node_snapshots (
            ts REAL NOT NULL, node TEXT NOT NULL, state TEXT NOT NULL, flags TEXT NOT NULL DEFAULT '',
            alloc_cpus INTEGER NOT NULL DEFAULT 0, cpus INTEGER NOT NULL DEFAULT 0, reason TEXT NOT NULL DEFAULT '',
            jobs TEXT NOT NULL DEFAULT '[]');
        CREATE INDEX node_snapshots_node_ts ON node_snapshots (node, ts);
        -- Small persistent detector state (isolation streaks, job baselines, cursors).
        CREATE TABLE detector_state (key TEXT PRIMARY KEY, value TEXT NOT NULL, updated_at REAL NOT NULL);
    """),
    ("0150_jit_checkpoints_and_losses", """
        -- Just-in-time checkpoint requests: the controller asks a job's healthy nodes to save before it requeues;
        -- the ingest reply hands each node its open requests, the node's sidecar writes the trainer's control file.
        CREATE TABLE checkpoint_requests (
            id INTEGER PRIMARY KEY, job_id INTEGER NOT NULL, node TEXT NOT NULL, incident_id INTEGER,
            requested_at REAL NOT NULL, deadline REAL NOT NULL,
            delivered_at REAL,               -- first ingest reply that carried it to the node's sidecar
            acked_at REAL, ack_step INTEGER);  -- the trainer's checkpoint event for this request
        CREATE INDEX checkpoint_requests_node ON checkpoint_requests (node, deadline);
        CREATE INDEX checkpoint_requests_incident ON checkpoint_requests (incident_id);
        -- What each requeue cost the job, once its new run is back at the step the old one had reached.
        CREATE TABLE job_losses (
            incident_id INTEGER NOT NULL, job_id INTEGER NOT NULL, fault_ts REAL NOT NULL,
            step_reached INTEGER NOT NULL,   -- highest step the old run reported before the requeue
            resume_step INTEGER NOT NULL,    -- step the new run started from (0: from scratch)
            steps_lost INTEGER NOT NULL, time_lost_s REAL, source TEXT NOT NULL DEFAULT '',
            recorded_at REAL NOT NULL, PRIMARY KEY (incident_id, job_id));
    """),
    ("0160_history_indexes", """
        -- What a tick reads of tables that grow for as long as the controller runs: the recent or the open rows.
        CREATE INDEX lifecycle_transitions_state_ts ON lifecycle_transitions (to_state, ts);
        CREATE INDEX actions_kind_created ON actions (kind, created_at);
        CREATE INDEX actions_kind_state_done ON actions (kind, state, done_at);
        CREATE INDEX incidents_open ON incidents (closed_at, status);
        CREATE INDEX incidents_source_status ON incidents (source, status);
    """),
    ("0170_node_requests", """
        -- What the controller asks of a node's sidecar (after a repair: acknowledge its kernel log): the ingest
        -- reply carries a node's open requests, the sidecar answers with a node_request event naming the id.
        CREATE TABLE node_requests (
            id INTEGER PRIMARY KEY, node TEXT NOT NULL, kind TEXT NOT NULL,
            action_key TEXT NOT NULL UNIQUE,  -- the journaled action that asked: asked once, however often run
            requested_at REAL NOT NULL, deadline REAL NOT NULL,
            delivered_at REAL,                -- first ingest reply that carried it to the node's sidecar
            answered_at REAL);                -- the answer (or the deadline) was seen
        CREATE INDEX node_requests_node ON node_requests (node, deadline);
    """),
    ("0180_open_cycles_and_incident_actions", """
        -- A tick reads the remediation cycles under way: only those rows, not every node the cluster ever
        -- remediated (the query names these states as literals, so the planner can use this index).
        CREATE INDEX node_lifecycle_unfinished ON node_lifecycle (node)
            WHERE state NOT IN ('resumed', 'escalated', 'admin', 'returned');
        -- An incident's actions of one kind: with only (incident_id) the planner took (kind, created_at) and
        -- walked every requeue ever made.
        CREATE INDEX actions_incident_kind ON actions (incident_id, kind);
        DROP INDEX actions_incident;
    """),
]

MIGRATIONS: list[Migration] = INGEST_MIGRATIONS + CONTROLLER_MIGRATIONS
# applied to this database by other code of this version (sigma.rules.learn.history: admin labels for rule learning)
ALSO_KNOWN = ("0200_rule_labels",)

# kpis' columns, for reads instead of `*`: on PostgreSQL the table also has its arrival order as a column, rowid
# (sigma.pgstore), which SQLite keeps implicit; rows read the same on both
KPI_COLUMNS = "node, ts, job_id, rank, step, loss, step_time_s, tokens_per_s, mfu, grad_norm, payload"


def open_db(path: str | Path, *, readonly: bool = False) -> sqlite3.Connection:
    """The controller database: an SQLite file, or PostgreSQL for a postgresql:// URL (same migrations)."""
    conn = open_store(path, readonly=readonly)
    try:
        if readonly:
            refuse_newer(conn, MIGRATIONS, ALSO_KNOWN, f"controller database {path}")
        else:
            migrate(conn, MIGRATIONS, ALSO_KNOWN, f"controller database {path}")
    except Exception:
        conn.close()
        raise
    return conn
