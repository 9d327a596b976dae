"""Isolation on real labelled telemetry: the controller's scoring against simple baselines, side by side.

Data (read in place, never copied): ../shared/data/asd (12 servers x 19 metrics, 5-minute points, anomaly segments
with their anomalous metrics) and ../shared/data/nab (single series with anomaly windows: the per-node detector).

Mapping onto the controller: one data point is one isolation window (its mean); the controller acts on the same
culprit in `rounds` consecutive windows (IsolationConfig defaults: min_score, dominance, rounds). Chronological split:
the history is what came before — ASD's train split (the first 30 days), NAB's first 15 % (its probationary
period) — and only what comes after it is scored. A simulated day is 86400 / window_s windows of the controller.

Figures per data set and method: top-1 (the labelled entity acted on during its segment), wrong node (another,
unlabelled entity acted on during the segment and the labelled one not), missed; top-1 where exactly one entity is
anomalous; false actions per normal window (no entity labelled) and per simulated day; HitRate@100 % / 150 %
(share of a segment's labelled metrics among its top 100 % / 150 % ranked metrics, over detected points, as in the
InterFusion code's IPS) and the same for a random ranking.

Methods: `engine` (sigma.controller.detect.isolation: own history + peers, one metric alone at the weights of the
healthy histograms of sigma.controller.detect.healthy, fed with the history through the controller's own rule,
healthy.Sketches.teach; its evidence ranks metrics as the controller's top_metrics do), `engine-online` (the same,
the histograms also fed during the scored split with the servers not under suspicion, no verdict this window, through
the same rule, as the controller goes on feeding them), `engine-top3` (the top-3 mean alone, its evidence the peer
scores: the engine before the histograms), `engine-own` (own history only, the
per-node detector), `3-sigma` (per metric, mean/std of the entity's own history; the entity with the largest
excursion beyond 3 sigma), `today` (the scorer before this one: `git show TODAY_REV:sigma/controller/detect/
isolation.py`, loaded into a module here; skipped with a note where git or that revision is missing).

usage: python bench/isolation_real.py [--data ../shared/data] [--servers 12] [--nab-files 24] [--only asd|nab]
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import subprocess
import sys
import time
import types
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from sigma.controller.config import IsolationConfig  # noqa: E402
from sigma.controller.detect import healthy, isolation  # noqa: E402

ISO = IsolationConfig()
DAY_WINDOWS = 86400 / ISO.window_s


# ---------- data ----------
def read_matrix(path: Path) -> np.ndarray:
    with path.open() as fh:
        rows = list(csv.reader(fh))
    return np.array([[float(v) for v in r[1:]] for r in rows[1:]])


@dataclass
class Segment:
    entity: int
    start: int
    end: int  # inclusive
    metrics: list[int] = field(default_factory=list)  # 0-based columns


def load_asd(root: Path, servers: int) -> tuple[list[str], np.ndarray, np.ndarray, np.ndarray, list[Segment]]:
    """(names, train [entities, time, metrics], test [entities, time, metrics], labels [entities, time], segments)."""
    dirs = sorted((root / "asd").glob("omi-*"), key=lambda p: int(p.name.split("-")[1]))[:servers]
    if not dirs:
        raise SystemExit(f"no ASD data under {root / 'asd'}: pass --data or set SIGMA_DATA to the shared data sets")
    trains = [read_matrix(d / "train.csv") for d in dirs]
    tests = [read_matrix(d / "test.csv") for d in dirs]
    T = max(len(t) for t in trains)
    train = np.full((len(dirs), T, trains[0].shape[1]), np.nan)
    for i, t in enumerate(trains):  # omi-12's train is shorter: aligned on its end (just before the test)
        train[i, T - len(t):] = t
    test = np.stack(tests)
    labels = np.stack([read_matrix(d / "test_label.csv")[:, 0] for d in dirs]).astype(bool)
    segments = []
    for i, d in enumerate(dirs):
        for line in (d / "interpretation_label.txt").read_text().split("\n"):
            if line.strip():
                span, dims = line.split(":")
                a, b = (int(x) for x in span.split("-"))
                segments.append(Segment(i, a, b, [int(x) - 1 for x in dims.split(",")]))
    return [d.name for d in dirs], train, test, labels, segments


def load_nab(root: Path, files: int) -> list[tuple[str, np.ndarray, list[tuple[int, int]]]]:
    """(name, values, anomaly windows as (start, end) indices) per series."""
    base = root / "nab"
    windows = json.loads((base / "labels" / "combined_windows.json").read_text())
    out = []
    for f in sorted((base / "data").glob("*/*.csv"))[:files]:
        with f.open() as fh:
            rows = list(csv.DictReader(fh))
        stamps = {r["timestamp"]: i for i, r in enumerate(rows)}
        spans = [(stamps[a.split(".")[0]], stamps[b.split(".")[0]])
                 for a, b in windows.get(f"{f.parent.name}/{f.name}", [])]
        out.append((f"{f.parent.name}/{f.name}", np.array([float(r["value"]) for r in rows]), spans))
    return out


# ---------- methods: history [E, T, M] -> per round (node scores [E], metric scores [E, M]) ----------
class Engine:
    """The controller's scorer: isolation.score, with the lone-metric weights from healthy.Sketches fed with the
    history's deviations from the peers (as the controller feeds them, one value per window and node)."""
    name = "engine"

    threshold = ISO.min_score

    def __init__(self, history: np.ndarray, peers: bool = True, lone: bool = True, online: bool = False):
        self.base = isolation.baseline(history)
        self.peers = peers
        self.lone = None
        if not peers:
            self.name = "engine-own"
        elif not lone:
            self.name = "engine-top3"
        else:
            E, T, M = history.shape
            self.entities, self.series = [f"e{i}" for i in range(E)], [f"m{j}" for j in range(M)]
            self.sketches = healthy.Sketches()
            for t in range(T):  # through the controller's rule: a server far out in its own histograms teaches not
                self.sketches.teach(self.entities, self.series, healthy.residuals(history[:, t, :]), np.ones(E, bool))
            weights = healthy.lone_weights(self.sketches, self.entities, self.series, self.base.peer_center,
                                           self.base.peer_scale)
            self.lone = lambda base: weights  # the history is fixed here: computed once
            if online:  # ... or, as the controller, every window from histograms that go on learning
                self.name = "engine-online"
                self.lone = lambda base: healthy.lone_weights(self.sketches, self.entities, self.series,
                                                              base.peer_center, base.peer_scale)
        self.online = online
        self.readings: list[tuple[np.ndarray, np.ndarray]] = []  # per round: (own-history scores, positions)

    def __call__(self, current: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(node scores [E], the evidence that ranks each node's metrics [E, M], the metric scores that decided)."""
        if not self.peers:
            z = isolation.metric_scores(current, self.base, peers=False)
            return isolation.top_k_mean(z, 3), z, z
        position = None if self.lone is None else (
            lambda deviation: self.sketches.positions(self.entities, self.series, deviation))
        s = isolation.score([f"e{i}" for i in range(current.shape[0])], current, base=self.base, lone=self.lone,
                            position=position)
        if position is not None:  # the evidence's other readings, kept for evidence_rankings
            self.readings.append((isolation.metric_scores(current, self.base, peers=False),
                                  np.nan_to_num(position(current - np.nanmedian(current, axis=0)), nan=0.0)))
        if self.online:  # the servers not under suspicion (no verdict: below min_score) may teach this window,
            # through the controller's rule (healthy.Sketches.teach: not those far out in their own histograms)
            self.sketches.teach(self.entities, self.series, healthy.residuals(current), s.total < ISO.min_score)
        # the engine before the histograms ranked its evidence by the peer scores alone
        return s.total, s.evidence if self.lone is not None else s.metric_z, s.metric_z

    def pick(self, names, scores, hint=None):
        return isolation.pick_outlier(names, scores, self.threshold, ISO.dominance).culprit


class ThreeSigma:
    """Per metric, the entity's own history mean/std; the entity with the largest excursion beyond 3 sigma."""
    name = "3-sigma"
    threshold = 3.0

    def __init__(self, history: np.ndarray):
        self.mean = np.nanmean(history, axis=1)
        self.std = np.maximum(np.nanstd(history, axis=1), 1e-9)

    def __call__(self, current):
        z = np.nan_to_num(np.abs(current - self.mean) / self.std, nan=0.0)
        return z.max(axis=1), z, z

    def pick(self, names, scores, hint=None):
        i = int(np.argmax(scores))
        return names[i] if scores[i] > self.threshold and np.sum(scores == scores[i]) == 1 else None


TODAY_REV = "d06369c"  # the last commit with the scorer before noise floors and the per-node score


def load_today() -> types.ModuleType | None:
    """The scorer before this one (TODAY_REV), for the side-by-side comparison."""
    try:
        src = subprocess.run(["git", "show", f"{TODAY_REV}:sigma/controller/detect/isolation.py"], cwd=REPO,
                             capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    mod = types.ModuleType("isolation_today")
    sys.modules[mod.__name__] = mod  # dataclasses look their module up there
    exec(compile(src, f"{TODAY_REV}:sigma/controller/detect/isolation.py", "exec"), mod.__dict__)
    return mod


class Today:
    """The earlier scorer with its defaults: peer deviation AND deviation from own history (the residual's stats)."""
    name = "today"
    threshold = ISO.min_score

    def __init__(self, mod, history: np.ndarray):
        self.mod = mod
        self.stats = mod.history_stats(history) if history.shape[0] >= 3 else None

    def __call__(self, current):
        spatial = self.mod.spatial_z(current)
        temporal = self.mod.temporal_z(current, self.stats) if self.stats is not None else None
        z = np.nan_to_num(self.mod.combine(spatial, temporal), nan=0.0, posinf=1e6)
        return self.mod.top_k_mean(z, 3), z, z

    def pick(self, names, scores, hint=None):
        return self.mod.pick_outlier(names, scores, self.threshold, ISO.dominance).culprit


class Rolling:
    """A method whose history is the previous `windows` points, as the controller's history_s is its last hour."""

    def __init__(self, make, series: np.ndarray, windows: int):
        self.make, self.series, self.windows = make, series, windows
        self.name = make(series[:, :3, :]).name + "/rolling"

    def at(self, t: int) -> None:
        self.method = self.make(self.series[:, max(0, t - self.windows):t, :])

    def __call__(self, current):
        return self.method(current)

    def pick(self, names, scores, hint=None):
        return self.method.pick(names, scores, hint)


# ---------- evaluation ----------
def hit_rate(z_row: np.ndarray, labelled: list[int], p: float) -> float:
    top = np.argsort(-z_row, kind="stable")[: int(p * len(labelled))]
    return len(set(top.tolist()) & set(labelled)) / len(labelled)


def score(method, test: np.ndarray) -> tuple[np.ndarray, np.ndarray, float, np.ndarray]:
    """One scoring pass over the test split: (node scores [T, E], the evidence ranking metrics [T, E, M], ms per
    round, the metric scores that decided [T, E, M])."""
    E, T, M = test.shape
    node_scores, evidence, metric_z = np.zeros((T, E)), np.zeros((T, E, M)), np.zeros((T, E, M))
    t0 = time.perf_counter()
    for t in range(T):
        if hasattr(method, "at"):
            method.at(t)
        node_scores[t], evidence[t], metric_z[t] = method(test[:, t, :])
    return node_scores, evidence, 1000 * (time.perf_counter() - t0) / T, metric_z


def run(method, test: np.ndarray, labels: np.ndarray, segments: list[Segment], names: list[str],
        scored: tuple | None = None, rounds: int = ISO.rounds) -> dict:
    """Rounds over the test split; acts as the controller does (same culprit in ISO.rounds consecutive windows).
    scored: a previous `score` pass of this method, replayed at its current threshold."""
    node_scores, metric_z, round_ms = (scored or score(method, test))[:3]
    T = test.shape[1]
    streaks = isolation.Streaks()
    acts = np.full(T, -1)  # entity acted on at t (-1: none)
    picked = np.full(T, -1)
    for t in range(T):
        culprit = method.pick(names, node_scores[t])
        picked[t] = names.index(culprit) if culprit else -1
        if streaks.update("job", culprit) >= rounds:
            acts[t] = names.index(culprit)
    anomalous = labels.any(axis=0)
    normal = ~anomalous
    false = int(np.sum((acts >= 0) & normal))
    outcome = {"top1": 0, "wrong": 0, "missed": 0}
    solo = [0, 0]
    hits = {1.0: [], 1.5: []}
    for s in segments:
        span = slice(s.start, s.end + 1)
        acted = acts[span]
        right = np.any(acted == s.entity)
        wrong = any(a >= 0 and not labels[a, s.start + i] for i, a in enumerate(acted))
        key = "top1" if right else "wrong" if wrong else "missed"
        outcome[key] += 1
        alone = labels[:, span].sum(axis=0).max() == 1
        if alone:
            solo[0] += right
            solo[1] += 1
        detected = [t for t in range(s.start, s.end + 1) if picked[t] == s.entity]
        if detected and s.metrics:
            for p in hits:
                hits[p].append(np.mean([hit_rate(metric_z[t, s.entity], s.metrics, p) for t in detected]))
    n = max(1, len(segments))
    return {"segments": n, **{k: v / n for k, v in outcome.items()}, "solo": solo,
            "false_per_window": false / max(1, int(normal.sum())), "false": false,
            "hit100": float(np.mean(hits[1.0])) if hits[1.0] else float("nan"),
            "hit150": float(np.mean(hits[1.5])) if hits[1.5] else float("nan"), "detected_segments": len(hits[1.0]),
            "round_ms": round_ms}


def random_hit_rate(segments: list[Segment], metrics: int, rng: np.random.Generator) -> tuple[float, float]:
    out = []
    for p in (1.0, 1.5):
        out.append(float(np.mean([np.mean([hit_rate(rng.random(metrics), s.metrics, p) for _ in range(50)])
                                  for s in segments if s.metrics])))
    return out[0], out[1]


def print_row(name: str, r: dict) -> None:
    solo = f"{r['solo'][0]}/{r['solo'][1]}" if r["solo"][1] else "n/a"
    wrong = "n/a" if r.get("single") else f"{100 * r['wrong']:5.1f}%"
    hit = ("   n/a     n/a" if np.isnan(r["hit100"]) else
           f"  {r['hit100']:.2f}    {r['hit150']:.2f} ({r['detected_segments']} seg)")
    print(f"  {name:11s} {100 * r['top1']:5.1f}%  {wrong:>6s}  {100 * r['missed']:5.1f}%  {solo:>7s}  "
          f"{100 * r['false_per_window']:6.2f}%  {r['false_per_window'] * DAY_WINDOWS:7.1f}  {hit}   "
          f"{r['round_ms']:.2f}")


HEADER = ("  method      top-1   wrong  missed  top-1 solo  false/win  false/day  HR@100  HR@150 (over)  ms/round")


def asd(root: Path, servers: int, today_mod) -> None:
    names, train, test, labels, segments = load_asd(root, servers)
    print(f"ASD: {len(names)} servers x {test.shape[2]} metrics, history = train split ({train.shape[1]} points), "
          f"{test.shape[1]} scored windows, {len(segments)} anomaly segments, "
          f"{int((~labels.any(axis=0)).sum())} normal windows (no server labelled)")
    print(HEADER)
    t0 = time.perf_counter()
    methods = [Engine(train)]
    print(f"  (healthy histograms: {len(methods[0].sketches)} fed with {np.isfinite(train).sum()} values in "
          f"{time.perf_counter() - t0:.1f} s, {methods[0].sketches.nbytes / 1e3:.0f} kB)")
    methods += [Engine(train, online=True), Engine(train, lone=False), Engine(train, peers=False), ThreeSigma(train)]
    if today_mod is not None:
        methods.append(Today(today_mod, train))
    passes = {m.name: score(m, test) for m in methods}
    for m in methods:
        print_row(m.name, run(m, test, labels, segments, names, passes[m.name]))
    # the controller's rounds come every poll_s over a sliding window: two consecutive rounds share all but one
    # second of it, so `rounds` consecutive windows above are stricter than the controller; acting on one window is
    # closer to what it does
    print("  acting on one window (the controller's consecutive rounds, poll_s apart, share nearly all of theirs):")
    for m in methods:
        print_row(m.name, run(m, test, labels, segments, names, passes[m.name], rounds=1))
    r100, r150 = random_hit_rate(segments, test.shape[2], np.random.default_rng(0))
    print(f"  random metric ranking: HR@100 {r100:.2f}, HR@150 {r150:.2f}")
    solo_misses(names, passes["engine"], labels, segments)
    for m in methods[:2]:
        wrong_actions(m, passes[m.name], labels, segments, names)
    equal_budget(methods, passes, test, labels, segments, names)
    aggregations(passes["engine"], test, labels, segments, names)
    halves(methods, passes, test, labels, segments, names)
    evidence_rankings(methods[:2], passes, test, labels, segments, names)
    teaching_gates(train, test, labels, segments, names)


def wrong_actions(m, scored, labels, segments, names) -> None:
    """Where the engine acted on a server that was not labelled: the wrong-node segments and the false actions,
    each with the acted-on server's score and its top decided metrics (1-based)."""
    node_scores, metric_z = scored[0], scored[3]
    streaks, acts = isolation.Streaks(), np.full(node_scores.shape[0], -1)
    for t in range(node_scores.shape[0]):
        culprit = m.pick(names, node_scores[t])
        if streaks.update("job", culprit) >= ISO.rounds:
            acts[t] = names.index(culprit)
    lines = []
    for t in np.flatnonzero(acts >= 0):
        x = acts[t]
        if labels[x, t]:
            continue
        inside = [s for s in segments if s.start <= t <= s.end]
        z = metric_z[t, x]
        top = ", ".join(f"{j + 1} {z[j]:.1f}" for j in np.argsort(-z)[:3])
        where = (f"during {', '.join(f'{names[s.entity]}@{s.start}-{s.end}' for s in inside)}" if inside
                 else "no server labelled")
        lines.append(f"{names[x]}@{t} ({where}): score {node_scores[t, x]:.1f}; top metrics {top}")
    print(f"  {m.name}: acted on an unlabelled server {len(lines)} time(s)" + (":" if lines else ""))
    for line in lines:
        print(f"    {line}")


def solo_misses(names, scored, labels, segments) -> None:
    """Why the engine misses the segments where one server alone is labelled, at the shipped operating point: each
    segment's best score for its server, the windows at or above min_score, and those where it was also the
    dominant outlier (rounds = ISO.rounds consecutive such windows act)."""
    node_scores, evidence, metric_z = scored[0], scored[1], scored[3]
    reasons: dict[str, list[str]] = {}
    details = []
    for s in segments:
        span = slice(s.start, s.end + 1)
        if labels[:, span].sum(axis=0).max() != 1:
            continue
        own = node_scores[span, s.entity]
        picks = [isolation.pick_outlier(names, node_scores[t], ISO.min_score, ISO.dominance).culprit == names[s.entity]
                 for t in range(s.start, s.end + 1)]
        run_, best_run = 0, 0
        for p in picks:
            run_ = run_ + 1 if p else 0
            best_run = max(best_run, run_)
        reason = ("acted on" if best_run >= ISO.rounds else
                  f"named in {sum(picks)} window(s), never {ISO.rounds} in a row" if any(picks) else
                  "at min_score but not dominant" if (own >= ISO.min_score).any() else "below min_score")
        reasons.setdefault(reason, []).append(f"{names[s.entity]}@{s.start} ({len(own)} windows, best {own.max():.1f},"
                                              f" {len(s.metrics)} metrics)")
        if reason != "acted on":  # what its best window was made of: its top metrics (* labelled), the runner-up
            t = s.start + int(np.argmax(own))
            z = evidence[t, s.entity]
            top = ", ".join(f"{j + 1}{'*' if j in s.metrics else ''} {z[j]:.1f}" for j in np.argsort(-z)[:4])
            lone = int(np.sum(metric_z[s.start:s.end + 1, s.entity][:, s.metrics].max(axis=1) >= ISO.min_score))
            other = np.delete(node_scores[t], s.entity).max()
            details.append(f"{names[s.entity]}@{s.start}: best window {t}: {top}; others' best {other:.1f}; a labelled"
                           f" metric alone >= {ISO.min_score} in {lone}/{len(own)} windows")
    print(f"  engine, one server anomalous, at min_score {ISO.min_score} / dominance {ISO.dominance} / rounds "
          f"{ISO.rounds}:")
    for reason, segs in sorted(reasons.items(), key=lambda x: -len(x[1])):
        print(f"    {reason}: {len(segs)}: {', '.join(segs)}")
    print("  the missed ones, their best window's top metric scores (metric numbers 1-based, * labelled):")
    for line in details:
        print(f"    {line}")


# the score each method needs to act: a sweep that puts every method at the same false-action rates
SWEEP = {"engine": np.arange(2.0, 12.01, 0.5), "engine-online": np.arange(2.0, 12.01, 0.5), "engine-top3": np.arange(2.0, 12.01, 0.5), "engine-own": np.arange(2.0, 12.01, 0.5),
         "today": np.arange(2.0, 12.01, 0.5), "3-sigma": np.array([3, 4, 5, 7, 10, 15, 20, 30, 50, 100, 300, 1e3])}


def _part(passes, test, labels, segments, lo: int, hi: int):
    """The rounds lo..hi-1 of the scored split as a split of its own (segments wholly inside, re-indexed)."""
    segs = [Segment(x.entity, x.start - lo, x.end - lo, x.metrics) for x in segments if lo <= x.start and x.end < hi]
    return ({k: (p[0][lo:hi], p[1][lo:hi], p[2]) for k, p in passes.items()}, test[:, lo:hi], labels[:, lo:hi], segs)


def equal_budget(methods, passes, test, labels, segments, names, budgets=(0.01, 0.03, 0.05)) -> None:
    """Each method at the threshold giving its best top-1 within a false-action budget: methods compared at the same
    false-alarm cost rather than at their own defaults (the shipped defaults are the rows above). Two readings: the
    sweep on the whole scored split (as a detection-rate curve at fixed false-positive rates is read), and the
    threshold chosen on the first half of the scored split (chronological) and applied to the second half, which it
    has not seen: what choosing an operating point from past data gives."""
    half = test.shape[1] // 2
    first, second = _part(passes, test, labels, segments, 0, half), _part(passes, test, labels, segments, half,
                                                                          test.shape[1])
    print("  at equal false-action budgets (best top-1 over a threshold sweep with false/win within the budget); "
          "chosen on the first half, on the second half:")
    print("  method      budget  threshold  top-1   wrong  top-1 solo  false/win |  threshold  top-1   wrong  "
          "top-1 solo  false/win")
    for m in methods:
        default = m.threshold
        sweep, early = [], []
        for th in SWEEP[m.name]:
            m.threshold = float(th)
            sweep.append((float(th), run(m, test, labels, segments, names, passes[m.name])))
            early.append((float(th), run(m, first[1], first[2], first[3], names, first[0][m.name])))
        for budget in budgets:
            row = f"  {m.name:11s} {100 * budget:5.0f}%"
            for curve, later in ((sweep, False), (early, True)):
                within = [(th, r) for th, r in curve if r["false_per_window"] <= budget]
                if not within:
                    row += (f"  cannot stay within it (lowest false/win "
                            f"{100 * min(r['false_per_window'] for _, r in curve):.2f}%)")
                    continue
                th, r = max(within, key=lambda x: (x[1]["top1"], -x[1]["wrong"]))
                if later:
                    m.threshold = th
                    r = run(m, second[1], second[2], second[3], names, second[0][m.name])
                row += (f"  {th:9.1f}  {100 * r['top1']:5.1f}%  {100 * r['wrong']:5.1f}%  "
                        f"{r['solo'][0]}/{r['solo'][1]:<7}  {100 * r['false_per_window']:6.2f}%")
                row += "" if later else " |"
            print(row)
        m.threshold = default


# ways to reduce a node's metric scores to one score: the shipped top-3 mean, and those that let fewer metrics decide
AGGREGATIONS = {"top-3 mean": lambda z: isolation.top_k_mean(z, 3), "top-2 mean": lambda z: isolation.top_k_mean(z, 2),
                "top-1": lambda z: isolation.top_k_mean(z, 1),
                "rms of top-3": lambda z: np.sqrt(np.mean(np.sort(z, axis=-1)[..., -3:] ** 2, axis=-1))}


class _Aggregated:
    """The engine's metric scores reduced to a node score another way; acts as the engine does."""
    name = "aggregated"

    def __init__(self, threshold: float):
        self.threshold = threshold

    def pick(self, names, scores, hint=None):
        return isolation.pick_outlier(names, scores, self.threshold, ISO.dominance).culprit


def aggregations(scored, test, labels, segments, names, false_goal: float = 0.01, wrong_goal: float = 0.02) -> None:
    """The engine's metric scores aggregated per node in other ways, each at the threshold that gives the best top-1
    on the first half of the scored split within the false-action and wrong-node goals, then applied to the second
    half: whether letting fewer metrics decide (what the missed one-server segments call for) holds on later data."""
    metric_z = scored[3]
    half = test.shape[1] // 2
    print(f"  aggregation of the engine's metric scores, threshold chosen on the first half (best top-1 with false/win "
          f"<= {100 * false_goal:.0f}% and wrong <= {100 * wrong_goal:.0f}%), then the second half:")
    print("  aggregation    threshold | first half: top-1   wrong  top-1 solo  false/win | second half: top-1   wrong  "
          "top-1 solo  false/win")
    for name, reduce in AGGREGATIONS.items():
        passes = {name: (reduce(metric_z), metric_z, scored[2])}
        first, second = (_part(passes, test, labels, segments, lo, hi) for lo, hi in ((0, half), (half, test.shape[1])))
        curve = [(float(th), run(_Aggregated(float(th)), first[1], first[2], first[3], names, first[0][name]))
                 for th in np.arange(3.0, 12.01, 0.5)]
        within = [(th, r) for th, r in curve if r["false_per_window"] <= false_goal and r["wrong"] <= wrong_goal]
        if not within:
            print(f"  {name:14s} no threshold meets the goals on the first half")
            continue
        th = max(within, key=lambda x: (x[1]["top1"], x[1]["solo"][0], x[0]))[0]
        rows = [(f"{name:14s} {th:9.1f}", th)]
        if name == "top-3 mean":  # and the shipped operating point on each half
            rows.append((f"{'  shipped':14s} {ISO.min_score:9.1f}", ISO.min_score))
        for label, th in rows:
            r1, r2 = (run(_Aggregated(th), part[1], part[2], part[3], names, part[0][name]) for part in (first, second))
            print(f"  {label} | " + " | ".join(
                f"{' ' * 12}{100 * r['top1']:5.1f}%  {100 * r['wrong']:5.1f}%  {r['solo'][0]}/{r['solo'][1]:<8}  "
                f"{100 * r['false_per_window']:6.2f}%" for r in (r1, r2)))


def evidence_rankings(engines, passes, test, labels, segments, names) -> None:
    """HitRate@100 % of the engine's verdicts with their metrics ranked by other readings than the shipped one (the
    strongest of the peer score, the own-history score and the position in the healthy histograms): which ranking
    names the labelled metrics best was chosen on the first half."""
    half = test.shape[1] // 2
    print("  evidence ranking, HitRate@100 % of the same verdicts: whole | first half | second half")
    for m in engines:
        node_scores, _, ms, decided = passes[m.name]
        own, position = (np.array(x) for x in zip(*m.readings))
        for label, ranking in (("peer score (before)", decided),
                               ("peer score, position", np.maximum(decided, position)),
                               ("peer score, own history", np.maximum(decided, own)),
                               ("all three (shipped)", np.maximum.reduce([decided, own, position]))):
            row = f"  {m.name:13s} {label:24s}"
            for lo, hi in ((0, test.shape[1]), (0, half), (half, test.shape[1])):
                part = _part({m.name: (node_scores, ranking, ms)}, test, labels, segments, lo, hi)
                r = run(m, part[1], part[2], part[3], names, part[0][m.name])
                row += f" | {r['hit100']:.3f}"
            print(row)


def teaching_gates(train, test, labels, segments, names) -> None:
    """The rule that keeps nodes far out in their own histograms from teaching them (healthy.Sketches.teach), at
    other thresholds than the shipped SUSPECT_Z (inf: no such rule), in both readings (the histograms from the
    history only, and also fed while scoring); the first half of the scored split chose, the second checks."""
    shipped = healthy.SUSPECT_Z
    half = test.shape[1] // 2
    print(f"  teaching gate (a node whose {healthy.SUSPECT_SERIES} farthest series lie on average this far out in "
          f"its own histograms teaches nothing; shipped {shipped:g}): whole | first half | second half")
    try:
        for gate in (healthy.CALIBRATION_Z, 2 * healthy.CALIBRATION_Z, shipped, float("inf")):
            healthy.SUSPECT_Z = gate
            for online in (False, True):
                m = Engine(train, online=online)
                kept = m.sketches.counts[:len(m.sketches)].sum() / max(1, np.isfinite(train).sum())
                scored = score(m, test)
                row = f"  {gate:5g} {m.name:13s} history kept {100 * kept:6.2f}%"
                for lo, hi in ((0, test.shape[1]), (0, half), (half, test.shape[1])):
                    part = _part({m.name: scored}, test, labels, segments, lo, hi)
                    r = run(m, part[1], part[2], part[3], names, part[0][m.name])
                    row += (f" | {100 * r['top1']:5.1f}% {100 * r['wrong']:4.1f}% {r['solo'][0]}/{r['solo'][1]:<3d}"
                            f"{100 * r['false_per_window']:5.2f}% HR {r['hit100']:.3f}")
                print(row, flush=True)
    finally:
        healthy.SUSPECT_Z = shipped
    print("    (each: top-1, wrong, one server, false/win, HR@100 %)")


def halves(methods, passes, test, labels, segments, names) -> None:
    """Every method at its own defaults on each half of the scored split (chronological): the lone-metric weighting
    (healthy.py: median over nodes, 99.9th percentile) was chosen on the first half only."""
    half = test.shape[1] // 2
    for label, (lo, hi) in (("first half", (0, half)), ("second half", (half, test.shape[1]))):
        part = _part(passes, test, labels, segments, lo, hi)
        print(f"  {label} ({hi - lo} windows, {len(part[3])} segments wholly inside), at the defaults:")
        for m in methods:
            print_row(m.name, run(m, part[1], part[2], part[3], names, part[0][m.name]))


def nab(root: Path, files: int) -> None:
    series = load_nab(root, files)
    history_windows = int(ISO.history_s / ISO.window_s)
    totals: dict[str, dict] = {}
    for name, values, spans in series:
        split = int(0.15 * len(values))
        history = values[None, :split, None]
        test = values[None, split:, None]
        labels = np.zeros((1, test.shape[1]), dtype=bool)
        segments = []
        for a, b in spans:
            a, b = max(a - split, 0), b - split
            if b >= 0:
                labels[0, a:b + 1] = True
                segments.append(Segment(0, a, b, []))
        # the rolling ones see the points before each round: the whole series, scored from the split on
        whole = values[None, :, None]
        methods = [Engine(history, peers=False), ThreeSigma(history),
                   Rolling(lambda h: Engine(h, peers=False), whole, history_windows),
                   Rolling(ThreeSigma, whole, history_windows)]
        for m in methods:
            r = run(_Shifted(m, split) if isinstance(m, Rolling) else m, test, labels, segments, ["node"])
            t = totals.setdefault(m.name, {"segments": 0, "top1": 0, "missed": 0, "false": 0, "normal": 0, "ms": []})
            t["segments"] += r["segments"]
            t["top1"] += round(r["top1"] * r["segments"])
            t["missed"] += round(r["missed"] * r["segments"])
            t["false"] += r["false"]
            t["normal"] += int((~labels[0]).sum())
            t["ms"].append(r["round_ms"])
    print(f"NAB: {len(series)} single series, per-node detector (no peers); history = the first 15 % (fixed), or "
          f"the previous {history_windows} windows (rolling: history_s / window_s, as the controller keeps it)")
    print(HEADER)
    for name, t in totals.items():
        n = max(1, t["segments"])
        print_row(name, {"top1": t["top1"] / n, "wrong": 0.0, "missed": t["missed"] / n, "solo": [0, 0],
                         "single": True, "false_per_window": t["false"] / max(1, t["normal"]),
                         "hit100": float("nan"), "hit150": float("nan"), "detected_segments": 0, "round_ms": float(np.mean(t["ms"]))})
    print(f"  ({sum(len(s) for _, _, s in series)} anomaly windows; wrong node and HitRate do not apply to one "
          f"series of one metric)")


class _Shifted:
    """A rolling method scored on the test part of a series: round t is point split + t."""

    def __init__(self, method: Rolling, split: int):
        self.method, self.split, self.name = method, split, method.name

    def at(self, t: int) -> None:
        self.method.at(self.split + t)

    def __call__(self, current):
        return self.method(current)

    def pick(self, names, scores, hint=None):
        return self.method.pick(names, scores, hint)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", type=Path, default=Path(os.environ.get("SIGMA_DATA") or REPO.parent / "shared" / "data"),
                    help="the shared data sets (default: $SIGMA_DATA, else ../shared/data beside the checkout)")
    ap.add_argument("--servers", type=int, default=12, help="ASD servers (omi-1..omi-N)")
    ap.add_argument("--nab-files", type=int, default=24)
    ap.add_argument("--only", choices=("asd", "nab"), default=None, help="one data set only")
    args = ap.parse_args()
    today = load_today()
    print(f"controller defaults: min_score {ISO.min_score}, dominance {ISO.dominance}, rounds {ISO.rounds}, "
          f"window {ISO.window_s:.0f} s (a simulated day = {DAY_WINDOWS:.0f} windows)"
          + ("" if today else "; `today` skipped: the earlier scorer is not available"))
    if args.only != "nab":
        asd(args.data, args.servers, today)
    if args.only != "asd":
        nab(args.data, args.nab_files)
    return 0


if __name__ == "__main__":
    sys.exit(main())
