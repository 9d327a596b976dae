"""Store helpers shared by the node store and the controller database: WAL, named migrations; the controller's
database may also be PostgreSQL, chosen by a postgresql:// URL (open_store)."""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Sequence
from pathlib import Path

Migration = tuple[str, str]  # (unique name, SQL script)


def is_url(target: str | Path) -> bool:
    """A PostgreSQL URL (postgresql://user@host/db, postgres://...) rather than an SQLite file path."""
    return isinstance(target, str) and target.startswith(("postgresql://", "postgres://"))


def open_store(target: str | Path, *, readonly: bool = False):
    """An SQLite file (sqlite3.Connection) or, for a postgresql:// URL, the PostgreSQL adapter with the same
    interface (sigma.pgstore): the one place that knows which."""
    if not is_url(target):
        return connect(target, readonly=readonly)
    from sigma.pgstore import PgConnection

    conn = PgConnection(str(target))
    if readonly:
        conn.raw.execute("SET default_transaction_read_only = on")
    return conn


def connect(path: str | Path, *, readonly: bool = False, timeout: float = 30.0) -> sqlite3.Connection:
    """Open a database in WAL mode (readers never block the writer); readonly opens with mode=ro."""
    if readonly:
        conn = sqlite3.connect(f"file:{Path(path)}?mode=ro", uri=True, timeout=timeout, check_same_thread=False)
        conn.execute("PRAGMA query_only = ON")
    else:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        conn = sqlite3.connect(str(path), timeout=timeout, check_same_thread=False)
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute("PRAGMA synchronous = NORMAL")
    conn.row_factory = sqlite3.Row
    return conn


class DatabaseTooNew(ValueError):
    """The database was written by a newer version of sigma: its schema has migrations this version lacks."""


def refuse_newer(conn, migrations: Sequence[Migration], also_known: Sequence[str] = (), where: str = "") -> None:
    """Raise DatabaseTooNew when the database records migrations this version does not know (a downgrade): this
    code would misread or damage what the newer one wrote. A database without a migrations table passes."""
    try:
        done = {row[0] for row in conn.execute("SELECT name FROM migrations")}
    except Exception:  # no table yet (a new database)
        if hasattr(conn, "rollback"):
            conn.rollback()  # PostgreSQL: the failed statement aborted the transaction
        return
    unknown = sorted(done - {name for name, _ in migrations} - set(also_known))
    if unknown:
        from sigma import __version__

        raise DatabaseTooNew(
            f"{where or 'the database'} was written by a newer sigma: its schema has {', '.join(unknown)}, which "
            f"sigma {__version__} does not know; refusing to use it. Run the newer sigma again, or restore the copy "
            f"of the database taken before the upgrade (docs/rollout.md, Rollback)")


def migrate(conn, migrations: Sequence[Migration], also_known: Sequence[str] = (), where: str = "",
            owner: bool = True) -> list[str]:
    """Apply migrations not yet recorded in the `migrations` table, in order; return the names applied. The
    database's owner (owner=True; False for a list of extra tables another module adds to it) refuses a database
    with migrations neither in the list nor in also_known: a newer version wrote it (DatabaseTooNew), and nothing
    is changed."""
    if owner:
        refuse_newer(conn, migrations, also_known, where)
    conn.execute("CREATE TABLE IF NOT EXISTS migrations (name TEXT PRIMARY KEY, applied_at REAL NOT NULL)")
    done = {row[0] for row in conn.execute("SELECT name FROM migrations")}
    names = [name for name, _ in migrations]
    if len(set(names)) != len(names):
        raise ValueError(f"duplicate migration names in {names}")
    applied = []
    for name, sql in migrations:
        if name in done:
            continue
        with conn:  # one transaction per migration: all of it or none
            conn.executescript(f"BEGIN;\n{sql}\nINSERT INTO migrations(name, applied_at) VALUES "
                               f"('{name}', {time.time()});\nCOMMIT;")
        applied.append(name)
    return applied
