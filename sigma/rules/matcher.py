"""Evaluate rules over rows (pure: rows in, findings out; no database, no SLURM).

Rows are mappings shaped like the controller tables (events, samples, kpis); `fields`, `labels`, `job_ids` and
`payload` may be JSON text or already decoded. `since` gives, per node, the time it last returned to service:
evidence older than that was already handled and never matches again.

Event rules (log, health) are matched once per event, when it arrives (EventWindows): a rule keeps, per node
(job-scope rules: per node and job list), per-second counts of its matching events in its window and the newest
MAX_EVIDENCE_ROWS of them. A tick then costs the new events times the rules plus one small sum per (rule, node),
however many events one noisy node keeps in the window; evidence is capped, the count stays exact.
"""

from __future__ import annotations

import fnmatch
import heapq
import json
import math
import re
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from sigma.findings import Finding, clean
from sigma.rules.composite import evaluate_composite
from sigma.rules.schema import OPS, HealthMatch, KpiMatch, LogMatch, MetricMatch, Rule

MAX_EVIDENCE_ROWS = 20

OnError = Callable[[Rule, Exception], None]


def evaluate(rules: Iterable[Rule], *, now: float, events: Iterable[Mapping] = (), samples: Iterable[Mapping] = (),
             kpis: Iterable[Mapping] = (), since: Mapping[str, float] | None = None,
             jobs_on_node: Mapping[str, list[int]] | None = None,
             since_job: Mapping[int, float] | None = None, on_error: OnError | None = None) -> list[Finding]:
    """since_job: per job, when we last restarted it; job-scope evidence older than that is handled.

    on_error: called with (rule, exception) for a rule that raises, the other rules still evaluated; without it
    the exception propagates."""
    rules, events = [r for r in rules if r.enabled], list(events)
    windows = EventWindows(rules)
    windows.add(events, on_error=on_error)
    findings = windows.findings(now, since=since, jobs_on_node=jobs_on_node, since_job=since_job, on_error=on_error)
    findings += evaluate_series(rules, now=now, samples=samples, kpis=kpis, since=since, since_job=since_job,
                                on_error=on_error)
    return findings + evaluate_composites(rules, now=now, events=events, samples=samples, kpis=kpis, since=since,
                                          jobs_on_node=jobs_on_node, since_job=since_job, on_error=on_error)


def evaluate_series(rules: Iterable[Rule], *, now: float, samples: Iterable[Mapping] = (),
                    kpis: Iterable[Mapping] = (), since: Mapping[str, float] | None = None,
                    since_job: Mapping[int, float] | None = None, on_error: OnError | None = None) -> list[Finding]:
    """The rules over numeric series (metric, kpi): each judged on its window's rows."""
    since = since or {}
    since_job = since_job or {}
    samples = [normalise(s) for s in samples]
    kpis = [normalise(k) for k in kpis]
    findings: list[Finding] = []
    for rule in rules:
        if not rule.enabled or rule.match_kind not in EVALUATORS:
            continue
        lo = now - rule.window_s
        try:
            if rule.metric is not None:
                rows = [r for r in samples if lo <= r["ts"] <= now and r["ts"] > since.get(r.get("node"), 0.0)]
            else:
                rows = [k for k in kpis if lo <= k["ts"] <= now and k["ts"] > since_job.get(int(k["job_id"]), 0.0)]
            findings += EVALUATORS[rule.match_kind](rule, getattr(rule, rule.match_kind), rows)
        except Exception as exc:  # noqa: BLE001 - one broken rule must not stop the others
            if on_error is None:
                raise
            on_error(rule, exc)
    return findings


def evaluate_composites(rules: Iterable[Rule], *, now: float, events: Iterable[Mapping] = (),
                        samples: Iterable[Mapping] = (), kpis: Iterable[Mapping] = (),
                        since: Mapping[str, float] | None = None, jobs_on_node: Mapping[str, list[int]] | None = None,
                        since_job: Mapping[int, float] | None = None, on_error: OnError | None = None
                        ) -> list[Finding]:
    """Composite rules (sigma.rules.composite): each leaf judged on its own window of the rows given."""
    rules = [r for r in rules if r.enabled and r.composite is not None]
    if not rules:
        return []
    data = dict(events=[normalise(e) for e in events], samples=[normalise(s) for s in samples],
                kpis=[normalise(k) for k in kpis], since=since or {}, jobs_on_node=jobs_on_node or {},
                since_job=since_job or {})
    findings: list[Finding] = []
    for rule in rules:
        try:
            findings += evaluate_composite(rule, now=now, **data)
        except Exception as exc:  # noqa: BLE001 - one broken rule must not stop the others
            if on_error is None:
                raise
            on_error(rule, exc)
    return findings


# ---------- discrete events, matched once on arrival ----------

@dataclass
class _Group:
    """One rule's matching events of one node (and job list): per-second [count, first ts, last ts] and the
    newest rows as evidence."""

    buckets: dict[int, list] = field(default_factory=dict)
    newest: list = field(default_factory=list)  # min-heap of (ts, seq, evidence), at most MAX_EVIDENCE_ROWS
    capped: bool = False  # more matching events than evidence rows (counted once on /metrics)

    def add(self, e: dict, seq: int, n: int = 1) -> None:
        ts = float(e["ts"])
        b = self.buckets.get(int(ts))
        if b is None:
            self.buckets[int(ts)] = [n, ts, ts]
        else:
            b[0] += n
            b[1], b[2] = min(b[1], ts), max(b[2], ts)
        item = (ts, seq, e)  # turned into evidence only when reported
        if len(self.newest) < MAX_EVIDENCE_ROWS:
            heapq.heappush(self.newest, item)
        elif item > self.newest[0]:
            heapq.heapreplace(self.newest, item)

    def prune(self, lo: float) -> None:
        for sec in [s for s in self.buckets if s + 1 <= lo]:
            del self.buckets[sec]

    def after(self, lo: float, hi: float, after: float) -> tuple[int, float, float]:
        """(count, first ts, last ts) of the events in [lo, hi] newer than `after`. A second that straddles `after`
        counts whole (its last event is new); the evidence rows are filtered exactly."""
        n, first, last = 0, math.inf, -math.inf
        for count, t0, t1 in self.buckets.values():
            if t1 <= after or t1 < lo or t0 > hi:
                continue
            n += count
            first, last = min(first, t0 if t0 > after else t1), max(last, min(t1, hi))
        return n, first, last

    def evidence(self, lo: float, hi: float, after: float) -> list[dict]:
        return [_event_evidence(e) for ts, _, e in sorted(self.newest) if lo <= ts <= hi and ts > after]


class EventWindows:
    """Event rules' windows, fed incrementally (`add` the new rows each tick, `findings` for the verdicts)."""

    def __init__(self, rules: Iterable[Rule]):
        self.rules = [r for r in rules if r.enabled and r.match_kind in EVENT_MATCHERS]
        self.groups: dict[str, dict[tuple, _Group]] = {r.id: {} for r in self.rules}
        self._compiled: list[tuple[Rule, Callable[[dict], bool], dict]] = []
        for r in self.rules:
            self._compiled.append((r, EVENT_MATCHERS[r.match_kind](getattr(r, r.match_kind)), self.groups[r.id]))
        self.capped: Counter = Counter()  # rule id -> (rule, node) groups whose evidence was capped
        self.newly_capped: list[tuple[str, str, int]] = []  # (rule id, node, count) since the caller last looked
        self._seq = 0
        self._by_kind: dict[tuple, list] = {}  # (source, kind) -> the rules that can match such an event

    def remove(self, rule_id: str) -> None:
        self.rules = [r for r in self.rules if r.id != rule_id]
        self._compiled = [c for c in self._compiled if c[0].id != rule_id]
        self._by_kind = {}
        self.groups.pop(rule_id, None)

    def _candidates(self, source, kind) -> list:
        key = (source, kind)
        found = self._by_kind.get(key)
        if found is None:
            found = self._by_kind[key] = [c for c in self._compiled
                                          if getattr(c[1], "prefilter", None) is None or c[1].prefilter(*key)]
        return found

    def adopt(self, old: "EventWindows", incomplete: Iterable[str] = ()) -> list[Rule]:
        """Keep what `old` counted for every rule that did not change (a reload); the rules that are new or changed,
        or whose windows `old` had not finished reading (incomplete), must be read again and are returned."""
        before = {r.id: r for r in old.rules}
        incomplete = set(incomplete)
        fresh = []
        for r in self.rules:
            if before.get(r.id) == r and r.id not in incomplete:
                self.groups[r.id].update(old.groups[r.id])
                self.capped[r.id] = old.capped.get(r.id, 0)
            else:
                fresh.append(r)
        self._seq = old._seq
        return fresh

    def add(self, events: Iterable[Mapping], on_error: OnError | None = None,
            only: Iterable[str] | None = None) -> None:
        """only: rule ids to feed (reading a new rule's window after a reload); default every rule."""
        only = None if only is None else set(only)
        for row in events:
            candidates = self._candidates(row["source"], row["kind"])
            if only is not None:
                candidates = [c for c in candidates if c[0].id in only]
            self._seq += 1
            if not candidates:
                continue
            e = normalise(row)
            for rule, hit, groups in candidates:
                try:
                    if not hit(e):
                        continue
                    jobs = () if rule.scope == "node" else tuple(
                        int(j) for j in (e.get("job_ids") or (e.get("fields") or {}).get("job_ids") or ()))
                    group = groups.get((e["node"], jobs))
                    if group is None:
                        group = groups[(e["node"], jobs)] = _Group()
                    group.add(e, self._seq, _weight(rule, e))
                except Exception as exc:  # noqa: BLE001 - one broken rule must not stop the others
                    if on_error is None:
                        raise
                    self.remove(rule.id)
                    on_error(rule, exc)

    def findings(self, now: float, *, since: Mapping[str, float] | None = None,
                 jobs_on_node: Mapping[str, list[int]] | None = None, since_job: Mapping[int, float] | None = None,
                 on_error: OnError | None = None) -> list[Finding]:
        since, since_job, jobs_on_node = since or {}, since_job or {}, jobs_on_node or {}
        out: list[Finding] = []
        for rule in list(self.rules):
            if not self.groups.get(rule.id):
                continue  # nothing in its window: nothing to find (most rules on most ticks)
            try:
                out += self._rule_findings(rule, now, since, jobs_on_node, since_job)
            except Exception as exc:  # noqa: BLE001
                if on_error is None:
                    raise
                self.remove(rule.id)
                on_error(rule, exc)
        return out

    def _rule_findings(self, rule: Rule, now: float, since, jobs_on_node, since_job) -> list[Finding]:
        lo = now - rule.window_s
        count = getattr(rule, rule.match_kind).count
        groups = self.groups[rule.id]
        for key, g in list(groups.items()):
            g.prune(lo)
            if not g.buckets:
                del groups[key]
        # target (node, None) or (None, job) -> parts [(node, group, only events newer than this)]
        targets: dict[tuple, list[tuple[str, _Group, float]]] = defaultdict(list)
        for (node, jobs), g in groups.items():
            after = since.get(node, 0.0)
            if rule.scope == "node":
                targets[(node, None)].append((node, g, after))
            else:
                for job in jobs or jobs_on_node.get(node, []):  # the job is the target wherever its ranks ran
                    targets[(None, int(job))].append((node, g, max(after, since_job.get(int(job), 0.0))))
        out = []
        for (node, job), parts in targets.items():
            stats = [(n, g, g.after(lo, now, after)) for n, g, after in parts]
            total = sum(st[0] for _, _, st in stats)
            if total < count:
                continue
            rows = sorted((ev for _, g, after in parts for ev in g.evidence(lo, now, after)), key=lambda r: r["ts"])
            rows = rows[-MAX_EVIDENCE_ROWS:]
            for n, g, st in stats:
                if st[0] > MAX_EVIDENCE_ROWS and not g.capped:
                    g.capped = True
                    self.capped[rule.id] += 1
                    self.newly_capped.append((rule.id, n, st[0]))
            hit = [(n, st) for n, _, st in stats if st[0]]
            out.append(_finding(rule, node, job, min(st[1] for _, st in hit), max(st[2] for _, st in hit),
                                {"events": rows, "count": total, "nodes": sorted({n for n, _ in hit}),
                                 **({"evidence_capped": True} if total > len(rows) else {})}))
        return out


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

def _globs(patterns: list[str]):
    """One compiled regex for a list of glob patterns (fnmatch semantics, case-sensitive); None = any."""
    return re.compile("|".join(fnmatch.translate(p) for p in patterns)).match if patterns else None


def log_matcher(m: LogMatch) -> Callable[[dict], bool]:
    """A predicate on one events row, compiled once per rule (it runs for every arriving event)."""
    sources = frozenset([m.source] if isinstance(m.source, str) else m.source)
    kind_ok = _globs(m.kinds)
    fields = list(m.fields.items())
    message = re.compile(m.message).search if m.message else None
    uptime = m.min_uptime_s is not None or m.max_uptime_s is not None

    def hit(e: dict) -> bool:
        if e.get("source") not in sources:
            return False
        if kind_ok and not kind_ok(str(e.get("kind", ""))):
            return False
        if fields:
            have = e.get("fields") or {}
            for key, accepted in fields:
                if key not in have or not _value_in(have[key], accepted):
                    return False
        if uptime and not _uptime_in(e, m.min_uptime_s, m.max_uptime_s):
            return False
        return message is None or message(str(e.get("message", ""))) is not None
    hit.prefilter = lambda source, kind: source in sources and (kind_ok is None or bool(kind_ok(str(kind))))
    return hit


def health_matcher(m: HealthMatch) -> Callable[[dict], bool]:
    statuses = frozenset(m.statuses)
    check_ok = _globs(m.checks)

    def hit(e: dict) -> bool:
        if e.get("source") != "health" or str(e.get("severity")) not in statuses:
            return False
        if check_ok and not check_ok(str(e.get("kind", ""))):
            return False
        have = e.get("fields") or {}
        if m.categories and have.get("category") not in m.categories:
            return False
        return not m.suites or have.get("suite") in m.suites
    hit.prefilter = lambda source, kind: source == "health" and (check_ok is None or bool(check_ok(str(kind))))
    return hit


def _uptime_in(e: dict, lo: float | None, hi: float | None) -> bool:
    """Whether the event falls in [lo, hi) seconds after its node booted; an unknown uptime is after any lower bound
    (the line counts as it always did) and never within an upper one."""
    up = (e.get("fields") or {}).get("uptime_s")
    try:
        up = float(up) if up is not None else None
    except (TypeError, ValueError):
        up = None
    if up is None:
        return hi is None
    return (lo is None or up >= lo) and (hi is None or up < hi)


def _weight(rule: Rule, e: dict) -> int:
    """How many occurrences the event stands for in the rule's count (LogMatch.weight), at least 1."""
    key = getattr(getattr(rule, rule.match_kind), "weight", "")
    if not key:
        return 1
    try:
        return max(1, int((e.get("fields") or {}).get(key, 1)))
    except (TypeError, ValueError):
        return 1


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


@dataclass
class SeriesStats:
    """What every metric aggregate needs of one series' window, however many samples it holds: mergeable, so a
    caller can keep it per time bucket and combine buckets (sigma.controller.detect.series)."""

    n: int
    first_ts: float
    first: float
    last_ts: float
    last: float
    vmin: float
    vmax: float
    vsum: float

    @classmethod
    def of(cls, ts: float, value: float) -> "SeriesStats":
        return cls(1, ts, value, ts, value, value, value, value)

    def add(self, ts: float, value: float) -> None:
        self.n += 1
        self.vsum += value
        self.vmin = min(self.vmin, value)
        self.vmax = max(self.vmax, value)
        if ts < self.first_ts:
            self.first_ts, self.first = ts, value
        if ts >= self.last_ts:
            self.last_ts, self.last = ts, value

    def merge(self, other: "SeriesStats") -> None:
        self.n += other.n
        self.vsum += other.vsum
        self.vmin = min(self.vmin, other.vmin)
        self.vmax = max(self.vmax, other.vmax)
        if other.first_ts < self.first_ts:
            self.first_ts, self.first = other.first_ts, other.first
        if other.last_ts >= self.last_ts:
            self.last_ts, self.last = other.last_ts, other.last

    def aggregate(self, agg: str) -> float:
        """aggregate() of the series' values in time order."""
        if agg == "delta":
            return self.last - self.first
        if agg == "max":
            return self.vmax
        if agg == "range":
            return self.vmax - self.vmin
        if agg == "min":
            return self.vmin
        if agg == "last":
            return self.last
        if agg == "mean":
            return self.vsum / self.n
        if agg == "count":
            return float(self.n)
        raise ValueError(f"unknown aggregate {agg!r}")


def _metric(rule: Rule, m: MetricMatch, samples: list[dict]) -> list[Finding]:
    series: dict[tuple, SeriesStats] = {}
    for s in samples:
        if s.get("metric") != m.metric or s.get("value") is None:
            continue
        key = (s["node"], json.dumps(s.get("labels") or {}, sort_keys=True))
        st = series.get(key)
        if st is None:
            series[key] = SeriesStats.of(s["ts"], float(s["value"]))
        else:
            st.add(s["ts"], float(s["value"]))
    return metric_findings(rule, m, series)


def metric_findings(rule: Rule, m: MetricMatch, series: Mapping[tuple[str, str], SeriesStats]) -> list[Finding]:
    """A metric rule judged on its window's series: {(node, labels JSON): stats of the samples in the window}."""
    per_node: dict[str, list[dict]] = defaultdict(list)
    for (node, labels_json), st in series.items():
        if st.n < m.min_samples:
            continue
        value = st.aggregate(m.agg)
        if not OPS[m.op](value, m.value):
            continue
        labels = json.loads(labels_json) if isinstance(labels_json, str) else dict(labels_json)
        if all(str(labels.get(k)) == str(v) for k, v in m.labels.items()):
            per_node[node].append({"labels": labels, "agg": m.agg, "value": value,
                                   "first_ts": st.first_ts, "last_ts": st.last_ts, "samples": st.n})
    return [_finding(rule, node, None, min(h["first_ts"] for h in hits), max(h["last_ts"] for h in hits),
                     {"metric": m.metric, "condition": f"{m.agg} {m.op} {m.value}", "series": clean(hits)})
            for node, hits in sorted(per_node.items())]


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


# Condition kinds (sigma.rules.schema.MATCH_KINDS): for events, match settings -> a predicate on one events row
# (compiled once per rule; an optional `prefilter(source, kind)` attribute lets events of other kinds skip it);
# for numeric series, an evaluator (rule, its match settings, window rows) -> findings.
EVENT_MATCHERS: dict[str, Callable[[object], Callable[[dict], bool]]] = {"log": log_matcher,
                                                                          "health": health_matcher}
EVALUATORS: dict[str, Callable[[Rule, object, list[dict]], list[Finding]]] = {"metric": _metric, "kpi": _kpi}


def _finding(rule: Rule, node: str | None, job: int | None, first: float, last: float, evidence: dict) -> Finding:
    return Finding(rule_id=rule.id, rule_version=rule.version, source="rule", scope=rule.scope,
                   severity=rule.severity, action=rule.action, summary=rule.short_text, first_ts=first,
                   last_ts=last, node=node, job_id=job, category=rule.category, requeue_jobs=rule.requeue_jobs,
                   shadow=rule.shadow, evidence=evidence)
