"""Time-window reads of the controller's `samples` table through its one index, (node, ts).

The table has no index on ts alone or per series (each index costs every insert, and a per-series key makes each
push write a page per series: migration 0006); instead the nodes present are enumerated by index seeks — a skip
scan: one seek per distinct node, never a pass over the rows — and each node's range is entered at `ts >= since`.
Rows come back ordered by ts, as a ts index would give them.
"""

from __future__ import annotations

import sqlite3

# the distinct nodes in samples, one index seek each
_NODES = """nodes(node) AS (
    SELECT (SELECT min(node) FROM samples)
    UNION ALL SELECT (SELECT min(node) FROM samples WHERE node > nodes.node) FROM nodes WHERE node IS NOT NULL)"""


# args: since, [highest rowid,] then the metrics; plain SQL both stores run (CROSS JOIN keeps SQLite's join order:
# nodes first); the columns named, since PostgreSQL's samples has its rowid as a column (sigma.pgstore)
BY_METRICS_SQL = (f"WITH RECURSIVE {_NODES} SELECT s.node, s.ts, s.metric, s.value, s.labels, s.job_ids"
                  " FROM nodes CROSS JOIN samples AS s WHERE s.node = nodes.node AND s.ts >= ?{upto}"
                  " AND nodes.node IS NOT NULL AND s.metric IN ({marks}) ORDER BY s.ts")


def recent_for_metrics(conn: sqlite3.Connection, since: float, metrics, upto_rowid: int | None = None) -> list:
    """Rows of every node with ts >= since and metric in `metrics`; with upto_rowid, only those that had arrived by
    then (a reader that goes on in rowid order reads the later ones: none is counted twice)."""
    metrics = sorted(set(metrics))
    if not metrics:
        return []
    sql = BY_METRICS_SQL.format(upto="" if upto_rowid is None else " AND s.rowid <= ?",
                                marks=",".join("?" * len(metrics)))
    bound = () if upto_rowid is None else (upto_rowid,)
    return conn.execute(sql, (since, *bound, *metrics)).fetchall()


# per (node, series, time slice) aggregates of the given nodes' samples, the sidecar's own metrics left out;
# each slice is an index range seek per node
BUCKETS_SQL = (
    "WITH slices(bucket, start) AS (VALUES {slices}), n(node) AS (VALUES {nodes})"
    " SELECT s.node, s.metric || CASE WHEN s.labels = '{{}}' THEN '' ELSE s.labels END AS series, slices.bucket,"
    " count(*), avg(s.value), avg(s.value * s.value), min(s.value), max(s.value), min(s.ts), max(s.ts)"
    " FROM n, slices CROSS JOIN samples AS s WHERE s.node = n.node"
    " AND s.ts >= slices.start AND s.ts < slices.start + ?"
    " AND s.metric NOT LIKE 'sidecar.%' AND s.value IS NOT NULL"
    " GROUP BY s.node, series, slices.bucket")  # args: slice starts, nodes, slice length


def bucket_stats(conn: sqlite3.Connection, nodes, since: float, until: float, buckets: int,
                 sample_s: float | None = None) -> list[tuple]:
    """(node, series, bucket, count, mean, mean of squares, min, max, first ts, last ts) per time bucket of
    [since, until) split in `buckets`, summed up by SQLite (no Python per sample). With sample_s, only the first
    sample_s seconds of each bucket are read: a long history is sampled, not scanned whole."""
    nodes = sorted(set(nodes))
    if not nodes or until <= since:
        return []
    width = (until - since) / buckets
    starts = [since + b * width for b in range(buckets)]
    length = width if sample_s is None else min(width, sample_s)
    sql = BUCKETS_SQL.format(slices=", ".join(f"({b}, ?)" for b in range(buckets)),
                             nodes=", ".join(["(?)"] * len(nodes)))
    return [tuple(r) for r in conn.execute(sql, (*starts, *nodes, length))]
