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
BY_NODES_SQL = (f"WITH RECURSIVE {_NODE_METRICS} SELECT s.* FROM pairs "
                "CROSS JOIN samples AS s ON s.node = pairs.node AND s.metric = pairs.metric AND s.ts >= ? "
                "WHERE pairs.metric IS NOT NULL ORDER BY s.ts")  # args: nodes JSON list, since


def recent_for_metrics(conn: sqlite3.Connection, since: float, metrics) -> list:
    """Rows of every node with ts >= since and metric in `metrics`."""
    metrics = sorted(set(metrics))
    if not metrics:
        return []
    return conn.execute(BY_METRICS_SQL, (json.dumps(metrics), since)).fetchall()


def recent_for_nodes(conn: sqlite3.Connection, since: float, nodes) -> list:
    """Rows of every metric with ts >= since on the given nodes."""
    nodes = sorted(set(nodes))
    if not nodes:
        return []
    return conn.execute(BY_NODES_SQL, (json.dumps(nodes), since)).fetchall()
