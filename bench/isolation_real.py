"""Isolation on real labelled telemetry it was not tuned on: the controller's engine against simple baselines.

Data (bench/isolation_data.py; read in place, never copied): ASD (the data earlier choices were made on), any data
set in ASD's layout (`--layout DIR`: how a held-out data set is run unchanged), microsoft/cloud-monitoring-dataset
(`--cloud DIR`), the EC2 instances of NAB's realAWSCloudwatch recorded together; and NAB's single series for the
per-node detector.

Protocol, as the controller runs: one data point is one isolation window (a simulated day = 86,400 / window_s
points); each round is scored against the previous history_s / window_s points (the controller's history is its
last hour) and, for the engine, the long-memory histograms (healthy.py) fed round by round through the controller's
teaching rule with the entities not named that round. The engine acts as the controller does: on the same dominant
culprit in `rounds` consecutive rounds, at the threshold its false-drain budget calibrates (budget.py) from the
action statistics of the rounds before (every round feeds them: the bench has no watchdog to say a round was
healthy, and an anomaly that slips in only raises the threshold); before the history supports the budget it acts
on nothing (it would notify). A group's history part is run the same way, unscored, so the engine starts the scored
part with the history the controller would have.

Figures per data set and method: top-1 (the labelled entity acted on during its segment), wrong (another, unlabelled
entity acted on during the segment and the labelled one not), missed; false actions per normal window (no entity
labelled) and per 1,000 node-days of normal windows (the budget's unit); HitRate@100 % of the engine's evidence
(share of a segment's labelled metrics among its top-ranked ones, where it named the labelled entity).

Methods: `engine` (the shipped defaults: peers where they help, own history elsewhere, the calibrated budget),
`engine@6` (the same scores at the fixed floor min_score, no budget), `before` (the engine of BEFORE_REV, min_score
6: the one an independent check found acting on 43 % of normal windows of another fleet), `3-sigma` (per metric,
mean/std of the entity's own history; the largest excursion beyond 3), `today` (the scorer of TODAY_REV),
`cusum` (sequential.py: Page's CUSUM over the engine's rounds of each entity's position in its own long healthy
history of its gap to the peers, at the same calibrated budget, acting in CUSUM_ROUNDS round; groups of 3 or more
entities). Each
baseline is also put at the engine's budget two ways: `(budget)`, the same calibration on its own scores (no
oracle), and at equal false-action budgets, the threshold of a sweep over the scored part that gives its best top-1
within the budget (an oracle choice no calibration gets).

Tuning: `--tune` runs the engine's choices (rounds 1-12, the comparability ratio, the lone-metric weights) on ASD's
history and the first half of its scored part only; every other figure is reported on data those choices did not
see (ASD's second half, every other data set). `--tune-cusum` does the same for the cusum's reference k, its cap
and its rounds.

A data set's groups are the jobs of one cluster: one budget calibration over all of them, the cluster's tail and
each group's own, as the controller's Calibrator keeps them.

usage: python bench/isolation_real.py [--data ../shared/data] [--cloud DIR] [--layout DIR ...] [--only NAME ...]
       [--tune] [--tune-cusum] [--cusum-reference K] [--cusum-cap C] [--cache DIR] [--nab-files 24]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
import types
from dataclasses import dataclass
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

import isolation_data as data  # noqa: E402
from isolation_data import Group  # noqa: E402

from sigma.controller.config import IsolationConfig  # noqa: E402
from sigma.controller.detect import budget, healthy, isolation, sequential  # noqa: E402

ISO = IsolationConfig()
DAY_WINDOWS = 86400 / ISO.window_s
HISTORY = int(ISO.history_s / ISO.window_s)  # rounds of history each round is scored against
OWN = HISTORY  # rounds of the engine's own history (--own-history-s; scores start at HISTORY all the same)
WEIGHTS_EVERY = max(1, int(healthy.WEIGHTS_S / ISO.window_s))  # rounds between recomputing the lone weights
CUSUM_REFERENCE, CUSUM_CAP = sequential.REFERENCE, sequential.CAP  # --cusum-reference, --cusum-cap
CUSUM_ROUNDS = 1  # the cusum acts on one round at its threshold (chosen with --tune-cusum)
CALIBRATE_EVERY = 30  # rounds between recalibrations (the controller recalibrates as its tail grows by 1 %)
TODAY_REV = "d06369c"  # the scorer before noise floors and the per-node score
BEFORE_REV = "79a1320"  # the engine before the calibrated budget (the one the held-out check ran)


def _module(rev: str, name: str) -> types.ModuleType | None:
    try:
        src = subprocess.run(["git", "show", f"{rev}:sigma/controller/detect/isolation.py"], cwd=REPO,
                             capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    mod = types.ModuleType(name)
    sys.modules[name] = mod  # dataclasses look their module up there
    exec(compile(src, f"{rev}:sigma/controller/detect/isolation.py", "exec"), mod.__dict__)
    return mod


# ---------- scoring passes: a group's rounds -> node scores [T, E] (and evidence [T, E, M]) ----------
@dataclass
class Pass:
    name: str
    scores: np.ndarray  # [rounds, entities], every round from HISTORY on (history part included)
    evidence: np.ndarray | None  # [rounds, entities, metrics] what ranks the metrics of a verdict
    threshold: float  # the method's own default
    ms: float  # per round
    positions: np.ndarray | None = None  # [rounds, entities, metrics] the engine's long-memory positions (cusum)


def _series(g: Group) -> np.ndarray:
    return np.concatenate([g.train, g.test], axis=1)


def engine_pass(g: Group, mod=isolation, name: str = "engine", lone: bool = True, ratio: float | None = None,
                k: int = 3, own: int | None = None) -> Pass:
    """The controller's rounds over a group: rolling history, long-memory histograms fed round by round. own: rounds
    of history behind the baseline (default OWN; fewer where the group has not had as many yet), rebuilt every round
    at the shipped hour, every hour (HISTORY rounds) when longer: a median of hours moves little in one."""
    own = OWN if own is None else own
    every = 1 if own <= HISTORY else HISTORY
    x = _series(g)
    E, T, M = x.shape
    ents, series = [f"e{i}" for i in range(E)], [f"m{j}" for j in range(M)]
    sketches = healthy.Sketches()
    scores, evidence = np.zeros((T - HISTORY, E)), np.zeros((T - HISTORY, E, M))
    positions = np.full((T - HISTORY, E, M), np.nan)
    weights = q = None
    if ratio is None and mod is isolation:
        ratio = ISO.comparable_ratio
    t0 = time.perf_counter()
    base = None
    for t in range(HISTORY, T):
        hist, cur = x[:, max(0, t - own):t], x[:, t]
        if base is None or t % every == 0:
            base = mod.baseline(hist) if ratio is None else mod.baseline(hist, ratio)
        if lone and E >= 3 and (weights is None or t % WEIGHTS_EVERY == 0):
            q = sketches.quantiles(ents, series, healthy.POSITION_QS)
            weights = healthy.lone_weights(sketches, ents, series, base.peer_center, base.peer_scale, q=q)
        s = mod.score(ents, cur, base=base, k=k, lone=(lambda b: weights) if lone and weights is not None else None,
                      position=(lambda d: sketches.positions(ents, series, d, q)) if lone and q is not None else None)
        scores[t - HISTORY] = s.total
        evidence[t - HISTORY] = s.evidence if s.evidence is not None else s.metric_z
        if q is not None:  # where the node's gap to its peers lies in its long healthy history (the cusum's input)
            positions[t - HISTORY] = sketches.positions(ents, series, healthy.residuals(cur), q)
        if lone and E >= 3:  # not those named this round (at the floor), through the teaching rule
            sketches.teach(ents, series, healthy.residuals(cur), s.total < ISO.min_score)
    return Pass(name, scores, evidence, ISO.min_score, 1000 * (time.perf_counter() - t0) / (T - HISTORY), positions)


def cusum_pass(engine: Pass, reference: float | None = None, cap: float | None = None) -> Pass:
    """Page's CUSUM (sequential.py) over the engine pass's long-memory positions: the same rounds, the statistic
    accumulated instead of judged round by round; its evidence the positions. Default: --cusum-reference, --cusum-cap
    (the shipped values unless given)."""
    reference = CUSUM_REFERENCE if reference is None else reference
    cap = CUSUM_CAP if cap is None else cap
    t0 = time.perf_counter()
    s = sequential.run(sequential.increments(engine.positions, cap=cap), reference)
    return Pass("cusum", s, np.nan_to_num(engine.positions, nan=0.0), ISO.min_score,
                engine.ms + 1000 * (time.perf_counter() - t0) / max(1, s.shape[0]), engine.positions)


def rounds_of(name: str) -> int:
    """The rounds a method's culprit must hold: the cusum's persistence is in its statistic."""
    return CUSUM_ROUNDS if name == "cusum" else ISO.rounds


def three_sigma_pass(g: Group) -> Pass:
    x = _series(g)
    E, T, M = x.shape
    scores, z_all = np.zeros((T - HISTORY, E)), np.zeros((T - HISTORY, E, M))
    t0 = time.perf_counter()
    for t in range(HISTORY, T):
        hist = x[:, t - HISTORY:t]
        with np.errstate(invalid="ignore", divide="ignore"):
            z = np.abs(x[:, t] - np.nanmean(hist, axis=1)) / np.maximum(np.nanstd(hist, axis=1), 1e-9)
        z_all[t - HISTORY] = np.nan_to_num(z, nan=0.0)
        scores[t - HISTORY] = z_all[t - HISTORY].max(axis=1)
    return Pass("3-sigma", scores, z_all, 3.0, 1000 * (time.perf_counter() - t0) / (T - HISTORY))


def today_pass(g: Group, mod) -> Pass:
    x = _series(g)
    E, T, M = x.shape
    scores, z_all = np.zeros((T - HISTORY, E)), np.zeros((T - HISTORY, E, M))
    t0 = time.perf_counter()
    for t in range(HISTORY, T):
        hist, cur = x[:, t - HISTORY:t], x[:, t]
        stats = mod.history_stats(hist) if E >= 3 else None
        temporal = mod.temporal_z(cur, stats) if stats is not None else None
        z = np.nan_to_num(mod.combine(mod.spatial_z(cur), temporal), nan=0.0, posinf=1e6)
        z_all[t - HISTORY] = z
        scores[t - HISTORY] = mod.top_k_mean(z, 3)
    return Pass("today", scores, z_all, ISO.min_score, 1000 * (time.perf_counter() - t0) / (T - HISTORY))


# ---------- acting: node scores -> the entity acted on each round ----------
def action_stats(scores: np.ndarray, rounds: int) -> np.ndarray:
    """[T, E] the smallest of each entity's last `rounds` scores (NaN before `rounds` rounds)."""
    out = np.full(scores.shape, np.nan)
    for t in range(rounds - 1, scores.shape[0]):
        out[t] = scores[t - rounds + 1:t + 1].min(axis=0)
    return out


def calibrated_thresholds(scores: np.ndarray, rounds: int, per_1000_node_days: float) -> tuple[np.ndarray, list]:
    """[T] the threshold the budget calibrates before each round from every earlier round's action statistics
    (inf where the history does not support it yet), and the calibrations (round, Calibration) along the way."""
    return cluster_thresholds([scores], rounds, per_1000_node_days)[0]


def cluster_thresholds(groups: list[np.ndarray], rounds: int, per_1000_node_days: float) -> list[tuple]:
    """calibrated_thresholds of groups (jobs) that share one cluster, as the controller's Calibrator keeps it: every
    group's rounds feed the cluster's tail and the group's own (its job shape), round by round side by side; a group
    acts at the cluster's threshold, or at its own where that supports the budget and is higher; without the
    cluster's support, nothing acts."""
    stats = [action_stats(s, rounds) for s in groups]
    rate = budget.allowed_rate(per_1000_node_days / 1000, ISO.window_s)
    cluster, own = budget.Tail(), [budget.Tail() for _ in groups]
    outs, trails = [np.full(s.shape[0], np.inf) for s in groups], [[] for _ in groups]
    cals = [budget.calibrate(cluster, rate, ISO.min_score)] * len(groups)
    for t in range(max(s.shape[0] for s in groups)):
        if t % CALIBRATE_EVERY == 0 and t:
            for i, st in enumerate(stats):
                if t <= st.shape[0]:
                    cluster.add(st[t - CALIBRATE_EVERY:t]), own[i].add(st[t - CALIBRATE_EVERY:t])
            whole = budget.calibrate(cluster, rate, ISO.min_score, seed=t)
            for i, st in enumerate(stats):
                if t < st.shape[0]:
                    mine = budget.calibrate(own[i], rate, ISO.min_score, seed=t) if whole.acts else whole
                    cals[i] = mine if mine.acts and mine.threshold > whole.threshold else whole
                    trails[i].append((t, cals[i]))
        for i, out in enumerate(outs):
            if t < out.size:
                out[t] = cals[i].threshold if cals[i].acts else np.inf
    return list(zip(outs, trails))


def acts_of(scores: np.ndarray, threshold, rounds: int = ISO.rounds) -> np.ndarray:
    """[T] the entity acted on at each round (-1: none): the same dominant culprit in `rounds` rounds."""
    names = [str(i) for i in range(scores.shape[1])]
    streaks, acts = isolation.Streaks(), np.full(scores.shape[0], -1)
    th = np.broadcast_to(np.asarray(threshold, float), scores.shape[:1])
    for t in range(scores.shape[0]):
        culprit = isolation.pick_outlier(names, scores[t], th[t], ISO.dominance).culprit if np.isfinite(th[t]) else None
        if streaks.update("job", culprit) >= rounds:
            acts[t] = int(culprit)
    return acts


def hit_rate(z_row: np.ndarray, labelled: list[int], p: float) -> float:
    top = np.argsort(-z_row, kind="stable")[: int(p * len(labelled))]
    return len(set(top.tolist()) & set(labelled)) / len(labelled)


def outcome(g: Group, acts: np.ndarray, lo: int = 0, hi: int | None = None, evidence: np.ndarray | None = None,
            named: np.ndarray | None = None) -> dict:
    """Figures of the scored rounds lo..hi-1 (acts and evidence indexed by scored round)."""
    hi = g.test.shape[1] if hi is None else hi
    normal = g.normal[lo:hi]
    out = {"segments": 0, "top1": 0, "wrong": 0, "missed": 0, "false": int(np.sum((acts[lo:hi] >= 0) & normal)),
           "normal": int(normal.sum()), "node_days": float(normal.sum()) * len(g.names) / DAY_WINDOWS, "hits": []}
    for s in g.segments:
        if not (lo <= s.start and s.end < hi):
            continue
        a = acts[s.start:s.end + 1]
        right = bool(np.any(a == s.entity))
        wrong = any(x >= 0 and not g.labels[x, s.start + i] for i, x in enumerate(a))
        out["segments"] += 1
        out["top1" if right else "wrong" if wrong else "missed"] += 1
        if evidence is not None and named is not None and s.metrics and len(s.metrics) < g.test.shape[2]:
            at = [t for t in range(s.start, s.end + 1) if named[t] == s.entity]
            if at:
                out["hits"].append(np.mean([hit_rate(evidence[t, s.entity], s.metrics, 1.0) for t in at]))
    return out


def total(results: list[dict]) -> dict:
    out = {k: sum(r[k] for r in results) for k in ("segments", "top1", "wrong", "missed", "false", "normal",
                                                   "node_days")}
    out["hits"] = [h for r in results for h in r["hits"]]
    return out


def row(label: str, r: dict, extra: str = "", width: int = 22) -> str:
    n = max(1, r["segments"])
    hr = f"{np.mean(r['hits']):.2f}" if r["hits"] else " n/a"
    return (f"  {label:{width}s} {100 * r['top1'] / n:5.1f}%  {100 * r['wrong'] / n:5.1f}%  {100 * r['missed'] / n:5.1f}%"
            f"  {100 * r['false'] / max(1, r['normal']):7.3f}%  {1000 * r['false'] / max(r['node_days'], 1e-9):9.1f}"
            f"  {hr}{extra}")


HEADER = "  method                 top-1   wrong  missed  false/win  per 1000 node-days  HR@100"


# ---------- a data set ----------
def scored(p: Pass, g: Group) -> np.ndarray:
    """The pass's scores of the scored part (its history part precedes them)."""
    return p.scores[g.train.shape[1] - HISTORY:]


def cached(cache: Path | None, dataset: str, g: Group, method: str, make) -> Pass:
    """A scoring pass, kept in `cache` (keyed by the code of the scorers and the group's data) when given."""
    if cache is None:
        return make()
    import hashlib

    key = hashlib.sha1(b"".join([(REPO / "sigma/controller/detect" / f).read_bytes() for f in (
        "isolation.py", "healthy.py") if method == "engine"] + [dataset.encode(), f"own{OWN}".encode() * (
        method == "engine" and OWN != HISTORY), b"positions" * (method == "engine"), g.name.encode(), method.encode(),
        np.ascontiguousarray(np.nan_to_num(_series(g))).tobytes()])).hexdigest()[:16]
    path = cache / f"{dataset}-{g.name}-{method}-{key}.npz"
    if path.exists():
        z = np.load(path)
        return Pass(method, z["scores"], z["evidence"] if z["evidence"].size else None, float(z["threshold"]),
                    float(z["ms"]), z["positions"] if "positions" in z and z["positions"].size else None)
    p = make()
    cache.mkdir(parents=True, exist_ok=True)
    np.savez(path, scores=p.scores, evidence=p.evidence if p.evidence is not None else np.zeros(0),
             threshold=p.threshold, ms=p.ms, positions=p.positions if p.positions is not None else np.zeros(0))
    return p


def run_dataset(ds: data.DataSet, before, today, budgets_per_window=(0.001,), cache: Path | None = None) -> dict:
    """Every method on every group at its defaults, then at equal budgets; returns the totals per method."""
    print(f"\n{ds.name}: {ds.note}")
    for g in ds.groups:
        print(f"  group {g.name}: {len(g.names)} entities x {g.test.shape[2]} metrics, history {g.train.shape[1]} "
              f"points, {g.test.shape[1]} scored, {len(g.segments)} segments, {int(g.normal.sum())} normal windows")
    per = {}  # method -> list of (group, pass)
    t0 = time.perf_counter()
    for g in ds.groups:
        passes = [cached(cache, ds.name, g, "engine", lambda: engine_pass(g))]
        if passes[0].positions is not None and len(g.names) >= 3:
            passes.append(cusum_pass(passes[0]))
        if before is not None:
            passes.append(cached(cache, ds.name, g, "before", lambda: engine_pass(g, before, "before", own=HISTORY)))
        passes.append(cached(cache, ds.name, g, "3-sigma", lambda: three_sigma_pass(g)))
        if today is not None:
            passes.append(cached(cache, ds.name, g, "today", lambda: today_pass(g, today)))
        for p in passes:
            per.setdefault(p.name, []).append((g, p))
    print(f"  (scored in {time.perf_counter() - t0:.0f} s)")
    print(HEADER)
    totals = {}
    for name, items in per.items():
        results, trails = [], []
        # the data set's groups are the jobs of one cluster: one budget calibration over all of them
        rounds = rounds_of(name)
        calibrated = cluster_thresholds([p.scores for _, p in items], rounds, ISO.budget_per_1000_node_days)
        calibrates = name in ("engine", "cusum")  # the controller's own statistics: the budget is their default
        for (g, p), (cal_th, trail) in zip(items, calibrated):
            s = scored(p, g)
            cal_th = cal_th[g.train.shape[1] - HISTORY:]
            if calibrates:
                th = cal_th
                trails.append((g, trail[-1][1] if trail else None))
            else:
                th = p.threshold
            named = np.where(s.max(axis=1) >= ISO.min_score, s.argmax(axis=1), -1)
            results.append(outcome(g, acts_of(s, th, rounds), evidence=scored_evidence(p, g), named=named))
            if name == "engine":
                totals.setdefault("engine@6", []).append(outcome(g, acts_of(s, ISO.min_score)))
            elif not calibrates:  # the same budget calibration on the method's own scores: equal budgets, no oracle
                totals.setdefault(f"{name} (budget)", []).append(outcome(g, acts_of(s, cal_th)))
        totals[name] = results
        print(row(name, total(results), f"   ({np.mean([p.ms for _, p in items]):.1f} ms/round)"))
        if not calibrates:
            print(row(f"{name} (budget)", total(totals[f"{name} (budget)"])))
        if name == "cusum":
            print_trails(trails)
        if name == "engine":
            print(row("engine@6 (no budget)", total(totals["engine@6"])))
            print_trails(trails)
    equal_budgets(per, budgets_per_window)
    return {k: total(v) for k, v in totals.items()}


def print_trails(trails: list) -> None:
    """Where each group's calibration stood at the end of its scored part."""
    for g, cal in trails:
        print(f"    {g.name}: {cal.method if cal else 'no calibration'}"
              f"{f', acts at {cal.threshold:.1f}' if cal and cal.acts else ', notifies only'}: "
              f"{cal.detail if cal else ''}")


def scored_evidence(p: Pass, g: Group):
    return None if p.evidence is None else p.evidence[g.train.shape[1] - HISTORY:]


SWEEP = np.concatenate([np.arange(2.0, 12.0, 0.5), np.arange(12.0, 40.0, 2.0), [50, 70, 100, 150, 300, 1000]])
# the cusum's statistic grows a round at a time: its thresholds reach further
CUSUM_SWEEP = np.concatenate([SWEEP[SWEEP < 300], np.arange(150.0, 1000.0, 50.0), [1000, 1500, 2000, 3000, 5000]])


def equal_budgets(per: dict, budgets_per_window, lo: int = 0) -> None:
    """Each method (name -> [(group, pass)]) at the threshold of a sweep over the scored rounds from `lo` on that
    gives its best top-1 with false actions per normal window within the budget: the stated budget
    (budget_per_1000_node_days) and each of budgets_per_window."""
    print(f"  at equal false-action budgets (best top-1 of a threshold sweep on the scored part; `th` the threshold):")
    stated = ISO.budget_per_1000_node_days / 1000
    for label, per_node_day, per_window in ([(f"{ISO.budget_per_1000_node_days:g}/1000 node-days", stated, None)]
                                            + [(f"{100 * b:g} %/window", None, b) for b in budgets_per_window]):
        line = f"    {label:22s}"
        for name, items in per.items():
            best = None
            for th in CUSUM_SWEEP if name == "cusum" else SWEEP:
                rs = [outcome(g, acts_of(scored(p, g), th, rounds_of(name)), lo) for g, p in items]
                r = total(rs)
                ok = (r["false"] <= per_node_day * r["node_days"] if per_node_day is not None
                      else r["false"] <= per_window * max(1, r["normal"]))
                if ok and (best is None or r["top1"] > best[1]["top1"]):
                    best = (th, r)
            n = max(1, best[1]["segments"]) if best else 1
            line += (f" | {name} {100 * best[1]['top1'] / n:4.1f}% top-1, {100 * best[1]['wrong'] / n:4.1f}% wrong "
                     f"(th {best[0]:g})" if best else f" | {name} cannot")
        print(line)


# ---------- tuning (ASD's history and the first half of its scored part only) ----------
def tuning_part(root: Path) -> Group:
    """ASD's first group with its history and the first half of its scored part."""
    g = data.asd(root).groups[0]
    half = g.test.shape[1] // 2
    return Group(g.name, g.names, g.train, g.test[:, :half], g.labels[:, :half],
                 [s for s in g.segments if s.end < half])


def tune(root: Path) -> None:
    first = tuning_part(root)
    print(f"tuning on ASD's history and the first half of its scored part ({first.test.shape[1]} windows, "
          f"{len(first.segments)} segments); figures: top-1, wrong, false actions per normal window at the "
          f"calibrated budget, and the best top-1 within 0.1 % false actions per window (oracle threshold)")
    for lone in (True, False):
        for ratio in (0.0, 1.0, 1e9):
            p = engine_pass(first, lone=lone, ratio=ratio)
            s = scored(p, first)
            for rounds in (1, 2, 3, 4, 6, 8, 12):
                th, trail = calibrated_thresholds(p.scores, rounds, ISO.budget_per_1000_node_days)
                r = outcome(first, acts_of(s, th[first.train.shape[1] - HISTORY:], rounds))
                best = max((outcome(first, acts_of(s, x, rounds)) for x in SWEEP), key=lambda o: (
                    o["false"] <= 0.001 * o["normal"], o["top1"]))
                n = max(1, r["segments"])
                print(f"  lone {lone!s:5} ratio {ratio:g} rounds {rounds}: calibrated {100 * r['top1'] / n:4.1f}% "
                      f"{100 * r['wrong'] / n:4.1f}% {100 * r['false'] / max(1, r['normal']):.3f}% (acts at "
                      f"{trail[-1][1].threshold if trail and trail[-1][1].acts else 'none'}) | within 0.1 %: "
                      f"{100 * best['top1'] / n:4.1f}% {100 * best['wrong'] / n:4.1f}%", flush=True)


def tune_own(root: Path) -> None:
    """The engine at the shipped settings with OWN rounds of own history, on the tuning part only."""
    first = tuning_part(root)
    p = engine_pass(first)
    s = scored(p, first)
    th, trail = calibrated_thresholds(p.scores, ISO.rounds, ISO.budget_per_1000_node_days)
    print(HEADER)
    print(row(f"engine own {OWN}", outcome(first, acts_of(s, th[first.train.shape[1] - HISTORY:]))),
          f"(acts at {trail[-1][1].threshold if trail and trail[-1][1].acts else 'none'}; {p.ms:.1f} ms/round)")
    print(row(f"engine@6 own {OWN}", outcome(first, acts_of(s, ISO.min_score))))
    for budget_win in (0.001,):
        best = max(((x, outcome(first, acts_of(s, x))) for x in SWEEP), key=lambda o: (
            o[1]["false"] <= budget_win * o[1]["normal"], o[1]["top1"]))
        print(row(f"within {100 * budget_win:g} %/win (th {best[0]:g})", best[1]))


def tune_cusum(root: Path, cache: Path | None = None) -> None:
    """The cusum's reference k, cap and rounds, on the tuning part only (one engine pass; the cusum is cheap)."""
    first = tuning_part(root)
    print(f"cusum on ASD's history and the first half of its scored part ({first.test.shape[1]} windows, "
          f"{len(first.segments)} segments): calibrated top-1, wrong, false actions per normal window (threshold at "
          f"the end) | the best top-1 within 0.1 % false actions per window (oracle threshold)")
    p = cached(cache, "asd-tune", first, "engine", lambda: engine_pass(first))
    lo = first.train.shape[1] - HISTORY
    inc, lab = sequential.increments(p.positions[lo:], cap=np.inf), first.labels.T
    healthy_q = " / ".join(f"{x:.2f}" for x in np.percentile(inc[~lab], [50, 99, 99.9]))
    print(f"  a round's increment (the top-{sequential.TOP} mean of positions, uncapped): unlabelled node-rounds "
          f"median / 99th / 99.9th percentile {healthy_q}; labelled node-rounds median {np.median(inc[lab]):.2f}")
    for cap in (6.0, 9.0, 12.0, 24.0, 1e9):
        for reference in (1.5, 2.0, 3.0, 4.0, 5.0, 6.0, 8.0):
            if cap <= reference:
                continue
            c = cusum_pass(p, reference, cap)
            s = scored(c, first)
            for rounds in (1, 2):
                th, trail = calibrated_thresholds(c.scores, rounds, ISO.budget_per_1000_node_days)
                r = outcome(first, acts_of(s, th[lo:], rounds))
                best = max(((x, outcome(first, acts_of(s, x, rounds))) for x in CUSUM_SWEEP), key=lambda o: (
                    o[1]["false"] <= 0.001 * o[1]["normal"], o[1]["top1"], -o[1]["wrong"]))
                n = max(1, r["segments"])
                cal = trail[-1][1] if trail else None
                print(f"  cap {cap:g} k {reference:g} rounds {rounds}: calibrated {100 * r['top1'] / n:4.1f}% "
                      f"{100 * r['wrong'] / n:4.1f}% {100 * r['false'] / max(1, r['normal']):.3f}% (acts at "
                      f"{f'{cal.threshold:.1f}' if cal and cal.acts else 'none'}) | within 0.1 %: "
                      f"{100 * best[1]['top1'] / n:4.1f}% {100 * best[1]['wrong'] / n:4.1f}% (th {best[0]:g})",
                      flush=True)


# ---------- NAB: single series, the per-node detector ----------
def nab(root: Path, files: int) -> None:
    """Each NAB series alone (no peers): the engine's own-history score at the floor and at the budget, against
    3-sigma; history = the previous HISTORY points."""
    import csv
    import json

    base = root / "nab"
    windows = json.loads((base / "labels" / "combined_windows.json").read_text())
    sums: dict[str, list[dict]] = {}
    count = 0
    for f in sorted((base / "data").glob("*/*.csv"))[:files]:
        with f.open() as fh:
            rows = list(csv.DictReader(fh))
        stamps = {r["timestamp"]: i for i, r in enumerate(rows)}
        values = np.array([float(r["value"]) for r in rows])
        labels = np.zeros(values.size, bool)
        for a, b in windows.get(f"{f.parent.name}/{f.name}", []):
            labels[stamps[a.split(".")[0]]:stamps[b.split(".")[0]] + 1] = True
        split = int(0.15 * values.size)
        segs = data._segments_from(labels[None, split:])
        g = Group(f.name, ["node"], values[None, :split, None], values[None, split:, None], labels[None, split:], segs)
        count += 1
        for p in (engine_pass(g, lone=False), three_sigma_pass(g)):
            s = scored(p, g)
            sums.setdefault(p.name, []).append(outcome(g, acts_of(s, p.threshold)))
            if p.name == "engine":
                th, _ = calibrated_thresholds(p.scores, ISO.rounds, ISO.budget_per_1000_node_days)
                sums.setdefault("engine (budget)", []).append(
                    outcome(g, acts_of(s, th[g.train.shape[1] - HISTORY:])))
    print(f"\nNAB: {count} single series, the per-node detector (no peers); history = the previous {HISTORY} points,"
          f" the first 15 % unscored")
    print(HEADER)
    for name, rs in sums.items():
        print(row(name, total(rs)))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", type=Path, default=Path(os.environ.get("SIGMA_DATA") or REPO.parent / "shared" / "data"),
                    help="the shared data sets (default: $SIGMA_DATA, else ../shared/data beside the checkout)")
    ap.add_argument("--cloud", type=Path, default=REPO / ".data" / "cloud-monitoring-dataset",
                    help="a clone of github.com/microsoft/cloud-monitoring-dataset (skipped if absent)")
    ap.add_argument("--layout", type=Path, action="append", default=[],
                    help="a data set in ASD's layout (one directory per entity), run as its own data set")
    ap.add_argument("--only", action="append", default=[], help="only these data sets (asd, cloud, nab-aws, nab, "
                                                                "or a --layout directory's name)")
    ap.add_argument("--nab-files", type=int, default=24)
    ap.add_argument("--tune", action="store_true", help="the tuning runs on ASD's first half, then stop")
    ap.add_argument("--own-history-s", type=float, default=ISO.history_s,
                    help="the engine's own history (default: the controller's history_s); --tune sweeps it")
    ap.add_argument("--tune-cusum", action="store_true", help="the cusum's reference, cap and rounds on the tuning "
                                                                  "part, then stop")
    ap.add_argument("--cusum-reference", type=float, default=sequential.REFERENCE,
                    help="the cusum's reference k (default: the shipped one)")
    ap.add_argument("--cusum-cap", type=float, default=sequential.CAP, help="the most a round adds to the cusum")
    ap.add_argument("--tune-own", action="store_true", help="the engine with --own-history-s on the tuning part")
    ap.add_argument("--cache", type=Path, default=None,
                    help="keep each scoring pass here (keyed by the scorers' code and the data): a re-run only acts")
    args = ap.parse_args()
    global OWN, CUSUM_REFERENCE, CUSUM_CAP
    OWN = int(args.own_history_s / ISO.window_s)
    CUSUM_REFERENCE, CUSUM_CAP = args.cusum_reference, args.cusum_cap
    print(f"controller defaults: budget {ISO.budget_per_1000_node_days:g} false drains per 1,000 node-days, "
          f"min_score {ISO.min_score} (floor), dominance {ISO.dominance}, rounds {ISO.rounds}, comparable_ratio "
          f"{ISO.comparable_ratio:g}, window {ISO.window_s:.0f} s (a simulated day = {DAY_WINDOWS:.0f} windows), "
          f"history {HISTORY} windows, the engine's own {OWN}; cusum reference {CUSUM_REFERENCE:g}, cap "
          f"{CUSUM_CAP:g}, rounds {CUSUM_ROUNDS}")
    if args.tune_cusum:
        tune_cusum(args.data, args.cache)
        return 0
    if args.tune_own:
        tune_own(args.data)
        return 0
    if args.tune:
        tune(args.data)
        return 0
    before, today = _module(BEFORE_REV, "isolation_before"), _module(TODAY_REV, "isolation_today")
    sets = []
    want = set(args.only)
    if not want or "asd" in want:
        sets.append(data.asd(args.data))
    for path in args.layout:
        if not want or path.name in want:
            sets.append(data.layout(path))
    if not want or "cloud" in want:
        if (args.cloud / "data").is_dir():
            sets.append(data.cloud(args.cloud))
        else:
            print(f"cloud: skipped, no clone at {args.cloud} (git clone https://github.com/microsoft/"
                  f"cloud-monitoring-dataset; commit 6a07a53)")
    if not want or "nab-aws" in want:
        sets.append(data.nab_aws(args.data))
    summary = {ds.name: run_dataset(ds, before, today, cache=args.cache) for ds in sets}
    # the second half of ASD's scored part: the part no choice was made on
    if "asd" in summary:
        print("\nASD, second half of the scored part only (the first half chose the engine's settings):")
        g = sets[0].groups[0]
        half = g.test.shape[1] // 2
        p = cached(args.cache, "asd", g, "engine", lambda: engine_pass(g))
        th, _ = calibrated_thresholds(p.scores, ISO.rounds, ISO.budget_per_1000_node_days)
        s, th = scored(p, g), th[g.train.shape[1] - HISTORY:]
        print(HEADER)
        print(row("engine", outcome(g, acts_of(s, th), half)))
        print(row("engine@6 (no budget)", outcome(g, acts_of(s, ISO.min_score), half)))
        c = cusum_pass(p)
        th, _ = calibrated_thresholds(c.scores, CUSUM_ROUNDS, ISO.budget_per_1000_node_days)
        print(row("cusum", outcome(g, acts_of(scored(c, g), th[g.train.shape[1] - HISTORY:], CUSUM_ROUNDS), half)))
        equal_budgets({"engine": [(g, p)], "cusum": [(g, c)]}, (0.001,), half)
    print("\nevery data set, at the shipped defaults:")
    print("  data set  " + HEADER[1:])
    for name, methods in summary.items():
        for m, r in methods.items():
            print(row(f"{name:10s} {m:22s}", r, width=33))
    if not want or "nab" in want:
        nab(args.data, args.nab_files)
    return 0


if __name__ == "__main__":
    sys.exit(main())
