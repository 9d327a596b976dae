"""Time-window reads of the controller's `samples` table through its one index, (node, metric, ts).

The table has no index on ts alone (each index costs every insert); instead the nodes (and, per node, the metrics)
present are enumerated by index seeks — a skip scan: one seek per distinct value, never a pass over the rows — and
each (node, metric) range is entered at `ts >= since`. Rows come back ordered by ts, as a ts index would give them.
"""

from __future__ import annotations

import json
import sqlite3

# the distinct nodes in samples, one index seek each
_NODES = """nodes(node) AS (
    SELECT (SELECT min(node) FROM samples)
    UNION ALL SELECT (SELECT min(node) FROM samples WHERE node > nodes.node) FROM nodes WHERE node IS NOT NULL)"""

# the distinct (node, metric) pairs for the given nodes, one index seek each
_NODE_METRICS = """pairs(node, metric) AS (
    SELECT j.value, (SELECT min(metric) FROM samples WHERE node = j.value) FROM json_each(?) AS j
    UNION ALL SELECT node, (SELECT min(metric) FROM samples WHERE node = pairs.node AND metric > pairs.metric)
        FROM pairs WHERE metric IS NOT NULL)"""


BY_METRICS_SQL = (f"WITH RECURSIVE {_NODES} SELECT s.* FROM nodes, json_each(?) AS m "
                  "CROSS JOIN samples AS s ON s.node = nodes.node AND s.metric = m.value AND s.ts >= ? "
                  "WHERE nodes.node IS NOT NULL ORDER BY s.ts")  # args: metrics JSON list, since
def recent_for_metrics(conn: sqlite3.Connection, since: float, metrics) -> list:
    """Rows of every node with ts >= since and metric in `metrics`."""
    metrics = sorted(set(metrics))
    if not metrics:
        return []
    return conn.execute(BY_METRICS_SQL, (json.dumps(metrics), since)).fetchall()


# per (node, series, time slice) aggregates of the given nodes' samples, the sidecar's own metrics left out;
# each slice is an index range seek per (node, metric)
BUCKETS_SQL = (
    "WITH RECURSIVE " + _NODE_METRICS + ", slices(bucket, start) AS (SELECT key, value FROM json_each(?))"
    " SELECT s.node, s.metric || CASE WHEN s.labels = '{}' THEN '' ELSE s.labels END AS series, slices.bucket,"
    " count(*), avg(s.value), avg(s.value * s.value), min(s.value), max(s.value), min(s.ts), max(s.ts)"
    " FROM pairs, slices CROSS JOIN samples AS s ON s.node = pairs.node AND s.metric = pairs.metric"
    " AND s.ts >= slices.start AND s.ts < slices.start + ?"
    " WHERE pairs.metric IS NOT NULL AND pairs.metric NOT LIKE 'sidecar.%' AND s.value IS NOT NULL"
    " GROUP BY s.node, series, slices.bucket")  # args: nodes JSON list, slice starts JSON list, slice length


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
    return [tuple(r) for r in conn.execute(BUCKETS_SQL, (json.dumps(nodes), json.dumps(starts), length))]
