"""Model configuration of the MoE decoder: a typed dataclass, validated on construction, and named presets.

    cfg = load_model_config("debug")                                  # configs/train/models/debug.yaml
    cfg = load_model_config("configs/my-model.yaml", {"n_layers": 4})  # a file plus overrides

Presets live in configs/train/models/<name>.yaml as flat ModelConfig keys.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import yaml

from sigma.config import ConfigError, _Source, from_dict, load_yaml
from sigma.paths import configs_dir

SCORE_FUNCS = ("softmax", "sigmoid")
BALANCE_MODES = ("aux_loss", "aux_free", "none")
INIT_MODES = ("gaussian", "scaled")
EXPERT_IMPLS = ("auto", "grouped_mm", "loop")
BALANCE_SCOPES = ("micro_batch", "global_batch")


@dataclass
class ModelConfig:
    vocab_size: int = 32000  # tokenizer vocabulary size (rows of the embedding and the output head)
    dim: int = 512  # model (residual stream) width
    n_layers: int = 8  # transformer blocks
    n_heads: int = 8  # query heads; head_dim = dim / n_heads
    n_kv_heads: int = 2  # key/value heads (GQA); must divide n_heads
    max_seq_len: int = 2048  # longest sequence RoPE tables are built for
    rope_theta: float = 10000.0  # RoPE base frequency
    norm_eps: float = 1e-5  # RMSNorm epsilon
    n_dense_layers: int = 1  # the first this many blocks use a dense SwiGLU FFN instead of MoE
    dense_hidden: int = 1408  # hidden width of the dense FFN
    n_experts: int = 8  # routed experts per MoE layer
    top_k: int = 2  # routed experts each token is sent to
    expert_hidden: int = 256  # hidden width of one routed expert (fine-grained: small)
    n_shared_experts: int = 0  # always-on shared experts; their FFN is n_shared_experts * expert_hidden wide
    score_func: Literal["softmax", "sigmoid"] = "softmax"  # router scores: softmax over experts or per-expert sigmoid
    norm_topk_prob: bool = True  # renormalise the top-k scores to sum to 1 (Mixtral, DeepSeek-V3); not for top_k=1
    route_scale: float = 1.0  # multiplies the routing weights (DeepSeek-V3 uses >1 with sigmoid scores)
    balance: Literal["aux_loss", "aux_free", "none"] = "aux_loss"  # load balancing: Switch aux loss, expert bias, off
    aux_loss_coef: float = 0.01  # weight of the Switch auxiliary loss in the returned aux_loss
    bias_update_speed: float = 0.001  # aux-free: step of the expert-bias update per update_bias() call
    init: Literal["gaussian", "scaled"] = "scaled"  # gaussian: all N(0, init_std); scaled: Megatron output init
    init_std: float = 0.02  # std of the Gaussian init (output projections: / sqrt(2 n_layers) with init=scaled)
    tie_embeddings: bool = False  # share the token embedding with the output head
    expert_impl: Literal["auto", "grouped_mm", "loop"] = "auto"  # torch._grouped_mm, per-expert loop, or pick
    balance_scope: Literal["micro_batch", "global_batch"] = "micro_batch"  # aux loss expert fractions: own tokens, or summed over all data-parallel ranks
    router_z_loss_coef: float = 0.0  # ST-MoE router z-loss weight: mean squared logsumexp of the router logits
    router_jitter: float = 0.0  # training only: router input times U(1 - jitter, 1 + jitter) noise (Switch, Mixtral)
    activation_checkpointing: bool = False  # recompute each block's forward in the backward (less memory, more FLOPs)
    qk_norm: bool = False  # RMSNorm on each head's queries and keys before RoPE (OLMo 2, Qwen 3): bounds attention logits
    dropout: float = 0.0  # training only: dropout on each block's attention and FFN outputs before the residual add

    def __post_init__(self) -> None:
        for name in ("vocab_size", "dim", "n_layers", "n_heads", "n_kv_heads", "max_seq_len", "n_experts", "top_k",
                     "expert_hidden"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        for name in ("n_dense_layers", "dense_hidden", "n_shared_experts"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ValueError(f"{name} must be a non-negative integer, got {value!r}")
        _choice("score_func", self.score_func, SCORE_FUNCS)
        _choice("balance", self.balance, BALANCE_MODES)
        _choice("init", self.init, INIT_MODES)
        _choice("expert_impl", self.expert_impl, EXPERT_IMPLS)
        _choice("balance_scope", self.balance_scope, BALANCE_SCOPES)
        if self.dim % self.n_heads:
            raise ValueError(f"dim ({self.dim}) must be divisible by n_heads ({self.n_heads})")
        if (self.dim // self.n_heads) % 2:
            raise ValueError(f"head_dim = dim / n_heads = {self.dim // self.n_heads} must be even for RoPE")
        if self.n_heads % self.n_kv_heads:
            raise ValueError(f"n_heads ({self.n_heads}) must be divisible by n_kv_heads ({self.n_kv_heads})")
        if self.top_k > self.n_experts:
            raise ValueError(f"top_k ({self.top_k}) must be <= n_experts ({self.n_experts})")
        if self.n_dense_layers > self.n_layers:
            raise ValueError(f"n_dense_layers ({self.n_dense_layers}) must be <= n_layers ({self.n_layers})")
        if self.n_dense_layers > 0 and self.dense_hidden < 1:
            raise ValueError("dense_hidden must be positive when n_dense_layers > 0")
        for name in ("rope_theta", "norm_eps", "init_std", "route_scale"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)!r}")
        if not 0 <= self.dropout < 1:
            raise ValueError(f"dropout must be in [0, 1), got {self.dropout!r}")
        if not 0 <= self.router_jitter < 1:
            raise ValueError(f"router_jitter must be in [0, 1), got {self.router_jitter!r}")
        for name in ("aux_loss_coef", "bias_update_speed", "router_z_loss_coef"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)!r}")

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_heads

    @property
    def n_moe_layers(self) -> int:
        return self.n_layers - self.n_dense_layers

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _choice(name: str, value: Any, options: tuple[str, ...]) -> None:
    if value not in options:
        raise ValueError(f"{name} must be one of {', '.join(map(repr, options))}, not {value!r}")


def models_dir() -> Path:
    return configs_dir() / "train" / "models"


def preset_names() -> list[str]:
    return sorted(p.stem for p in models_dir().glob("*.yaml"))


def resolve_model_path(name_or_path: str | Path) -> Path:
    """A preset name (configs/train/models/<name>.yaml) or a path to a YAML file."""
    text = str(name_or_path)
    path = Path(text).expanduser()
    if text.endswith((".yaml", ".yml")) or path.is_file():
        return path
    preset = models_dir() / f"{text}.yaml"
    if not preset.is_file():
        raise ConfigError(text, f"unknown model preset; presets: {', '.join(preset_names())}")
    return preset


def load_model_config(name_or_path: str | Path, overrides: dict[str, Any] | None = None) -> ModelConfig:
    """Load a preset or file; overrides (flat keys) replace file values before type checks and validation.

    String override values are parsed as YAML scalars, so CLI text like {"dim": "128"} becomes an int.
    """
    path = resolve_model_path(name_or_path)
    data, source = load_yaml(path)
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(source.where(()), f"expected a mapping of model keys, got {type(data).__name__}")
    for key, value in (overrides or {}).items():
        data[key] = yaml.safe_load(value) if isinstance(value, str) else value
    return from_dict(ModelConfig, data, source)


def model_config_from_dict(data: dict[str, Any], where: str = "<model>") -> ModelConfig:
    """Build a ModelConfig from plain data (e.g. a `model:` section already loaded elsewhere)."""
    return from_dict(ModelConfig, data, _Source(where, ""))
