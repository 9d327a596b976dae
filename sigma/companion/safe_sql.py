"""Run a SELECT written by somebody else (a person or a language model) on the controller database, read-only by
construction. Four independent locks, so a gap in one is held by the next:
1. the text is parsed (sqlglot, SQLite dialect): exactly one statement, a SELECT (WITH and UNION allowed), reading
   only the allowed tables;
2. the connection is opened with mode=ro and `PRAGMA query_only`;
3. an authorizer denies every operation but reading allowed tables and calling allowed functions (no ATTACH, no
   PRAGMA, no writes, no load_extension / readfile / writefile);
4. a progress handler stops a statement after `time_limit_s`, and at most `row_limit` rows are fetched.
"""

from __future__ import annotations

import sqlite3
import time
from dataclasses import dataclass, field
from pathlib import Path

import sqlglot
from sqlglot import exp

# Tables the companion may read: what the controller knows and decided. `migrations` and the ingest bookkeeping
# (`batches`, `detector_state`) say nothing a question needs.
ALLOWED_TABLES = frozenset({
    "incidents", "actions", "node_lifecycle", "lifecycle_transitions", "node_snapshots",
    "events", "kpis", "samples", "checkpoint_requests", "job_losses"})

# Table-valued functions a query may read from (json_each(job_ids) lists a sample's jobs).
TABLE_FUNCTIONS = frozenset({"json_each", "json_tree"})

# Scalar and aggregate functions a question may need; anything else (load_extension, readfile, fts3_tokenizer,
# sqlite_*, ...) is refused by the authorizer.
ALLOWED_FUNCTIONS = frozenset({
    "abs", "avg", "coalesce", "count", "date", "datetime", "group_concat", "ifnull", "iif", "instr", "julianday",
    "length", "lower", "ltrim", "max", "min", "nullif", "printf", "format", "replace", "round", "rtrim", "strftime",
    "substr", "substring", "sum", "time", "total", "trim", "typeof", "unixepoch", "upper", "like", "glob",
    "json_extract", "json_each", "json_array_length", "json_type", "json_valid", "json", "cast",
    "row_number", "rank", "dense_rank", "lag", "lead", "first_value", "last_value", "ntile", "percent_rank",
    "cume_dist", "random", "sign", "max_ts", "exp", "ln", "log", "sqrt", "power", "pow", "floor", "ceil", "ceiling",
})


class UnsafeQuery(ValueError):
    """The text is not a single read-only SELECT over the allowed tables; the message says which rule it broke."""


@dataclass
class QueryResult:
    sql: str
    columns: list[str]
    rows: list[tuple]
    truncated: bool = False   # more rows existed than row_limit
    elapsed_s: float = 0.0
    tables: list[str] = field(default_factory=list)


def check_select(sql: str, allowed: frozenset[str] = ALLOWED_TABLES) -> list[str]:
    """Parse `sql`; raise UnsafeQuery unless it is one SELECT over allowed tables. Returns the tables read."""
    return _inspect(sql, allowed)[0]


def _inspect(sql: str, allowed: frozenset[str]) -> tuple[list[str], set[str]]:
    """(tables read, names of the query's own CTEs), or UnsafeQuery."""
    text = sql.strip().rstrip(";").strip()
    if not text:
        raise UnsafeQuery("empty query")
    try:
        statements = [s for s in sqlglot.parse(text, read="sqlite") if s is not None]
    except sqlglot.errors.ParseError as exc:
        raise UnsafeQuery(f"not valid SQL: {str(exc).splitlines()[0]}") from None
    if len(statements) != 1:
        raise UnsafeQuery(f"one statement only, got {len(statements)}")
    tree = statements[0]
    if not isinstance(tree, (exp.Select, exp.Union, exp.Intersect, exp.Except)):
        raise UnsafeQuery(f"only SELECT is allowed, got {tree.key.upper()}")
    for node in tree.walk():
        if isinstance(node, (exp.Insert, exp.Update, exp.Delete, exp.Drop, exp.Create, exp.Alter, exp.Command,
                             exp.Pragma, exp.Attach, exp.Detach)):
            raise UnsafeQuery(f"{node.key.upper()} is not allowed")
    ctes = {c.alias_or_name.lower() for c in tree.find_all(exp.CTE)}
    tables = sorted({t.name.lower() for t in tree.find_all(exp.Table) if t.name} - ctes)
    for t in tree.find_all(exp.Table):
        if t.args.get("db") or t.args.get("catalog"):
            raise UnsafeQuery(f"table {t.sql(dialect='sqlite')}: schema-qualified names are not allowed")
    denied = [t for t in tables if t not in allowed | TABLE_FUNCTIONS]
    if denied:
        raise UnsafeQuery(f"table(s) {', '.join(denied)} not allowed; allowed: {', '.join(sorted(allowed))}")
    for fn in tree.find_all(exp.Anonymous):
        if fn.name.lower() not in ALLOWED_FUNCTIONS:
            raise UnsafeQuery(f"function {fn.name}() is not allowed")
    return tables, ctes


def authorizer(allowed: frozenset[str]):
    def authorize(action, arg1, arg2, db_name, trigger):
        if action == sqlite3.SQLITE_SELECT:
            return sqlite3.SQLITE_OK
        if action == sqlite3.SQLITE_READ:
            # arg1 = the base table read (empty for a CTE or subquery column)
            ok = not arg1 or arg1.lower() in allowed or arg1.lower() in TABLE_FUNCTIONS
            return sqlite3.SQLITE_OK if ok else sqlite3.SQLITE_DENY
        if action == sqlite3.SQLITE_FUNCTION:
            return sqlite3.SQLITE_OK if (arg2 or "").lower() in ALLOWED_FUNCTIONS else sqlite3.SQLITE_DENY
        if action == getattr(sqlite3, "SQLITE_RECURSIVE", -1):
            return sqlite3.SQLITE_OK
        return sqlite3.SQLITE_DENY
    return authorize


def open_readonly(path: str | Path) -> sqlite3.Connection:
    """A read-only connection (mode=ro, query_only); the database file must exist."""
    if not Path(path).exists():
        raise FileNotFoundError(f"no controller database at {path}")
    conn = sqlite3.connect(f"file:{Path(path)}?mode=ro", uri=True, timeout=5.0, check_same_thread=False)
    conn.execute("PRAGMA query_only = ON")
    # SQLite registers an eponymous virtual table (json_each) in the schema on first use, which an authorizer
    # would see as a write to sqlite_master: use them once now, before any authorizer is set.
    conn.execute("SELECT 1 FROM json_each('[]'), json_tree('[]')").fetchall()
    return conn


def run_select(conn: sqlite3.Connection, sql: str, params: tuple | dict = (), *, row_limit: int = 1000,
               time_limit_s: float = 5.0, allowed: frozenset[str] = ALLOWED_TABLES) -> QueryResult:
    """Check and run one read-only SELECT; raise UnsafeQuery or sqlite3.Error with a readable message."""
    tables, ctes = _inspect(sql, allowed)
    deadline = time.monotonic() + time_limit_s
    conn.set_authorizer(authorizer(allowed | ctes))
    conn.set_progress_handler(lambda: 1 if time.monotonic() > deadline else 0, 10_000)
    started = time.monotonic()
    try:
        cur = conn.execute(sql.strip().rstrip(";"), params)
        rows = cur.fetchmany(row_limit + 1)
    except sqlite3.DatabaseError as exc:
        if "interrupted" in str(exc):
            raise UnsafeQuery(f"query stopped after its time limit of {time_limit_s:g} s") from None
        if "not authorized" in str(exc) or "prohibited" in str(exc):
            raise UnsafeQuery(f"query refused by the read-only guard: {exc}") from None
        raise
    finally:
        conn.set_authorizer(None)
        conn.set_progress_handler(None, 0)
    columns = [d[0] for d in cur.description or ()]
    return QueryResult(sql=sql.strip(), columns=columns, rows=[tuple(r) for r in rows[:row_limit]],
                       truncated=len(rows) > row_limit, elapsed_s=time.monotonic() - started, tables=tables)
