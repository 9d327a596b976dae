"""Named migrations: applied once, in order, recorded; a failing one leaves nothing half-done."""

import sqlite3

import pytest

from sigma.controller.db import MIGRATIONS, open_db
from sigma.store import connect, migrate


def test_controller_db_migrates_once(tmp_path):
    db = tmp_path / "c.db"
    conn = open_db(db)
    names = [r[0] for r in conn.execute("SELECT name FROM migrations ORDER BY name")]
    assert names == [n for n, _ in MIGRATIONS]
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    conn.close()
    assert migrate(connect(db), MIGRATIONS) == []


def test_failed_migration_is_rolled_back(tmp_path):
    conn = connect(tmp_path / "x.db")
    with pytest.raises(sqlite3.OperationalError):
        migrate(conn, [("good", "CREATE TABLE a (x);"), ("bad", "CREATE TABLE b (y); SELECT nope FROM nowhere;")])
    tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    assert "a" in tables and "b" not in tables
    assert [r[0] for r in conn.execute("SELECT name FROM migrations")] == ["good"]


def test_readonly_refuses_writes(tmp_path):
    open_db(tmp_path / "c.db").close()
    ro = open_db(tmp_path / "c.db", readonly=True)
    with pytest.raises(sqlite3.OperationalError):
        ro.execute("DELETE FROM samples")
