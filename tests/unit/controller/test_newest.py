"""The tick's per-node and per-job "newest" reads of audit tables are incremental and still exact."""

import sqlite3

from sigma.controller.newest import NewestPerKey

SQL = "SELECT node, MAX(ts) FROM t WHERE ts >= ? GROUP BY node"


def table() -> sqlite3.Connection:
    conn = sqlite3.connect(":memory:")
    conn.execute("CREATE TABLE t (node TEXT, ts REAL)")
    return conn


def test_keeps_the_newest_per_key_across_reads():
    conn = table()
    conn.executemany("INSERT INTO t VALUES (?, ?)", [("n1", 100.0), ("n2", 50.0), ("n1", 80.0)])
    newest = NewestPerKey(conn, SQL, overlap_s=10.0)
    assert newest.read() == {"n1": 100.0, "n2": 50.0}
    conn.execute("INSERT INTO t VALUES ('n2', 200.0)")
    assert newest.read() == {"n1": 100.0, "n2": 200.0}


def test_a_row_committed_late_with_an_older_time_is_still_read():
    conn = table()
    conn.execute("INSERT INTO t VALUES ('n1', 1000.0)")
    newest = NewestPerKey(conn, SQL, overlap_s=60.0)
    newest.read()
    conn.execute("INSERT INTO t VALUES ('n2', 970.0)")  # another writer's row, stamped before the newest seen
    assert newest.read() == {"n1": 1000.0, "n2": 970.0}


class Counting:
    """The connection, counting the rows each query hands back."""

    def __init__(self, conn):
        self.conn, self.rows = conn, 0

    def execute(self, sql, params=()):
        rows = self.conn.execute(sql, params).fetchall()
        self.rows += len(rows)
        return rows


def test_later_reads_look_only_at_recent_rows():
    conn = table()
    conn.executemany("INSERT INTO t VALUES (?, ?)", [(f"n{i}", float(i)) for i in range(1000)])
    counting = Counting(conn)
    newest = NewestPerKey(counting, SQL, overlap_s=5.0)
    assert len(newest.read()) == 1000
    counting.rows = 0
    conn.execute("INSERT INTO t VALUES ('n0', 2000.0)")
    assert newest.read()["n0"] == 2000.0
    assert counting.rows == 7  # n994..n999 (within the overlap of the newest seen) and the new row
