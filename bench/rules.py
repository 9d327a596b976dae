"""Rule learning on real third-party data: learn on the past, score on the future, against simple baselines.

Data (../shared/data, read in place): loghub BGL, HPC and Thunderbird 2k samples (log lines; BGL alert tags), NAB
realKnownCause + realAWSCloudwatch (metric series with labelled anomaly windows). Every data set is split in time
(`--split`, the older share learns). The learner is the one `sigma rules learn` runs (deterministic proposer,
repair, review with the default false-positive budget), fed with examples built from the data instead of the
controller database; learned rules are scored through the real matcher.

- logs, event = one line: precision, recall, F1 of "this line is an alert", learned rules vs a keyword list;
  one learning problem per alert category seen in the learning part.
  HPC has no alert labels upstream: it is scored against a proxy label named in the output (the line's State field
  says the component failed), not ground truth. Thunderbird's sample has no alert at all: learning on it must say
  so, and the false alarms of the BGL rules and of the keywords on its 2,000 healthy lines are reported.
- NAB, per series: examples are windows of `--window` samples. The incidents are the labelled anomaly points of
  the learning part (each gives the windows that contain it); healthy windows, every `--window/2` samples, touch
  no labelled anomaly window. Alarms are the scored part's windows (every `--window/2` samples) a rule matches. Event-level: a labelled
  window (in the scored part) is detected when an alarm falls in it; precision = alarms inside windows / alarms.
  Also the NAB score, standard profile (TP 1, FP 0.11, FN 1; earliest detection per window, scaled sigmoid,
  normalised 0 = no detections, 100 = perfect), over the scored part. Baseline: a static threshold at the
  learning part's mean +- 3 standard deviations, evaluated at the same alarm points.

usage: python bench/rules.py [--sets bgl hpc thunderbird nab] [--split 0.5] [--window 12] [--nab-files N]
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import re
import statistics
import sys
import time
from datetime import datetime
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from sigma.rules.learn import LearnError  # noqa: E402
from sigma.rules.learn.config import LearnConfig  # noqa: E402
from sigma.rules.learn.examples import Example, Problem, chronological_split  # noqa: E402
from sigma.rules.learn.learner import learn  # noqa: E402
from sigma.rules.learn.propose import DeterministicProposer  # noqa: E402
from sigma.rules.learn.review import hits, repair  # noqa: E402

DATA = Path(os.environ.get("SIGMA_DATA") or REPO.parent / "shared" / "data")  # $SIGMA_DATA: the shared data sets
KEYWORDS = re.compile(r"(?i)\b(error|fail\w*|fatal|exception|critical|panic|abort\w*|corrupt\w*|severe)\b")
HPC_PROXY_STATES = ("error", "state_change.unavailable", "clusterfilesystem.not_served",
                    "clusterfilesystem.no_server", "bcast-error")
DEFAULTS = LearnConfig()
NO_BREAKER = 10 ** 9  # a data set has no circuit breaker; the false-positive budget still applies


def learn_problem(problem: Problem) -> tuple[list, int, int, float]:
    """(accepted rules, proposed, accepted, wall s) for one problem, with the defaults `sigma rules learn` uses."""
    out = learn(problem, [DeterministicProposer(DEFAULTS.max_templates)], [], max_iterations=DEFAULTS.max_iterations,
                fp_budget=DEFAULTS.fp_budget, breaker_limit=NO_BREAKER, breaker_window_s=3600.0)
    best = out.best
    return ([best[0].rule] if best else []), out.proposed, len(out.accepted), out.wall_s


def prf(tp: int, fp: int, fn: int) -> tuple[float, float, float]:
    p = tp / (tp + fp) if tp + fp else 0.0
    r = tp / (tp + fn) if tp + fn else 0.0
    return p, r, (2 * p * r / (p + r) if p + r else 0.0)


# ---------- logs ----------

def read_lines(name: str) -> list[dict]:
    path = DATA / "loghub" / name / f"{name}_2k.log_structured.csv"
    rows = list(csv.DictReader(path.open(newline="", encoding="utf-8", errors="replace")))
    out = []
    for r in rows:
        if name == "HPC":
            ts, node, label = float(r["Time"]), r["Node"], r["State"] if r["State"] in HPC_PROXY_STATES else "-"
        elif name == "BGL":
            ts, node, label = float(r["Timestamp"]), r["Node"], r["Label"]
        else:
            ts, node, label = float(r["Timestamp"]), r["User"], r["Label"]
        out.append({"ts": ts, "node": node, "label": label, "message": r["Content"], "id": r["LineId"]})
    return sorted(out, key=lambda x: (x["ts"], int(x["id"])))


def line_example(line: dict, positive: bool) -> Example:
    ev = {"node": line["node"], "ts": line["ts"], "source": "log", "kind": "line", "message": line["message"]}
    return Example(line["node"], line["ts"] - 1.0, line["ts"], positive, f"line {line['id']}", events=[ev])


def log_set(name: str, split: float, extra_rules: list | None = None) -> dict:
    lines = read_lines(name)
    cut = int(len(lines) * split)
    past, future = lines[:cut], lines[cut:]
    t0 = time.monotonic()
    rules, proposed, accepted, problems, notes = [], 0, 0, 0, []
    for cause in sorted({x["label"] for x in past} - {"-"}):
        pos = [x for x in past if x["label"] == cause]
        neg = [x for x in past if x["label"] == "-"]
        k = max(1, round(len(pos) * 0.3)) if len(pos) > 1 else 0  # the newest of the past reviews, as in learn
        nk = max(1, round(len(neg) * 0.3))
        train = [line_example(x, True) for x in pos[:len(pos) - k]] + [line_example(x, False) for x in neg[:-nk]]
        test = ([line_example(x, True) for x in pos[len(pos) - k:]] if k else
                [line_example(x, True) for x in pos]) + [line_example(x, False) for x in neg[-nk:]]
        found, n_prop, n_acc, _ = learn_problem(Problem(cause, train, test, {}, in_sample=not k))
        rules += found
        proposed, accepted, problems = proposed + n_prop, accepted + n_acc, problems + 1
    if not problems:
        notes.append(LearnError(f"nothing to learn: no alert line among the {len(past)} learning lines").args[0])
    wall = time.monotonic() - t0
    truth = [x["label"] != "-" for x in future]
    learned = [hits(rules, line_example(x, False)) for x in future] if rules else [False] * len(future)
    keywords = [bool(KEYWORDS.search(x["message"])) for x in future]
    seen = {x["label"] for x in past} - {"-"}
    coming = {x["label"] for x in future} - {"-"}
    notes.append(f"alert categories in the scored part: {len(coming)}, of which seen in the learning part: "
                 f"{len(coming & seen)} ({', '.join(sorted(coming & seen)) or 'none'})")
    out = {"set": name, "lines": len(lines), "scored": len(future), "alerts": sum(truth), "problems": problems,
           "proposed": proposed, "accepted": accepted, "rules": [r.id for r in rules],
           "learn_wall_s": round(wall, 2), "notes": notes, "_rules": rules}
    for key, pred in (("learned", learned), ("keywords", keywords)):
        tp = sum(p and t for p, t in zip(pred, truth))
        fp = sum(p and not t for p, t in zip(pred, truth))
        fn = sum(t and not p for p, t in zip(pred, truth))
        out[key] = {"tp": tp, "fp": fp, "fn": fn, "prf": prf(tp, fp, fn)}
    if extra_rules is not None:
        out["foreign"] = sum(hits(extra_rules, line_example(x, False)) for x in future) if extra_rules else 0
    return out


# ---------- NAB ----------

STANDARD = {"tp": 1.0, "fp": 0.11, "fn": 1.0}


def parse_ts(text: str) -> float:
    return datetime.strptime(text[:19], "%Y-%m-%d %H:%M:%S").timestamp()


def scaled_sigmoid(x: float) -> float:
    return -1.0 if x > 3.0 else 2.0 / (1.0 + math.exp(5.0 * x)) - 1.0


def nab_raw(detections: list[float], windows: list[tuple[float, float]], lo: float) -> float:
    """NAB sweeper scoring (standard profile) of detections at or after lo against windows that start after lo."""
    score, detected = 0.0, set()
    for t in sorted(d for d in detections if d >= lo):
        inside = next((i for i, (a, b) in enumerate(windows) if a <= t <= b), None)
        if inside is not None:
            if inside not in detected:  # only the earliest detection of a window counts
                detected.add(inside)
                a, b = windows[inside]
                score += STANDARD["tp"] * scaled_sigmoid(-(b - t) / (b - a)) / scaled_sigmoid(-1.0)
            continue
        before = [w for w in windows if w[1] < t]
        if before:
            a, b = before[-1]
            score += STANDARD["fp"] * scaled_sigmoid(abs(t - b) / (b - a))
        else:
            score -= STANDARD["fp"]
    return score - STANDARD["fn"] * (len(windows) - len(detected))


def nab_file(rel: str, windows_all: list, point_labels: list, split: float, window: int) -> dict:
    rows = list(csv.DictReader((DATA / "nab" / "data" / rel).open()))
    ts = [parse_ts(r["timestamp"]) for r in rows]
    vals = [float(r["value"]) for r in rows]
    windows = [(parse_ts(a), parse_ts(b)) for a, b in windows_all]
    points = {parse_ts(p) for p in point_labels}
    cut = int(len(rows) * split)
    step = max(1, window // 2)
    span = ts[window] - ts[0] if len(ts) > window else 300.0 * window
    samples = [{"node": "series", "ts": t, "metric": "value", "value": v, "labels": {}} for t, v in zip(ts, vals)]

    def example(end_i: int, positive) -> Example:
        t_end = ts[end_i]
        rows_ = samples[max(0, end_i - window + 1): end_i + 1]
        return Example("series", t_end - span, t_end, bool(positive), f"row {end_i}", samples=rows_)

    # incidents are the labelled anomaly points: each gives the windows that contain it (as a fault's window
    # around its time in the controller); healthy windows are those that touch no labelled anomaly window
    in_window = [any(a <= t <= b for a, b in windows) for t in ts]
    point_rows = [i for i, t in enumerate(ts) if t in points and i < cut]
    pos_ends = sorted({i + j for i in point_rows for j in range(window) if i + j < cut})
    past_pos = [example(i, True) for i in pos_ends]
    past_neg = [example(i, False) for i in range(window - 1, cut, step)
                if not any(in_window[max(0, i - window + 1): i + 1])]
    future = [example(i, None) for i in range(max(cut, window - 1), len(rows), step)]
    t0 = time.monotonic()
    rules, proposed, accepted, note = [], 0, 0, ""
    if not point_rows:
        note = "no labelled anomaly in the learning part: too few incidents, nothing learned"
    else:
        train, test, in_sample = chronological_split(past_pos, past_neg, DEFAULTS.test_fraction)
        rules, proposed, accepted, _ = learn_problem(Problem(rel, train, test, {}, in_sample=in_sample))
    wall = time.monotonic() - t0
    mu, sd = statistics.fmean(vals[:cut]), statistics.pstdev(vals[:cut]) or 1e-9
    static = [repair({"id": "static-high", "description": "static threshold", "severity": "error", "action": "drain",
                      "metric": {"metric": "value", "agg": "max", "op": ">", "value": mu + 3 * sd,
                                 "window_s": span + 1}}),
              repair({"id": "static-low", "description": "static threshold", "severity": "error", "action": "drain",
                      "metric": {"metric": "value", "agg": "min", "op": "<", "value": mu - 3 * sd,
                                 "window_s": span + 1}})]
    lo = ts[cut]
    scored_windows = [w for w in windows if w[0] >= lo]
    out = {"file": rel, "rows": len(rows), "windows": len(scored_windows), "proposed": proposed,
           "accepted": accepted, "learn_wall_s": wall, "note": note,
           "rules": [json.dumps({k: v for k, v in (r.metric.__dict__ if r.metric else {}).items()
                                 if k in ("agg", "op", "value")}) for r in rules]}
    for key, rs in (("learned", rules), ("static", static)):
        alarms = [e.end for e in future if rs and hits(rs, e)]
        detected = sum(any(a <= t <= b for t in alarms) for a, b in scored_windows)
        inside = sum(any(a <= t <= b for a, b in scored_windows) for t in alarms)
        out[key] = {"alarms": len(alarms), "inside": inside, "detected": detected,
                    "raw": nab_raw(alarms, scored_windows, lo)}
    out["null"] = -STANDARD["fn"] * len(scored_windows)
    out["perfect"] = float(len(scored_windows))
    return out


def nab_set(split: float, window: int, limit: int | None) -> dict:
    labels = json.loads((DATA / "nab" / "labels" / "combined_windows.json").read_text())
    points = json.loads((DATA / "nab" / "labels" / "combined_labels.json").read_text())
    files = sorted(str(p.relative_to(DATA / "nab" / "data")) for p in (DATA / "nab" / "data").glob("*/*.csv"))
    files = files[:limit] if limit else files
    per = [nab_file(f, labels.get(f, []), points.get(f, []), split, window) for f in files]
    out = {"set": "NAB", "files": len(per), "windows": sum(p["windows"] for p in per),
           "proposed": sum(p["proposed"] for p in per), "accepted": sum(p["accepted"] for p in per),
           "learned_files": sum(1 for p in per if p["rules"]), "learn_wall_s": round(sum(p["learn_wall_s"]
                                                                                         for p in per), 2),
           "per_file": per}
    null, perfect = sum(p["null"] for p in per), sum(p["perfect"] for p in per)
    for key in ("learned", "static"):
        alarms = sum(p[key]["alarms"] for p in per)
        inside = sum(p[key]["inside"] for p in per)
        detected = sum(p[key]["detected"] for p in per)
        precision = inside / alarms if alarms else 0.0
        recall = detected / out["windows"] if out["windows"] else 0.0
        f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
        raw = sum(p[key]["raw"] for p in per)
        out[key] = {"alarms": alarms, "detected": detected, "prf": (precision, recall, f1),
                    "nab": 100 * (raw - null) / (perfect - null) if perfect != null else 0.0}
    return out


# ---------- output ----------

def fmt(prf_: tuple) -> str:
    return "  ".join(f"{x:.3f}" for x in prf_)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sets", nargs="+", default=["bgl", "hpc", "thunderbird", "nab"],
                    choices=["bgl", "hpc", "thunderbird", "nab"])
    ap.add_argument("--split", type=float, default=0.5, help="older share of each data set that learns")
    ap.add_argument("--window", type=int, default=12, help="NAB: samples per example window")
    ap.add_argument("--nab-files", type=int, default=None, help="NAB: only the first N files (quick runs)")
    args = ap.parse_args()
    if not (DATA / "loghub").is_dir() or not (DATA / "nab").is_dir():
        raise SystemExit(f"no loghub or NAB data under {DATA}: set SIGMA_DATA to the directory of the shared data sets")
    print(f"rule learning, learn on the oldest {args.split:.0%}, score on the rest (deterministic proposer, "
          f"fp_budget {DEFAULTS.fp_budget}, max_iterations {DEFAULTS.max_iterations})\n")
    bgl = None
    if "thunderbird" in args.sets and "bgl" not in args.sets:
        bgl = log_set("BGL", args.split)  # its rules are tried on Thunderbird's healthy lines
    print(f"{'data set':<12} {'detector':<9} {'precision':>9} {'recall':>7} {'F1':>6}   details")
    for name in [s for s in args.sets if s != "nab"]:
        loghub = {"bgl": "BGL", "hpc": "HPC", "thunderbird": "Thunderbird"}[name]
        r = log_set(loghub, args.split, extra_rules=(bgl["_rules"] if bgl else []) if name == "thunderbird" else None)
        if name == "bgl":
            bgl = r
        label = " (proxy labels: State in " + "/".join(HPC_PROXY_STATES) + ")" if name == "hpc" else ""
        for key in ("learned", "keywords"):
            d = r[key]
            print(f"{loghub:<12} {key:<9} {d['prf'][0]:>9.3f} {d['prf'][1]:>7.3f} {d['prf'][2]:>6.3f}   "
                  f"tp {d['tp']} fp {d['fp']} fn {d['fn']} of {r['scored']} lines, {r['alerts']} alerts{label}")
        print(f"{'':<12} learning: {r['problems']} causes, {r['proposed']} rules proposed, {r['accepted']} accepted, "
              f"{len(r['rules'])} kept, {r['learn_wall_s']:.2f} s")
        for n in r["notes"]:
            print(f"{'':<12} {n}")
        if "foreign" in r:
            print(f"{'':<12} BGL-learned rules on these {r['scored']} healthy lines: {r['foreign']} false alarms; "
                  f"keywords: {r['keywords']['fp']}")
    if "nab" in args.sets:
        r = nab_set(args.split, args.window, args.nab_files)
        for key in ("learned", "static"):
            d = r[key]
            print(f"{'NAB':<12} {key:<9} {d['prf'][0]:>9.3f} {d['prf'][1]:>7.3f} {d['prf'][2]:>6.3f}   "
                  f"NAB standard {d['nab']:.1f}; {d['detected']}/{r['windows']} windows, {d['alarms']} alarms")
        print(f"{'':<12} learning: {r['files']} series, {r['proposed']} rules proposed, {r['accepted']} accepted, "
              f"rules for {r['learned_files']} series, {r['learn_wall_s']:.2f} s")
        skipped = [p for p in r["per_file"] if p["note"]]
        if skipped:
            print(f"{'':<12} {len(skipped)} series had no labelled anomaly in the learning part "
                  f"(nothing learned: too few incidents)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
