"""One validated layout of a training run: dp x tp x pp ranks, experts over ep of the dp ranks, vpp stages per rank.

    dims = ParallelDims.build(world=8, tp=2, pp=2, ep=2, n_layers=8, n_experts=8, global_batch=8, ...)

Rank order (innermost first): tp, then ep, then the rest of dp (edp), then pp. Tensor-parallel peers are
neighbours (NVLink on a GPU node); expert-parallel groups are carved out of the data-parallel ranks, so an EP
group holds one copy of every expert and the edp ranks replicate it. Every check runs before any process group
exists and names the key and the numbers that fail.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sigma.config import ConfigError

SCHEDULES = ("1f1b", "gpipe", "interleaved_1f1b")


def _fail(key: str, message: str):
    raise ConfigError(f"[{key}]", message)


def even_split(n_layers: int, n_stages: int) -> list[int]:
    """Layers per stage as even as possible; the first stages take the remainder (the last stage has the head)."""
    base, extra = divmod(n_layers, n_stages)
    return [base + (1 if i < extra else 0) for i in range(n_stages)]


@dataclass(frozen=True)
class ParallelDims:
    world: int
    dp: int
    tp: int = 1
    pp: int = 1
    ep: int = 1
    vpp: int = 1  # virtual pipeline stages per pp rank (interleaved 1F1B)
    schedule: str = "1f1b"
    microbatches: int = 1  # per optimiser step and data-parallel rank
    stage_layers: tuple[int, ...] = field(default=())  # layers of each of the pp * vpp stages, in model order

    @property
    def n_stages(self) -> int:
        return self.pp * self.vpp

    @property
    def edp(self) -> int:
        return self.dp // self.ep

    @property
    def mesh_shape(self) -> tuple[int, int, int, int]:
        return self.pp, self.edp, self.ep, self.tp

    mesh_names = ("pp", "edp", "ep", "tp")

    def coords(self, rank: int) -> dict[str, int]:
        """This rank's index along every mesh dimension (row-major over mesh_shape), plus its dp index."""
        out = {}
        for name, size in reversed(list(zip(self.mesh_names, self.mesh_shape))):
            out[name] = rank % size
            rank //= size
        out["dp"] = out["edp"] * self.ep + out["ep"]
        return out

    def stages_of(self, pp_rank: int) -> list[int]:
        """Stage ids held by a pp rank: pp_rank, pp_rank + pp, ... (the loop order of interleaved 1F1B)."""
        return [pp_rank + v * self.pp for v in range(self.vpp)]

    def layers_of_stage(self, stage: int) -> list[int]:
        start = sum(self.stage_layers[:stage])
        return list(range(start, start + self.stage_layers[stage]))

    def describe(self) -> str:
        text = f"dp{self.dp} tp{self.tp} pp{self.pp} ep{self.ep}"
        if self.pp > 1:
            text += f" vpp{self.vpp} {self.schedule} mb{self.microbatches} layers{list(self.stage_layers)}"
        return text

    @classmethod
    def build(cls, world: int, *, tp: int = 1, pp: int = 1, ep: int = 1, vpp: int = 1, schedule: str = "auto",
              microbatches: int = 0, micro_batch: int = 0, pp_layers: list[int] | None = None, n_layers: int = 1,
              n_experts: int = 1, n_heads: int = 1, n_kv_heads: int = 1, hidden_sizes: dict[str, int] | None = None,
              global_batch: int = 1, tie_embeddings: bool = False) -> "ParallelDims":
        for key, value in (("parallel.tp", tp), ("parallel.pp", pp), ("parallel.ep", ep), ("parallel.vpp", vpp)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                _fail(key, f"must be a positive integer, got {value!r}")
        if world % (tp * pp):
            _fail("parallel.tp", f"world size {world} (launch.nodes x launch.gpus_per_node) is not divisible by "
                                 f"parallel.tp x parallel.pp = {tp} x {pp} = {tp * pp}")
        dp = world // (tp * pp)
        if dp % ep:
            _fail("parallel.ep", f"parallel.ep={ep} must divide the data-parallel degree dp = world size {world} / "
                                 f"(tp {tp} x pp {pp}) = {dp}: expert-parallel groups are made of data-parallel ranks")
        if n_experts % ep:
            _fail("parallel.ep", f"the model's {n_experts} routed experts cannot be split over parallel.ep={ep} ranks")
        if tp > 1:
            for name, size in {"n_heads": n_heads, "n_kv_heads": n_kv_heads, **(hidden_sizes or {})}.items():
                if size % tp:
                    _fail("parallel.tp", f"parallel.tp={tp} must divide the model's {name}={size}")
        if global_batch % dp:
            _fail("data.global_batch", f"global_batch {global_batch} is not divisible by the {dp} data-parallel "
                                       f"ranks (world {world} / (tp {tp} x pp {pp}))")
        local_batch = global_batch // dp

        if schedule == "auto":
            schedule = "interleaved_1f1b" if vpp > 1 else "1f1b"
        if schedule not in SCHEDULES:
            _fail("parallel.pp_schedule", f"unknown schedule {schedule!r}; use auto, {', '.join(SCHEDULES)}")
        if vpp > 1 and pp == 1:
            _fail("parallel.vpp", f"parallel.vpp={vpp} needs pipeline parallelism (parallel.pp > 1)")
        if vpp > 1 and schedule != "interleaved_1f1b":
            _fail("parallel.pp_schedule", f"parallel.vpp={vpp} needs pp_schedule interleaved_1f1b, not {schedule}")
        if vpp == 1 and schedule == "interleaved_1f1b":
            _fail("parallel.vpp", "pp_schedule interleaved_1f1b needs parallel.vpp >= 2 virtual stages per rank")
        if pp > 1 and tie_embeddings:
            _fail("parallel.pp", "tie_embeddings shares the first and the last stage's weight; use pp=1 or untie")
        n_stages = pp * vpp
        if pp_layers:
            if len(pp_layers) != n_stages:
                _fail("parallel.pp_layers", f"{len(pp_layers)} entries for pp x vpp = {pp} x {vpp} = {n_stages} stages")
            if any(not isinstance(n, int) or n < 1 for n in pp_layers):
                _fail("parallel.pp_layers", f"every stage needs at least one layer, got {list(pp_layers)}")
            if sum(pp_layers) != n_layers:
                _fail("parallel.pp_layers", f"stage layers {list(pp_layers)} sum to {sum(pp_layers)}, but the model "
                                            f"has n_layers={n_layers}")
            stage_layers = tuple(pp_layers)
        else:
            if n_layers < n_stages:
                _fail("parallel.vpp" if vpp > 1 else "parallel.pp",
                      f"pp x vpp = {pp} x {vpp} = {n_stages} stages need at least {n_stages} layers; the model has "
                      f"n_layers={n_layers}")
            stage_layers = tuple(even_split(n_layers, n_stages))

        microbatches = _resolve_microbatches(microbatches, micro_batch, local_batch, global_batch, dp, pp)
        # a count derived from data.micro_batch is reported under that key, with the size it came from
        key, derived = (("data.micro_batch", f" (data.micro_batch={micro_batch} of {local_batch} sequences)")
                        if micro_batch else ("parallel.microbatches", ""))
        if pp > 1 and microbatches < pp:
            _fail(key, f"{microbatches} micro-batches{derived} cannot fill a {pp}-stage pipeline: "
                       f"{schedule} needs at least pp={pp}")
        if schedule == "interleaved_1f1b" and microbatches % pp:
            _fail(key, f"interleaved 1F1B (vpp={vpp}) runs micro-batches in rounds of pp={pp}; "
                       f"{microbatches}{derived} is not a multiple of {pp}")
        return cls(world=world, dp=dp, tp=tp, pp=pp, ep=ep, vpp=vpp, schedule=schedule if pp > 1 else "1f1b",
                   microbatches=microbatches, stage_layers=stage_layers)


def _resolve_microbatches(count: int, size: int, local_batch: int, global_batch: int, dp: int, pp: int) -> int:
    """Micro-batches per step and data-parallel rank, from parallel.microbatches (a count) and data.micro_batch
    (sequences each); 0 leaves one open. The rank's batch always splits into count x size sequences."""
    batch = f"the {local_batch} sequences per data-parallel rank (global_batch {global_batch} / dp {dp})"
    for key, value in (("parallel.microbatches", count), ("data.micro_batch", size)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            _fail(key, f"must be a non-negative integer (0: derived), got {value!r}")
    if size and local_batch % size:
        _fail("data.micro_batch", f"micro_batch {size} does not divide {batch}")
    if count and local_batch % count:
        _fail("parallel.microbatches", f"{batch} do not split into {count} micro-batches")
    if count and size and count * size != local_batch:
        _fail("data.micro_batch", f"parallel.microbatches={count} micro-batches of data.micro_batch={size} "
                                  f"sequences are {count * size}, but {batch}; set one of them, or both to agree")
    if size:
        return local_batch // size
    return count or (pp if pp > 1 else 1)


def dims_from_config(cfg, world: int, model_cfg) -> ParallelDims:
    """ParallelDims of a TrainConfig (sigma.train.train_config) and its ModelConfig."""
    par = cfg.parallel
    hidden = {"expert_hidden": model_cfg.expert_hidden}
    if model_cfg.n_dense_layers:
        hidden["dense_hidden"] = model_cfg.dense_hidden
    return ParallelDims.build(
        world, tp=par.tp, pp=par.pp, ep=par.ep, vpp=par.vpp, schedule=par.pp_schedule,
        microbatches=par.microbatches, micro_batch=cfg.data.micro_batch, pp_layers=list(par.pp_layers),
        n_layers=model_cfg.n_layers, n_experts=model_cfg.n_experts, n_heads=model_cfg.n_heads,
        n_kv_heads=model_cfg.n_kv_heads, hidden_sizes=hidden, global_batch=cfg.data.global_batch,
        tie_embeddings=model_cfg.tie_embeddings)
