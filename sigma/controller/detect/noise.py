"""Noise attribution (pure: rows in, verdicts out): why a job's step times jitter, per rank.

A synchronous job runs at the pace of its slowest rank, so every local pause on one rank costs all of them
(the Sigma paper's lazy page-cache reclaim and unsynchronised Python GC). For each rank, the slow steps (step time
above the rank's median by more than `slow_fraction`) carry an excess over that median; the excess is explained,
step by step, by:

- the rank's own counters on its KPI lines (sigma.train.noise): `gc_s` (GC pauses), `io_wait_s` (blocked on block
  I/O, where delay accounting is on), `blocked_s` (the training thread off the CPU, less its collective wait
  `wait_s`: reading data behind a busy disk), `cpu_wait_s` (runnable but no CPU: another process had it) — each in
  seconds beyond its mean over the rank's fast steps (CPU wait: beyond the fast steps' wait per second of CPU the
  step used, `cpu_s`, so a step that copies more data on a busy host is not more contention), in that order (time waiting for a CPU inside a
  GC pause is the pause's); but the rest of a step with many major faults (`majflt`) is page-cache reclaim (the
  rank's code or data had been evicted and came back from disk; it blocks the rank, and on a busy host every
  fault's wake-up also waits for a CPU: the faults' cost, not more contention) — unless its node's I/O stalled
  `busy_disk` of the time over the fast steps too: then the faults queued behind other I/O, an I/O stall;
- what is left, from its node's telemetry over exactly the rank's slow steps against its fast ones (any trainer,
  no counters needed): pressure stall time (PSI) of memory (with major faults: page-cache reclaim), CPU, I/O, and
  hardware throttling counters.

The named cause is the one explaining the most excess; `unexplained` when nothing reaches `min_share` of it.
"""

from __future__ import annotations

import json
import statistics
from bisect import bisect_left
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from functools import lru_cache

from sigma.train.kpi import throughput_stability

CAUSES = ("page-cache", "gc", "cpu-contention", "io-stall", "throttling")
FIXES = {
    "page-cache": "drop the page cache before the run (`drop_page_cache: true`; the epilog drops it between jobs) "
                  "and look for what fills it on the node",
    "gc": "synchronised manual GC: `gc_manual: true` with `gc_every` N (every rank collects at the same step)",
    "cpu-contention": "move or stop the other processes named, or give the job whole nodes (`--exclusive`)",
    "io-stall": "find what saturates the node's disk (checkpoint writers, other jobs' I/O) or stage data locally",
    "throttling": "the hardware slowed its clocks (thermal or power): check cooling and power capping on the node",
}
TIME_SIGNALS = (("gc_s", "gc"), ("io_wait_s", "io-stall"), ("blocked_s", "io-stall"),
                ("cpu_wait_s", "cpu-contention"))
# node counters (cumulative) compared over a rank's slow steps against its fast steps: metric -> cause
NODE_COUNTERS = {"host.pressure.memory.some.total_us": "page-cache", "host.pressure.cpu.some.total_us":
                 "cpu-contention", "host.pressure.io.some.total_us": "io-stall",
                 "host.vmstat.pgmajfault": "page-cache", "host.cpu.throttle_count": "throttling"}
NODE_METRICS = tuple(NODE_COUNTERS) + ("host.proc.cpu_pct", "gpu.throttle_reasons")
# NVML clock-throttle reason bits that are the hardware protecting itself, not idling or an applications clock
NVML_SLOWDOWN_BITS = 0x4 | 0x8 | 0x20 | 0x40 | 0x80  # sw power cap, hw slowdown, sw thermal, hw thermal, hw brake


@dataclass
class NoiseConfig:
    slow_fraction: float = 0.25  # a step slower than the rank's median by more than this is a slow step
    min_jitter: float = 0.05  # excess below this share of the rank's total step time: steady, nothing to explain
    min_share: float = 0.2  # a cause must explain at least this share of the excess to be named
    majflt_min: int = 8  # major faults in a step that count as elevated (and above 4x the rank's median)
    node_ratio: float = 2.0  # a node counter's rate over slow steps must exceed this x its rate over fast steps
    busy_disk: float = 0.1  # node I/O stall share (PSI) over the fast steps too: faults queued behind other I/O
    top_processes: int = 3  # other processes listed as CPU-contention evidence


@dataclass
class RankNoise:
    rank: int
    node: str
    steps: int
    median_step_s: float
    slow_steps: int
    excess_s: float  # time the slow steps took beyond the median
    jitter: float  # excess / total step time
    cause: str  # one of CAUSES, "steady" or "unexplained"
    explained: dict[str, float] = field(default_factory=dict)  # cause -> seconds of excess it explains
    evidence: list[str] = field(default_factory=list)
    stability: dict | None = None


@dataclass
class JobNoise:
    job_id: int
    stability: dict | None  # of the job's step throughput (the slowest rank at each step)
    ranks: list[RankNoise]

    def causes(self) -> dict[str, list[int]]:
        """cause -> ranks it was named for (steady ranks left out)."""
        out: dict[str, list[int]] = {}
        for r in self.ranks:
            if r.cause != "steady":
                out.setdefault(r.cause, []).append(r.rank)
        return out

    def to_dict(self) -> dict:
        return {"job_id": self.job_id, "stability": self.stability, "causes": self.causes(),
                "ranks": [asdict(r) for r in self.ranks]}


def kpi_payload(row: Mapping) -> dict:
    """A KPI row's payload as a dict ({} where a rank wrote something else: the rank's own words, never trusted).
    Read-only (copy it to change it): a text payload is parsed once and shared, since the watchdog reads the same
    rows' payloads every tick for as long as they stay in its windows."""
    p = row.get("payload") or {}
    if isinstance(p, str):
        return _parsed(p)
    return p if isinstance(p, dict) else {}


@lru_cache(maxsize=1 << 16)  # the straggler window's rows at 256 nodes: 32 jobs x 64 ranks x 30 s = 61,440
def _parsed(text: str) -> dict:
    try:
        p = json.loads(text)
    except ValueError:
        return {}
    return p if isinstance(p, dict) else {}


def job_stability(kpis: Iterable[Mapping]) -> dict | None:
    """Stability of a job's step throughput: per step, the slowest rank's tokens_per_s (the job's pace)."""
    per_step: dict[int, float] = {}
    for k in kpis:
        tps, step = k.get("tokens_per_s"), k.get("step")
        if step is None or tps is None or tps <= 0:
            continue
        per_step[step] = min(per_step.get(step, tps), tps)
    return throughput_stability(per_step.values())


class Counter:
    """A cumulative counter series of one node, read at any time by linear interpolation."""

    def __init__(self, points: list[tuple[float, float]]):
        points = sorted(points)
        self.ts = [t for t, _ in points]
        self.vs = [v for _, v in points]

    def at(self, t: float) -> float | None:
        ts, vs = self.ts, self.vs
        if len(ts) < 2 or t < ts[0] or t > ts[-1]:
            return None
        i = bisect_left(ts, t)
        if ts[i] == t:
            return vs[i]
        t0, t1, v0, v1 = ts[i - 1], ts[i], vs[i - 1], vs[i]
        return v0 + (v1 - v0) * (t - t0) / (t1 - t0)

    def rate(self, spans: list[tuple[float, float]]) -> float | None:
        """Counter increase per second over the spans it covers (None where it covers none)."""
        inc = dur = 0.0
        for a, b in spans:
            va, vb = self.at(a), self.at(b)
            if va is None or vb is None or b <= a:
                continue
            inc, dur = inc + max(0.0, vb - va), dur + (b - a)
        return inc / dur if dur > 0 else None


def attribute(job_id: int, kpis: Iterable[Mapping], node_samples: Iterable[Mapping] = (),
              cfg: NoiseConfig | None = None) -> JobNoise:
    """kpis: the job's metric rows (node, ts, rank, step, step_time_s, tokens_per_s, payload);
    node_samples: rows (node, ts, metric, value, labels) of NODE_METRICS on the job's nodes over the same time."""
    cfg = cfg or NoiseConfig()
    kpis = [dict(k) for k in kpis if k.get("step") is not None]
    by_rank: dict[int, dict[int, dict]] = {}
    for k in sorted(kpis, key=lambda r: r["ts"]):
        if k.get("step_time_s") and k["step_time_s"] > 0:
            by_rank.setdefault(int(k.get("rank") or 0), {})[k["step"]] = k  # a resumed run's step replaces
    counters: dict[tuple[str, str, str], list] = {}  # (node, metric, labels) -> [(ts, value)]
    procs: dict[str, list[Mapping]] = {}
    throttle: dict[str, list[tuple[float, int]]] = {}
    for s in node_samples:
        if s["value"] is None:
            continue
        if s["metric"] == "host.proc.cpu_pct":
            procs.setdefault(s["node"], []).append(s)
        elif s["metric"] == "gpu.throttle_reasons":
            throttle.setdefault(s["node"], []).append((s["ts"], int(s["value"])))
        else:
            counters.setdefault((s["node"], s["metric"], s.get("labels") or "{}"), []).append((s["ts"], s["value"]))
    series = {key: Counter(points) for key, points in counters.items()}
    ranks = [_rank(rank, list(steps.values()), series, procs, throttle, cfg) for rank, steps in sorted(by_rank.items())]
    return JobNoise(job_id, job_stability(kpis), ranks)


def _rank(rank: int, rows: list[dict], series: dict, procs: dict, throttle: dict, cfg: NoiseConfig) -> RankNoise:
    node = rows[-1]["node"]
    times = [r["step_time_s"] for r in rows]
    med = statistics.median(times)
    slow = [r for r in rows if r["step_time_s"] > med * (1 + cfg.slow_fraction)]
    fast = [r for r in rows if r["step_time_s"] <= med * (1 + cfg.slow_fraction)]
    excess = sum(r["step_time_s"] - med for r in slow)
    out = RankNoise(rank, node, len(rows), round(med, 6), len(slow), round(excess, 6),
                    round(excess / sum(times), 4) if sum(times) else 0.0, "steady",
                    stability=throughput_stability(r.get("tokens_per_s") for r in rows))
    if not slow or out.jitter < cfg.min_jitter:
        return out
    payloads = {r["step"]: dict(kpi_payload(r)) for r in rows}  # copies: changed below
    for p in payloads.values():  # waiting in a collective for a slower peer is the peer's noise, not this rank's
        if "blocked_s" in p:
            p["blocked_s"] = max(0.0, float(p["blocked_s"] or 0.0) - float(p.get("wait_s") or 0.0))
    explained = dict.fromkeys(CAUSES, 0.0)
    residual = {}
    # a time signal explains what it took beyond what it takes in a usual (fast) step; waiting for a CPU is judged
    # per second of CPU the step used (`cpu_s`): a step that copies more data on a busy host waits longer at the
    # same contention
    value = lambda r, key: float(payloads[r["step"]].get(key) or 0.0)
    typical = {key: statistics.fmean(value(r, key) for r in fast) if fast else 0.0 for key, _ in TIME_SIGNALS}
    fast_cpu = sum(value(r, "cpu_s") for r in fast)
    wait_per_cpu = sum(value(r, "cpu_wait_s") for r in fast) / fast_cpu if fast_cpu > 0 else None
    mf_typical = statistics.median(float(payloads[r["step"]].get("majflt") or 0) for r in rows)
    for r in slow:
        left = r["step_time_s"] - med
        p = payloads[r["step"]]
        faulted = float(p.get("majflt") or 0) >= max(cfg.majflt_min, 4 * mf_typical)
        for key, cause in TIME_SIGNALS:
            if key in p and left > 0:
                if faulted and key in ("blocked_s", "cpu_wait_s"):
                    break  # a fault storm blocks the rank, and on a busy host each wake-up waits for a CPU
                per_cpu = key == "cpu_wait_s" and wait_per_cpu is not None and "cpu_s" in p
                usual = wait_per_cpu * float(p["cpu_s"] or 0.0) if per_cpu else typical[key]
                part = min(left, max(0.0, float(p[key] or 0.0) - usual))
                explained[cause] += part
                left -= part
        if faulted and left > 0:
            explained["page-cache"] += left
            left = 0.0
        residual[r["step"]] = left
    spans = lambda rs: [(r["ts"] - r["step_time_s"], r["ts"]) for r in rs]
    if explained["page-cache"] > 0:  # faults on a disk busy with other I/O all along: an I/O stall, not reclaim
        busy = sum(c.rate(spans(fast)) or 0.0 for (n, m, _), c in series.items()
                   if n == node and m == "host.pressure.io.some.total_us") * 1e-6
        if busy >= cfg.busy_disk:
            out.evidence.append(f"node {node}: I/O stalled {100 * busy:.0f}% of the time even over fast steps: "
                                f"the faults queued behind other I/O")
            explained["io-stall"] += explained.pop("page-cache")
            explained["page-cache"] = 0.0
    for cause, seconds in explained.items():
        if seconds > 0:
            out.evidence.append(f"{cause}: {seconds:.3f}s of the {excess:.3f}s excess from the rank's own counters")
    # what the rank's counters leave unexplained: its node's telemetry over its slow steps against its fast steps
    left_total = sum(residual.values())
    if left_total > cfg.min_share * excess:
        elevated = {}
        rates: dict[str, list] = {}  # metric -> [rate over slow steps, over fast steps], summed over its labels
        for (n, metric, _), counter in series.items():
            if n != node:
                continue
            hot, cold = counter.rate(spans(slow)), counter.rate(spans(fast))
            if hot is not None:
                acc = rates.setdefault(metric, [0.0, 0.0])
                acc[0], acc[1] = acc[0] + hot, acc[1] + (cold or 0.0)
        for metric, (hot, cold) in rates.items():
            if hot <= 0:
                continue
            ratio = hot / cold if cold else float("inf")
            if ratio >= cfg.node_ratio:
                elevated[metric] = (hot, cold, ratio)
                unit = "% of the time stalled" if metric.endswith("total_us") else "/s"
                scale = 1e-4 if metric.endswith("total_us") else 1.0  # us/s -> percent
                out.evidence.append(f"node {node}: {metric} {hot * scale:.3g}{unit} over slow steps vs "
                                    f"{(cold or 0) * scale:.3g} over fast ones")
        hot, cold = (_throttled_share(throttle.get(node, []), spans(rs)) for rs in (slow, fast))
        if hot is not None and hot > 0 and hot >= cfg.node_ratio * (cold or 0.0):
            elevated["gpu.throttle_reasons"] = (1.0, 0.0, float("inf"))
            out.evidence.append(f"node {node}: GPU clocks throttled (thermal or power) during slow steps")
        # strongest node signal per cause (PSI stall share, else the ratio) takes the unexplained rest
        best = None
        for metric, (hot, _, ratio) in elevated.items():
            cause = NODE_COUNTERS.get(metric, "throttling")
            if cause == "page-cache" and metric.startswith("host.pressure.memory") \
                    and "host.vmstat.pgmajfault" not in elevated:
                continue  # memory stalls without major faults: reclaim of anonymous memory, not page cache
            weight = hot * 1e-6 if metric.endswith("total_us") else min(ratio, 10.0) / 10.0
            if best is None or weight > best[0]:
                best = (weight, cause)
        if best is not None:
            explained[best[1]] += left_total
    procs_here = procs.get(node, [])
    if procs_here:
        top: dict[str, float] = {}
        for s in procs_here:
            labels = json.loads(s["labels"]) if isinstance(s.get("labels"), str) else (s.get("labels") or {})
            name = f"{labels.get('comm', '?')}[{labels.get('pid', '?')}]"
            top[name] = max(top.get(name, 0.0), s["value"])
        ranked = sorted(top.items(), key=lambda kv: -kv[1])[:cfg.top_processes]
        out.evidence.append(f"node {node}: busiest other processes: "
                            + ", ".join(f"{n} {v:.0f}% CPU" for n, v in ranked))
    out.explained = {c: round(s, 6) for c, s in explained.items() if s > 0}
    cause, seconds = max(explained.items(), key=lambda kv: kv[1])
    out.cause = cause if seconds >= cfg.min_share * excess else "unexplained"
    return out


def _throttled_share(points: list[tuple[float, int]], spans: list[tuple[float, float]]) -> float | None:
    """Share of the throttle-reason samples taken within the spans that show the hardware slowing down."""
    spans = sorted(spans)
    starts = [a for a, _ in spans]
    inside = []
    for t, v in points:
        i = bisect_left(starts, t) - 1  # the last span starting before t (steps do not overlap)
        if i >= 0 and t <= spans[i][1]:
            inside.append(v)
    return sum(1 for v in inside if v & NVML_SLOWDOWN_BITS) / len(inside) if inside else None
