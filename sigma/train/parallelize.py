"""The parallelize step: take the single-device model and apply tp, ep and pp (with vpp) from outside.

    run = build_parallel(model_cfg, dims, rank, seed=0)     # after dist.init_process_group (world > 1)
    loss, aux, gnorm = train_step(run, optimizer, named, batch, max_norm=1.0)

Mesh ("pp", "edp", "ep", "tp") from ParallelDims; dp = edp x ep.
- Tensor parallel (DTensor): wq/wk/wv and the FFNs' w1/w3 colwise, wo and w2 rowwise (torch's ColwiseParallel /
  RowwiseParallel; the heads per rank shrink by tp). Routed experts keep plain local slices of their hidden
  width (w1/w3 rows, w2 columns) between an identity-forward/all-reduce-backward op and an all-reduce-forward op,
  the same algebra for grouped GEMMs, which DTensor has no rule for.
- Expert parallel: sigma.train.parallel.ExpertParallel over the ep group (after the tp split).
- Pipeline parallel: torch.distributed.pipelining with one PipelineStage per held stage (vpp per rank), built on
  the first step with the micro-batch's activation shapes (so no extra shape-inference forward); a stage
  module keeps the full model's parameter names (`layers.5.attn.wq.weight`), so checkpoints reshard across
  layouts. The MoE aux loss joins backward through an identity whose gradient is the aux loss's.
- Gradients: dense ones averaged over dp, expert ones over edp (the all-to-all backward already summed the ep
  group), the norm summed over pp, tp (sharded parameters) and ep (experts).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from sigma.train.config import ModelConfig
from sigma.train.dims import ParallelDims
from sigma.train.parallel import EPDispatch, _collective, dropped_tokens, install_expert_parallel, is_expert_param


# ---------------------------------------------------------------- tensor-parallel collectives for experts

class _CopyToTp(torch.autograd.Function):
    """Identity forward; backward sums the input gradient over the tp group (each rank saw part of the hidden)."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        grad = grad.contiguous()
        with _collective():
            dist.all_reduce(grad, group=ctx.group)
        return grad, None


class _ReduceFromTp(torch.autograd.Function):
    """Sum of the partial outputs over the tp group; backward is the identity."""

    @staticmethod
    def forward(ctx, x, group):
        x = x.contiguous()
        with _collective():
            dist.all_reduce(x, group=group)
        return x

    @staticmethod
    def backward(ctx, grad):
        return grad, None


class _AuxLoss(torch.autograd.Function):
    """x unchanged; backward also seeds the aux loss with gradient 1 (a loss that is no stage output; the schedule
    divides every gradient by the micro-batch count afterwards, as it does for the CE loss)."""

    @staticmethod
    def forward(ctx, x, aux):
        ctx.aux_shape = aux.shape
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return grad, grad.new_ones(ctx.aux_shape)


class _BackwardClock(torch.autograd.Function):
    """Identity that notes when its gradient passes: at a stage's output (its backward starts) and at its first
    hidden input (its backward ends), so a rank knows how long its own stages computed."""

    @staticmethod
    def forward(ctx, x, clock, start):
        ctx.clock, ctx.start = clock, start
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        ctx.clock.mark(ctx.start)
        return grad, None, None


class StageClock:
    """Seconds this rank spent computing its stages (forward + backward) in the current step."""

    def __init__(self):
        self.busy_s = 0.0
        self._t0 = None

    def mark(self, start: bool) -> None:
        now = time.perf_counter()
        if start:
            self._t0 = now
        elif self._t0 is not None:
            self.busy_s += now - self._t0
            self._t0 = None


# ---------------------------------------------------------------- stage module

class Stage(nn.Module):
    """The layers of one pipeline stage (first: + embedding, last: + final norm and head), full-model names."""

    def __init__(self, model, layer_ids: list[int], first: bool, last: bool):
        super().__init__()
        self.tok_embeddings = model.tok_embeddings if first else None
        self.layers = nn.ModuleDict({str(i): model.layers[i] for i in layer_ids})
        self.norm = model.norm if last else None
        self.output = model.output if last else None
        self.register_buffer("rope_cos", model.rope_cos, persistent=False)
        self.register_buffer("rope_sin", model.rope_sin, persistent=False)
        self.aux_values: list[float] = []
        self.clock = StageClock()
        self.poison = False  # testing only (fault.nan_at_step): the last stage's logits become NaN

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t0 = time.perf_counter()
        if self.tok_embeddings is not None:
            x = self.tok_embeddings(x)
        if torch.is_grad_enabled():
            x = _BackwardClock.apply(x, self.clock, False)
        t = x.shape[1]
        cos, sin = self.rope_cos[:t], self.rope_sin[:t]
        for layer in self.layers.values():
            x, aux = layer(x, cos, sin)
            if aux is not None and aux.requires_grad:
                self.aux_values.append(float(aux.detach()))
                x = _AuxLoss.apply(x, aux)
        if self.output is not None:
            x = self.output(self.norm(x))
            if self.poison:
                x = x * float("nan")
        self.clock.busy_s += time.perf_counter() - t0
        return _BackwardClock.apply(x, self.clock, True) if torch.is_grad_enabled() else x


class StageHolder(nn.Module):
    """All modules this rank holds, under the full model's names (the union of its stages)."""

    def __init__(self, model, stages: list[Stage]):
        super().__init__()
        self.cfg = model.cfg
        self.layers = nn.ModuleDict({k: v for s in stages for k, v in s.layers.items()})
        for name in ("tok_embeddings", "norm", "output"):
            held = [getattr(s, name) for s in stages if getattr(s, name) is not None]
            if held:
                setattr(self, name, held[0])

    def moe_layers(self):
        return [layer.ffn for layer in self.layers.values() if layer.is_moe]


# ---------------------------------------------------------------- the run

@dataclass
class ParallelRun:
    dims: ParallelDims
    rank: int
    model_cfg: ModelConfig
    module: nn.Module  # what this rank holds; parameter names as in the full model
    mesh: object = None
    stages: list = field(default_factory=list)  # pipelining PipelineStages
    schedule: object = None
    schedule_shape: tuple = ()  # (rows, seq) of the micro-batches the schedule was built for
    moe_by_id: dict = field(default_factory=dict)  # layer id -> MoELayer held here
    load_sum: dict = field(default_factory=dict)  # layer id -> tokens per expert summed over this step's forwards
    stage_modules: list = field(default_factory=list)
    recompute: object = None
    ep_dispatch: EPDispatch = field(default_factory=EPDispatch)
    amp_dtype: torch.dtype = torch.float32  # autocast dtype of the forward (bfloat16: fp32 master weights)
    kpi: dict = field(default_factory=dict)  # last step: step_s, and with pp: stage_busy_s, bubble (measured)

    def group(self, name: str):
        return None if self.mesh is None else self.mesh.get_group(name)

    def autocast(self):
        """The forward's autocast context (off in float32); backward runs in the dtypes the forward recorded."""
        device = next(self.module.parameters()).device.type
        return torch.autocast(device, dtype=self.amp_dtype, enabled=self.amp_dtype != torch.float32)

    @property
    def coords(self) -> dict:
        return self.dims.coords(self.rank)


def _tp_plan(block, tp_mesh) -> None:
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    tp = tp_mesh.size()
    ffn_plan = {"w1": ColwiseParallel(), "w3": ColwiseParallel(), "w2": RowwiseParallel()}
    parallelize_module(block.attn, tp_mesh, {"wq": ColwiseParallel(), "wk": ColwiseParallel(),
                                             "wv": ColwiseParallel(), "wo": RowwiseParallel()})
    block.attn.n_heads //= tp
    block.attn.n_kv_heads //= tp
    if not block.is_moe:
        parallelize_module(block.ffn, tp_mesh, ffn_plan)
    elif block.ffn.shared is not None:
        parallelize_module(block.ffn.shared, tp_mesh, ffn_plan)


def _shard_experts(layer, run: ParallelRun) -> None:
    """Keep this rank's experts (ep) and hidden slice (tp) as plain parameters; route through all-to-all."""
    dims, c = run.dims, run.coords
    experts = layer.experts
    per_rank, hidden = experts.n_experts // dims.ep, experts.hidden // dims.tp
    e_keep = slice(c["ep"] * per_rank, (c["ep"] + 1) * per_rank)
    h_keep = slice(c["tp"] * hidden, (c["tp"] + 1) * hidden)
    with torch.no_grad():
        experts.w1 = nn.Parameter(experts.w1[e_keep, h_keep, :].clone())
        experts.w3 = nn.Parameter(experts.w3[e_keep, h_keep, :].clone())
        experts.w2 = nn.Parameter(experts.w2[e_keep, :, h_keep].clone())
    experts.n_experts, experts.hidden = per_rank, hidden
    tp_group = run.group("tp") if dims.tp > 1 else None
    ep_group = run.group("ep") if dims.ep > 1 else None

    def local(x, counts=None, _experts=experts):
        if tp_group is None:
            return _experts(x, counts)
        return _ReduceFromTp.apply(_experts(_CopyToTp.apply(x, tp_group), counts), tp_group)

    if ep_group is None:
        layer.compute_experts = local
    else:
        install_expert_parallel(layer, local, ep_group, dims.ep, run.ep_dispatch)


def build_parallel(model_cfg: ModelConfig, dims: ParallelDims, rank: int = 0, seed: int = 0,
                   device: torch.device | None = None, recompute_layers: list[int] | None = None,
                   recompute_policy: str = "none", recompute_count: int = 0,
                   ep_dispatch: EPDispatch = EPDispatch(), amp_dtype: torch.dtype = torch.float32) -> ParallelRun:
    """Build the full model from `seed` (identical on every rank), then cut out and wire this rank's part."""
    from sigma.train.model import MoETransformer
    from sigma.train.recompute import Recompute

    device = device or torch.device("cpu")
    torch.manual_seed(seed)
    model = MoETransformer(model_cfg).to(device)
    mesh = None
    if dims.world > 1:
        from torch.distributed.device_mesh import init_device_mesh

        mesh = init_device_mesh(device.type, dims.mesh_shape, mesh_dim_names=ParallelDims.mesh_names)
        mesh["edp", "ep"]._flatten("dp")
    run = ParallelRun(dims=dims, rank=rank, model_cfg=model_cfg, module=model, mesh=mesh, ep_dispatch=ep_dispatch,
                      amp_dtype=amp_dtype)
    run.recompute = Recompute(model, recompute_layers, recompute_policy, recompute_count)
    c = run.coords
    held_ids = [i for s in dims.stages_of(c["pp"]) for i in dims.layers_of_stage(s)]
    for i in held_ids:
        block = model.layers[i]
        if dims.tp > 1:
            _tp_plan(block, mesh["tp"])
        if block.is_moe:
            if dims.tp > 1 or dims.ep > 1:
                _shard_experts(block.ffn, run)
            run.moe_by_id[i] = block.ffn
            block.ffn.register_forward_hook(_count_load(run, i))
    if dims.pp == 1:
        return run

    stage_ids = dims.stages_of(c["pp"])
    for s in stage_ids:
        module = Stage(model, dims.layers_of_stage(s), s == 0, s == dims.n_stages - 1)
        run.stage_modules.append(module)
    run.module = StageHolder(model, run.stage_modules)
    return run


def _pipeline_loss(logits, targets):
    return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), targets.reshape(-1))


def pipeline_schedule(run: ParallelRun, rows: int, seq: int):
    """The schedule for micro-batches of rows x seq tokens (built on first use, again when the shape changes).

    Every PipelineStage is given the shapes it receives and sends. Without them the schedule infers them on its
    first step by running each stage's forward once more, on the first micro-batch or on uninitialised buffers:
    that forward routes tokens through the MoE layers (counted into the step's expert loads, which moves the
    aux-free bias differently from one process) and records an aux loss that no micro-batch had."""
    if run.schedule is not None and run.schedule_shape == (rows, seq):
        return run.schedule
    from torch.distributed.pipelining import PipelineStage
    from torch.distributed.pipelining.schedules import ScheduleGPipe, Schedule1F1B, ScheduleInterleaved1F1B

    dims, cfg = run.dims, run.model_cfg
    weight = next(run.module.parameters())
    hidden = torch.empty(rows, seq, cfg.dim, dtype=weight.dtype, device="meta", requires_grad=True)
    tokens = torch.empty(rows, seq, dtype=torch.long, device="meta")
    # under autocast the head's GEMM gives logits in the autocast dtype; the residual stream stays float32
    logits_dtype = weight.dtype if run.amp_dtype == torch.float32 else run.amp_dtype
    logits = torch.empty(rows, seq, cfg.vocab_size, dtype=logits_dtype, device="meta", requires_grad=True)
    run.stages = []
    for s, module in zip(dims.stages_of(run.coords["pp"]), run.stage_modules):
        run.stages.append(PipelineStage(
            module, s, dims.n_stages, weight.device, input_args=tokens if s == 0 else hidden,
            output_args=logits if s == dims.n_stages - 1 else hidden, group=run.group("pp")))
    if dims.schedule == "interleaved_1f1b":
        run.schedule = ScheduleInterleaved1F1B(run.stages, dims.microbatches, loss_fn=_pipeline_loss)
    else:
        cls = ScheduleGPipe if dims.schedule == "gpipe" else Schedule1F1B
        run.schedule = cls(run.stages[0], dims.microbatches, loss_fn=_pipeline_loss)
    run.schedule_shape = (rows, seq)
    return run.schedule


def _count_load(run: ParallelRun, layer_id: int):
    def hook(module, args, output):
        if torch._C._current_graph_task_id() != -1:
            return  # a recompute inside backward routes the same tokens again: count them once
        run.load_sum.setdefault(layer_id, []).append(module.last_load.detach().clone())
    return hook


def step_loads(run: ParallelRun) -> dict[int, torch.Tensor]:
    """Tokens per expert of this step's micro-batches per held MoE layer: the last `microbatches` forwards (the
    pipeline's first step runs one more, to infer the shapes it sends between stages)."""
    return {i: torch.stack(loads[-run.dims.microbatches:]).sum(0) for i, loads in run.load_sum.items()}


# ---------------------------------------------------------------- one optimiser step

def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if hasattr(t, "to_local") else t


def _is_tp_sharded(p) -> bool:
    placements = getattr(p, "placements", None)
    return placements is not None and any(pl.is_shard() for pl in placements)


def sync_and_clip(run: ParallelRun, named, max_norm: float) -> float:
    """Average gradients over the data-parallel ranks and clip to the global norm; return that norm."""
    from sigma.train.parallel import _bucketed_all_reduce

    dims = run.dims
    dense, expert = [], []
    for name, p in named:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
        (expert if is_expert_param(name) else dense).append(_local(p.grad))
    if dims.dp > 1:
        _bucketed_all_reduce(dense, run.group("dp"))
    if dims.edp > 1:
        _bucketed_all_reduce(expert, run.group("edp"))
    if dims.dp > 1:
        for g in dense + expert:
            g.div_(dims.dp)
    dense_sq = torch.zeros((), dtype=torch.float64)
    expert_sq = torch.zeros((), dtype=torch.float64)
    for name, p in named:
        sq = _local(p.grad).detach().double().pow(2).sum()
        if is_expert_param(name):
            expert_sq += sq  # plain slices: each tp and ep rank holds a different part
        elif _is_tp_sharded(p) or dims.tp == 1:
            dense_sq += sq
        else:
            dense_sq += sq / dims.tp  # replicated over the tp group: counted tp times by the sum below
    for name, size in (("ep", dims.ep),):
        if size > 1:
            with _collective():
                dist.all_reduce(expert_sq, group=run.group(name))
    total = dense_sq + expert_sq
    for name, size in (("tp", dims.tp), ("pp", dims.pp)):
        if size > 1:
            with _collective():
                dist.all_reduce(total, group=run.group(name))
    norm = math.sqrt(float(total))
    if max_norm > 0 and math.isfinite(norm) and norm > max_norm:
        scale = max_norm / (norm + 1e-6)
        for _, p in named:
            _local(p.grad).mul_(scale)
    return norm


def forward_backward(run: ParallelRun, batch: torch.Tensor, poison: bool = False) -> tuple[float, float]:
    """This dp rank's rows [b, T+1]: forward and backward over its micro-batches; (mean CE, mean aux) over them.
    poison (testing only): the logits become NaN, a numerical fault inside the forward pass."""
    dims = run.dims
    inputs, targets = batch[:, :-1], batch[:, 1:]
    run.load_sum.clear()
    if dims.pp == 1:
        ces, auxes = [], []
        for mb_in, mb_tg in zip(inputs.chunk(dims.microbatches), targets.chunk(dims.microbatches)):
            with run.autocast():
                logits, aux = run.module(mb_in)
            if poison:
                logits = logits * float("nan")
            ce = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), mb_tg.reshape(-1))
            ((ce + aux.float()) / dims.microbatches).backward()
            ces.append(float(ce.detach()))
            auxes.append(float(aux.detach()))
        return sum(ces) / len(ces), sum(auxes) / len(auxes)
    for module in run.stage_modules:
        module.aux_values.clear()
        module.clock.busy_s = 0.0
        module.poison = poison
    c = run.coords
    losses: list[torch.Tensor] = []
    first = c["pp"] == 0
    last = dims.n_stages - 1 in dims.stages_of(c["pp"])
    kwargs = {"target": targets, "losses": losses} if last else {}
    schedule = pipeline_schedule(run, inputs.shape[0] // dims.microbatches, inputs.shape[1])
    with run.autocast():  # the schedule runs forwards and backwards in this thread
        if first:
            schedule.step(inputs, **kwargs)
        else:
            schedule.step(**kwargs)
    # CE lives on the last stage, aux on every stage: sum both over the pp group
    ce_sum = sum(float(x.detach()) for x in losses) / dims.microbatches if last else 0.0
    aux_sum = sum(v for m in run.stage_modules for v in m.aux_values) / dims.microbatches
    values = torch.tensor([ce_sum, aux_sum], dtype=torch.float64)
    with _collective():
        dist.all_reduce(values, group=run.group("pp"))
    return float(values[0]), float(values[1])


@torch.no_grad()
def eval_loss_sum(run: ParallelRun, batch: torch.Tensor) -> float:
    """Sum over this dp rank's micro-batches of the mean CE (forward only; with pp, the schedule's eval run)."""
    dims = run.dims
    inputs, targets = batch[:, :-1], batch[:, 1:]
    if dims.pp == 1:
        total = 0.0
        for mb_in, mb_tg in zip(inputs.chunk(dims.microbatches), targets.chunk(dims.microbatches)):
            with run.autocast():
                logits, _ = run.module(mb_in)
            total += float(F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), mb_tg.reshape(-1)))
        return total
    last = dims.n_stages - 1 in dims.stages_of(run.coords["pp"])
    losses: list[torch.Tensor] = []
    kwargs = {"target": targets, "losses": losses} if last else {}
    schedule = pipeline_schedule(run, inputs.shape[0] // dims.microbatches, inputs.shape[1])
    with run.autocast():
        if run.coords["pp"] == 0:
            schedule.eval(inputs, **kwargs)
        else:
            schedule.eval(**kwargs)
    value = torch.tensor([sum(float(x) for x in losses)], dtype=torch.float64)
    with _collective():
        dist.all_reduce(value, group=run.group("pp"))
    return float(value[0])


def global_loads(run: ParallelRun) -> torch.Tensor | None:
    """Tokens per expert of every MoE layer [n_moe, E], summed over all data-parallel ranks and micro-batches."""
    cfg = run.model_cfg
    if cfg.n_moe_layers == 0:
        return None
    loads = torch.zeros(cfg.n_moe_layers, cfg.n_experts, dtype=torch.float64)
    for layer_id, load in step_loads(run).items():
        loads[layer_id - cfg.n_dense_layers] = load.double()
    for name, size in (("dp", run.dims.dp), ("pp", run.dims.pp)):
        if size > 1:
            with _collective():
                dist.all_reduce(loads, group=run.group(name))
    return loads


def local_step(run: ParallelRun, optimizer, named, local: torch.Tensor, max_norm: float = 1.0,
               poison: bool = False) -> tuple[float, float, float, torch.Tensor | None]:
    """One optimiser step on this dp rank's rows [b, T+1]: (loss, aux, grad norm) averaged over the dp ranks, and
    the step's tokens per expert [n_moe, E] summed over all ranks (None without MoE layers)."""
    dims = run.dims
    t0 = time.perf_counter()
    optimizer.zero_grad(set_to_none=True)
    t_fb = time.perf_counter()
    ce, aux = forward_backward(run, local, poison)
    fb_s = time.perf_counter() - t_fb
    values = torch.tensor([ce, aux], dtype=torch.float64)
    if dims.dp > 1:
        with _collective():
            dist.all_reduce(values, group=run.group("dp"))
        values /= dims.dp
    gnorm = sync_and_clip(run, named, max_norm)
    optimizer.step()
    run.kpi = {"step_s": time.perf_counter() - t0}
    dropped = dropped_tokens(run.moe_by_id.values())
    if dropped is not None:
        run.kpi["dropped_tokens"] = dropped  # share of this rank's routed copies over capacity
    if dims.pp > 1:
        busy = sum(m.clock.busy_s for m in run.stage_modules)
        # the share of the schedule's run this rank's stages did not compute: waits for its neighbours
        run.kpi.update(pipeline_s=fb_s, stage_busy_s=busy, bubble=max(0.0, 1 - busy / fb_s))
    loads = global_loads(run)
    if loads is not None:
        for layer_id, layer in run.moe_by_id.items():
            if layer.balance == "aux_free":
                layer.update_bias(loads[layer_id - run.model_cfg.n_dense_layers])
        if run.recompute is not None:
            run.recompute.update({i + run.model_cfg.n_dense_layers: row for i, row in enumerate(loads)})
    return float(values[0]), float(values[1]), gnorm, loads


def train_step(run: ParallelRun, optimizer, named, batch: torch.Tensor, max_norm: float = 1.0
               ) -> tuple[float, float, float]:
    """One optimiser step on the global batch [B, T+1] (each dp rank takes its rows): (loss, aux, grad norm)."""
    rows = batch.shape[0] // run.dims.dp
    dp = run.coords["dp"]
    loss, aux, gnorm, _ = local_step(run, optimizer, named, batch[dp * rows:(dp + 1) * rows], max_norm)
    return loss, aux, gnorm


# ---------------------------------------------------------------- checkpoints that reshard

def _expert_dtensor(run: ParallelRun, name: str, local: torch.Tensor):
    """A routed expert's plain slice as a DTensor over (ep, tp): experts on dim 0, hidden on dim 1 (w1, w3) or 2."""
    dims = run.dims
    if dims.ep == 1 and dims.tp == 1:
        return local
    from torch.distributed.tensor import DTensor, Shard

    hidden_dim = 2 if name.endswith("w2") else 1
    return DTensor.from_local(local, run.mesh["ep", "tp"], [Shard(0), Shard(hidden_dim)], run_check=False)


def checkpoint_state(run: ParallelRun, optimizer, named, step: int) -> dict:
    """State for torch.distributed.checkpoint under full-model names, every sharded tensor a DTensor."""
    params = dict(named)
    model_sd = {n: (_expert_dtensor(run, n, t) if is_expert_param(n) else t)
                for n, t in run.module.state_dict().items()}
    optim_sd = {}
    for n, p in params.items():
        if p not in optimizer.state:
            continue  # a sharded optimiser: another rank owns this state and saves it
        st = optimizer.state[p]
        optim_sd[n] = {"step": st["step"]}
        for key in ("exp_avg", "exp_avg_sq"):
            optim_sd[n][key] = _expert_dtensor(run, n, st[key]) if is_expert_param(n) else st[key]
    return {"model": model_sd, "optim": optim_sd, "step": torch.tensor(step)}


def load_checkpoint(run: ParallelRun, optimizer, named, path: str) -> int:
    """Load a checkpoint written under any layout of the same model into this one; return its step.

    A checkpoint of another model fails with the names or shapes that differ (DCP's planner)."""
    import torch.distributed.checkpoint as dcp

    state = checkpoint_state(run, optimizer, named, 0)
    dcp.load(state, checkpoint_id=path)
    restore_loaded(run, optimizer, named, state)
    return int(state["step"])


def restore_loaded(run: ParallelRun, optimizer, named, state: dict) -> None:
    """After an in-place DCP load of checkpoint_state's dict, make sure the live tensors hold the loaded values."""
    with torch.no_grad():
        live = run.module.state_dict()
        for n, holder in state["model"].items():
            if _local(holder).data_ptr() != _local(live[n]).data_ptr():
                _local(live[n]).copy_(_local(holder))
        for n, p in named:
            if n not in state["optim"]:
                continue
            st = optimizer.state[p]
            for key in ("step", "exp_avg", "exp_avg_sq"):
                if _local(state["optim"][n][key]).data_ptr() != _local(st[key]).data_ptr():
                    _local(st[key]).copy_(_local(state["optim"][n][key]))


def build_optimizer(run: ParallelRun, cfg, shard: bool = False):
    """The trainer's AdamW over this rank's parameters; per-tensor updates when some are DTensors (tp > 1):
    foreach kernels refuse lists that mix DTensors and plain tensors. shard: ZeRO-1 (sigma.train.zero)."""
    from sigma.train.trainer import build_optimizer as trainer_optimizer

    device = next(run.module.parameters()).device
    if shard and run.dims.dp > 1:
        from sigma.train.zero import ShardedAdamW

        named = [(n, p) for n, p in run.module.named_parameters() if p.requires_grad]
        optimizer = ShardedAdamW(run, named, cfg)
        fused = False
    else:
        optimizer, named, fused = trainer_optimizer(run.module, cfg, device)
    if any(hasattr(p, "placements") for _, p in named):
        for group in optimizer.param_groups:
            group["foreach"], group["fused"] = False, None
    return optimizer, named, fused


def is_dp_ep_only(dims: ParallelDims, shard_optimizer: bool = False) -> bool:
    """A layout the trainer's plain data x expert parallel loop runs; any other goes through local_step."""
    return dims.tp == 1 and dims.pp == 1 and not shard_optimizer
