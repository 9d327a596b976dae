"""Upgrade and rollback of the databases: a database of any earlier schema migrates forward keeping its rows; a
database a newer version wrote is refused with a clear message and left untouched (docs/rollout.md)."""

from __future__ import annotations

import sqlite3

import pytest

from sigma.cli import main
from sigma.controller.db import ALSO_KNOWN, MIGRATIONS, open_db
from sigma.store import DatabaseTooNew, migrate


def older(path, k: int) -> None:
    """A controller database as the version whose schema ended at migration k wrote it, with a row in it."""
    conn = sqlite3.connect(path)
    migrate(conn, MIGRATIONS[:k])
    conn.execute("INSERT INTO events (node, ts, source, kind) VALUES ('node1', 1.0, 'log', 'xid')")
    conn.commit()
    conn.close()


@pytest.mark.parametrize("k", range(1, len(MIGRATIONS) + 1))
def test_every_earlier_schema_migrates_forward_and_keeps_its_rows(tmp_path, k):
    db = tmp_path / "controller.db"
    older(db, k)
    conn = open_db(db)
    try:
        assert [r[0] for r in conn.execute("SELECT name FROM migrations ORDER BY rowid")] == [n for n, _ in MIGRATIONS]
        assert [tuple(r) for r in conn.execute("SELECT node, kind FROM events")] == [("node1", "xid")]
    finally:
        conn.close()


def test_a_database_written_by_a_newer_version_is_refused_and_left_alone(tmp_path, capsys):
    db = tmp_path / "controller.db"
    older(db, len(MIGRATIONS))
    conn = sqlite3.connect(db)
    conn.executescript("CREATE TABLE future (x); INSERT INTO migrations VALUES ('0900_future', 1.0);")
    conn.close()
    def schema():
        c = sqlite3.connect(db)
        try:
            return c.execute("SELECT sql FROM sqlite_master ORDER BY name").fetchall(), \
                c.execute("SELECT name FROM migrations ORDER BY name").fetchall()
        finally:
            c.close()

    before = schema()
    with pytest.raises(DatabaseTooNew, match=r"controller database .* was written by a newer sigma: its schema has "
                                             r"0900_future, which sigma \S+ does not know; refusing to use it"):
        open_db(db)
    with pytest.raises(DatabaseTooNew):
        open_db(db, readonly=True)
    assert schema() == before  # nothing migrated, nothing created
    assert main(["incidents", "--db", str(db)]) == 2
    err = capsys.readouterr().err
    assert "0900_future" in err and "restore the copy of the database taken before the upgrade" in err


def test_the_rule_label_tables_are_known_to_the_controller_database():
    from sigma.rules.learn.history import LABEL_MIGRATIONS

    assert {n for n, _ in LABEL_MIGRATIONS} == set(ALSO_KNOWN)


def test_a_node_store_written_by_a_newer_version_is_refused(tmp_path):
    from sigma.telemetry.store import NodeStore

    path = tmp_path / "telemetry.db"
    NodeStore(path, "node1").close()
    conn = sqlite3.connect(path)
    conn.execute("INSERT INTO migrations VALUES ('9999_future', 1.0)")
    conn.commit()
    conn.close()
    with pytest.raises(DatabaseTooNew, match="node store .* was written by a newer sigma"):
        NodeStore(path, "node1")
