"""The companion's SQL guard: only one SELECT over allowed tables ever runs, on a read-only connection."""

from __future__ import annotations

import hashlib
import sqlite3

import pytest

from sigma.companion.safe_sql import ALLOWED_TABLES, UnsafeQuery, authorizer, check_select, open_readonly, run_select
from sigma.controller.db import open_db


@pytest.fixture
def db(tmp_path):
    path = tmp_path / "controller.db"
    conn = open_db(path)
    with conn:
        conn.execute("INSERT INTO incidents (key, opened_at, updated_at, rule_id, source, scope, node, severity, "
                     "action, fault_ts, status) VALUES ('k', 10, 10, 'gpu-xid-79', 'rule', 'node', 'node2', "
                     "'critical', 'drain', 9, 'resolved')")
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()
    return path


def digest(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


HOSTILE = [
    ("DROP TABLE incidents", "only SELECT"),
    ("DELETE FROM incidents", "only SELECT"),
    ("UPDATE incidents SET status = 'x'", "only SELECT"),
    ("INSERT INTO incidents (key) VALUES ('x')", "only SELECT"),
    ("SELECT 1; DROP TABLE incidents", "one statement"),
    ("ATTACH DATABASE '/tmp/x.db' AS x", "only SELECT"),
    ("PRAGMA query_only = OFF", "only SELECT"),
    ("SELECT * FROM sqlite_master", "not allowed"),
    ("SELECT * FROM migrations", "not allowed"),
    ("SELECT load_extension('/tmp/evil.so')", "not allowed"),
    ("SELECT readfile('/etc/shadow')", "not allowed"),
    ("SELECT writefile('/tmp/x', 'y')", "not allowed"),
    ("WITH x AS (SELECT 1) DELETE FROM incidents", "only SELECT"),
    ("SELECT * FROM main.incidents", "schema-qualified"),
    ("", "empty"),
    ("this is not sql at all", "SQL"),
]


@pytest.mark.parametrize("sql,why", HOSTILE)
def test_hostile_queries_are_refused_and_change_nothing(db, sql, why):
    before = digest(db)
    conn = open_readonly(db)
    with pytest.raises((UnsafeQuery, sqlite3.Error)) as exc:
        run_select(conn, sql)
    assert why.lower() in str(exc.value).lower()
    conn.close()
    assert digest(db) == before
    assert sqlite3.connect(db).execute("SELECT COUNT(*) FROM incidents").fetchone()[0] == 1


def test_a_plain_select_runs_and_reports_its_tables(db):
    res = run_select(open_readonly(db), "SELECT node, rule_id FROM incidents WHERE opened_at > ?", (0,))
    assert res.columns == ["node", "rule_id"] and res.rows == [("node2", "gpu-xid-79")]
    assert res.tables == ["incidents"]


def test_ctes_joins_and_json_functions_are_allowed(db):
    sql = ("WITH x AS (SELECT id, node FROM incidents) SELECT x.node, json_extract('{\"a\": 1}', '$.a') "
           "FROM x JOIN incidents i ON i.id = x.id")
    assert run_select(open_readonly(db), sql).rows == [("node2", 1)]
    assert check_select(sql) == ["incidents"]


def test_a_runaway_query_stops_at_its_time_limit(db):
    sql = "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n) SELECT COUNT(*) FROM n, incidents"
    with pytest.raises(UnsafeQuery, match="time limit"):
        run_select(open_readonly(db), sql, time_limit_s=0.2)


def test_rows_beyond_the_limit_are_cut_and_flagged(db):
    sql = "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n LIMIT 50) SELECT i FROM n, incidents"
    res = run_select(open_readonly(db), sql, row_limit=10)
    assert len(res.rows) == 10 and res.truncated


def test_the_authorizer_holds_on_its_own(db):
    # Without the parser in front, SQLite itself refuses what is not a read of an allowed table.
    conn = open_readonly(db)
    conn.set_authorizer(authorizer(ALLOWED_TABLES))
    assert conn.execute("SELECT COUNT(*) FROM incidents").fetchone() == (1,)
    for sql in ("SELECT * FROM migrations", "SELECT * FROM sqlite_master", "PRAGMA table_info(incidents)",
                "SELECT sqlite_version()", "ATTACH DATABASE ':memory:' AS x"):
        with pytest.raises(sqlite3.DatabaseError, match="not authorized|prohibited"):
            conn.execute(sql).fetchall()


def test_a_missing_database_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="no controller database"):
        open_readonly(tmp_path / "nope.db")
