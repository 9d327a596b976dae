"""Isolation at scale: sensitivity to small injected faults, false isolations on healthy runs, and the time of one
isolation round over 256 nodes x 8 accelerators x 200 metrics; the scorer before it side by side.

Signals: synchronous training makes every accelerator follow the same workload shape. Each metric follows one
of the NAB series (../shared/data/nab, realAWSCloudwatch + realKnownCause, normalised) as the common shape, plus a
small static per-accelerator offset (hardware variation), plus noise; a tenth of the metrics count rare events
(0 nearly always, one count now and then on a healthy accelerator, as error or retransmit counters do). Faults are small: 2-8 per-sample noise
sigmas, on 1-8 metrics of one accelerator (or of all 8 accelerators of a node: host-level faults), as a step, a ramp
that is still growing, the shape of a real NAB anomaly window, an intermittent fault (present in a random 30-70 %
of each window's samples) or a single metric. The controller acts on the same scoring
(sigma.controller.detect.isolation) with its defaults (IsolationConfig: min_score, dominance, rounds); `today` is
the scorer before it (isolation_real.TODAY_REV) on the same data.

usage: python bench/isolation.py [--trials 100] [--nodes 256] [--gpus 8] [--metrics 200] [--history 30]
"""

from __future__ import annotations

import argparse
import csv
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from sigma.controller.config import IsolationConfig  # noqa: E402
from sigma.controller.detect import healthy  # noqa: E402
from sigma.controller.detect.isolation import Streaks, baseline, pick_outlier, score_nodes  # noqa: E402
from isolation_real import load_today  # noqa: E402

ISO = IsolationConfig()  # the controller's defaults
NAB = Path(os.environ.get("SIGMA_DATA") or REPO.parent / "shared" / "data") / "nab" / "data"  # $SIGMA_DATA: the shared data sets
NOISE = 0.5  # per-sample noise scale of every metric
WINDOW = 6  # samples averaged per isolation round (e.g. 60 s of 10 s samples)
SIZE = (2.0, 8.0)  # fault size range, in sigmas of the per-sample noise
BUCKETS = ((2, 4), (4, 6), (6, 8))
SPARSE = 0.1  # share of the metrics that are counts of rare events (0 nearly always)
BLIP = 0.002  # chance that such a metric counts one event in a window on a healthy accelerator
KINDS = ("gpu-step", "gpu-ramp", "gpu-nab", "gpu-intermittent", "gpu-one-metric", "host-step", "host-nab")


def load_shapes(length: int, rng: np.random.Generator) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Normalised healthy windows and anomaly windows (around labelled NAB anomalies) of `length` points."""
    healthy, anomalous = [], []
    files = sorted(NAB.glob("*/*.csv"))
    if not files:
        raise SystemExit(f"no NAB data under {NAB}: set SIGMA_DATA to the directory of the shared data sets")
    import json

    labels = json.loads((NAB.parent / "labels" / "combined_labels.json").read_text())
    for f in files:
        with f.open() as fh:
            rows = list(csv.DictReader(fh))
        values = np.array([float(r["value"]) for r in rows])
        stamps = [r["timestamp"] for r in rows]
        z = (values - values.mean()) / (values.std() + 1e-9)
        marks = {stamps.index(t) for t in labels.get(f"{f.parent.name}/{f.name}", []) if t in stamps}
        for start in range(0, len(z) - length, max(length, len(z) // 20)):
            window = z[start:start + length]
            if not any(start <= m < start + length for m in marks):
                healthy.append(window - window[0])
        for m in marks:
            if m - length + 2 >= 0 and m + 2 <= len(z):
                window = z[m - length + 2:m + 2]
                window = window - np.median(window[:-3])
                tail = np.abs(window[-2:])
                # a one-point spike is gone by the next round: only anomalies that persist can be isolated
                if tail.max() >= 1.0 and tail.min() >= 0.5 * tail.max():
                    anomalous.append(window)
    rng.shuffle(healthy)
    return healthy, anomalous


class World:
    def __init__(self, nodes: int, gpus: int, metrics: int, history: int, rng: np.random.Generator):
        self.nodes, self.gpus, self.metrics, self.history = nodes, gpus, metrics, history
        self.rng = rng
        self.length = history + 2  # history, then two isolation rounds
        self.healthy_shapes, self.anomaly_shapes = load_shapes(self.length, rng)
        self.entity_node = np.repeat(np.arange(nodes), gpus)
        self.names = [f"node{i:03d}" for i in range(nodes)]
        self.stats_times: list[float] = []
        self.weight_times: list[float] = []
        E = nodes * gpus
        # the cluster's own: static per-accelerator hardware variation, and which metrics count rare events
        self.offset = rng.normal(0, NOISE, (E, metrics))
        self.sparse = rng.random(metrics) < SPARSE
        self.entities = [f"{self.names[i // gpus]}/{i % gpus}" for i in range(E)]
        self.metric_names = [f"m{j}" for j in range(metrics)]
        self.sketches = healthy.Sketches()

    def noise(self, T: int) -> np.ndarray:
        """[entities, T, metrics] per-sample noise of T window means."""
        # per-sample noise is heavy-tailed (t, 5 dof: excess kurtosis 6); each round scores a window mean of
        # WINDOW samples (as the controller averages its window): scale / sqrt(WINDOW), excess kurtosis 6/WINDOW,
        # modelled as a t with 4 + 6/(6/WINDOW) dof (t_nu has excess kurtosis 6/(nu-4))
        dof = 4 + WINDOW
        unit = np.sqrt(dof / (dof - 2))  # std of t_dof
        E, M = self.offset.shape
        return self.rng.standard_t(dof, (E, T, M)).astype(np.float32) * (NOISE * np.sqrt(5 / 3) / unit
                                                                         / np.sqrt(WINDOW))

    def learn_healthy(self, rounds: int, chunk: int = 20) -> float:
        """Feed the healthy histograms (healthy.Sketches.teach, as the controller does between faults) with `rounds`
        healthy rounds of every accelerator's deviation from its peers; returns the seconds it took."""
        t0 = time.perf_counter()
        E, M = self.offset.shape
        for done in range(0, rounds, chunk):
            T = min(chunk, rounds - done)
            data = self.offset[:, None, :] + self.noise(T)  # the common workload cancels in the deviation
            data[:, :, self.sparse] = (self.rng.random((E, T, int(self.sparse.sum()))) < BLIP).astype(np.float32)
            self.sketches.teach(self.entities, self.metric_names, healthy.residuals(data), np.ones(E, bool))
        return time.perf_counter() - t0

    def run(self, fault: str | None, size: tuple[float, float] = SIZE) -> tuple[np.ndarray, int | None]:
        """Series [entities, time, metrics] with the fault (if any) starting in the first scored round."""
        E, T, M = self.nodes * self.gpus, self.length, self.metrics
        picks = self.rng.integers(0, len(self.healthy_shapes), M)
        shape = np.stack([self.healthy_shapes[p] for p in picks], axis=1)  # [T, M] common workload
        level = self.rng.uniform(10, 100, M)
        data = level + 3.0 * shape[None, :, :] + self.offset[:, None, :] + self.noise(T)
        # error counters and the like: 0 nearly always, on a healthy node now and then one count in a window
        sparse = self.sparse
        data[:, :, sparse] = (self.rng.random((E, T, int(sparse.sum()))) < BLIP).astype(np.float32)
        if fault is None:
            return data, None
        node = int(self.rng.integers(self.nodes))
        gpu_ents = np.arange(node * self.gpus, (node + 1) * self.gpus)
        ents = gpu_ents if fault.startswith("host") else gpu_ents[[self.rng.integers(self.gpus)]]
        k = 1 if fault.endswith("one-metric") else int(self.rng.integers(2, 9))
        cols = self.rng.choice(M, k, replace=False)
        self.last_size = float(self.rng.uniform(*size))
        sigma = NOISE * self.last_size  # in sigmas of the raw per-sample noise
        sign = self.rng.choice([-1.0, 1.0], k)
        rounds = np.arange(T - 2, T)
        if fault.endswith("step") or fault.endswith("one-metric"):
            data[np.ix_(ents, rounds, cols)] += sigma * sign
        elif fault.endswith("intermittent"):  # on for a random share of each window's samples
            share = self.rng.uniform(0.3, 0.7, len(rounds))
            data[np.ix_(ents, rounds, cols)] += sigma * sign * share[None, :, None]
        elif fault.endswith("ramp"):
            data[np.ix_(ents, rounds, cols)] += sigma * sign * np.array([0.7, 1.0])[None, :, None]
        else:  # the tail of a real NAB anomaly window, scaled to the fault size
            shape = self.anomaly_shapes[int(self.rng.integers(len(self.anomaly_shapes)))][-2:]
            shape = shape / (np.abs(shape).max() + 1e-9)
            data[np.ix_(ents, rounds, cols)] += sigma * 1.5 * sign * shape[None, :, None]
        return data, node

    def isolate(self, data: np.ndarray, today=None) -> tuple[str | None, list[float]]:
        """Two rounds; act on a dominant outlier seen in both (as the controller does). today: the earlier
        scorer's module, run instead of the current one."""
        streaks = Streaks()
        t0 = time.perf_counter()
        history = data[:, : self.history, :]
        base = today.history_stats(history) if today else baseline(history)  # once per history window
        if not today:
            base.own  # the own-history statistics the verdict's evidence ranks metrics with, once per window too
        self.stats_times.append(time.perf_counter() - t0)
        if not today:  # the lone-metric weights, as the controller computes them (once per history window)
            t0 = time.perf_counter()
            q = self.sketches.quantiles(self.entities, self.metric_names, healthy.POSITION_QS)
            weights = healthy.lone_weights(self.sketches, self.entities, self.metric_names, base.peer_center,
                                           base.peer_scale, q=q)
            self.weight_times.append(time.perf_counter() - t0)
        culprit, times = None, []
        for r in range(2):
            current = data[:, self.history + r, :]
            t0 = time.perf_counter()
            if today:
                scores = today.score_nodes(self.names, current, entity_node=self.entity_node, stats=base)
                verdict = today.pick_outlier(self.names, scores, ISO.min_score, ISO.dominance)
            else:
                position = lambda deviation: self.sketches.positions(self.entities, self.metric_names, deviation, q)
                scores = score_nodes(self.names, current, entity_node=self.entity_node, base=base, position=position,
                                     lone=lambda _: weights)
                verdict = pick_outlier(self.names, scores, ISO.min_score, ISO.dominance)
            times.append(time.perf_counter() - t0)
            if streaks.update("job", verdict.culprit) >= ISO.rounds:
                culprit = verdict.culprit
        return culprit, times


class Tally:
    def __init__(self):
        self.kind = {k: [0, 0] for k in KINDS}
        self.size = {b: [0, 0] for b in BUCKETS}
        self.wrong = 0
        self.false = 0
        self.times: list[float] = []

    def fault(self, kind: str, size: float, culprit: str | None, truth: str) -> None:
        bucket = next(b for b in BUCKETS if b[0] <= size < b[1])
        for row in (self.kind[kind], self.size[bucket]):
            row[0] += culprit == truth
            row[1] += 1
        self.wrong += culprit is not None and culprit != truth


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--trials", type=int, default=100, help="fault trials (and as many healthy runs)")
    ap.add_argument("--nodes", type=int, default=256)
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--metrics", type=int, default=200)
    ap.add_argument("--history", type=int, default=30, help="healthy rounds per node for the temporal score")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--healthy-rounds", type=int, default=healthy.MIN_VALUES,
                    help="healthy rounds fed to the long healthy histograms before the trials")
    args = ap.parse_args()
    rng = np.random.default_rng(args.seed)
    world = World(args.nodes, args.gpus, args.metrics, args.history, rng)
    today = load_today()
    fed = world.learn_healthy(args.healthy_rounds)
    engines = {"engine": (None, Tally())} | ({"today": (today, Tally())} if today else {})
    for i in range(args.trials):
        kind = KINDS[i % len(KINDS)]
        data, node = world.run(kind)
        for mod, tally in engines.values():
            culprit, t = world.isolate(data, mod)
            tally.times += t
            tally.fault(kind, world.last_size, culprit, world.names[node])
    for _ in range(args.trials):
        data, _ = world.run(None)
        for mod, tally in engines.values():
            culprit, t = world.isolate(data, mod)
            tally.times += t
            tally.false += culprit is not None
    print(f"isolation over {args.nodes} nodes x {args.gpus} accelerators x {args.metrics} metrics "
          f"(history {args.history} rounds, NAB shapes: {len(world.healthy_shapes)} healthy / "
          f"{len(world.anomaly_shapes)} anomalous windows; {args.trials} faults of {SIZE[0]:.0f}-{SIZE[1]:.0f} "
          f"sigma and {args.trials} healthy runs)" + ("" if today else "; `today` skipped: the earlier scorer is not available"))
    names = list(engines)
    print("  " + " " * 22 + "".join(f"{n:>12s}" for n in names))
    for kind in KINDS:
        print(f"  top-1 {kind:16s}" + "".join(f"{t.kind[kind][0]:>7d}/{t.kind[kind][1]:<4d}"
                                             for _, t in engines.values()))
    for b in BUCKETS:
        label = f"{b[0]}-{b[1]} sigma"
        print(f"  top-1 {label:16s}" + "".join(
            f"{100 * t.size[b][0] / max(1, t.size[b][1]):>11.0f}%" for _, t in engines.values()))
    print("  top-1 all             " + "".join(
        f"{100 * sum(v[0] for v in t.kind.values()) / args.trials:>11.1f}%" for _, t in engines.values()))
    print("  wrong node            " + "".join(f"{t.wrong:>7d}/{args.trials:<4d}" for _, t in engines.values()))
    print("  false isolations      " + "".join(f"{t.false:>7d}/{args.trials:<4d}" for _, t in engines.values()))
    print("  round median ms       " + "".join(f"{1000 * statistics.median(t.times):>12.0f}"
                                               for _, t in engines.values()))
    print("  round max ms          " + "".join(f"{1000 * max(t.times):>12.0f}" for _, t in engines.values()))
    print(f"  history baseline (once per history window, both engines): median "
          f"{1000 * statistics.median(world.stats_times):.0f} ms")
    print(f"  healthy histograms: {len(world.sketches)} ({args.nodes * args.gpus} accelerators x {args.metrics} "
          f"metrics), {world.sketches.nbytes / 2 ** 20:.1f} MiB, fed {args.healthy_rounds} rounds in {fed:.1f} s; "
          f"lone-metric weights (once per history window): median {1000 * statistics.median(world.weight_times):.0f}"
          f" ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
