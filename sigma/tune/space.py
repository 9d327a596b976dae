"""The layouts a tuner may pick: every valid tp x pp x ep x vpp x micro-batch size for a world and global batch.

A Layout is what a trainer config needs (`parallel.*`, `data.micro_batch`); validity is sigma.train.dims's, so
the tuner never proposes what `sigma train` would refuse.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from sigma.config import ConfigError
from sigma.train.config import ModelConfig
from sigma.train.dims import ParallelDims


@dataclass(frozen=True)
class Layout:
    tp: int = 1
    pp: int = 1
    ep: int = 1
    vpp: int = 1
    mbs: int = 1  # sequences per micro-batch
    zero: bool = False  # ZeRO-1 (parallel.shard_optimizer)
    recompute: bool = False  # every MoE layer recomputed in backward (parallel.recompute.moe_layers)
    pp_layers: tuple[int, ...] = field(default=())  # empty: even split

    @property
    def schedule(self) -> str:
        return "interleaved_1f1b" if self.vpp > 1 else "1f1b"

    def name(self) -> str:
        text = f"tp{self.tp} pp{self.pp} ep{self.ep}"
        if self.vpp > 1:
            text += f" vpp{self.vpp}"
        text += f" mbs{self.mbs}"
        if self.zero:
            text += " zero1"
        if self.recompute:
            text += " rc"
        if self.pp_layers:
            text += " [" + ",".join(map(str, self.pp_layers)) + "]"
        return text

    def dims(self, world: int, model: ModelConfig, global_batch: int) -> ParallelDims:
        hidden = {"expert_hidden": model.expert_hidden}
        if model.n_dense_layers:
            hidden["dense_hidden"] = model.dense_hidden
        return ParallelDims.build(world, tp=self.tp, pp=self.pp, ep=self.ep, vpp=self.vpp, micro_batch=self.mbs,
                                  pp_layers=list(self.pp_layers), n_layers=model.n_layers,
                                  n_experts=model.n_experts, n_heads=model.n_heads, n_kv_heads=model.n_kv_heads,
                                  hidden_sizes=hidden, global_batch=global_batch,
                                  tie_embeddings=model.tie_embeddings)

    def overrides(self, model: ModelConfig) -> list[str]:
        """The trainer config keys of this layout."""
        out = [f"parallel.tp={self.tp}", f"parallel.pp={self.pp}", f"parallel.ep={self.ep}",
               f"parallel.vpp={self.vpp}", f"parallel.pp_schedule={self.schedule if self.pp > 1 else 'auto'}",
               f"data.micro_batch={self.mbs}", "parallel.microbatches=0",
               f"parallel.shard_optimizer={'true' if self.zero else 'false'}"]
        if self.pp_layers:
            out.append("parallel.pp_layers=[" + ", ".join(map(str, self.pp_layers)) + "]")
        if self.recompute:
            out.append("parallel.recompute.moe_layers=[" + ", ".join(map(str, moe_layer_ids(model))) + "]")
        return out

    def as_dict(self) -> dict:
        return {**asdict(self), "pp_layers": list(self.pp_layers)}

    @classmethod
    def from_dict(cls, d: dict) -> "Layout":
        return cls(**{**d, "pp_layers": tuple(d.get("pp_layers", ()))})


def moe_layer_ids(model: ModelConfig) -> list[int]:
    return list(range(model.n_dense_layers, model.n_layers))


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


@dataclass(frozen=True)
class Space:
    """Degrees the search may use; None: every divisor that is valid."""
    max_tp: int | None = None  # usually the accelerators per node: tp peers exchange activations every layer
    vpps: tuple[int, ...] = (1, 2)
    max_mbs: int | None = None
    zero: tuple[bool, ...] = (False, True)
    recompute: tuple[bool, ...] = (False,)


def enumerate_layouts(world: int, model: ModelConfig, global_batch: int, space: Space = Space()
                      ) -> list[tuple[Layout, ParallelDims]]:
    """Every valid layout, each with its validated dims, in a stable order."""
    if global_batch < 1:
        raise ConfigError("[--global-batch]", f"must be a positive number of sequences, got {global_batch}")
    out = []
    for tp in divisors(world):
        if space.max_tp and tp > space.max_tp:
            continue
        for pp in divisors(world // tp):
            dp = world // (tp * pp)
            if global_batch % dp:
                continue
            local = global_batch // dp
            for ep in divisors(dp):
                for vpp in space.vpps if pp > 1 else (1,):
                    for mbs in divisors(local):
                        if space.max_mbs and mbs > space.max_mbs:
                            continue
                        for zero in space.zero if dp > 1 else (False,):
                            for rc in space.recompute:
                                layout = Layout(tp=tp, pp=pp, ep=ep, vpp=vpp, mbs=mbs, zero=zero, recompute=rc)
                                try:
                                    out.append((layout, layout.dims(world, model, global_batch)))
                                except ConfigError:
                                    continue
    return out


def explain_empty(world: int, model: ModelConfig, global_batch: int) -> str:
    """Why no layout is valid: the data-parallel degrees a global batch would have to divide."""
    dps = sorted({world // (tp * pp) for tp in divisors(world) for pp in divisors(world // tp)})
    return (f"no layout of {world} ranks is valid for global batch {global_batch} and this model "
            f"({model.n_layers} layers, {model.n_experts} experts, {model.n_heads} heads): the global batch must be "
            f"divisible by a data-parallel degree (possible: {dps}) whose tp/pp/ep also divide the model")
