"""Isolation at scale: top-1 accuracy on injected faults no rule knows, false isolations on healthy runs, and the
time of one isolation round over 256 nodes x 8 accelerators x 200 metrics.

Signals: synchronous training makes every accelerator follow the same workload shape. Each metric follows one
of the NAB series (../shared/data/nab, realAWSCloudwatch + realKnownCause, normalised) as the common shape, plus a
small static per-accelerator offset (hardware variation), plus noise. Faults move 2-8 correlated metrics of one
accelerator (or of all 8 accelerators of a node: host-level faults) by 8-20 per-sample noise sigmas (the goal set;
3-8 sigma faults are run too and reported as the sensitivity limit), as a step, as a ramp
that is still growing, or as the shape of a real NAB anomaly window. The controller acts on the same scoring
(sigma.controller.detect.isolation) with its defaults (IsolationConfig: min_score, dominance, rounds).

usage: python bench/isolation.py [--trials 200] [--nodes 256] [--gpus 8] [--metrics 200] [--history 30]
"""

from __future__ import annotations

import argparse
import csv
import statistics
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from sigma.controller.config import IsolationConfig  # noqa: E402
from sigma.controller.detect.isolation import Streaks, history_stats, pick_outlier, score_nodes  # noqa: E402

ISO = IsolationConfig()  # the controller's defaults
NAB = REPO.parent / "shared" / "data" / "nab" / "data"
NOISE = 0.5  # per-sample noise scale of every metric
WINDOW = 6  # samples averaged per isolation round (e.g. 60 s of 10 s samples)
SIZE = (8.0, 20.0)  # fault size range, in sigmas of the per-sample noise (the goal set)
SMALL = (3.0, 8.0)  # subtler faults, reported separately as the sensitivity limit
BUCKETS = ((3, 5), (5, 8), (8, 12), (12, 16), (16, 20))


def load_shapes(length: int, rng: np.random.Generator) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Normalised healthy windows and anomaly windows (around labelled NAB anomalies) of `length` points."""
    healthy, anomalous = [], []
    files = sorted(NAB.glob("*/*.csv"))
    if not files:
        raise SystemExit(f"no NAB data under {NAB}")
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

    def run(self, fault: str | None, size: tuple[float, float] = SIZE) -> tuple[np.ndarray, int | None]:
        """Series [entities, time, metrics] with the fault (if any) starting in the first scored round."""
        E, T, M = self.nodes * self.gpus, self.length, self.metrics
        picks = self.rng.integers(0, len(self.healthy_shapes), M)
        shape = np.stack([self.healthy_shapes[p] for p in picks], axis=1)  # [T, M] common workload
        level = self.rng.uniform(10, 100, M)
        offset = self.rng.normal(0, NOISE, (E, M))  # static per-accelerator hardware variation
        # per-sample noise is heavy-tailed (t, 5 dof: excess kurtosis 6); each round scores a window mean of
        # WINDOW samples (as the controller averages its window): scale / sqrt(WINDOW), excess kurtosis 6/WINDOW,
        # modelled as a t with 4 + 6/(6/WINDOW) dof (t_nu has excess kurtosis 6/(nu-4))
        dof = 4 + WINDOW
        unit = np.sqrt(dof / (dof - 2))  # std of t_dof
        noise = self.rng.standard_t(dof, (E, T, M)).astype(np.float32) * (NOISE * np.sqrt(5 / 3) / unit
                                                                            / np.sqrt(WINDOW))
        data = level + 3.0 * shape[None, :, :] + offset[:, None, :] + noise
        if fault is None:
            return data, None
        node = int(self.rng.integers(self.nodes))
        gpu_ents = np.arange(node * self.gpus, (node + 1) * self.gpus)
        ents = gpu_ents if fault.startswith("host") else gpu_ents[[self.rng.integers(self.gpus)]]
        k = int(self.rng.integers(2, 9))
        cols = self.rng.choice(M, k, replace=False)
        self.last_size = float(self.rng.uniform(*size))
        sigma = NOISE * self.last_size  # in sigmas of the raw per-sample noise
        sign = self.rng.choice([-1.0, 1.0], k)
        rounds = np.arange(T - 2, T)
        if fault.endswith("step"):
            data[np.ix_(ents, rounds, cols)] += sigma * sign
        elif fault.endswith("ramp"):
            data[np.ix_(ents, rounds, cols)] += sigma * sign * np.array([0.7, 1.0])[None, :, None]
        else:  # the tail of a real NAB anomaly window, scaled to the fault size
            shape = self.anomaly_shapes[int(self.rng.integers(len(self.anomaly_shapes)))][-2:]
            shape = shape / (np.abs(shape).max() + 1e-9)
            data[np.ix_(ents, rounds, cols)] += sigma * 1.5 * sign * shape[None, :, None]
        return data, node

    def isolate(self, data: np.ndarray) -> tuple[str | None, list[float]]:
        """Two rounds; act on a dominant outlier seen in both (as the controller does)."""
        streaks = Streaks()
        t0 = time.perf_counter()
        stats = history_stats(data[:, : self.history, :])  # once per history window, reused by each round
        self.stats_times.append(time.perf_counter() - t0)
        culprit, times = None, []
        for r in range(2):
            current = data[:, self.history + r, :]
            t0 = time.perf_counter()
            scores = score_nodes(self.names, current, entity_node=self.entity_node, stats=stats)
            verdict = pick_outlier(self.names, scores, ISO.min_score, ISO.dominance)
            times.append(time.perf_counter() - t0)
            if streaks.update("job", verdict.culprit) >= ISO.rounds:
                culprit = verdict.culprit
        return culprit, times


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--trials", type=int, default=100, help="fault trials (and as many healthy runs)")
    ap.add_argument("--nodes", type=int, default=256)
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--metrics", type=int, default=200)
    ap.add_argument("--history", type=int, default=30, help="healthy rounds per node for the temporal score")
    ap.add_argument("--seed", type=int, default=7)
    args = ap.parse_args()
    rng = np.random.default_rng(args.seed)
    world = World(args.nodes, args.gpus, args.metrics, args.history, rng)
    kinds = ["gpu-step", "gpu-ramp", "gpu-nab", "host-step", "host-nab"]
    per_kind = {k: [0, 0] for k in kinds}
    per_size = {b: [0, 0] for b in BUCKETS}
    times = []
    for i in range(args.trials):
        kind = kinds[i % len(kinds)]
        data, node = world.run(kind)
        culprit, t = world.isolate(data)
        times += t
        per_kind[kind][0] += culprit == world.names[node]
        per_kind[kind][1] += 1
        bucket = next(b for b in BUCKETS if b[0] <= world.last_size < b[1])
        per_size[bucket][0] += culprit == world.names[node]
        per_size[bucket][1] += 1
    small = [0, 0]
    for i in range(args.trials // 2):
        data, node = world.run(kinds[i % len(kinds)], SMALL)
        culprit, t = world.isolate(data)
        bucket = next(b for b in BUCKETS if b[0] <= world.last_size < b[1])
        per_size[bucket][0] += culprit == world.names[node]
        per_size[bucket][1] += 1
        small[0] += culprit == world.names[node]
        small[1] += 1
    false = 0
    for _ in range(args.trials):
        data, _ = world.run(None)
        culprit, t = world.isolate(data)
        times += t
        false += culprit is not None
    correct = sum(v[0] for v in per_kind.values())
    print(f"isolation over {args.nodes} nodes x {args.gpus} accelerators x {args.metrics} metrics "
          f"(history {args.history} rounds, NAB shapes: {len(world.healthy_shapes)} healthy / "
          f"{len(world.anomaly_shapes)} anomalous windows)")
    print(f"  top-1 accuracy on injected faults ({SIZE[0]:.0f}-{SIZE[1]:.0f} sigma): {correct}/{args.trials} = "
          f"{100 * correct / args.trials:.1f}% (goal >= 90%)")
    for kind, (ok, n) in per_kind.items():
        print(f"    {kind:10s} {ok}/{n}")
    print(f"  subtle faults ({SMALL[0]:.0f}-{SMALL[1]:.0f} sigma, not in the goal set): {small[0]}/{small[1]}")
    for (lo, hi), (ok, n) in per_size.items():
        print(f"    fault size {lo:2d}-{hi:2d} sigma: {ok}/{n}" + (f" = {100 * ok / n:.0f}%" if n else ""))
    print(f"  false isolations on healthy runs: {false}/{args.trials} (goal 0)")
    print(f"  one isolation round: median {1000 * statistics.median(times):.0f} ms, "
          f"max {1000 * max(times):.0f} ms (goal < 1000 ms); history baseline (once per window): median "
          f"{1000 * statistics.median(world.stats_times):.0f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
