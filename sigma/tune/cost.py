"""A cost model of one training step under a layout, from costs measured on this platform or stated for another.

Costs (what phase 1 fits, or a fabric file states for `--what-if`):
- compute: seconds of forward + backward of one dense layer, one MoE layer and the output head at tp=1 for a
  micro-batch of t tokens, affine in t (a + b t: the fixed part is what makes small micro-batches slow); and where
  phase 1 timed a layer split over tp ranks (`moe@tp2`), that figure with its all-reduces, instead of compute / tp
  plus the modelled all-reduces;
- links: alpha + bytes / beta per collective (all_reduce, all_to_all, p2p), inside a node or across nodes;
- the optimiser's seconds per parameter, and per schedule the measured bubble over the schedule's theoretical one;
- where phase 1 ran real steps, how much the layers and the update (gradient sync, clipping, the optimiser) cost
  inside them against the model (sigma.tune.calibrate).

Step time of a layout = the pipeline's run + gradient all-reduces + optimiser step. A pipeline rank computes each
micro-batch through its stages: layer compute / tp (the head is replicated), tp all-reduces of the activations
(two per block in forward and two in backward, two more for routed experts), ep all-to-alls (dispatch and combine,
forward and backward), and a p2p send of activations and of their gradient per stage it holds. Compute is at the
speed of a rank alone. Where every rank computes at one speed (`sharing` 1: an accelerator each), the slowest rank
sets the pace: m micro-batches plus the bubble's (p - 1) / v of them (x the schedule's measured factor). Where ranks
share cores (phase 1 measures by how much: `sharing` > 1), the schedule is simulated (sigma.tune.schedule): the
ranks that wait in the pipeline's fill and drain leave their cores to the others, and a layout whose ranks never
wait pays the whole slowdown.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

from sigma.train.config import ModelConfig
from sigma.train.dims import ParallelDims
from sigma.train.memory import estimate, stage_param_counts
from sigma.tune.schedule import pipeline_time

KINDS = ("dense", "moe", "head")
OPS = ("all_reduce", "all_to_all", "p2p")
BUCKET_ELEMS = 1 << 23  # sigma.train.parallel's gradient bucket


@dataclass
class Link:
    alpha: float  # seconds per call
    beta: float  # bytes per second

    def time(self, nbytes: float) -> float:
        return self.alpha + nbytes / self.beta


@dataclass
class Costs:
    compute: dict[str, list[float]]  # kind -> [a seconds, b seconds per token], forward + backward at tp=1
    links: dict[str, Link]  # "<op>/intra" and "<op>/inter"
    optimizer_s_per_param: float
    bubble_factor: dict[str, float]  # schedule -> measured bubble / theoretical bubble
    gpus_per_node: int
    memory_bytes: float | None = None  # per accelerator; None: no memory limit known
    act_bytes: int = 4
    param_bytes: int = 4
    keep_outputs: bool = True  # the last pipeline stage keeps every micro-batch's logits (sigma.train.memory)
    sharing: float = 1.0  # a rank computes this much slower while every rank computes (ranks sharing cores)
    compute_scale: float = 1.0  # the layers' cost inside a real step / timed one by one (already in `compute`)
    update_scale: float = 1.0  # gradient sync + optimiser inside a real step / modelled from links and AdamW alone
    exchange_latency_s: float = 0.0  # a collective call's latency inside a real step beyond timed alone (in the
    # all-to-all links; added per ZeRO-1 broadcast)
    tp_scale: float = 1.0  # layers over tp ranks inside a real step / timed alone (already in `compute`)
    band: float = 0.0  # how close two predictions may be for the model to tell them apart (sigma.tune.calibrate)
    source: str = ""
    constraints: list[str] = field(default_factory=list)

    def as_dict(self) -> dict:
        d = asdict(self)
        d["links"] = {k: asdict(v) for k, v in self.links.items()}
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "Costs":
        return cls(**{**d, "links": {k: Link(**v) for k, v in d["links"].items()}})

    def link(self, op: str, inter: bool) -> Link:
        key = f"{op}/{'inter' if inter else 'intra'}"
        if key not in self.links:  # a platform of one node has no inter-node figure: the intra one is the best guess
            key = f"{op}/intra"
        return self.links[key]


@dataclass
class Prediction:
    step_s: float
    parts: dict[str, float]  # seconds: compute, tp, ep, p2p, bubble, grad_sync, optimizer
    memory_bytes: int  # largest peak of a pipeline rank (sigma.train.memory)


def _spans_nodes(stride: int, size: int, gpus_per_node: int) -> bool:
    """Rank order tp, ep, edp, pp: a group of `size` ranks `stride` apart stays in one node if it spans at most one."""
    return size > 1 and stride * size > gpus_per_node


def _ring(n: int) -> float:
    return 2 * (n - 1) / n


def layer_compute(costs: Costs, kind: str, tokens: int) -> float:
    a, b = costs.compute[kind]
    return a + b * tokens


def predict(costs: Costs, model: ModelConfig, dims: ParallelDims, mbs: int, seq_len: int, zero: bool = False,
            recompute: bool = False) -> Prediction:
    """recompute: every MoE layer runs its forward again in backward (+1/3 of its compute, +1/2 of its tp and ep
    exchanges) and keeps only its input."""
    g, act = costs.gpus_per_node, costs.act_bytes
    tp, ep, pp, v, m = dims.tp, dims.ep, dims.pp, dims.vpp, dims.microbatches
    tokens = mbs * seq_len
    hidden_bytes = tokens * model.dim * act
    tp_link = costs.link("all_reduce", _spans_nodes(1, tp, g))
    a2a_link = costs.link("all_to_all", _spans_nodes(tp, ep, g))
    p2p_link = costs.link("p2p", _spans_nodes(tp * dims.dp, 2, g))

    def stage_parts(stage: int) -> dict[str, float]:
        parts = {"compute": 0.0, "tp": 0.0, "ep": 0.0}
        for layer in dims.layers_of_stage(stage):
            moe = layer >= model.n_dense_layers
            again = recompute and moe
            kind = "moe" if moe else "dense"
            measured_tp = f"{kind}@tp{tp}" in costs.compute  # phase 1 timed this layer split over tp ranks
            if measured_tp:
                parts["compute"] += layer_compute(costs, f"{kind}@tp{tp}", tokens) * (4 / 3 if again else 1)
            else:
                parts["compute"] += layer_compute(costs, kind, tokens) / tp * (4 / 3 if again else 1)
            if tp > 1 and not measured_tp:
                calls = 4 + (2 if moe else 0) + (2 if moe and model.n_shared_experts else 0)
                parts["tp"] += calls * tp_link.time(_ring(tp) * hidden_bytes) * (1.5 if again else 1)
            if moe and ep > 1:
                routed = hidden_bytes * model.top_k * (ep - 1) / ep
                parts["ep"] += (4 * a2a_link.time(routed) + a2a_link.alpha) * (1.5 if again else 1)  # + counts
        if stage == dims.n_stages - 1:
            parts["compute"] += layer_compute(costs, "head", tokens)
        return parts

    per_rank, stage_s = [], {}
    for r in range(pp):
        parts = {"compute": 0.0, "tp": 0.0, "ep": 0.0, "p2p": 0.0}
        for s in dims.stages_of(r):
            of_stage = stage_parts(s)
            stage_s[s] = sum(of_stage.values())
            for k, val in of_stage.items():
                parts[k] += val
            if pp > 1:
                parts["p2p"] += 2 * p2p_link.time(hidden_bytes)
        per_rank.append(parts)
    slowest = max(per_rank, key=lambda p: sum(p.values()))
    result = {k: m * val for k, val in slowest.items()}
    busy = sum(result.values())
    if costs.sharing > 1:
        # ranks share cores: simulate the schedule (sigma.tune.schedule), at the lone speed and shared
        p2p_s = p2p_link.time(hidden_bytes) if pp > 1 else 0.0
        stages = [stage_s[s] for s in range(dims.n_stages)]
        alone = pipeline_time(stages, pp, v, m, p2p_s)
        result["bubble"] = max(0.0, alone - busy)
        result["sharing"] = max(0.0, pipeline_time(stages, pp, v, m, p2p_s, costs.sharing) - max(alone, busy))
    else:  # every rank at one speed: the closed form, the theoretical bubble x the schedule's measured factor
        result["bubble"] = costs.bubble_factor.get(dims.schedule, 1.0) * (pp - 1) / v * busy / m if pp > 1 else 0.0
        result["sharing"] = 0.0

    # gradients: dense ones over dp, expert ones over edp (bucketed all-reduces); the optimiser over what it owns
    worst_params = max(stage_param_counts(model, dims, r) for r in range(pp))
    n_params, n_expert = worst_params
    n_dense = n_params - n_expert
    pb = costs.param_bytes
    sync = 0.0
    if dims.dp > 1:
        link = costs.link("all_reduce", _spans_nodes(tp, dims.dp, g))
        sync += math.ceil(n_dense / BUCKET_ELEMS) * link.alpha + _ring(dims.dp) * n_dense * pb / link.beta
    if dims.edp > 1 and n_expert:
        link = costs.link("all_reduce", _spans_nodes(tp * ep, dims.edp, g))
        sync += math.ceil(n_expert / BUCKET_ELEMS) * link.alpha + _ring(dims.edp) * n_expert * pb / link.beta
    owned = (n_dense / dims.dp + n_expert / dims.edp) if zero else n_params
    optimizer = costs.optimizer_s_per_param * owned
    broadcasts = 0.0
    if zero:  # each owner broadcasts its parameters: one send per tensor from its owner, the bytes of all of them
        link = costs.link("p2p", _spans_nodes(tp, dims.dp, g))
        tensors = 12 * sum(len(dims.layers_of_stage(s)) for s in dims.stages_of(0)) + 3
        optimizer += tensors * link.alpha + n_params * pb / link.beta
        broadcasts = tensors * costs.exchange_latency_s  # each a collective call inside the step, like an all-to-all
    result["grad_sync"] = sync * costs.update_scale
    result["optimizer"] = optimizer * costs.update_scale + broadcasts
    rc_layers = tuple(range(model.n_dense_layers, model.n_layers)) if recompute else ()
    memory = max(estimate(model, dims, r, micro_batch=mbs, seq_len=seq_len, act_bytes=act, param_bytes=pb,
                          shard_optimizer=zero, recompute_layers=rc_layers, keep_outputs=costs.keep_outputs).peak
                 for r in _distinct_ranks(pp))
    return Prediction(step_s=sum(result.values()), parts=result, memory_bytes=memory)


def _distinct_ranks(pp: int) -> list[int]:
    """Pipeline ranks whose memory differs most: the first (embedding, most in flight), the last (head), one between."""
    return sorted({0, pp // 2, pp - 1})


# ---------------------------------------------------------------- fitting phase 1's measurements

def fit_affine(points: list[tuple[float, float]]) -> list[float]:
    """Least squares y = a + b x over (x, y) points, a and b clamped at >= 0 (costs are never negative)."""
    if len(points) == 1:
        x, y = points[0]
        return [0.0, y / x] if x else [y, 0.0]
    n = len(points)
    sx = sum(x for x, _ in points)
    sy = sum(y for _, y in points)
    sxx = sum(x * x for x, _ in points)
    sxy = sum(x * y for x, y in points)
    den = n * sxx - sx * sx
    b = (n * sxy - sx * sy) / den if den else 0.0
    a = (sy - b * sx) / n
    if b < 0:
        b, a = 0.0, sy / n
    if a < 0:
        a, b = 0.0, sxy / sxx if sxx else 0.0
    return [a, b]


def fit_links(samples: list[dict]) -> dict[str, Link]:
    """samples: {op, n (group size), bytes (per rank), inter, seconds}; bytes on the wire scaled like predict()."""
    groups: dict[str, list[tuple[float, float]]] = {}
    for s in samples:
        n, nbytes = s["n"], s["bytes"]
        wire = {"all_reduce": _ring(n) * nbytes, "all_to_all": nbytes * (n - 1) / n, "p2p": nbytes}[s["op"]]
        groups.setdefault(f"{s['op']}/{'inter' if s['inter'] else 'intra'}", []).append((wire, s["seconds"]))
    links = {}
    for key, points in groups.items():
        a, b = fit_affine(points)
        links[key] = Link(alpha=a, beta=1.0 / b if b > 0 else float("inf"))
    return links
