"""What the fast tier can talk about: entities (a table, or a query in the vocabulary document) with their columns,
each column a measure, a time, a category, a reference (node, job, rule) or plain text, and the words for all of them.

Made from three sources, so a new table or column is understood without new code:
- the controller database itself: every allowed table is an entity, and every column of every entity gets a role and
  words from its name (steps_lost -> "steps lost", a number in steps; time_lost_s -> "time lost", seconds);
- the values in the database: a category's values become words that filter on it ("critical", "drain",
  "shadow"), and a JSON column's keys become "KEY N" filters ("xid 79");
- sigma/companion/vocabulary.yaml: the words names alone do not give, and the entities that are not one table.
"""

from __future__ import annotations

import json
import re
import sqlite3
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

import yaml

from sigma.companion.lexicon import STOPWORDS, phrase_stems
from sigma.companion.safe_sql import ALLOWED_TABLES

VOCABULARY = Path(__file__).with_name("vocabulary.yaml")
CATEGORY_MAX = 64          # a text column with at most this many distinct short values is a category
SAMPLE_ROWS = 50_000       # values and JSON keys are learnt from the newest rows of a table
JSON_COLUMNS_SKIP = {"evidence", "payload", "params", "data", "labels"}  # free-form JSON: no filters from their keys
REF_COLUMNS = {"node": "node", "job_id": "job", "rule_id": "rule"}
LIST_REFS = {"job_ids": "job", "jobs": "job"}

UNITS = {("bytes", "GiB"): 2 ** 30, ("bytes", "MiB"): 2 ** 20, ("bytes", "GB"): 1e9, ("bytes", "MB"): 1e6,
         ("s", "min"): 60, ("s", "h"): 3600, ("s", "s"): 1,
         ("bytes", "bytes"): 1}   # (the measure's unit, the one asked for): divide by


@dataclass
class Column:
    name: str
    sql: str                          # expression over the entity's row (alias src)
    role: str                         # measure | time | category | ref | list | json | id | text
    unit: str = ""                    # s, %, bytes, /s, steps ...
    words: list[tuple[str, ...]] = field(default_factory=list)
    agg: str = ""                     # default aggregate when a question names the measure without one
    values: dict[str, list[tuple[str, ...]]] = field(default_factory=dict)  # category value -> its words
    keys: list[str] = field(default_factory=list)                           # JSON keys seen
    learnt: bool = False              # its words come from its name, not from the schema document
    unseen: set[str] = field(default_factory=set)   # values the schema lists that no row has (yet)
    only_in: str = ""                 # a time set only on rows of this condition ("done_at": state = 'done')


@dataclass(frozen=True)
class Cond:
    entity: str
    sql: str                          # a predicate over the entity's row
    label: str                        # the words, for "understood as"
    column: str = ""                  # the column it constrains (a default on it then no longer applies)
    params: tuple = ()


@dataclass(frozen=True)
class Sense:
    """A word readers take two ways (the schema document's `senses`): its other reading, a predicate `sql` on
    `column`, taken where the question's own condition on that column is `value` (None: where it has none)."""
    words: tuple[tuple[str, ...], ...]
    column: str
    sql: str
    said: str                         # the other reading in a few words (the name of its figure's column)
    means: str                        # both readings in words, said beside both figures
    value: str | None = None
    modifier: bool = False            # before another noun the word has the other reading alone ("log errors")


@dataclass
class Entity:
    name: str
    source: str                       # FROM clause body: a table name or a parenthesised SELECT
    words: list[tuple[str, ...]]
    time: str | None
    label: str
    show: list[str]
    columns: dict[str, Column]
    conds: dict[tuple[str, ...], Cond]
    refs: dict[str, str]              # node/job/rule -> column name
    default: str = ""                 # a predicate applied unless a condition on its column is asked
    now: bool = False                 # the current state (present tense), not a history
    explicit: bool = False            # described in the vocabulary document
    measure_names: dict | None = None         # {column, value}: each value of `column` names a measure in `value`
    explicit_values: dict[str, dict[str, list[tuple[str, ...]]]] = field(default_factory=dict)  # from the document
    row_words: list[tuple[str, ...]] = field(default_factory=list)   # what one row is ("drain": a time out of
    #                                   service), so "per drain" or "a drained node" is each row, not a grouping
    by_words: list[tuple[str, ...]] = field(default_factory=list)    # who writes every row ("the trainer" of
    #                                   KPI lines): named as the subject, it fits and constrains nothing
    devices: dict[tuple[str, ...], tuple[str, frozenset]] = field(default_factory=dict)   # a device's words ->
    #                                   (column, its values): "NVSwitch" beside the kind sxid says nothing more
    readings: bool = False            # its rows sample a state over time (KPI lines, host metrics): the latest
    #                                   row of one node or job is its value now ("what step is job 1 on now")
    parts: tuple[str, str] | None = None   # (noun, source) of the rows each row merges (a checkpoint: its ranks'
    #                                   writes): a count or an aggregate is said over the rows and over the parts
    senses: tuple[Sense, ...] = ()    # words readers take two ways ("logged": by any source, or the kernel log)

    def measures(self) -> list[Column]:
        return [c for c in self.columns.values() if c.role == "measure"]


@dataclass
class Model:
    entities: dict[str, Entity]
    refs: dict[str, list[tuple[str, ...]]]            # node/job/rule -> their words
    rule_words: dict[tuple[str, ...], list[str]]      # words -> rule id LIKE patterns ('#' = a number)
    rule_ids: set[str]
    nodes: set[str]


def _words_of_name(name: str) -> tuple[str, ...]:
    base = re.sub(r"_(s|at|ts|bytes|pct|id)$", "", name)
    base = base.replace("_per_s", " per second")
    return phrase_stems(base.replace("_", " ").replace(".", " "))


def unit_of(name: str) -> str:
    """The unit a column's (or metric's) name ends in: _s seconds, _per_s a rate, _bytes, _pct."""
    for suffix, unit in (("_per_s", "/s"), ("_s", "s"), ("_bytes", "bytes"), ("_pct", "%")):
        if name.endswith(suffix):
            return unit
    return ""


def _role(name: str, values: list, decltype: str = "") -> str:
    if name in ("ts", "fault_ts", "deadline", "bucket", "since") or name.endswith("_at"):
        return "time"
    if name in REF_COLUMNS:
        return "ref"
    if name in LIST_REFS:
        return "list"
    if name == "id" or name.endswith("_id"):
        return "id"
    present = [v for v in values if v is not None]
    if present and all(isinstance(v, (int, float)) for v in present):
        return "measure"
    if not present and (decltype.upper() in ("REAL", "INTEGER") or unit_of(name)):  # no rows yet: the declaration
        return "measure"
    if present and all(isinstance(v, str) and v[:1] in "{[" and _json(v) for v in present[:50]):
        return "json"
    return "text"


def _json(text: str) -> bool:
    try:
        json.loads(text)
        return True
    except ValueError:
        return False


def _sample(conn: sqlite3.Connection, source: str) -> str:
    if source.lstrip().upper().startswith("SELECT"):
        return f"({source})"
    return f"(SELECT * FROM {source} ORDER BY rowid DESC LIMIT {SAMPLE_ROWS})"


@lru_cache(maxsize=1)
def documented_values() -> dict[str, dict[str, list[str]]]:
    """table -> column -> the values the schema document lists for it (a migration's column note that is a list of
    identifiers: `state TEXT NOT NULL, -- planned done skipped failed shadow`), so that a value no row has yet
    ("how many actions failed?": none) is understood and counted, not unknown."""
    from sigma.companion.schema import tables

    out: dict[str, dict[str, list[str]]] = {}
    for t in tables():
        for c in t.columns:
            words = c.note.split()
            if len(words) >= 2 and all(re.fullmatch(r"[a-z_]+", w) for w in words):
                out.setdefault(t.name, {})[c.name] = words
    return out


def table_of(ent: Entity) -> str:
    """The table an entity's rows come from: its source, or the first table its query reads (not a subquery's)."""
    top = ent.source
    while "(" in top:
        top, n = re.subn(r"\([^()]*\)", "", top)
        if not n:
            break
    m = re.search(r"\bFROM\s+(\w+)", top, re.I)
    return m.group(1) if m else ent.source


def _learn(conn: sqlite3.Connection, ent: Entity, names: list[str]) -> None:
    """Give every column of the entity a role, words and (for categories and JSON) its values from the data."""
    sample = _sample(conn, ent.source)
    documented = documented_values().get(table_of(ent), {})
    declared = {} if " " in ent.source else {r[1]: r[2] or "" for r in conn.execute(f"PRAGMA table_info({ent.source})")}
    for name in names:
        col = ent.columns.get(name) or Column(name, f"src.{name}", "")
        ent.columns[name] = col
        if col.role:
            continue
        first = [r[0] for r in conn.execute(f"SELECT {name} FROM {sample} WHERE {name} IS NOT NULL LIMIT 200")]
        col.role = _role(name, first, declared.get(name, ""))
        if col.role == "ref":
            ent.refs.setdefault(REF_COLUMNS[name], name)
        elif col.role == "list":
            ent.refs.setdefault(LIST_REFS[name], "list:" + name)
        elif col.role == "text":
            vals = [r[0] for r in conn.execute(f"SELECT DISTINCT {name} FROM {sample} LIMIT {CATEGORY_MAX + 1}")]
            ident = [v for v in vals if isinstance(v, str) and re.fullmatch(r"[A-Za-z0-9_.+,-]{1,40}", v)]
            listed = documented.get(name, [])
            if listed and set(ident) <= set(listed):   # every value the schema lists, seen in the data or not yet
                col.unseen = set(listed) - set(ident)
                ident = list(dict.fromkeys(ident + listed))
            if len(vals) <= CATEGORY_MAX and ident and len(ident) >= len([v for v in vals if v]):
                col.role = "category"
                for v in ident:
                    for part in set(v.split(",")) if "," in v else {v}:
                        col.values.setdefault(part, [])
        elif col.role == "json" and name not in JSON_COLUMNS_SKIP:
            col.keys = [r[0] for r in conn.execute(
                f"SELECT DISTINCT j.key FROM (SELECT {name} AS v FROM {sample} WHERE json_valid({name}) LIMIT 5000) s, "
                f"json_each(s.v) j "
                "WHERE j.type IN ('integer', 'text') LIMIT 100")]
        if not col.unit and col.role == "measure":
            col.unit = unit_of(name)
        if not col.words and col.role not in ("id", "json", "list"):
            col.words, col.learnt = [_words_of_name(name)], True
    for col in ent.columns.values():
        for value, words in col.values.items():
            auto = phrase_stems(value.replace("_", " ").replace(".", " ").replace("-", " ").replace("+", " "))
            split = re.fullmatch(r"([a-z]{3,})(out|up|down|off|over)", value)   # "timeout": "timed out"
            own = [w for w in words if w] + ([phrase_stems(f"{split.group(1)} {split.group(2)}")] if split else [])
            whole = (value.lower(),)
            suffix = phrase_stems(value.rsplit(".", 1)[-1].replace("_", " ")) if "." in value else ()
            cands = own + [auto, whole] + ([suffix] if suffix and not own else [])
            col.values[value] = [] if value.lower() in STOPWORDS and not own else [
                w for w in dict.fromkeys(cands) if w and not (len(w) == 1 and w[0] in STOPWORDS)]


def _duration_words(ent: Entity) -> None:
    """A duration from the row's start to another of its times is also named by that time's own word ("ack time",
    "time to ack", "slowest to ack": acked_at - requested_at), as the schema's column names give it."""
    for col in ent.measures():
        m = re.fullmatch(r"\s*(?:src\.)?(\w+)\s*-\s*(?:src\.)?(\w+)\s*", col.sql)
        end = ent.columns.get(m.group(1)) if m else None
        if end is None or end.role != "time" or end.name == ent.time or m.group(2) != ent.time:
            continue
        verb = re.sub(r"_(at|ts)$", "", end.name).replace("_", " ")
        col.words += [p for p in (phrase_stems(f"{verb} time"), phrase_stems(f"time to {verb}"),
                                  phrase_stems(f"to {verb}")) if p not in col.words]


def _referred_columns(entities: dict[str, Entity]) -> None:
    """The categories of the row another one refers to by its `<table>_id` column, named by that table's noun and
    the column's words ("incident category" of a job loss: its incident's category); the referred table's own rows
    take the same words for the column itself."""
    for other in list(entities.values()):
        key = _key(other)
        if not key or other.source != key[:-3] + "s":
            continue
        noun = phrase_stems(key[:-3].replace("_", " "))
        for col in [c for c in other.columns.values() if c.role == "category"]:
            words = [noun + w for w in col.words if w and noun + w not in col.words]
            col.words += words
            for ent in entities.values():
                if ent is other or key not in ent.columns or col.name in ent.columns:
                    continue
                name = f"{key[:-3]}_{col.name}"
                ent.columns.setdefault(name, Column(
                    name, f"(SELECT r.{col.name} FROM {other.source} r WHERE r.id = src.{key})", "category",
                    words=list(words), learnt=col.learnt))


def _said(sql: str) -> str:
    """A condition's words built from its SQL's values ("result IN ('fail', 'reject')": "result fail or reject"),
    so that an answer names every value it counted, never a subset; "" for any other predicate."""
    m = re.fullmatch(r"(\w+) (?:= '(\w+)'|IN \(((?:'\w+'(?:, )?)+)\))", sql.strip())
    if not m:
        return ""
    return m.group(1) + " " + (m.group(2) or " or ".join(re.findall(r"'(\w+)'", m.group(3))))


def _entity(name: str, spec: dict) -> Entity:
    conds = {}
    for words, sql in (spec.get("conds") or {}).items():
        m = re.match(r"\(?\s*(?:NOT \()?\s*(\w+)\b", sql)
        conds[phrase_stems(words)] = Cond(name, sql, _said(sql) or words, m.group(1) if m else "")
    columns = {}
    for cname, c in (spec.get("columns") or {}).items():
        c = c or {}
        role = "measure" if "sql" in c and not cname.endswith("_at") else ""
        columns[cname] = Column(cname, c.get("sql", f"src.{cname}"), role, unit_of(cname) if role else "",
                                [phrase_stems(w) for w in c.get("words", [])], c.get("agg", ""),
                                only_in=c.get("only_in", ""))
    for cname, vals in (spec.get("values") or {}).items():
        col = columns.setdefault(cname, Column(cname, f"src.{cname}", ""))
        col.values = {v: [phrase_stems(w) for w in words] for v, words in vals.items()}
    explicit_values = {c: {v: [phrase_stems(w) for w in words] for v, words in vals.items()}
                       for c, vals in (spec.get("values") or {}).items()}
    source = " ".join(str(spec["source"]).split())
    return Entity(name, source, [phrase_stems(w) for w in spec.get("words", [])], spec.get("time"),
                  spec.get("label", "id"), spec.get("show", []), columns, conds, {},
                  spec.get("default", ""), bool(spec.get("now")), True, spec.get("measure_names"),
                  explicit_values, [phrase_stems(w) for w in spec.get("row", [])],
                  [phrase_stems(w) for w in spec.get("by", [])],
                  {phrase_stems(device): (column, frozenset(values))
                   for column, devices in (spec.get("devices") or {}).items() for device, values in devices.items()},
                  bool(spec.get("readings")),
                  (spec["parts"]["noun"], " ".join(spec["parts"]["source"].split())) if spec.get("parts") else None,
                  tuple(Sense(tuple(phrase_stems(w) for w in x["words"]), x["column"], x["sql"], x["said"],
                              x["means"], x.get("value"), bool(x.get("modifier"))) for x in spec.get("senses", [])))


@lru_cache(maxsize=1)
def vocabulary() -> dict:
    return yaml.safe_load(VOCABULARY.read_text())


def build(conn: sqlite3.Connection, allowed: frozenset[str] = ALLOWED_TABLES) -> Model:
    """The model of one database (its tables, columns and values as they are now)."""
    voc = vocabulary()
    entities: dict[str, Entity] = {}
    for name, spec in voc["entities"].items():
        entities[name] = _entity(name, spec)
    described = {e.source for e in entities.values()} | {s.get("table") for s in voc["entities"].values()}
    for (table,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name"):
        if table in allowed and table not in described and table not in entities:
            words = [phrase_stems(table.replace("_", " ")), phrase_stems(table.rstrip("s").replace("_", " "))]
            entities[table] = Entity(table, table, words, None, "rowid", [], {}, {}, {})
    for ent in entities.values():
        src = ent.source if ent.source.upper().startswith("SELECT") is False else f"({ent.source})"
        cur = conn.execute(f"SELECT * FROM {src} AS src LIMIT 0")
        names = [d[0] for d in cur.description]
        _learn(conn, ent, names)
        if ent.time is None:
            ent.time = next((c for c in names if ent.columns[c].role == "time"), None)
        if not ent.show:
            ent.show = [c for c in names if ent.columns[c].role not in ("json",)][:8]
        if ent.label == "rowid":
            ent.label = ent.show[0] if ent.show else names[0]
        _duration_words(ent)
    _referred_columns(entities)
    rule_ids = {r[0] for r in conn.execute("SELECT DISTINCT rule_id FROM incidents")}
    nodes = {r[0] for r in conn.execute("SELECT node FROM node_snapshots UNION SELECT node FROM incidents "
                                        "WHERE node IS NOT NULL UNION SELECT node FROM node_lifecycle")}
    return Model(entities, {k: [phrase_stems(w) for w in v] for k, v in voc["refs"].items()},
                 {tuple(s for w in k.split() for s in (("#",) if w == "#" else phrase_stems(w))): v
                  for k, v in voc["rule_words"].items()}, rule_ids, nodes)


def _key(ent: Entity) -> str | None:
    """The column other tables refer to one of this entity's rows by: incidents -> incident_id."""
    if re.fullmatch(r"[a-z_]+s", ent.source) and "id" in ent.columns:
        return ent.source[:-1] + "_id"
    return None


def link(a: Entity, b: Entity) -> str | None:
    """How a row of `b` (alias o) belongs to the current row of `a` ({row}: named where the condition is used): b
    refers to a, a refers to b, or both refer to the same incident. None when they are not related in the schema."""
    ka, kb = _key(a), _key(b)
    if ka and ka in b.columns:
        return f"o.{ka} = {{row}}.id"
    if kb and kb in a.columns:
        return f"o.id = {{row}}.{kb}"
    if "incident_id" in a.columns and "incident_id" in b.columns:
        return "o.incident_id = {row}.incident_id"
    return None

