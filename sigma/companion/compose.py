"""A parsed query (sigma.companion.parse.Query) as one read-only SELECT, with the unit of each result column.

The entity's rows come first, with its measures computed (`base`), then its filters (`rows`): references (nodes,
jobs, rules), conditions, the time range on the entity's time column, a comparison on the measure. What is selected
from them follows from the question's shape: a count, an aggregate of the measure (average, median, total, maximum,
minimum, share), one row per node/job/rule/category ("which nodes ..."), per group or per time bucket, a ranking
that keeps every row tied at the top, the latest or earliest row, a time, or the rows themselves.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace

from sigma.companion.model import UNITS, Column, Cond
from sigma.companion.parse import Query, percentile

# Every node or job the controller knows, for "which nodes were never ...".
UNIVERSES = {"node": "SELECT node FROM node_snapshots", "job_id": "SELECT job_id FROM kpis"}
SPAN = re.compile(r"(\w+) - (\w+)")   # a measure that is the time from one of a row's times to another
RATE_UNITS = {1: "second", 60: "minute", 3600: "hour", 86400: "day"}
AGG_SQL = {"avg": "AVG({})", "sum": "SUM({})", "max": "MAX({})", "min": "MIN({})", "count": "COUNT(*)"}


class NotUnderstood(ValueError):
    """The slots are understood one by one but do not make one question the data answers."""


@dataclass
class Built:
    sql: str
    params: list
    units: dict[str, str] = field(default_factory=dict)   # result column -> unit (s, time, %, bytes, ...)
    shape: str = "rows"                                   # rows scalar groups ranking latest hypo
    value: str = ""                                       # the column holding the answer's number
    showed: bool = False                                  # the columns the question asked for are in the result
    extras: list[str] = field(default_factory=list)        # the columns answering the question's second part


def _bucket_size(q: Query, now: float) -> int:
    if q.bucket:
        return q.bucket
    span = now - q.since if q.since else 86400
    return 60 if span <= 3 * 3600 else 3600 if span <= 3 * 86400 else 86400


def compose(q: Query, now: float, tz_offset: float) -> Built:
    if None in q.extras:
        raise NotUnderstood(f"the second part of the question, of {q.entity.name}")
    if q.measure is not None and q.measure.name in [*q.group, q.project]:   # "max step per step": no answer
        raise NotUnderstood(f"{q.measure.name} both measured and grouped by")
    if q.versus is not None:   # "drains in the last hour vs the hour before that": one value of each period
        one = replace(q, versus=None)
        if q.qkind in ("list", "yesno") and q.measure is None and not (q.project or q.group or q.show):
            one = replace(one, qkind="count")   # rows of two periods side by side: how many of each
        first = compose(one, now, tz_offset)
        other = q.versus
        second = compose(replace(one, since=other.since, until=other.until, period=other.words), now, tz_offset)
        if first.shape != "scalar" or second.shape != "scalar" or first.extras:
            raise NotUnderstood("a comparison of two periods of anything but one value")
        name = f"{first.value}_{'_'.join(re.findall(r'[a-z0-9]+', other.words))}"
        return Built(f"SELECT ({first.sql}) AS {first.value}, ({second.sql}) AS {name}", first.params + second.params,
                     {**first.units, name: first.units.get(first.value, "")}, "versus", first.value)
    if q.ago:   # "how long ago": from the row's time to now
        q = replace(q, measure=Column("ago_s", f"{now!r} - {q.time_col or q.entity.time}", "measure", "s"))
    q = _within(q, now)
    used: list[Extra] = []
    built = _compose(q, now, tz_offset, used)
    if q.entity.parts and built.shape == "scalar" and not q.extras and (
            built.value == "n" or (q.measure is not None and built.units.get(built.value) != "time")):
        built = _with_parts(q, built, now, tz_offset)
    built.extras = [x.name for x in used]
    if q.show and not built.showed:   # a column asked for that this shape of answer would leave out
        raise NotUnderstood(f"{', '.join(q.show)} together with a count, an aggregate or a grouping")
    if len(built.extras) != len(q.extras):
        raise NotUnderstood("the second part of the question together with this kind of answer")
    return built


def _within(q: Query, now: float) -> Query:
    """A time a row lasted (from its own time to another of its times) that adds up, asked within a time range
    ("seconds out of service in the last hour"): the part of each stay inside the range, one not ended yet lasting
    until now; the rows are those that overlap the range, not only those that began in it."""
    m, ent = q.measure, q.entity
    span = SPAN.fullmatch(m.sql) if m is not None else None
    total = q.agg == "sum" or (not q.agg and not q.rank and m is not None and m.agg == "sum" and q.qkind != "count")
    if not (span and total and span.group(2) == ent.time == (q.timed or ent.time)   # (a range on the row's start)
            and (q.since is not None or q.until is not None)
            and q.bucket is None and getattr(ent.columns.get(span.group(1)), "role", "") == "time"):
        return q
    end, start = f"COALESCE({span.group(1)}, {now!r})", span.group(2)
    since = start if q.since is None else f"{q.since!r}"
    until = f"{now!r}" if q.until is None else f"{q.until!r}"
    clipped = replace(m, name=re.sub(r"_s$", "", m.name) + "_in_range_s",
                      sql=f"MAX(0, MIN({end}, {until}) - MAX({start}, {since}))")
    overlap = [Cond(ent.name, f"{end} > {since}", q.period, "range:end"),
               Cond(ent.name, f"{start} < {until}", q.period, "range:start")]
    return replace(q, measure=clipped, since=None, until=None, conds=q.conds + overlap)


def _with_parts(q: Query, built: Built, now: float, tz_offset: float) -> Built:
    """"How many checkpoints", "median time to save a checkpoint": the value over the rows and, beside it, over
    the parts each row merges (the ranks' writes), as either is what a reader may mean."""
    noun, source = q.entity.parts
    parts = replace(q, entity=replace(q.entity, source=source, parts=None, default=""))
    other = _compose(parts, now, tz_offset, [])
    name = f"{built.value}_{'_'.join(noun.split())}"
    return Built(f"SELECT ({built.sql}) AS {built.value}, ({other.sql}) AS {name}", built.params + other.params,
                 {**built.units, name: built.units.get(built.value, "")}, "parts", built.value)


@dataclass
class Extra:
    """A second part of the question, asked of the first part's rows: one more column of the answer."""
    sql: str
    name: str
    unit: str
    params: list
    plain: bool          # a column of each row ("and at which step"), not an aggregate over them


def _extra(qb: Query) -> Extra:
    """"..., and how many of them led to a drain" (a count of those rows that also meet its conditions), "and the
    first time one opened" (a time), "and the average X" (an aggregate), "and at which step" (a column)."""
    ent = qb.entity
    if qb.project and qb.project in ent.columns and qb.which and not (
            qb.group or qb.bucket is not None or qb.having or qb.hypo or qb.measure or qb.conds or qb.show
            or qb.agg or qb.rank or qb.qkind != "list"):   # "..., and for which node": each row's node
        return Extra(qb.project, qb.project, "", [], True)
    if qb.group or qb.bucket is not None or qb.project or qb.having or qb.hypo:
        raise NotUnderstood("a second part with its own grouping")
    where, params, _ = _filters(qb, "rows")
    if ent.default in where:
        where.remove(ent.default)   # the first part's rows already are the entity's
    cond = " AND ".join(where)
    when = (lambda v: f"CASE WHEN {cond} THEN {v} END") if cond else (lambda v: v)  # noqa: E731
    m = qb.measure
    if qb.qkind == "when":
        t = qb.time_col or qb.timed or ent.time
        fn, word = ("MIN", "first") if qb.order == "earliest" else ("MAX", "last")
        return Extra(f"{fn}({when(t)})", f"{word}_{t}", "time", params, False)
    if m is not None and (qb.agg or qb.rank) and qb.agg not in ("count", "share", "median") and not percentile(qb.agg):
        fn = qb.agg or qb.rank
        return Extra(AGG_SQL[fn].format(when(m.name)), f"{fn}_{m.name}", m.unit, params, False)
    if qb.qkind == "count" and m is None and not qb.agg:
        label = "_".join(re.findall(r"[a-z0-9]+", " ".join(c.label for c in qb.conds) or "all"))
        return Extra(f"SUM(CASE WHEN {cond or '1'} THEN 1 ELSE 0 END)", f"n_{label}", "", params, False)
    column = m.name if m is not None else (qb.show[0] if len(qb.show) == 1 else None)
    if column and not cond and not qb.agg and not qb.rank:
        return Extra(column, column, m.unit if m is not None else "", [], True)
    raise NotUnderstood("a second part that is not a count, a time, an aggregate or a column")


def _filters(q: Query, row: str) -> tuple[list[str], list, list[tuple[str, list]]]:
    """The predicates of the question's filters over the entity's rows (`row`: their alias, for relations), their
    parameters, and the conditions that are a share's numerator rather than a filter."""
    ent = q.entity
    where, params = [], []
    for ref, values in (("node", q.nodes), ("job", q.jobs)):
        if not values:
            continue
        col = ent.refs.get(ref)
        if col is None:
            raise NotUnderstood(f"{ent.name} have no {ref}")
        marks = ",".join("?" * len(values))
        where.append(f"EXISTS (SELECT 1 FROM json_each({col[5:]}) jl WHERE jl.value IN ({marks}))"
                     if col.startswith("list:") else f"{col} IN ({marks})")
        params += values
    if q.rules:
        col = ent.refs.get("rule")
        if col is None:
            raise NotUnderstood(f"{ent.name} have no rule")
        where.append("(" + " OR ".join(f"{col} LIKE ?" for _ in q.rules) + ")")
        params += q.rules
    for ref, values in q.exclude.items():   # "excluding xid", "except on node1": rows without a value count too
        col = ent.refs.get(ref)
        if col is None or col.startswith("list:"):
            raise NotUnderstood(f"{ent.name} cannot exclude a {ref}")
        if ref == "rule":
            where.append("NOT COALESCE((" + " OR ".join(f"{col} LIKE ?" for _ in values) + "), 0)")
        else:
            where.append(f"COALESCE({col}, '') NOT IN ({','.join('?' * len(values))})")
        params += values
    # the entity's default rows (actions done) unless the question names the default's column: as a condition, or
    # as what it groups or lists by ("actions per state": every state)
    asked = {c.column.rstrip("!") for c in q.conds} | set(q.group) | {q.project}
    if ent.default and ent.default.split()[0] not in asked:
        where.append(ent.default)
    share_conds = []       # "what share of X are Y": Y is the numerator, not a filter
    metric_col = (ent.measure_names or {}).get("column")
    by_column: dict[str, list] = {}
    for c in q.conds:   # several values of one column ("warning or error events") are alternatives; a test of
        #                 another kind ("acknowledged", "missed the deadline": null, a comparison) holds as well
        value = c.column.endswith("!") or not re.search(r"\bIS (?:NOT )?NULL\b|[<>]", c.sql)   # "!": ANDed anyway
        by_column.setdefault((c.column or c.sql) if value else c.sql, []).append(c)
    for column, conds in by_column.items():
        joiner = " AND " if column.endswith("!") else " OR "   # "not A or B": neither
        sql = conds[0].sql if len(conds) == 1 else "(" + joiner.join(c.sql for c in conds) + ")"
        args = [a for c in conds for a in c.params]
        if q.agg in ("share", "of_all") and column.rstrip("!") != metric_col:
            share_conds.append((sql.replace("{row}", "rows"), args))
        else:
            where.append(sql.replace("{row}", row))   # a relation names the row it belongs to
            params += args
    if q.since is not None or q.until is not None:
        if not ent.time:
            raise NotUnderstood(f"{ent.name} have no time to filter on")
        t = q.timed or ent.time
        if q.since is not None:
            where.append(f"{t} >= ?")
            params.append(q.since)
        if q.until is not None:
            where.append(f"{t} < ?")
            params.append(q.until)
    return where, params, share_conds


def has_value(key: str) -> str:
    """A group key's row has a value: neither NULL nor the empty string a column without one may hold (an incident
    with no category is no category '')."""
    return f"NULLIF({key}, '') IS NOT NULL"


def _known_keys(q: Query) -> list[str]:
    """Per-group and per-X answers are about the groups the question names: rows without a value of the key (an
    incident with no node) are no group of their own ("the last incident on each node" lists nodes), unless a
    condition of the question is on that column."""
    asked = {c.column.rstrip("!") for c in q.conds}
    keys = [k for k in [*q.group, q.project] if k and not k.startswith("list:") and k not in asked]
    return [has_value(k) for k in dict.fromkeys(keys) if k in q.entity.columns]


def _having_count(q: Query) -> str:
    return f"COUNT(DISTINCT {q.having_of})" if q.having_of else "COUNT(*)"


def _in_unit(q: Query) -> Column | None:
    """The question's measure, in the unit it asks for ("in GiB", "in minutes") if it names one."""
    m = q.measure
    if not q.unit or (q.unit == "%" and q.agg == "share"):   # a share in percent (agg_of)
        return m
    factor = UNITS.get((m.unit if m else "", q.unit))
    if factor is None:
        raise NotUnderstood(f"'in {q.unit}' for {m.name if m else 'no measure'}")
    name = re.sub(r"_(s|bytes)$", "", m.name) + "_" + q.unit.lower()   # out_of_service_s -> out_of_service_min
    return replace(m, name=name, sql=f"({m.sql}) / {factor}", unit=q.unit)   # its words and aggregate kept


def _compose(q: Query, now: float, tz_offset: float, used: list[Extra]) -> Built:
    """The SELECT; `used` gets the second parts of the question it answers."""
    ent = q.entity
    m = _in_unit(q)
    measures = [c for c in ent.columns.values() if c.role in ("measure", "category") and c.sql != f"src.{c.name}"]
    if m and m.name not in ent.columns and m.sql != f"src.{m.name}":
        measures.append(m)   # a measure of the question's own: the time between two times, one in another unit
    extra = "".join(f", {c.sql} AS {c.name}" for c in measures)
    src = ent.source if not ent.source.upper().startswith("SELECT") else f"({ent.source})"
    base = f"base AS (SELECT src.*{extra} FROM {src} AS src)"
    where, params, share_conds = _filters(q, "base")
    where += _known_keys(q)
    if q.latest_each:   # each one's latest row of those the question names (its own conditions, again, inside)
        same = " AND ".join(where) or "1"
        where.append(f"{ent.time} = (SELECT MAX(b2.{ent.time}) FROM base b2 WHERE b2.{q.project} = base.{q.project} "
                     f"AND {same})")
        params += params
    extras = [_extra(x) for x in q.extras]
    aggregates, plain = [x for x in extras if not x.plain], [x for x in extras if x.plain]

    def add(more: list[Extra]) -> str:
        """The extra columns of a SELECT (their parameters in the order they appear)."""
        for x in more:
            params.extend(x.params)
            units[x.name] = x.unit
            used.append(x)
        return "".join(f", {x.sql} AS {x.name}" for x in more)
    if q.qkind == "duration" and m is None:
        m = next((c for c in ent.measures() if c.unit == "s"), None)
        if m is None:
            raise NotUnderstood(f"how long: {ent.name} have no duration")
    if q.qkind == "duration" and m.unit not in ("s", "min", "h"):
        raise NotUnderstood(f"how long: {m.name} is not a duration")
    if q.cmp:
        op, value, unit = q.cmp
        if m is None or (unit == "s") != (m.unit == "s") or (unit == "%") != (m.unit == "%"):
            raise NotUnderstood(f"'{op} {value:g}{' ' + unit if unit else ''}' without a measure of that kind")
        if q.agg in ("share", "of_all"):   # "what share lost no steps": the share's numerator, not a filter
            share_conds.append((f"{m.name} {op} ?", [value]))
        else:
            where.append(f"{m.name} {op} ?")
            params.append(value)
    rows = "rows AS (SELECT * FROM base" + (" WHERE " + " AND ".join(where) if where else "") + ")"
    head = f"WITH {base}, {rows} "
    units = {c.name: ("time" if c.role == "time" else c.unit) for c in ent.columns.values()
             if c.role in ("time", "measure") and (c.unit or c.role == "time")}
    mname = m.name if m else None
    if m:
        units[mname] = m.unit
    if ent.time:
        units[ent.time] = "time"

    def agg_of(agg: str, col: str | None) -> str:
        if agg == "share":
            if not share_conds:
                raise NotUnderstood("a share of what")
            cond = " AND ".join(s for s, _ in share_conds)
            for _, p in share_conds:
                params.extend(p)
            return f"{'100.0 * ' if q.unit == '%' else ''}AVG(CASE WHEN {cond} THEN 1.0 ELSE 0.0 END)"
        if agg == "distinct":
            return f"COUNT(DISTINCT {q.distinct_of or proj})"
        if agg == "count" or col is None:
            if agg not in ("count", "", "sum") and col is None:   # a total of rows with no measure: their number
                raise NotUnderstood(f"{agg} of what")
            return "COUNT(*)"
        return AGG_SQL[agg].format(col)

    # ---- a hypothetical: which jobs an action on these nodes would hit ----
    if q.hypo:
        if ent.name != "nodes" or not q.nodes:
            raise NotUnderstood("a what-if needs the node(s) it is about")
        sql = head + ("SELECT rows.node, jl.value AS job_id FROM rows, json_each(rows.jobs) jl "
                      "ORDER BY rows.node, jl.value")
        return Built(sql, params, units, "hypo")
    # ---- a counter's rate: "how many steps per minute" (its rise over the time it took) ----
    if m and m.agg == "max" and q.bucket and q.qkind == "count" and q.agg in ("", "avg") and not q.group:
        if ent.refs.get("job") and not q.jobs:
            raise NotUnderstood(f"a rate of {mname} over several jobs' counters")
        name = f"{mname}_per_{RATE_UNITS.get(q.bucket, f'{q.bucket}_s')}"
        sql = head + (f"SELECT {q.bucket} * (MAX({mname}) - MIN({mname})) / NULLIF(MAX({ent.time}) - "
                      f"MIN({ent.time}), 0) AS {name} FROM rows")
        return Built(sql, params, units, "scalar", name)
    # ---- one row per group or time bucket ----
    group = list(q.group)
    bucket = None
    if q.bucket is not None:
        if not ent.time:
            raise NotUnderstood(f"{ent.name} have no time to follow over time")
        size = _bucket_size(q, now)
        bucket = f"CAST(({q.timed or ent.time} + {tz_offset:.0f}) / {size} AS INTEGER) * {size} - {tz_offset:.0f}"
        units["period"] = "time"
    proj = q.project
    if proj and proj.startswith("list:"):
        proj = proj[5:]
    agg = q.agg or ("count" if q.qkind == "count" else "")
    if agg == "count" and q.agg and m:
        raise NotUnderstood(f"both a count and the {q.agg} of {m.name}")
    if m and q.qkind == "count" and q.agg:
        raise NotUnderstood(f"both a count and the {q.agg} of {m.name}")
    if m and not agg and q.rank and (group or bucket is not None):
        agg = q.rank
    if m and not agg and (group or bucket is not None or (proj and q.rank and m)):
        agg = m.agg if m.agg in AGG_SQL else ("" if (proj and q.rank) else "avg")
    if (agg == "median" or percentile(agg)) and m is None:
        raise NotUnderstood(f"a {'median' if agg == 'median' else 'percentile'} of what")

    def grouped(keys: list[str], value_agg: str) -> tuple[str, str, str]:
        """(CTE, SELECT keys, value ... GROUP BY keys, the value's name); a median through window functions."""
        cols = ", ".join(keys)
        if value_agg == "median":
            part = f"PARTITION BY {cols} " if keys else ""
            body = (f"med AS (SELECT {cols + ', ' if keys else ''}{mname} AS v, ROW_NUMBER() OVER ({part}ORDER BY "
                    f"{mname}) AS rn, COUNT(*) OVER ({part.strip()}) AS n FROM rows WHERE {mname} IS NOT NULL) ")
            sel = (f"SELECT {cols + ', ' if keys else ''}AVG(v) AS median_{mname} FROM med WHERE rn IN ((n + 1) / 2, "
                   f"(n + 2) / 2)" + (f" GROUP BY {cols}" if keys else ""))
            units[f"median_{mname}"] = m.unit
            return body, sel, f"median_{mname}"
        if percentile(value_agg):   # the nearest rank: the smallest value with at least p % of them at or below it
            part = f"PARTITION BY {cols} " if keys else ""
            body = (f"pct AS (SELECT {cols + ', ' if keys else ''}{mname} AS v, ROW_NUMBER() OVER ({part}ORDER BY "
                    f"{mname}) AS rn, COUNT(*) OVER ({part.strip()}) AS n FROM rows WHERE {mname} IS NOT NULL) ")
            name = f"{value_agg}_{mname}"
            sel = (f"SELECT {cols + ', ' if keys else ''}MIN(v) AS {name} FROM pct WHERE rn = (n * "
                   f"{percentile(value_agg)} + 99) / 100" + (f" GROUP BY {cols}" if keys else ""))
            units[name] = m.unit
            return body, sel, name
        name = "n" if value_agg in ("count", "distinct") or m is None else f"{value_agg}_{mname}"
        if value_agg == "share":
            name = "share"
            units[name] = "%" if q.unit == "%" else ""
        if m is not None and value_agg not in ("count", "share"):
            units[name] = m.unit
        expr = agg_of(value_agg, mname)
        more = add(aggregates)
        named = [k for k in keys if " AS " not in k]
        known = (" WHERE " + " AND ".join(has_value(k) for k in named)) if named else ""
        return "", f"SELECT {cols + ', ' if keys else ''}{expr} AS {name}{more} FROM rows{known}" + (
            f" GROUP BY {cols}" if keys else ""), name

    if q.qkind == "when" and (group or proj) and bucket is None:
        tcol = q.time_col or q.timed or ent.time
        keys = group or [proj]
        fn = "MIN" if q.order == "earliest" else "MAX"
        units[tcol] = "time"
        sql = head + (f"SELECT {', '.join(keys)}, {fn}({tcol}) AS {tcol} FROM rows GROUP BY {', '.join(keys)} "
                      f"ORDER BY {', '.join(keys)}")
        return Built(sql, params, units, "groups", tcol)
    if group and q.per_item and m and not q.agg:   # "how long did each validation take, per node"
        cols = list(dict.fromkeys(group + [mname] + ([ent.time] if ent.time else [])))
        return Built(head + f"SELECT {', '.join(cols)} FROM rows ORDER BY {', '.join(group)}", params, units, "rows",
                     mname)
    if (group or bucket is not None) and proj and proj not in group:
        if q.count_distinct and agg == "count":   # "how many different rules fired on node2 versus node1"
            agg = "distinct"
        else:   # "which rules fired, per node": one row per node and rule
            group.append(proj)
    if group or bucket is not None:
        keys = group + ([f"{bucket} AS period"] if bucket is not None else [])
        key_names = group + (["period"] if bucket is not None else [])
        if q.rank and not agg:
            agg = "count"
        extra_cte, sel, name = grouped(key_names if bucket is None else keys, agg or "count")
        if bucket is not None:
            sel = sel.replace(f"GROUP BY {', '.join(keys)}", f"GROUP BY {', '.join(key_names)}")
        if q.having:
            sel += f" HAVING {_having_count(q)} {q.having[0]} {q.having[1]:g}"
        largest = f"{name} DESC, " if q.sort and bucket is None else ""   # "per rule, largest first"
        sql = head + (", " + extra_cte if extra_cte else "") + sel + f" ORDER BY {largest}{', '.join(key_names)}"
        return Built(sql.replace("WITH base", "WITH base", 1), params, units, "groups")

    if q.without is not None:   # "nodes drained but never rebooted": the listed ones less those the other's rows name
        ref = next(r for r, c in ent.refs.items() if c == proj)
        col = q.without.refs[ref]
        other = compose(Query(q.without, project=col, which=True), now, tz_offset)
        if q.qkind == "count":
            raise NotUnderstood("how many of one entity's, less another's")
        sql = head + (f"SELECT DISTINCT {proj} FROM rows WHERE {has_value(proj)} AND {proj} NOT IN (SELECT {col} "
                      f"FROM ({other.sql}) WHERE {col} IS NOT NULL) ORDER BY {proj}")
        return Built(sql, params + other.params, units, "rows")
    if q.anti:   # "which nodes were never drained": every one known, less those with such rows
        universe = UNIVERSES.get(proj)
        if universe is None:
            raise NotUnderstood(f"'never' over {proj}")
        sql = head + (f"SELECT DISTINCT {proj} FROM ({universe}) WHERE {proj} NOT IN "
                      f"(SELECT {proj} FROM rows WHERE {proj} IS NOT NULL) ORDER BY {proj}")
        return Built(sql, params, units, "rows")
    if proj:
        listed = proj if not (ent.refs.get("job", "").startswith("list:") and proj == ent.refs["job"][5:]) else None
        if listed is None:  # "which jobs" over a JSON list of job ids
            sql = head + f"SELECT DISTINCT jl.value AS job_id FROM rows, json_each(rows.{proj}) jl ORDER BY 1"
            return Built(sql, params, units, "rows")
        if q.rank and m and not q.agg:     # "which node was out of service the longest": the row(s) at the top
            fn = "MAX" if q.rank == "max" else "MIN"
            sql = head + (f"SELECT DISTINCT {proj}, {mname} FROM rows WHERE {mname} = (SELECT {fn}({mname}) "
                          f"FROM rows) ORDER BY {proj}")   # each one at the top once ("job 1", not once per rank)
            return Built(sql, params, units, "ranking", mname)
        if q.which and m and not plain and not agg and not q.rank and q.qkind != "count":   # "which jobs lost
            fn = m.agg if m.agg in ("sum", "avg", "max", "min") else "max"   # more than 10 steps": each once
            name = f"{fn}_{mname}"
            units[name] = m.unit
            sql = head + (f"SELECT {proj}, {AGG_SQL[fn].format(mname)} AS {name} FROM rows WHERE {has_value(proj)} "
                          f"GROUP BY {proj} ORDER BY {proj}")
            return Built(sql, params, units, "groups", name)
        if (m or plain) and not agg and not q.rank and q.qkind != "count":
            add(plain)   # "which nodes were drained, and how long until each came back": each row
            cols = list(dict.fromkeys([proj] + ([mname] if m else []) + [x.name for x in plain]
                                      + ([ent.time] if ent.time else [])))
            order = f" ORDER BY {ent.time}" if ent.time else ""
            return Built(head + f"SELECT {', '.join(cols)} FROM rows{order}", params, units, "rows",
                         mname or plain[0].name)
        if q.show and not (m or agg or q.rank or q.having):   # "which rules ..., and what would they have done"
            keys = list(dict.fromkeys([proj] + q.show))
            _, sel, _ = grouped(keys, "count")
            return Built(head + sel + f" ORDER BY {', '.join(keys)}", params, units, "groups", "n", showed=True)
        value_agg = agg or ("distinct" if q.distinct_of else "count")   # "the node with the most different kinds"
        extra_cte, sel, name = grouped([proj], value_agg)
        if q.having:
            if value_agg != "count":
                raise NotUnderstood("a count condition with another measure")
            sel += f" HAVING {_having_count(q)} {q.having[0]} {q.having[1]:g}"
        if q.qkind == "count" and not q.rank and (q.count_distinct or q.having):   # "how many nodes were drained"
            inner = head + (", " + extra_cte if extra_cte else "") + sel
            sql = f"SELECT COUNT(*) AS n FROM ({inner})"
            return Built(sql, params, units, "scalar", "n")
        body = (", " + extra_cte if extra_cte else "") + sel
        if q.rank:
            fn = "MAX" if q.rank == "max" else "MIN"
            if q.top:
                sql = head + body + f" ORDER BY {name} {'DESC' if q.rank == 'max' else 'ASC'}, {proj} LIMIT {q.top}"
            else:
                inner = head + body
                sql = f"SELECT * FROM ({inner}) g WHERE {name} = (SELECT {fn}({name}) FROM ({inner}))"
                params = params + params
            return Built(sql, params, units, "ranking", name)
        sql = head + body + (f" ORDER BY {name} DESC, {proj}" if q.sort else f" ORDER BY {proj}")
        return Built(sql, params, units, "groups", name)

    if q.qkind == "when":
        tcol = q.time_col or q.timed or ent.time
        if not tcol:
            raise NotUnderstood(f"{ent.name} have no time")
        units[tcol] = "time"
        if q.order or q.rank:
            fn = "MAX" if (q.order == "latest" or q.rank == "max") else "MIN"
            return Built(head + f"SELECT {fn}({tcol}) AS {tcol}{add(aggregates)} FROM rows", params, units, "scalar",
                         tcol)
        cols = list(dict.fromkeys([tcol] + [c for c in ent.show if c != tcol]))
        return Built(head + f"SELECT {', '.join(cols)} FROM rows ORDER BY {tcol}", params, units, "rows")

    if q.having:
        raise NotUnderstood("more than N times: of what (per node, per job, ...)")
    if agg == "of_all" and not m:   # "out of all requests, how many were acked in time": those, and all
        if not share_conds or q.qkind != "count":
            raise NotUnderstood("out of all: how many of what")
        cond = " AND ".join(c for c, _ in share_conds)
        params += [p for _, ps in share_conds for p in ps]
        return Built(head + f"SELECT SUM(CASE WHEN {cond} THEN 1 ELSE 0 END) AS n, COUNT(*) AS n_all FROM rows",
                     params, units, "scalar", "n")
    if (q.qkind == "count" or agg == "sum") and not m:   # "total drains": a total of rows with no measure
        return Built(head + f"SELECT COUNT(*) AS n{add(aggregates)} FROM rows", params, units, "scalar", "n")

    if m and q.rank and q.top and not agg and not q.order:   # "the 3 incidents that took longest to close": the
        cols = list(dict.fromkeys([c for c in ent.show if c] + [mname] + [x.name for x in plain]))   # rows at the top
        add(plain)
        sql = head + (f"SELECT {', '.join(cols)} FROM rows WHERE {mname} IS NOT NULL ORDER BY {mname} "
                      f"{'DESC' if q.rank == 'max' else 'ASC'} LIMIT {q.top}")
        return Built(sql, params, units, "ranking", mname)
    if m and q.rank and not agg and (q.which or plain) and not q.order:   # the row(s) at the top
        fn = "MAX" if q.rank == "max" else "MIN"
        cols = [mname] if plain and not q.which else [c for c in ent.show if c] + [mname]
        cols = list(dict.fromkeys(cols + [x.name for x in plain if x.name != mname]))
        add(plain)
        sql = head + (f"SELECT DISTINCT {', '.join(cols)} FROM rows WHERE {mname} = (SELECT {fn}({mname}) "
                      "FROM rows)")
        return Built(sql, params, units, "ranking", mname)
    if m and agg and q.rank and agg != q.rank:   # "the highest average" of one value: one of the two is unused
        raise NotUnderstood(f"both the {agg} and the {q.rank} of one value")
    if m and (agg or q.rank) and not q.order:
        value_agg = agg or q.rank
        extra_cte, sel, name = grouped([], value_agg)
        return Built(head + (", " + extra_cte if extra_cte else "") + sel, params, units, "scalar", name)
    if agg == "share":
        _, sel, _ = grouped([], "share")
        return Built(head + sel, params, units, "scalar", "share")
    if agg and not m:
        raise NotUnderstood(f"the {agg} of what")

    if m and m.agg and not q.order and q.qkind not in ("duration",) and not q.cmp:   # "lost more than 10": the rows
        extra_cte, sel, name = grouped([], m.agg if m.agg in AGG_SQL else "avg") if m.agg != "latest" else ("", "", "")
        if sel:
            return Built(head + sel, params, units, "scalar", name)
        q.order = "latest"
    if q.show and not q.order and not m:
        cols = list(dict.fromkeys([ent.label] + q.show + ent.show))
        return Built(head + f"SELECT DISTINCT {', '.join(cols)} FROM rows ORDER BY {ent.label}", params, units,
                     "rows", showed=True)
    cols = list(dict.fromkeys([c for c in ent.show if c] + q.show + ([mname] if m else [])
                              + [x.name for x in plain]))
    add(plain)
    if q.order:
        if q.qkind == "count":   # "how many ... last": one row is no count
            raise NotUnderstood(f"a count together with the {q.order} row")
        if not ent.time:
            raise NotUnderstood(f"{ent.name} have no time to order by")
        direction = "DESC" if q.order == "latest" else "ASC"
        sql = head + f"SELECT {', '.join(cols)} FROM rows ORDER BY {ent.time} {direction} LIMIT {q.top or 1}"
        return Built(sql, params, units, "latest", mname or "", showed=True)
    if q.rank and not m:
        raise NotUnderstood("the most or least of what")
    order = f" ORDER BY {ent.time}" if ent.time else ""
    return Built(head + f"SELECT {', '.join(cols)} FROM rows{order}", params, units, "rows", mname or "", showed=True)
