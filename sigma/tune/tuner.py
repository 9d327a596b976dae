"""The two phases of `sigma tune`, their state on disk (so `--resume` goes on where a run stopped), and the result.

    state = Tuner(request).run()      # phase 1 (or the fabric file), phase 2, the chosen layout's trainer config

Files under the output directory: `phase1.json` (what the profiling job measured), `measured.jsonl` (one line per
layout timed for real, appended as the job goes), `result.json` (every candidate: measured, predicted or pruned
and why) and `<name>-tuned.yaml` (the chosen layout as a trainer config).
"""

from __future__ import annotations

import json
import math
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from sigma.config import ConfigError
from sigma.train.config import ModelConfig, load_model_config
from sigma.tune.cost import Costs, Link, fit_affine, fit_links, predict
from sigma.tune.space import Layout, Space, enumerate_layouts, explain_empty

GIB = 1 << 30


class TuneError(RuntimeError):
    """A tuning run that cannot go on; partial results stay on disk for `--resume`."""


@dataclass
class Request:
    config: str  # trainer preset (configs/train/<name>.yaml)
    nodes: int
    gpus_per_node: int
    global_batch: int
    out: Path
    overrides: list[str] = field(default_factory=list)
    budget_min: float | None = None
    measure: int = 3  # the few best the cost model ranks, timed for real
    steps: int = 3  # timed steps (interleaved rounds) per measured layout at least, after a warm-up
    max_steps: int = 12  # at most, while the fastest is not yet told apart from the runner-up
    memory_gb: float | None = None  # per rank; None: the platform's (phase 1), or the fabric's
    max_tp: int | None = None  # default: gpus_per_node
    resume: bool = False
    what_if: str | None = None  # a fabric file: phase 2 on the cost model alone
    profile_nodes: int = 2  # the small allocation of phase 1
    recompute: bool = False  # also search MoE recompute (always with --what-if)
    threads: int = 1


class Tuner:
    def __init__(self, req: Request, progress=None):
        from sigma.train.train_config import load_train_config

        self.req = req
        self.cfg = load_train_config(req.config, list(req.overrides))
        self.model: ModelConfig = load_model_config(self.cfg.model, self.cfg.model_overrides)
        self.seq_len = self.cfg.data.seq_len
        self.world = req.nodes * req.gpus_per_node
        self.progress = progress  # rich Progress, or None
        req.out.mkdir(parents=True, exist_ok=True)
        self.phase1_path = req.out / "phase1.json"
        self.measured_path = req.out / "measured.jsonl"
        if not req.resume:
            for path in (self.phase1_path, self.measured_path):
                path.unlink(missing_ok=True)

    # ------------------------------------------------------------ phase 1

    def costs(self) -> Costs:
        if self.req.what_if:
            return fabric_costs(self.req.what_if, self.model, self.seq_len)
        if self.phase1_path.exists():
            raw = json.loads(self.phase1_path.read_text())
        else:
            raw = self._profile()
            self.phase1_path.write_text(json.dumps(raw, indent=1))
        return fit_costs(raw, self.req.gpus_per_node, self._memory_bytes(), self.model)

    def _memory_bytes(self) -> float:
        if self.req.memory_gb:
            return self.req.memory_gb * GIB
        import psutil

        return psutil.virtual_memory().total / self.req.gpus_per_node  # a rank's share of one node

    def _executor(self, nodes: int, name: str):
        from sigma.train.launch import make_executor
        from sigma.train.train_config import load_train_config

        folder = self.req.out / "submitit"
        cfg = load_train_config(self.req.config, list(self.req.overrides) + [
            f"launch.nodes={nodes}", f"launch.gpus_per_node={self.req.gpus_per_node}", f"launch.folder={folder}",
            f"threads={self.req.threads}"])
        executor = make_executor(cfg)
        executor.update_parameters(name=f"sigma-tune-{name}")
        return executor

    def _wait(self, job, what: str, count=None, total: int = 0):
        """Wait for a submitit job with a progress bar; count(): items done so far (for phase 2)."""
        task = self.progress.add_task(what, total=total or None) if self.progress else None
        try:
            while not job.done():
                if task is not None and count:
                    self.progress.update(task, completed=count())
                time.sleep(1.0)
            if task is not None:
                self.progress.update(task, completed=count() if count else 1, total=total or 1)
            return job.results()
        except Exception as exc:
            said = (str(exc).strip().splitlines() or [type(exc).__name__])[-1][:400]
            raise TuneError(f"{what} (job {job.job_id}) failed: {said}; its "
                            f"log is {job.paths.stderr}; what was measured is kept under {self.req.out}: run "
                            f"again with --resume") from None

    def _profile(self) -> dict:
        nodes = min(self.req.profile_nodes, self.req.nodes)
        local = max(1, self.req.global_batch // self.world)  # sequences per rank at dp = world
        mbs = sorted({m for m in (1, 2, 4, 8) if m <= max(4, local)})  # >= 3 points for the affine fits
        from sigma.tune.profile import ProfileTask

        spec = {"model": self.cfg.model, "model_overrides": self.cfg.model_overrides, "seq_len": self.seq_len,
                "mbs": mbs, "threads": self.req.threads, "max_tp": self.req.max_tp or self.req.gpus_per_node}
        job = self._executor(nodes, "profile").submit(ProfileTask(spec))
        results = self._wait(job, f"phase 1: profiling on {nodes} x {self.req.gpus_per_node} ranks")
        raw = next(r for r in results if r)
        raw["mbs"] = mbs
        return raw

    # ------------------------------------------------------------ phase 2

    def candidates(self, costs: Costs) -> list[dict]:
        """Every valid layout with its prediction and status: ranked, or pruned (memory, dominated) with why."""
        space = Space(max_tp=self.req.max_tp or self.req.gpus_per_node,
                      vpps=(1, 2, 4) if self.req.what_if else (1, 2), max_mbs=8,
                      recompute=(False, True) if self.req.what_if or self.req.recompute else (False,))
        layouts = enumerate_layouts(self.world, self.model, self.req.global_batch, space)
        if not layouts:
            raise ConfigError("[--global-batch]", explain_empty(self.world, self.model, self.req.global_batch))
        rows = []
        for layout, dims in layouts:
            pred = predict(costs, self.model, dims, layout.mbs, self.seq_len, layout.zero, layout.recompute)
            rows.append({"layout": layout, "dims": dims, "dp": dims.dp, "predicted_s": pred.step_s,
                         "parts": pred.parts, "memory_bytes": pred.memory_bytes, "status": "ranked", "why": ""})
        limit = costs.memory_bytes
        for row in rows:
            if limit and row["memory_bytes"] > limit:
                row["status"], row["why"] = "pruned", (f"memory: {row['memory_bytes'] / GIB:.1f} GiB > "
                                                       f"{limit / GIB:.1f} GiB")
        fits = [r for r in rows if r["status"] == "ranked"]
        if not fits:
            smallest = min(rows, key=lambda r: r["memory_bytes"])
            raise TuneError(f"{self.cfg.model} fits no layout of {self.world} ranks: the smallest, "
                            f"{smallest['layout'].name()}, needs {smallest['memory_bytes'] / GIB:.1f} GiB per rank, "
                            f"the limit is {limit / GIB:.1f} GiB (--memory-gb)")
        # dominated: another layout that fits is at least as fast with at most as much memory (one strictly)
        by_time = sorted(fits, key=lambda r: (r["predicted_s"], r["memory_bytes"]))
        best_mem = math.inf
        best_name = ""
        for row in by_time:
            if row["memory_bytes"] >= best_mem:
                row["status"], row["why"] = "pruned", f"dominated by {best_name}"
            else:
                best_mem, best_name = row["memory_bytes"], row["layout"].name()
        keep_despite_model(by_time, costs.band)
        ranked = sorted((r for r in rows if r["status"] == "ranked"), key=lambda r: r["predicted_s"])
        for i, row in enumerate(ranked, 1):
            row["rank"] = i
        return rows

    def measure(self, rows: list[dict], budget_s: float | None = None, group: int | None = None,
                reference: Layout | None = None) -> dict[str, dict]:
        """Time the chosen rows for real, interleaved (sigma.tune.measure); those already in measured.jsonl are
        kept, not timed again. group: layouts timed together (all by default); reference: a layout timed in every
        group, to compare groups; budget_s: seconds of timed rounds per group at most."""
        done = read_measured(self.measured_path)
        todo = [r["layout"] for r in rows if r["layout"].name() not in done]
        if todo:
            from sigma.tune.measure import MeasureTask

            spec = {"model": self.cfg.model, "model_overrides": self.cfg.model_overrides, "seq_len": self.seq_len,
                    "global_batch": self.req.global_batch, "min_rounds": self.req.steps,
                    "max_rounds": max(self.req.steps, self.req.max_steps), "budget_s": budget_s,
                    "threads": self.req.threads, "layouts": [l.as_dict() for l in todo],
                    "results": str(self.measured_path), "group": group,
                    "reference": reference.as_dict() if reference else None}
            job = self._executor(self.req.nodes, "measure").submit(MeasureTask(spec))
            before = len(done)
            self._wait(job, f"phase 2: measuring {len(todo)} layout(s) on {self.world} ranks",
                       count=lambda: len(read_measured(self.measured_path)) - before, total=len(todo))
            done = read_measured(self.measured_path)
        return done

    def how_many(self, ranked: list[dict]) -> int:
        """The few best: --measure, fewer when --budget minutes cannot pay for them (predicted step x steps + start)."""
        n = min(self.req.measure, len(ranked))
        if self.req.budget_min:
            spent, fit = 0.0, 0
            for row in ranked[:n]:
                spent += 20.0 + (self.req.steps + 1) * row["predicted_s"] * 3  # start-up, and a margin of 3x
                if spent > self.req.budget_min * 60:
                    break
                fit += 1
            n = max(1, fit)
        return n

    # ------------------------------------------------------------ the whole run

    def run(self) -> dict:
        t0 = time.monotonic()
        costs = self.costs()
        rows = self.candidates(costs)
        ranked = sorted((r for r in rows if r["status"] == "ranked"), key=lambda r: r["predicted_s"])
        measured: dict[str, dict] = {}
        if not self.req.what_if:
            chosen = to_measure(ranked, self.how_many(ranked), len(rows), costs.band)
            budget_s = None
            if self.req.budget_min:  # what phase 1 left of the budget, less the job's start-up and warm-up
                budget_s = max(0.0, self.req.budget_min * 60 - (time.monotonic() - t0)
                               - sum(20.0 + 2 * r["predicted_s"] for r in chosen))
            gauge = gauge_row(rows)
            if gauge not in chosen:
                gauge["why"] = "the gauge" + (f" ({gauge['status']}: {gauge['why']})" if gauge["why"] else "")
            measured = self.measure(chosen + ([gauge] if gauge not in chosen else []), budget_s,
                                    reference=gauge["layout"])
            for row in rows:
                got = measured.get(row["layout"].name())
                if got and "error" in got:
                    row["status"], row["why"] = "failed", got["error"]
                elif got:
                    row["status"] = "measured"
                    row["measured_s"] = got["step_s"]
                    row["timing"] = {k: got[k] for k in ("min_s", "ci_s", "spread", "rounds") if k in got}
                    if "vs_reference" in got:  # this layout's time / the gauge's, round by round
                        row["timing"]["vs_gauge"] = got["vs_reference"]["median"]
                        row["predicted_vs_gauge"] = row["predicted_s"] / gauge["predicted_s"]
        ok = [r for r in rows if r["status"] == "measured"]
        if not self.req.what_if and not ok:
            raise TuneError(f"no measured layout ran: {[r['why'] for r in rows if r['status'] == 'failed']}; "
                            f"see {self.measured_path}")
        pick = min(ok, key=lambda r: r["measured_s"]) if ok else ranked[0]
        result = {
            "model": self.cfg.model, "config": str(self.req.config), "world": self.world, "nodes": self.req.nodes,
            "gpus_per_node": self.req.gpus_per_node, "global_batch": self.req.global_batch, "seq_len": self.seq_len,
            "what_if": self.req.what_if, "costs": costs.as_dict(), "constraints": constraints(rows, costs),
            "pick": row_json(pick), "candidates": [row_json(r) for r in rows],
            "counts": {s: sum(1 for r in rows if r["status"] == s) for s in ("measured", "ranked", "pruned", "failed")},
            "wall_s": round(time.monotonic() - t0, 1)}
        if ok:
            # relative to the gauge timed in the same rounds: what a cost model can be judged on where the load moves
            relative = [abs(r["predicted_vs_gauge"] / r["timing"]["vs_gauge"] - 1) for r in ok
                        if "predicted_vs_gauge" in r]
            if relative:
                result["cost_model_median_error"] = statistics.median(relative)
            result["cost_model_median_error_seconds"] = statistics.median(  # at phase 1's load
                abs(r["predicted_s"] - r["measured_s"]) / r["measured_s"] for r in ok)
            result["gauge"] = row_json(gauge)
        result["trainer_config"] = str(self.write_config(pick["layout"]))
        (self.req.out / "result.json").write_text(json.dumps(result, indent=1))
        return result

    def write_config(self, layout: Layout) -> Path:
        """The chosen layout as a trainer config: the preset's keys, the layout's and the allocation's."""
        from sigma.train.train_config import load_train_config

        overrides = list(self.req.overrides) + layout.overrides(self.model) + [
            f"launch.nodes={self.req.nodes}", f"launch.gpus_per_node={self.req.gpus_per_node}",
            f"data.global_batch={self.req.global_batch}"]
        cfg = load_train_config(self.req.config, overrides)  # validates the keys once more
        path = self.req.out / f"{self.cfg.name}-tuned.yaml"
        text = yaml.safe_dump(cfg.to_dict(), sort_keys=False)
        path.write_text(f"# written by sigma tune: {layout.name()} on {self.world} ranks, global batch "
                        f"{self.req.global_batch}\n" + text)
        return path


def keep_despite_model(by_time: list[dict], band: float) -> None:
    """Undo pruning the model cannot vouch for: the fastest predicted layout of each pipeline depth (the model's
    error is largest between depths, whose bubbles and shared cores it simulates), and every layout predicted
    within `band` (the model's error band, sigma.tune.calibrate) of the fastest. by_time: the layouts that fit, by
    predicted time."""
    if not by_time:
        return
    limit = by_time[0]["predicted_s"] * (1 + band)
    depths = set()
    for row in by_time:
        depth = row["layout"].pp
        if row["status"] == "ranked":
            depths.add(depth)
            continue
        if depth not in depths:
            row["status"], row["why"] = "ranked", f"kept: the fastest predicted with pp={depth} ({row['why']})"
        elif row["predicted_s"] <= limit:
            row["status"], row["why"] = "ranked", (f"kept: within the model's error band ({100 * band:.0f}%) of "
                                                   f"the fastest ({row['why']})")
        depths.add(depth)


def to_measure(ranked: list[dict], n: int, total: int, band: float) -> list[dict]:
    """The layouts phase 2 times: the n best ranked, the fastest predicted of each pipeline depth, and those
    predicted within the model's error band of the fastest, in predicted order while the measured stay at most a
    fifth of all the layouts (the gauge aside)."""
    chosen = ranked[:n]
    depths = {r["layout"].pp for r in chosen}
    for row in ranked[n:]:
        if row["layout"].pp not in depths:
            chosen.append(row)
            depths.add(row["layout"].pp)
    cap = max(len(chosen), total // 5)
    limit = ranked[0]["predicted_s"] * (1 + band) if ranked else 0.0
    for row in ranked[n:]:
        if len(chosen) >= cap or row["predicted_s"] > limit:
            break
        if row not in chosen:
            chosen.append(row)
    return sorted(chosen, key=lambda r: r["predicted_s"])


def read_measured(path: Path) -> dict[str, dict]:
    out = {}
    if path.exists():
        for line in path.read_text().splitlines():
            if line.strip():
                rec = json.loads(line)
                out[Layout.from_dict(rec["layout"]).name()] = rec
    return out


def gauge_row(rows: list[dict]) -> dict:
    """The layout every measured one is compared with, round by round: plain data parallelism (tp, pp, ep 1) with
    the smallest micro-batch that fits, else the fastest predicted that fits; fixed before anything is timed."""
    fits = [r for r in rows if not r["why"].startswith("memory")]
    plain = [r for r in fits if (r["layout"].tp, r["layout"].pp, r["layout"].ep, r["layout"].zero) == (1, 1, 1, False)]
    return min(plain, key=lambda r: r["layout"].mbs) if plain else min(fits, key=lambda r: r["predicted_s"])


def row_json(row: dict) -> dict:
    out = {"layout": row["layout"].name(), "keys": row["layout"].as_dict(), "dp": row["dp"],
           "predicted_s": row["predicted_s"], "memory_gib": row["memory_bytes"] / GIB, "status": row["status"],
           "why": row["why"], "parts": row["parts"]}
    for key in ("measured_s", "predicted_vs_gauge", "timing", "rank"):
        if key in row:
            out[key] = row[key]
    return out


# ---------------------------------------------------------------- fitting and stated costs

def fit_costs(raw: dict, gpus_per_node: int, memory_bytes: float | None, model: ModelConfig | None = None) -> Costs:
    """Costs fitted from phase 1; with the model, calibrated on phase 1's real steps (sigma.tune.calibrate)."""
    from sigma.tune.calibrate import calibrate

    compute = {}
    whole = {(p["kind"], p["tokens"]): lone_seconds(p, raw) for p in raw["compute"] if "@" not in p["kind"]}
    for kind in sorted({p["kind"] for p in raw["compute"]}):  # dense, moe, head, and dense@tp2, moe@tp2, ...
        points = []
        for p in raw["compute"]:
            if p["kind"] == kind:
                key = (kind.split("@")[0], p["tokens"])
                # a layer over tp ranks: its measured ratio to the whole layer, both with every rank busy
                lone = p["vs_tp1"] * whole[key] if "vs_tp1" in p and key in whole else lone_seconds(p, raw)
                points.append((p["tokens"], lone))
        compute[kind] = fit_affine(points)
    links = fit_links(raw["links"]) if raw["links"] else {}
    for op in ("all_reduce", "all_to_all", "p2p"):
        links.setdefault(f"{op}/intra", Link(alpha=0.0, beta=float("inf")))  # one rank: nothing to exchange
    bubbles = {s: (b["measured"] / b["theory"]) for s, b in raw.get("bubbles", {}).items() if b["theory"]}
    costs = Costs(compute=compute, links=links, optimizer_s_per_param=raw["optimizer_s_per_param"] * raw.get("load", 1),
                  bubble_factor=bubbles, gpus_per_node=gpus_per_node, memory_bytes=memory_bytes,
                  sharing=raw.get("sharing", 1.0),
                  source=f"phase 1 on {raw['world']} rank(s), nodes {', '.join(raw['nodes'])}")
    calibrated = calibrate(costs, raw, model) if model is not None else costs
    if calibrated is not costs:
        return calibrated
    scale = compute_scale(raw, compute)  # phase 1 of an older version: its busiest rank's compute only
    costs.compute = {kind: [a * scale, b * scale] for kind, (a, b) in compute.items()}
    costs.compute_scale = scale
    return costs


def compute_scale(raw: dict, compute: dict[str, list[float]]) -> float:
    """Layers inside a real pipeline step (phase 1's pp=2 runs: the busiest rank's compute, every rank of the job
    busy) against the same layers timed one by one (lone x sharing): the median ratio over the schedules, which
    scales every layer's cost. 1 where phase 1 did not record it."""
    ratios = []
    for run in raw.get("bubbles", {}).values():
        if not run.get("busy_s") or "layers" not in run:
            continue
        per_mb = sum(n * (compute[kind][0] + compute[kind][1] * run["tokens"])
                     for kind, n in run["layers"].items() if n and kind in compute)
        if per_mb > 0:
            ratios.append(run["busy_s"] / (run["microbatches"] * per_mb * raw.get("sharing", 1.0)))
    return statistics.median(ratios) if ratios else 1.0


def lone_seconds(point: dict, raw: dict) -> float:
    """A layer's seconds on one rank alone at phase 1's load: its CPU seconds (steady whatever else runs) x how
    much longer than its CPU time a call lasted then (`load`, the median over every call rank 0 timed alone);
    timed with every rank busy only (tp layers, files of older versions): / sharing."""
    if "cpu" in point:
        return point["cpu"] * raw.get("load", 1.0)
    return point["seconds"] / raw.get("sharing", 1.0)


def fabric_costs(path: str, model: ModelConfig, seq_len: int) -> Costs:
    """Costs a fabric file states (configs/tune/*.yaml): compute from FLOPs at a stated efficiency."""
    p = Path(path)
    try:
        spec = yaml.safe_load(p.read_text())
    except FileNotFoundError:
        raise ConfigError(f"[{path}]", "no such fabric file") from None
    for key in ("gpus_per_node", "peak_flops", "efficiency", "layer_overhead_s", "memory_gb", "links",
                "optimizer_s_per_param"):
        if key not in spec:
            raise ConfigError(f"[{path}: {key}]", "missing; a fabric file states every figure the cost model uses")
    def num(value, key: str) -> float:
        try:
            return float(value)  # YAML reads 9.89e14 (no sign in the exponent) as a string
        except (TypeError, ValueError):
            raise ConfigError(f"[{path}: {key}]", f"must be a number, got {value!r}") from None

    rate = num(spec["peak_flops"], "peak_flops") * num(spec["efficiency"], "efficiency")
    overhead = num(spec["layer_overhead_s"], "layer_overhead_s")
    compute = {kind: [overhead, layer_flops(model, kind, seq_len) / rate] for kind in ("dense", "moe")}
    compute["head"] = [overhead, 6 * model.dim * model.vocab_size / rate]
    links = {k: Link(alpha=num(v["alpha_s"], f"links.{k}.alpha_s"), beta=num(v["gb_per_s"], f"links.{k}.gb_per_s") * 1e9)
             for k, v in spec["links"].items()}
    return Costs(compute=compute, links=links,
                 optimizer_s_per_param=num(spec["optimizer_s_per_param"], "optimizer_s_per_param"),
                 bubble_factor=spec.get("bubble_factor") or {}, gpus_per_node=int(spec["gpus_per_node"]),
                 memory_bytes=num(spec["memory_gb"], "memory_gb") * GIB, act_bytes=int(spec.get("act_bytes", 2)),
                 param_bytes=int(spec.get("param_bytes", 4)),
                 keep_outputs=bool(spec.get("pipeline_keeps_outputs", True)), source=f"stated in {path}")


def layer_flops(model: ModelConfig, kind: str, seq_len: int) -> float:
    """Forward + backward FLOPs per token of one layer (6 x matmul parameters + attention), flops.py's convention."""
    hd = model.head_dim
    attn = (2 * model.n_heads * hd + 2 * model.n_kv_heads * hd) * model.dim
    if kind == "dense":
        ffn = 3 * model.dim * model.dense_hidden
    else:
        ffn = (model.top_k + model.n_shared_experts) * 3 * model.dim * model.expert_hidden + model.dim * model.n_experts
    return 6 * (attn + ffn) + 12 * model.n_heads * hd * seq_len


def constraints(rows: list[dict], costs: Costs) -> list[str]:
    """What the platform's costs rule out, in words: the best layout with a degree vs the best without it."""
    fits = [r for r in rows if not r["why"].startswith("memory")]
    out = []

    def best(pred):
        chosen = [r for r in fits if pred(r["layout"], r["dims"])]
        return min(chosen, key=lambda r: r["predicted_s"]) if chosen else None

    checks = [("TP>1", lambda l, d: l.tp > 1, lambda l, d: l.tp == 1),
              ("PP>1", lambda l, d: l.pp > 1, lambda l, d: l.pp == 1),
              ("EP>1", lambda l, d: l.ep > 1, lambda l, d: l.ep == 1),
              ("EP across nodes", lambda l, d: l.tp * l.ep > costs.gpus_per_node,
               lambda l, d: l.tp * l.ep <= costs.gpus_per_node),
              ("VPP>1", lambda l, d: l.vpp > 1, lambda l, d: l.pp > 1 and l.vpp == 1)]
    for name, with_it, without in checks:
        a, b = best(with_it), best(without)
        if a is None or b is None:
            continue
        ratio = a["predicted_s"] / b["predicted_s"]
        if ratio > 1.0:
            out.append(f"{name} never pays here: its best layout ({a['layout'].name()}) is predicted "
                       f"{ratio:.2f}x slower than the best without it ({b['layout'].name()})")
        else:
            out.append(f"{name} pays: {a['layout'].name()} is predicted {1 / ratio:.2f}x faster than the best "
                       f"without it ({b['layout'].name()})")
    inter, intra = costs.links.get("all_to_all/inter"), costs.links.get("all_to_all/intra")
    if inter and intra and inter.beta < intra.beta:
        out.append(f"all-to-all across nodes moves {inter.beta / 1e9:.3g} GB/s against {intra.beta / 1e9:.3g} GB/s "
                   f"inside one")
    return out
