"""Early collapse warning from the KPIs a run already writes (`sigma collapse check`).

Signals, each with the step it was first seen (the first three read the precursors the trainer measures on the
steps it reports the norms, sigma/train/precursors.py; "in two reports in a row": one noisy report is not a trend):
  attn_logits   the largest attention logit of some layer is above `attn_logit` in two reports in a row: the
                attention-logit growth that precedes a divergence without qk-norm (Wortsman et al. 2023)
  log_z_drift   the output logits' mean log Z moved more than `log_z` from its first report, in two reports in a row
                (the output-logit divergence z-loss prevents)
  router_collapse  some MoE layer's router entropy (over that of a uniform router) is below `router_entropy` in two
                reports in a row: the router sends its tokens to the same experts whatever they are
  norm_valley   the layer-wise MoE parameter-norm profile dips in the middle layers below both ends by more than
                `valley` (relative) in two reports in a row (the paper's precursor of a collapse)
  norm_growth   some MoE layer's parameter norm grew by more than `growth` (relative) between two reports (after
                the first `window` steps, whose growth from the initialisation is normal)
  grad_spikes   more than `spike_rate` of the last `window` steps were spikes: a gradient norm above
                `spike_factor` x the median of the `window` steps before it (each step against its own past, so the
                falling gradient norm of a run's first steps is not mistaken for spikes)
  load_skew     the busiest expert of some MoE layer took more than `load_skew` x the mean load (at most
                n_experts / top_k: the debug preset's 4 experts, top 2, cannot pass 2)
  diverged      the loss is non-finite, or its moving average (over `window` steps) stays above `diverge` x the
                lowest moving average so far for `window` steps in a row (the collapse itself; a noisy step or a
                spike the run recovers from does not count). Its step is the first of those steps.
Verdict: collapsing when diverged; warning when any other signal fired; else healthy.
"""

from __future__ import annotations

import json
import math
import os
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class Thresholds:
    valley: float = 0.1
    growth: float = 0.5
    spike_factor: float = 3.0
    spike_rate: float = 0.1
    window: int = 20
    load_skew: float = 4.0
    # Set on bench/collapse.py's tuning seeds, at least twice as far from the extreme of its runs that did not
    # diverge (largest logit 163, log Z drift 1.15, lowest router entropy 0.214) as that extreme
    attn_logit: float = 350.0
    log_z: float = 2.5
    router_entropy: float = 0.1
    diverge: float = 1.1


@dataclass
class Verdict:
    state: str  # healthy | warning | collapsing
    first: dict[str, int] = field(default_factory=dict)  # signal -> first step
    evidence: dict[str, str] = field(default_factory=dict)
    norms: list[tuple[int, list[float]]] = field(default_factory=list)  # (step, per-layer norms)
    precursors: list[tuple[int, float, float]] = field(default_factory=list)  # (step, largest logit, lowest entropy)
    last_step: int = 0

    @property
    def warning_step(self) -> int | None:
        steps = [s for k, s in self.first.items() if k != "diverged"]
        return min(steps) if steps else None

    def to_dict(self) -> dict:
        return {"state": self.state, "first": self.first, "evidence": self.evidence, "warning_step": self.warning_step,
                "diverged_step": self.first.get("diverged"), "last_step": self.last_step}


def _number(value) -> float:
    try:
        return float(value)  # NaN/Inf are written as strings ("nan")
    except (TypeError, ValueError):
        return math.nan


def read_metrics(paths: list[Path]) -> list[dict]:
    """Metric lines of rank 0 (or of the lowest rank present), by step; torn or foreign lines are skipped."""
    rows: dict[int, dict] = {}
    for path in paths:
        for number, line in enumerate(Path(path).read_text().splitlines(), 1):
            try:
                d = json.loads(line)
            except json.JSONDecodeError:
                continue
            if not isinstance(d, dict) or "step" not in d or "event" in d:
                continue
            rows.setdefault(int(d["step"]), d)
    return [rows[s] for s in sorted(rows)]


def assess(metrics: list[dict], th: Thresholds | None = None) -> Verdict:
    th = th or Thresholds()
    v = Verdict("healthy")
    best, grads, spiked, prev_norms, ema, seen, dipped = math.inf, [], [], None, None, 0, False
    above = None  # (first step, moving average) of the current excursion above diverge x best
    alpha = 2.0 / (th.window + 1)

    def fire(signal: str, step: int, text: str) -> None:
        if signal not in v.first:
            v.first[signal], v.evidence[signal] = step, text

    streak: dict[str, int] = {}

    def persist(signal: str, hit: bool, step: int, text: str) -> None:
        """Fire on the second report in a row past the threshold (one noisy report is not a trend)."""
        streak[signal] = streak.get(signal, 0) + 1 if hit else 0
        if streak[signal] >= 2:
            fire(signal, step, text)

    log_z0 = None

    for row in metrics:
        step = int(row["step"])
        v.last_step = step
        loss = _number(row.get("loss"))
        if not math.isfinite(loss):
            fire("diverged", step, f"loss {row.get('loss')} at step {step}")
        else:
            ema = loss if ema is None else ema + alpha * (loss - ema)
            seen += 1
            if seen > th.window and ema > th.diverge * best:  # the first window is the start-up transient
                above = above or (step, ema)
                if step - above[0] + 1 >= th.window:
                    fire("diverged", above[0], f"loss average {above[1]:.3f} at step {above[0]}, over "
                                               f"{th.diverge} x its lowest {best:.3f}, and above that through step "
                                               f"{step}")
            else:
                above = None
                best = min(best, ema)
        g = _number(row.get("grad_norm"))
        if math.isfinite(g):
            if len(grads) >= th.window:
                spiked.append(g > th.spike_factor * statistics.median(grads[-th.window:]))
                spikes = sum(spiked[-th.window:])
                if spikes / th.window > th.spike_rate:
                    fire("grad_spikes", step, f"{spikes} of the last {th.window} steps had a gradient norm above "
                                              f"{th.spike_factor} x the median of the {th.window} steps before it")
            grads.append(g)
        norms = row.get("moe_param_norm")
        if isinstance(norms, list) and norms and all(math.isfinite(_number(n)) for n in norms):
            norms = [float(n) for n in norms]
            v.norms.append((step, norms))
            if len(norms) >= 3:
                ends = min(norms[0], norms[-1])
                dip = (ends - min(norms[1:-1])) / ends if ends > 0 else 0.0
                if dip > th.valley and dipped:
                    fire("norm_valley", step, f"middle MoE layers' norm {min(norms[1:-1]):.3f} is {100 * dip:.1f}% "
                                              f"below the end layers' {ends:.3f} (profile {_fmt(norms)})")
                dipped = dip > th.valley
            if prev_norms and len(prev_norms) == len(norms) and step > th.window:  # not the start-up growth
                growth = max((b - a) / a for a, b in zip(prev_norms, norms) if a > 0)
                if growth > th.growth:
                    fire("norm_growth", step, f"an MoE layer's parameter norm grew {100 * growth:.0f}% since the "
                                              f"last report (profile {_fmt(norms)})")
            prev_norms = norms
        logits = _finite_list(row.get("attn_logit_max"))
        if logits:
            top = max(logits)
            persist("attn_logits", top > th.attn_logit, step,
                    f"largest attention logit {top:.1f} (layer {logits.index(top)}) above {th.attn_logit}")
        log_z = _number(row.get("output_log_z"))
        if math.isfinite(log_z):
            log_z0 = log_z if log_z0 is None else log_z0
            persist("log_z_drift", abs(log_z - log_z0) > th.log_z, step,
                    f"output log Z {log_z:.2f} drifted {log_z - log_z0:+.2f} from its first report {log_z0:.2f}")
        entropy = _finite_list(row.get("router_entropy"))
        if entropy:  # no start-up transient to skip: a fresh router's scores are near uniform (entropy ~1)
            low = min(entropy)
            persist("router_collapse", low < th.router_entropy, step,
                    f"MoE layer {entropy.index(low)}'s router entropy {low:.3f} of the uniform's, below "
                    f"{th.router_entropy}: its tokens go to the same experts whatever they are")
        if logits and entropy:
            v.precursors.append((step, max(logits), min(entropy)))
        loads = row.get("expert_load")
        if isinstance(loads, list):
            for layer, load in enumerate(loads):
                if isinstance(load, list) and load and sum(load) > 0:
                    skew = max(load) / (sum(load) / len(load))
                    if skew > th.load_skew:
                        fire("load_skew", step, f"MoE layer {layer}: busiest expert takes {skew:.1f} x the mean load")
    v.state = "collapsing" if "diverged" in v.first else ("warning" if v.first else "healthy")
    return v


def _finite_list(values) -> list[float]:
    if not isinstance(values, list) or not values:
        return []
    numbers = [_number(x) for x in values]
    return numbers if all(math.isfinite(x) for x in numbers) else []


def _fmt(norms: list[float]) -> str:
    return "[" + ", ".join(f"{n:.2f}" for n in norms) + "]"


def kpi_files(job: int | None, kpi: str | None, kpi_dir: str | None) -> list[Path]:
    if kpi:
        path = Path(kpi)
        if not path.is_file():
            raise FileNotFoundError(f"{path}: no such KPI file")
        return [path]
    from sigma.train.kpi import DEFAULT_KPI_DIR

    root = Path(kpi_dir or os.environ.get("SIGMA_KPI_DIR") or DEFAULT_KPI_DIR) / f"job-{job}"
    files = sorted(root.glob("rank-0.*.jsonl")) or sorted(p for p in root.glob("rank-*.jsonl")
                                                          if not p.name.startswith("rank-collapse."))
    if not files:
        raise FileNotFoundError(f"{root}: no KPI files of job {job} (--kpi-dir or $SIGMA_KPI_DIR)")
    return files[:1]


def plot(verdict: Verdict, out: str | Path, title: str = "") -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if not verdict.norms:
        raise ValueError("no moe_param_norm in these KPIs: the run needs kpi.param_norm_every > 0")
    fig, axes = plt.subplots(1, 3 if verdict.precursors else 2, figsize=(16 if verdict.precursors else 11, 4))
    a, b = axes[0], axes[1]
    steps = [s for s, _ in verdict.norms]
    layers = len(verdict.norms[0][1])
    for i in range(layers):
        a.plot(steps, [n[i] if i < len(n) else math.nan for _, n in verdict.norms], label=f"MoE layer {i}")
    a.set_xlabel("step"), a.set_ylabel("parameter L2 norm"), a.legend(fontsize=7)
    picks = sorted({0, len(verdict.norms) // 2, len(verdict.norms) - 1})
    for k in picks:
        step, norms = verdict.norms[k]
        b.plot(range(len(norms)), norms, marker="o", label=f"step {step}")
    b.set_xlabel("MoE layer"), b.set_ylabel("parameter L2 norm"), b.set_title("profile over depth"), b.legend(fontsize=7)
    if verdict.precursors:
        c, steps = axes[2], [s for s, _, _ in verdict.precursors]
        c.semilogy(steps, [p[1] for p in verdict.precursors], color="tab:red", label="largest attention logit")
        c.set_xlabel("step"), c.set_ylabel("attention logit", color="tab:red")
        d = c.twinx()
        d.plot(steps, [p[2] for p in verdict.precursors], color="tab:blue", label="lowest router entropy")
        d.set_ylabel("router entropy / uniform", color="tab:blue"), d.set_ylim(0, 1.05)
        c.set_title("precursors")
    fig.suptitle(f"{title} {verdict.state}".strip())
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)


def emit(kpi_file: Path, verdict: Verdict) -> Path:
    """A `collapse_warning` event in rank-collapse.<node>.jsonl beside the job's rank files (the sidecar tails
    rank-*.<node>.jsonl), once per state and first step."""
    from sigma.train.kpi import _clean

    node = kpi_file.name.split(".", 1)[1].rsplit(".jsonl", 1)[0]
    job = kpi_file.parent.name.removeprefix("job-")
    out = kpi_file.parent / f"rank-collapse.{node}.jsonl"
    first = sorted(verdict.first.items(), key=lambda kv: kv[1])
    message = f"{verdict.state}: " + "; ".join(f"{k} from step {s}: {verdict.evidence[k]}" for k, s in first)
    line = {"ts": time.time(), "job_id": int(job) if job.isdigit() else 0, "rank": 0, "event": "collapse_warning",
            "message": message, "state": verdict.state, "warning_step": verdict.warning_step,
            "diverged_step": verdict.first.get("diverged")}
    if out.is_file() and any(f'"message":{json.dumps(message)}' in prev for prev in out.read_text().splitlines()):
        return out
    with open(out, "a", encoding="utf-8") as f:
        f.write(json.dumps(_clean(line), separators=(",", ":")) + "\n")
    owner = kpi_file.stat()
    if os.geteuid() == 0 and (owner.st_uid, owner.st_gid) != (0, 0):
        # The sidecar reads only files of the job's user: run from root's cron, hand the file to that user.
        os.chown(out, owner.st_uid, owner.st_gid)
    return out


# ---------------------------------------------------------------- CLI

def register(subparsers) -> None:
    parser = subparsers.add_parser("collapse", help="early warning of a training collapse from a job's KPIs")
    sub = parser.add_subparsers(dest="collapse_command", metavar="SUBCOMMAND", required=True)
    chk = sub.add_parser("check", help="healthy / warning / collapsing, with the evidence and first steps")
    src = chk.add_mutually_exclusive_group(required=True)
    src.add_argument("--job", type=int, help="SLURM job id: reads <KPI dir>/job-<id>/rank-0.*.jsonl")
    src.add_argument("--kpi", help="a KPI file (rank-<r>.<node>.jsonl)")
    chk.add_argument("--kpi-dir", help="KPI root (default: $SIGMA_KPI_DIR, else /var/spool/sigma/kpi)")
    chk.add_argument("--plot", metavar="PNG", help="draw the MoE parameter-norm profile over steps")
    chk.add_argument("--json", action="store_true")
    chk.add_argument("--emit", action="store_true",
                     help="on warning/collapsing, append a `collapse_warning` KPI event next to the job's KPI files "
                          "(the controller's kpi-collapse-warning rule notifies on it)")
    for name, default in vars(Thresholds()).items():
        chk.add_argument(f"--{name.replace('_', '-')}", type=type(default), default=default,
                         help=f"threshold (default: %(default)s; module docstring of sigma/train/collapse.py)")
    chk.set_defaults(func=run_check)


def run_check(args) -> int:
    th = Thresholds(**{k: getattr(args, k) for k in vars(Thresholds())})
    try:
        files = kpi_files(args.job, args.kpi, args.kpi_dir)
    except FileNotFoundError as exc:
        print(f"sigma collapse: error: {exc}", file=sys.stderr)
        return 2
    metrics = read_metrics(files)
    if not metrics:
        print(f"sigma collapse: error: {files[0]}: no metric lines (step, loss, ...)", file=sys.stderr)
        return 2
    verdict = assess(metrics, th)
    if args.plot:
        try:
            plot(verdict, args.plot, str(files[0].parent.name))
        except ValueError as exc:
            print(f"sigma collapse: error: {exc}", file=sys.stderr)
            return 2
    if args.emit and verdict.state != "healthy":
        emit(files[0], verdict)
    if args.json:
        print(json.dumps(verdict.to_dict(), indent=1))
    else:
        print(f"{verdict.state} (steps 1..{verdict.last_step} of {files[0]})")
        for signal, step in sorted(verdict.first.items(), key=lambda kv: kv[1]):
            print(f"  {signal:<15} first at step {step}: {verdict.evidence[signal]}")
    return {"healthy": 0, "warning": 1, "collapsing": 3}[verdict.state]
