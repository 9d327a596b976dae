"""Evaluate rules over rows (pure: rows in, findings out; no database, no SLURM).

Rows are mappings shaped like the controller tables (events, samples, kpis); `fields`, `labels`, `job_ids` and
`payload` may be JSON text or already decoded. `since` gives, per node, the time it last returned to service:
evidence older than that was already handled and never matches again.
"""

from __future__ import annotations

import fnmatch
import json
import math
import re
from collections import defaultdict
from collections.abc import Iterable, Mapping

from sigma.findings import Finding, clean
from sigma.rules.composite import evaluate_composite
from sigma.rules.schema import OPS, HealthMatch, KpiMatch, LogMatch, MetricMatch, Rule

MAX_EVIDENCE_ROWS = 20


def evaluate(rules: Iterable[Rule], *, now: float, events: Iterable[Mapping] = (), samples: Iterable[Mapping] = (),
             kpis: Iterable[Mapping] = (), since: Mapping[str, float] | None = None,
             jobs_on_node: Mapping[str, list[int]] | None = None,
             since_job: Mapping[int, float] | None = None) -> list[Finding]:
    """since_job: per job, when we last restarted it; job-scope evidence older than that is handled."""
    since = since or {}
    since_job = since_job or {}
    jobs_on_node = jobs_on_node or {}
    events = [normalise(e) for e in events]
    samples = [normalise(s) for s in samples]
    kpis = [normalise(k) for k in kpis]
    findings: list[Finding] = []
    for rule in rules:
        if not rule.enabled:
            continue
        lo = now - rule.window_s
        fresh = lambda rows: [r for r in rows if lo <= r["ts"] <= now and r["ts"] > since.get(r.get("node"), 0.0)]
        if rule.log is not None:
            hits = [e for e in fresh(events) if _log_hit(rule.log, e)]
            findings += _grouped(rule, hits, rule.log.count, jobs_on_node, since_job)
        elif rule.health is not None:
            hits = [e for e in fresh(events) if _health_hit(rule.health, e)]
            findings += _grouped(rule, hits, rule.health.count, jobs_on_node, since_job)
        elif rule.metric is not None:
            findings += _metric(rule, rule.metric, fresh(samples))
        elif rule.kpi is not None:
            findings += _kpi(rule, rule.kpi, [k for k in kpis if lo <= k["ts"] <= now
                                              and k["ts"] > since_job.get(int(k["job_id"]), 0.0)])
        elif rule.composite is not None:  # each leaf applies its own window
            findings += evaluate_composite(rule, now=now, events=events, samples=samples, kpis=kpis, since=since,
                                           jobs_on_node=jobs_on_node, since_job=since_job)
    return findings


def normalise(row: Mapping) -> dict:
    d = {k: row[k] for k in row.keys()} if hasattr(row, "keys") else dict(row)
    for key, empty in (("fields", {}), ("labels", {}), ("payload", {}), ("job_ids", [])):
        if key in d and isinstance(d[key], str):
            try:
                d[key] = json.loads(d[key])
            except json.JSONDecodeError:
                d[key] = empty
    return d


# ---------- discrete events ----------

def _log_hit(m: LogMatch, e: dict) -> bool:
    if e.get("source") not in ([m.source] if isinstance(m.source, str) else m.source):
        return False
    if m.kinds and not any(fnmatch.fnmatchcase(str(e.get("kind", "")), k) for k in m.kinds):
        return False
    fields = e.get("fields") or {}
    for key, accepted in m.fields.items():
        if key not in fields or not _value_in(fields[key], accepted):
            return False
    return not m.message or re.search(m.message, str(e.get("message", ""))) is not None


def _health_hit(m: HealthMatch, e: dict) -> bool:
    if e.get("source") != "health" or str(e.get("severity")) not in m.statuses:
        return False
    if m.checks and not any(fnmatch.fnmatchcase(str(e.get("kind", "")), c) for c in m.checks):
        return False
    fields = e.get("fields") or {}
    if m.categories and fields.get("category") not in m.categories:
        return False
    return not m.suites or fields.get("suite") in m.suites


def _value_in(value, accepted: list) -> bool:
    """Numbers compare as numbers ('79' from a regex group equals 79 in a rule)."""
    for a in accepted:
        if value == a or str(value) == str(a):
            return True
        try:
            if float(value) == float(a):
                return True
        except (TypeError, ValueError):
            pass
    return False


def _grouped(rule: Rule, hits: list[dict], count: int, jobs_on_node: Mapping[str, list[int]],
             since_job: Mapping[int, float]) -> list[Finding]:
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for e in hits:
        if rule.scope == "node":
            groups[(e["node"], None)].append(e)
        else:
            jobs = e.get("job_ids") or (e.get("fields") or {}).get("job_ids") or jobs_on_node.get(e["node"], [])
            for job in jobs:  # the job is the target wherever its ranks ran
                if e["ts"] > since_job.get(int(job), 0.0):
                    groups[(None, int(job))].append(e)
    out = []
    for (node, job), rows in groups.items():
        if len(rows) < count:
            continue
        rows.sort(key=lambda r: r["ts"])
        out.append(_finding(rule, node, job, rows[0]["ts"], rows[-1]["ts"],
                            {"events": [_event_evidence(r) for r in rows[-MAX_EVIDENCE_ROWS:]], "count": len(rows),
                             "nodes": sorted({r["node"] for r in rows})}))
    return out


def _event_evidence(e: dict) -> dict:
    return clean({k: e.get(k) for k in ("id", "node", "ts", "source", "kind", "severity", "message", "fields")})


# ---------- numeric conditions ----------

def aggregate(values: list[float], agg: str) -> float:
    """values in time order."""
    if agg == "count":
        return float(len(values))
    if agg == "last":
        return values[-1]
    if agg == "min":
        return min(values)
    if agg == "max":
        return max(values)
    if agg == "mean":
        return sum(values) / len(values)
    if agg == "delta":
        return values[-1] - values[0]
    if agg == "range":
        return max(values) - min(values)
    raise ValueError(f"unknown aggregate {agg!r}")


def _metric(rule: Rule, m: MetricMatch, samples: list[dict]) -> list[Finding]:
    series: dict[tuple, list[dict]] = defaultdict(list)
    for s in samples:
        if s.get("metric") != m.metric or s.get("value") is None:
            continue
        labels = s.get("labels") or {}
        if any(str(labels.get(k)) != str(v) for k, v in m.labels.items()):
            continue
        series[(s["node"], json.dumps(labels, sort_keys=True))].append(s)
    per_node: dict[str, list[dict]] = defaultdict(list)
    for (node, labels), rows in series.items():
        if len(rows) < m.min_samples:
            continue
        rows.sort(key=lambda r: r["ts"])
        value = aggregate([float(r["value"]) for r in rows], m.agg)
        if OPS[m.op](value, m.value):
            per_node[node].append({"labels": json.loads(labels), "agg": m.agg, "value": value,
                                   "first_ts": rows[0]["ts"], "last_ts": rows[-1]["ts"], "samples": len(rows)})
    return [_finding(rule, node, None, min(h["first_ts"] for h in hits), max(h["last_ts"] for h in hits),
                     {"metric": m.metric, "condition": f"{m.agg} {m.op} {m.value}", "series": clean(hits)})
            for node, hits in per_node.items()]


def _kpi(rule: Rule, m: KpiMatch, kpis: list[dict]) -> list[Finding]:
    per_job: dict[int, list[dict]] = defaultdict(list)
    for k in kpis:
        payload = k.get("payload") or {}
        raw = k.get(m.field)
        if raw is None:  # ingest keeps NaN/Inf out of REAL columns: payload {"nonfinite": {"loss": "nan"}}
            raw = payload.get(m.field, (payload.get("nonfinite") or {}).get(m.field))
        v = _as_float(raw)
        if v is not None:
            per_job[int(k["job_id"])].append({**k, "_v": v})
    out = []
    for job, rows in per_job.items():
        rows.sort(key=lambda r: r["ts"])
        if m.nonfinite:
            bad = [r for r in rows if not math.isfinite(r["_v"])]
            if not bad:
                continue
            evidence = {"kpis": [clean({"ts": r["ts"], "rank": r.get("rank"), "node": r.get("node"),
                                        "step": r.get("step"), m.field: r["_v"]}) for r in bad[-MAX_EVIDENCE_ROWS:]]}
            nodes = sorted({r.get("node") for r in bad if r.get("node")})
            out.append(_finding(rule, None, job, bad[0]["ts"], bad[-1]["ts"], {**evidence, "nodes": nodes}))
            continue
        finite = [r for r in rows if math.isfinite(r["_v"])]
        if not finite:
            continue
        value = aggregate([r["_v"] for r in finite], m.agg)
        if OPS[m.op](value, m.value):
            out.append(_finding(rule, None, job, finite[0]["ts"], finite[-1]["ts"],
                                {"kpi": m.field, "condition": f"{m.agg} {m.op} {m.value}", "value": value}))
    return out


def _as_float(v) -> float | None:
    if v is None or isinstance(v, bool):
        return None
    try:
        return float(v)  # accepts 'nan', 'inf' strings from JSON payloads
    except (TypeError, ValueError):
        return None


def _finding(rule: Rule, node: str | None, job: int | None, first: float, last: float, evidence: dict) -> Finding:
    return Finding(rule_id=rule.id, rule_version=rule.version, source="rule", scope=rule.scope,
                   severity=rule.severity, action=rule.action, summary=rule.short_text, first_ts=first,
                   last_ts=last, node=node, job_id=job, category=rule.category, requeue_jobs=rule.requeue_jobs,
                   shadow=rule.shadow, evidence=evidence)
