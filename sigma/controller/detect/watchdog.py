"""Job watchdog over KPIs (pure: rows in, findings out).

- hang: the job's highest step has not advanced for hang_timeout_s (NCCL would sit for 30 minutes);
- throughput drop: recent throughput below (1 - drop_fraction) x the job's own earlier throughput, or below the
  history of jobs with the same model config;
- straggler: the job may not be measurably slower (on a busy host its throughput swings more than a 30 % straggler
  costs it), but its ranks say that every other node waits for one node whose ranks are held off the CPU outside
  collectives (laggard.py): isolation names that node;
- throughput jitter: no drop, but the job's step throughput over jitter_window_s is unstable (its coefficient of
  variation above jitter_cv): a local noise source (page-cache reclaim, GC, another process) that `sigma noise`
  attributes per rank;
- crash loop: the job (re)started crash_loop_restarts times within the window.
NaN/Inf loss is a knowledge-base rule (configs/rules/job.yaml).

The checks read a job's rows through a view: RowsView computes everything from the rows (the reference), the
controller's KpiWindow keeps the long-window parts (the highest step, the earlier throughput) as running state fed
with each tick's new rows (kpiwindow.py), so a tick costs what arrived since the last one, not the job's history.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from sigma.controller.config import WatchdogConfig
from sigma.controller.detect.laggard import STEADY_S
from sigma.controller.detect.laggard import WINDOW_S as LAGGARD_WINDOW_S
from sigma.controller.detect.laggard import held_shares, waited_for_node
from sigma.controller.detect.noise import job_stability
from sigma.findings import Finding


@dataclass(frozen=True)
class JobInfo:
    job_id: int
    nodes: tuple[str, ...]
    start_time: float  # start of the current run (after the last requeue)
    name: str = ""
    restarts: int = 0


@dataclass
class JobProgress:
    job_id: int
    max_step: int | None
    progress_ts: float | None  # when the highest step was first reported
    last_ts: float | None
    ranks: dict[int, dict]  # rank -> {"node", "step", "ts"}

    def laggards(self) -> dict[str, list[int]]:
        """Nodes whose ranks are behind the job's highest step (the ones a synchronous job waits for)."""
        out: dict[str, list[int]] = defaultdict(list)
        for rank, r in self.ranks.items():
            if self.max_step is not None and r["step"] is not None and r["step"] < self.max_step:
                out[r["node"]].append(rank)
        return dict(out)


def progress(job_id: int, kpis: Iterable[Mapping]) -> JobProgress:
    ranks: dict[int, dict] = {}
    max_step, progress_ts, last_ts = None, None, None
    for k in sorted(kpis, key=lambda r: r["ts"]):
        step = k.get("step")
        last_ts = k["ts"]
        ranks.setdefault(int(k.get("rank") or 0), {"node": k["node"], "step": None, "ts": None})
        r = ranks[int(k.get("rank") or 0)]
        r["ts"], r["node"] = k["ts"], k["node"]
        if step is None:
            continue
        r["step"] = step if r["step"] is None else max(r["step"], step)
        if max_step is None or step > max_step:
            max_step, progress_ts = step, k["ts"]
    return JobProgress(job_id, max_step, progress_ts, last_ts, ranks)


def rate(r: Mapping) -> tuple[float, float] | None:
    """A row's (throughput, seconds it lasted): tokens_per_s, else 1/step_time_s; weighted by step_time_s."""
    step_time = r.get("step_time_s")
    step_time = float(step_time) if step_time is not None and step_time > 0 else None
    if r.get("tokens_per_s") is not None and r["tokens_per_s"] > 0:
        return float(r["tokens_per_s"]), step_time or 1.0
    if step_time:
        return 1.0 / step_time, step_time
    return None


def rates(rows: Iterable[Mapping]) -> list[tuple[float, float]]:
    """Per-row (throughput, seconds it lasted) of the rows that carry one."""
    return [p for p in map(rate, rows) if p is not None]


def throughput(rows: Iterable[Mapping]) -> float | None:
    """The throughput the job delivered: work done over the time it took (the mean rate weighted by each row's
    step time, i.e. tokens / seconds, or steps / seconds). A straggler stopped 30 % of every second alternates a
    few long steps with many fast ones; its long steps fill less than half of the time, so a median (over rows or
    over time) sees the fast steps and misses the 30 % the job loses. Sums are exact (fsum): the same in any order,
    so running sums kept as rows come and go give the same value."""
    return weighted_mean(rates(rows))


def weighted_mean(points: list[tuple[float, float]]) -> float | None:
    total = math.fsum(w for _, w in points)
    return math.fsum(v * w for v, w in points) / total if total > 0 else None


def typical_throughput(rows: Iterable[Mapping]) -> float | None:
    """The rate the job ran at for most of the time: the median over time. A restart's slow first steps do not
    move it, so it judges whether a job that moved nodes runs as fast as before (throughput() would still be
    dragged down by them)."""
    points = sorted(rates(rows))
    half, seen = sum(w for _, w in points) / 2, 0.0
    for value, weight in points:
        seen += weight
        if seen >= half:
            return value
    return points[-1][0] if points else None


class RowsView:
    """A job's rows of its current run, everything computed from them on each call (the reference the controller's
    running state must equal: kpiwindow.KpiView)."""

    def __init__(self, rows: list[Mapping]):
        self.rows = rows

    def since(self, t: float) -> list[Mapping]:
        """The rows with ts >= t, in their order."""
        return [k for k in self.rows if k["ts"] >= t]

    def last(self, n: int) -> list[Mapping]:
        return self.rows[-n:]

    def head(self) -> tuple[int | None, float | None]:
        """(the highest step, when it was first reported)."""
        prog = progress(0, self.rows)
        return prog.max_step, prog.progress_ts

    def progress(self, job_id: int) -> JobProgress:
        return progress(job_id, self.rows)

    def earlier(self, lo: float, hi: float) -> tuple[int, float | None]:
        """(rows with a rate, their throughput) of the rows with lo <= ts < hi."""
        rows = [k for k in self.rows if lo <= k["ts"] < hi]
        return len(rates(rows)), throughput(rows)

    def first_step_ts(self) -> float | None:
        return min((k["ts"] for k in self.rows if k.get("step") is not None), default=None)


def check_job(job: JobInfo, kpis: list[Mapping], now: float, cfg: WatchdogConfig, *, ever_reported: bool,
              history_median: float | None = None, start_times: Iterable[float] = (),
              pause: tuple[float, float] | None = None) -> list[Finding]:
    """kpis: this job's rows since (at least) baseline_window_s + recent_window_s ago."""
    return judge(job, RowsView([k for k in kpis if k["ts"] >= job.start_time]), now, cfg,
                 ever_reported=ever_reported, history_median=history_median, start_times=start_times, pause=pause)


def judge(job: JobInfo, current, now: float, cfg: WatchdogConfig, *, ever_reported: bool,
          history_median: float | None = None, start_times: Iterable[float] = (),
          pause: tuple[float, float] | None = None) -> list[Finding]:
    """check_job over a view of the job's rows of its current run (RowsView, or the controller's KpiView).
    pause: (when the trainer's newest `pause` or `pause_end` event came, until when the pause may last; 0 once
    ended): a legitimate stretch without steps (an evaluation) is no hang until then, and counts as progress."""
    findings: list[Finding] = []
    max_step, progress_ts = current.head()
    base = dict(source="watchdog", scope="job", job_id=job.job_id)
    paused = pause is not None and now < pause[1]
    if pause is not None and progress_ts is not None:
        progress_ts = max(progress_ts, pause[0])
    # hang (none while the trainer said it pauses)
    if not paused and progress_ts is None:
        if ever_reported and now - job.start_time > cfg.startup_grace_s:
            findings.append(Finding(rule_id="watchdog-hang", severity="error", action="requeue",
                                    summary=f"no training step in {now - job.start_time:.0f}s since (re)start",
                                    first_ts=job.start_time, last_ts=now, category="hang",
                                    evidence={"nodes": list(job.nodes), "since_start_s": now - job.start_time},
                                    **base))
    elif not paused and now - progress_ts > cfg.hang_timeout_s:
        prog = current.progress(job.job_id)  # the ranks' evidence, read only for a hang
        findings.append(Finding(rule_id="watchdog-hang", severity="error", action="requeue",
                                summary=f"no step progress for {now - prog.progress_ts:.0f}s (step {prog.max_step})",
                                first_ts=prog.progress_ts, last_ts=now, category="hang",
                                evidence={"nodes": list(job.nodes), "max_step": prog.max_step,
                                          "stalled_s": round(now - prog.progress_ts, 1),
                                          "laggards": prog.laggards(),
                                          "ranks": {str(r): v for r, v in sorted(prog.ranks.items())}}, **base))
    # a hung job's throughput is nil: the hang says it all (and one finding per job keeps isolation's rounds whole)
    if not findings:
        findings += _throughput_findings(job, current, now, cfg, history_median, base)
    if not any(f.rule_id in ("watchdog-hang", "watchdog-throughput-drop") for f in findings):
        findings += _straggler_findings(job, current, now, cfg, base)
    if not findings and cfg.jitter_cv > 0:
        findings += _jitter_findings(job, current, now, cfg, base)
    # crash loop
    starts = sorted(t for t in start_times if now - t <= cfg.crash_loop_window_s)
    if len(starts) >= cfg.crash_loop_restarts:
        findings.append(Finding(rule_id="watchdog-crash-loop", severity="error", action="notify",
                                summary=f"{len(starts)} starts in {cfg.crash_loop_window_s:.0f}s: crash loop; "
                                        f"no more automatic requeues", first_ts=starts[0], last_ts=starts[-1],
                                category="crash-loop", evidence={"starts": starts}, **base))
    return findings


def _steady_window(current, now: float) -> list[Mapping]:
    """laggard.steady_window over a view: the last WINDOW_S of step rows once the run has stepped STEADY_S."""
    first = current.first_step_ts()
    if first is None or first > now - STEADY_S:
        return []
    return [r for r in current.since(now - LAGGARD_WINDOW_S) if r.get("step") is not None]


def _straggler_findings(job: JobInfo, current, now: float, cfg: WatchdogConfig, base: dict) -> list[Finding]:
    """The node every other node waits for, held off the CPU outside collectives (only where the ranks report
    blocked_s: without it a node waited for is judged only beside a throughput drop)."""
    recent = _steady_window(current, now)
    if len(job.nodes) < 2 or len(rates(recent)) < cfg.min_points:
        return []
    held = held_shares(recent)
    if set(held) != set(job.nodes):
        return []
    node, shares = waited_for_node(list(job.nodes), recent)
    if node is None:
        return []
    return [Finding(rule_id="watchdog-straggler", severity="warning", action="notify",
                    summary=f"the job's ranks wait for {node} ({100 * shares[node]:.0f}% of its time waiting, others "
                            f"{100 * min(v for n, v in shares.items() if n != node):.0f}%), held off the CPU "
                            f"{100 * held[node]:.0f}% of its time", first_ts=now - LAGGARD_WINDOW_S, last_ts=now,
                    category="performance",
                    evidence={"nodes": list(job.nodes), "waited_for": node,
                              "wait_shares": {n: round(v, 3) for n, v in sorted(shares.items())},
                              "held_shares": {n: round(v, 3) for n, v in sorted(held.items())}}, **base)]


def _jitter_findings(job: JobInfo, current, now: float, cfg: WatchdogConfig, base: dict) -> list[Finding]:
    window = current.since(now - cfg.jitter_window_s)
    stability = job_stability(window)
    if stability is None or stability["steps"] < 2 * cfg.min_points or stability["cv"] <= cfg.jitter_cv:
        return []
    return [Finding(rule_id="watchdog-throughput-jitter", severity="warning", action="notify",
                    summary=f"step throughput jitters: std {stability['std']:.3g} ({100 * stability['cv']:.0f}% of "
                            f"the mean), min/peak {stability['min_over_peak']:.2f}, mean/peak "
                            f"{stability['mean_over_peak']:.2f} over {stability['steps']} steps; see sigma noise "
                            f"--job {job.job_id}", first_ts=now - cfg.jitter_window_s, last_ts=now, category="noise",
                    evidence={"stability": stability, "nodes": list(job.nodes)}, **base)]


def _throughput_findings(job: JobInfo, current, now: float, cfg: WatchdogConfig,
                         history_median: float | None, base: dict) -> list[Finding]:
    """Throughput drop against the job's own recent past, and against its model config's history."""
    findings = []
    recent = rates(current.since(now - cfg.recent_window_s))
    if len(recent) < cfg.min_points:
        return findings
    recent_tp = weighted_mean(recent)
    points, base_tp = current.earlier(now - cfg.recent_window_s - cfg.baseline_window_s, now - cfg.recent_window_s)
    if points >= cfg.min_points:
        if recent_tp < (1 - cfg.drop_fraction) * base_tp:
            findings.append(Finding(rule_id="watchdog-throughput-drop", severity="warning", action="notify",
                                    summary=f"throughput {recent_tp:.3g} is {100 * (1 - recent_tp / base_tp):.0f}% "
                                            f"below the job's baseline {base_tp:.3g}",
                                    first_ts=now - cfg.recent_window_s, last_ts=now, category="performance",
                                    evidence={"recent": recent_tp, "baseline": base_tp, "nodes": list(job.nodes)},
                                    **base))
    if history_median and recent_tp < (1 - cfg.drop_fraction) * history_median:
        findings.append(Finding(rule_id="watchdog-below-history", severity="warning", action="notify",
                                summary=f"throughput {recent_tp:.3g} below the model config's history "
                                        f"{history_median:.3g}", first_ts=now - cfg.recent_window_s,
                                last_ts=now, category="performance",
                                evidence={"recent": recent_tp, "history": history_median, "nodes": list(job.nodes)},
                                **base))
    return findings
