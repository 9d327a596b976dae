"""Labelled multi-entity telemetry for bench/isolation_real.py, read in place (never copied into the repository).

Each data set is one or more *groups* (entities that run side by side: the servers of one service, the sibling
series of one production signal), each split chronologically into a history and a scored part:

- `asd` (../shared/data/asd, MIT): 12 servers x 19 metrics at 5-minute points, history = the train split (30 days),
  anomaly segments with their metrics. The data the engine's earlier choices were made on.
- `layout DIR`: any data set written in ASD's layout (one directory per entity with train.csv, test.csv,
  test_label.csv, interpretation_label.txt): how a data set not looked at here is run unchanged.
- `cloud` (github.com/microsoft/cloud-monitoring-dataset at 6a07a53, MIT, `--cloud DIR` where it was cloned):
  production telemetry of Microsoft cloud services, anomalies labelled by domain experts per series; its groups of 4
  or more sibling series that share their timestamps (a middle tier's latency to each of its 22 backend
  dependencies and in all, MongoDB query rates by application, ingress rates into one service, crash rates by OS
  version, purchase rates by client); history = the first half of each group.
- `nab-aws` (../shared/data/nab, realAWSCloudwatch, MIT): EC2 instances of one AWS
  account whose CPU utilisation was recorded over the same two weeks (4 in February 2014, 3 in April 2014),
  anomaly windows as NAB labels them; history = the first half.

Entities that are only labelled anomalous together (a service-wide disruption) are still scored: acting on one of
them is right (top-1) or wrong (another one), never a false action.
"""

from __future__ import annotations

import csv
import json
import re
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import numpy as np


@dataclass
class Segment:
    entity: int
    start: int
    end: int  # inclusive
    metrics: list[int] = field(default_factory=list)  # 0-based columns (empty: not labelled)


@dataclass
class Group:
    name: str
    names: list[str]  # entities
    train: np.ndarray  # [entities, time, metrics] history
    test: np.ndarray  # [entities, time, metrics] scored
    labels: np.ndarray  # [entities, time] anomalous
    segments: list[Segment]

    @property
    def normal(self) -> np.ndarray:
        return ~self.labels.any(axis=0)


@dataclass
class DataSet:
    name: str
    note: str  # source, licence, what a point is
    groups: list[Group]


def _natural(p: Path):
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", p.name)]


def _matrix(path: Path) -> np.ndarray:
    with path.open() as fh:
        rows = list(csv.reader(fh))
    try:
        return np.array([[float(v) for v in r[1:]] for r in rows[1:]])
    except ValueError as exc:
        raise SystemExit(f"{path}: not a table of numbers after its header and first column ({exc})") from None


def _segments_from(labels: np.ndarray) -> list[Segment]:
    out = []
    for e, row in enumerate(labels):
        edges = np.flatnonzero(np.diff(np.concatenate([[0], row.astype(int), [0]])))
        out += [Segment(e, int(a), int(b) - 1) for a, b in zip(edges[::2], edges[1::2])]
    return out


def layout(root: Path, name: str | None = None, most: int | None = None) -> DataSet:
    """A data set in ASD's layout: root/<entity>/{train,test,test_label}.csv and interpretation_label.txt
    (`start-end:metric,...`, 0-based inclusive rows, 1-based metrics)."""
    dirs = sorted((d for d in root.iterdir() if (d / "test.csv").exists()), key=_natural)[:most]
    if not dirs:
        raise SystemExit(f"no entity directories with test.csv under {root}")
    trains = [_matrix(d / "train.csv") for d in dirs]
    tests = [_matrix(d / "test.csv") for d in dirs]
    widths = {t.shape[1] for t in trains + tests}
    if len(widths) != 1:
        raise SystemExit(f"{root}: entities have different numbers of metrics {sorted(widths)}")
    T = max(len(t) for t in trains)
    train = np.full((len(dirs), T, widths.pop()), np.nan)
    for i, t in enumerate(trains):  # a shorter history is aligned on its end (just before the scored part)
        train[i, T - len(t):] = t
    length = min(len(t) for t in tests)
    test = np.stack([t[:length] for t in tests])
    labels = np.stack([_matrix(d / "test_label.csv")[:length, 0] for d in dirs]).astype(bool)
    segments = []
    for i, d in enumerate(dirs):
        interp = d / "interpretation_label.txt"
        if not interp.exists():
            segments += [Segment(i, s.start, s.end) for s in _segments_from(labels[i:i + 1])]
            continue
        for n, line in enumerate(interp.read_text().split("\n"), 1):
            if not line.strip():
                continue
            try:
                span, dims = line.split(":")
                a, b = (int(x) for x in span.split("-"))
                metrics = [int(x) - 1 for x in dims.split(",") if x.strip()]
            except ValueError:
                raise SystemExit(f"{interp}:{n}: not `start-end:metric,...`: {line!r}") from None
            if a < length:
                segments.append(Segment(i, a, min(b, length - 1), metrics))
    name = name or root.name
    return DataSet(name, f"{root} ({len(dirs)} entities, history = train split)",
                   [Group(name, [d.name for d in dirs], train, test, labels, segments)])


def _stamp(text: str) -> float:
    text = text.strip().strip('"').replace("Z", "")
    return datetime.fromisoformat(text).replace(tzinfo=timezone.utc).timestamp()


def _series_csv(path: Path, ts: str, value: str, label: str | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    with path.open() as fh:
        rows = list(csv.DictReader(fh))
    try:
        t = np.array([_stamp(r[ts]) for r in rows])
        v = np.array([float(r[value]) if r[value].strip() else np.nan for r in rows])  # an empty value: a gap
        lab = np.array([int(float(r[label])) for r in rows], bool) if label else np.zeros(len(rows), bool)
    except (KeyError, ValueError) as exc:
        raise SystemExit(f"{path}: expected columns {ts}, {value}{', ' + label if label else ''} ({exc})") from None
    return t, v, lab


def _group(name: str, series: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]], tolerance_s: float,
           history_share: float = 0.5) -> Group:
    """Sibling series on the first one's timestamps (each value the nearest within tolerance_s; NaN else),
    split into history and scored part."""
    names = list(series)
    grid = series[names[0]][0]
    values = np.full((len(names), grid.size, 1), np.nan)
    labels = np.zeros((len(names), grid.size), bool)
    for i, n in enumerate(names):
        t, v, lab = series[n]
        j = np.clip(np.searchsorted(t, grid), 1, max(1, t.size - 1))
        j = np.where(np.abs(t[j - 1] - grid) <= np.abs(t[np.minimum(j, t.size - 1)] - grid), j - 1, j)
        j = np.minimum(j, t.size - 1)
        ok = np.abs(t[j] - grid) <= tolerance_s
        values[i, ok, 0] = v[j[ok]]
        labels[i, ok] = lab[j[ok]]
    split = int(history_share * grid.size)
    test_labels = labels[:, split:]
    segments = [Segment(s.entity, s.start, s.end, [0]) for s in _segments_from(test_labels)]
    return Group(name, names, values[:, :split], values[:, split:], test_labels, segments)


def cloud(root: Path, least: int = 4) -> DataSet:
    """microsoft/cloud-monitoring-dataset: each data/<group>/ with `least` or more series on shared timestamps."""
    groups = []
    for d in sorted((root / "data").iterdir()):
        files = sorted(f for f in d.glob("*.csv"))
        series = {f.stem: _series_csv(f, "TimeStamp", "Value", "Label") for f in files}
        # the series that span the group's common period (a late or partial one is left out)
        spans = {n: (t[0], t[-1], t.size) for n, (t, _, _) in series.items()}
        common = max(spans.values(), key=lambda s: s[2])
        keep = {n: s for n, s in series.items() if spans[n][0] <= common[0] and spans[n][2] >= 0.95 * common[2]}
        if len(keep) < least:
            continue
        step = float(np.median(np.diff(keep[next(iter(keep))][0])))
        groups.append(_group(d.name, keep, 0.45 * step))
    if not groups:
        raise SystemExit(f"no group of {least} or more sibling series under {root / 'data'}")
    return DataSet("cloud", "microsoft/cloud-monitoring-dataset (MIT): sibling production series, expert labels; "
                   "history = first half", groups)


# EC2 instances of one account recorded over the same two weeks (NAB realAWSCloudwatch)
NAB_AWS = {"aws-feb": ["ec2_cpu_utilization_24ae8d", "ec2_cpu_utilization_53ea38", "ec2_cpu_utilization_5f5533",
                       "ec2_cpu_utilization_fe7f93"],
           "aws-apr": ["ec2_cpu_utilization_77c1ca", "ec2_cpu_utilization_ac20cd", "ec2_cpu_utilization_c6585a"]}


def nab_aws(root: Path) -> DataSet:
    base = root / "nab"
    windows = json.loads((base / "labels" / "combined_windows.json").read_text())
    groups = []
    for name, files in NAB_AWS.items():
        series = {}
        for f in files:
            t, v, _ = _series_csv(base / "data" / "realAWSCloudwatch" / f"{f}.csv", "timestamp", "value")
            lab = np.zeros(t.size, bool)
            for a, b in windows.get(f"realAWSCloudwatch/{f}.csv", []):
                lab |= (t >= _stamp(a.split(".")[0])) & (t <= _stamp(b.split(".")[0]))
            series[f.rsplit("_", 1)[1]] = (t, v, lab)
        groups.append(_group(name, series, 270.0))
    return DataSet("nab-aws", "NAB realAWSCloudwatch (MIT): EC2 CPU utilisation of instances recorded together, "
                   "NAB anomaly windows; history = first half", groups)


def asd(root: Path, servers: int = 12) -> DataSet:
    data = layout(root / "asd", "asd", most=servers)
    data.note = "InterFusion ASD (MIT): 12 servers x 19 metrics, 5-minute points, history = train split (30 days)"
    return data
