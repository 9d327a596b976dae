"""Run configuration of `sigma train`: typed sections, CLI `key=value` overrides, layout validation.

A run preset (configs/train/<name>.yaml) names a model preset (`model: debug`) plus `model_overrides`, and
sets data, optimiser, parallelism, checkpoint, KPI and launch options. Unknown keys are errors that list the
valid ones (sigma.config).
"""

from __future__ import annotations

import copy
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Literal

import yaml

from sigma.config import ConfigError, _Source, from_dict, load_yaml


@dataclass
class DataConfig:
    path: str = "~/.cache/sigma/data/stdlib-{tokenizer}-{vocab_size}"  # prepared shards; {vocab_size}: the model's
    prepare_if_missing: bool = True  # rank 0 prepares the stdlib corpus there when the directory has no data
    prepare_max_mb: float = 16.0  # corpus size for that automatic prepare
    tokenizer: Literal["bpe", "byte"] = "bpe"  # automatic prepare: BPE trained to the model's vocab_size, or bytes
    seq_len: int = 128  # tokens per training sequence
    global_batch: int = 8  # sequences per optimiser step over all data-parallel ranks
    micro_batch: int = 0  # sequences per micro-batch (gradient accumulation, pipeline); 0: from parallel.microbatches
    seed: int = 0  # order of the windows; the batch of step s depends only on (seed, s)

    def __post_init__(self):
        if self.seq_len < 1 or self.global_batch < 1:
            raise ValueError("data.seq_len and data.global_batch must be positive")
        if self.micro_batch < 0:
            raise ValueError("data.micro_batch must not be negative")

    def resolved_path(self, vocab_size: int) -> Path:
        return Path(self.path.format(tokenizer=self.tokenizer, vocab_size=vocab_size)).expanduser()


@dataclass
class EvalConfig:
    every: int = 50  # held-out loss and perplexity every this many steps and at the last step; 0 never
    batches: int = 2  # global batches of held-out windows per evaluation (the same windows every time)

    def __post_init__(self):
        if self.every < 0 or self.batches < 1:
            raise ValueError("eval.every must be >= 0 and eval.batches >= 1")


@dataclass
class OptimConfig:
    lr: float = 3e-3  # peak learning rate after warm-up
    min_lr: float = 3e-4  # cosine decay ends here at the last step
    warmup_steps: int = 10  # linear warm-up from 0
    weight_decay: float = 0.1  # applied to matrices only (not norms, biases, embeddings' bias)
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-8
    grad_clip: float = 1.0  # global gradient-norm clip; 0 disables
    fused: bool = True  # fused AdamW kernel where the device supports it, else foreach

    def __post_init__(self):
        if self.lr <= 0 or self.min_lr < 0 or self.min_lr > self.lr:
            raise ValueError(f"optim needs 0 <= min_lr <= lr and lr > 0 (lr={self.lr}, min_lr={self.min_lr})")
        if self.warmup_steps < 0 or self.grad_clip < 0:
            raise ValueError("optim.warmup_steps and optim.grad_clip must not be negative")


@dataclass
class RecomputeConfig:
    moe_layers: list[int] = field(default_factory=list)  # recompute these MoE layers' activations in backward
    policy: Literal["none", "balanced"] = "none"  # balanced: the `count` MoE layers with the most even routing
    count: int = 0  # layers the balanced policy picks


@dataclass
class ParallelConfig:
    ep: int = 1  # expert-parallel degree: experts are sharded over groups of this many ranks
    ep_dispatch: Literal["capacity", "dropless"] = "dropless"  # dropless: exact, one host read per layer; capacity: fixed shapes, none
    ep_capacity_factor: float = 2.0  # capacity dispatch: rows per expert and rank = this x the even share (>= E/top_k never drops)
    ep_chunks: int = 2  # capacity dispatch: pieces the all-to-all is issued in, so experts compute while the next arrives
    backend: Literal["auto", "gloo", "nccl"] = "auto"  # auto: nccl on GPU, gloo on CPU
    # Layout beyond dp x ep (sigma/train/dims.py, docs/train-parallel.md): dp = world / (tp x pp).
    tp: int = 1  # tensor-parallel degree: attention heads, FFN and expert hidden widths split over tp ranks
    pp: int = 1  # pipeline-parallel degree: the layers split into pp (x vpp) stages
    vpp: int = 1  # virtual stages per pipeline rank (interleaved 1F1B)
    pp_schedule: Literal["auto", "1f1b", "gpipe", "interleaved_1f1b"] = "auto"  # auto: interleaved when vpp > 1
    pp_layers: list[int] = field(default_factory=list)  # layers per stage (pp x vpp entries); empty: even split
    microbatches: int = 0  # micro-batches per step and data-parallel rank; 0: from data.micro_batch, else pp
    shard_optimizer: bool = False  # ZeRO-1: each AdamW state on one data-parallel rank (sigma/train/zero.py)
    recompute: RecomputeConfig = field(default_factory=RecomputeConfig)

    def __post_init__(self):
        if self.ep < 1:
            raise ValueError(f"parallel.ep must be at least 1, got {self.ep}")
        if not self.ep_capacity_factor > 0:
            raise ValueError(f"parallel.ep_capacity_factor must be positive, got {self.ep_capacity_factor}")
        if self.ep_chunks < 1:
            raise ValueError(f"parallel.ep_chunks must be at least 1, got {self.ep_chunks}")


@dataclass
class CheckpointConfig:
    dir: str = "runs/{name}/checkpoints"  # {name} is the run name; shared by all ranks (shared filesystem)
    every: int = 50  # save every this many steps (and at the last step); 0 saves only at the end
    keep: int = 3  # newest complete checkpoints kept
    resume: bool = True  # start from the newest complete checkpoint under dir when there is one
    background: bool = True  # write checkpoints from a thread while training goes on (state copied to CPU first)
    nan_rollback: bool = True  # on a NaN/Inf loss, save the last healthy step (unless saved) before stopping
    replica_every: int = 0  # in-memory peer replica every this many steps (sigma/train/replica.py); 0 off
    replica_dir: str = "/dev/shm/sigma-replicas"  # node-local host memory (tmpfs) holding the replicas
    jit_poll_every: int = 1  # look for the controller's just-in-time checkpoint request every this many steps; 0 never

    def __post_init__(self):
        if self.every < 0 or self.keep < 1 or self.jit_poll_every < 0:
            raise ValueError("checkpoint.every and checkpoint.jit_poll_every must be >= 0 and checkpoint.keep >= 1")


@dataclass
class KpiConfig:
    dir: str = ""  # KPI root; empty: $SIGMA_KPI_DIR, else /var/spool/sigma/kpi
    param_norm_every: int = 10  # MoE parameter norm per layer every this many steps; 0 never
    progress_every: int = 1  # rank 0 prints a progress line every this many steps
    heartbeat_s: float = 5.0  # a `heartbeat` KPI event from a side thread every this many seconds; 0 never


@dataclass
class FaultConfig:
    """Testing only: make a fault happen at its source to exercise detection and recovery paths."""

    nan_at_step: int | None = None  # poison the logits with NaN at this step (training must stop with an event)
    kill_at_step: int | None = None  # SIGKILL the rank as this step starts, once: only in a run that began at step 0
    hang_at_step: int | None = None  # SIGSTOP rank `hang_rank` as this step starts (as `sigma chaos hang`), once: only in a run that began at step 0
    hang_rank: int = 0  # the rank fault.hang_at_step stops
    step_delay_s: float = 0.0  # sleep this long in every step, like a slow node (gives tests time to act mid-run)
    nan_trigger: bool = False  # poison the logits when <KPI dir>/job-<id>/inject-nan appears; consumed (`sigma chaos nan`)
    gc_trigger: bool = False  # while <KPI dir>/job-<id>/inject-gc.<node> exists, make garbage cycles every step (`sigma chaos gc-pressure`)


@dataclass
class LaunchConfig:
    nodes: int = 1  # SLURM nodes
    gpus_per_node: int = 1  # ranks per node (one GPU each on GPU nodes, one process each on CPU nodes)
    cpus_per_task: int = 1  # CPU cores per rank
    timeout_min: int = 60  # SLURM time limit; submitit requeues on timeout through its checkpoint hook
    partition: str = ""  # SLURM partition, empty for the default one
    folder: str = "runs/{name}/submitit"  # submitit logs and pickles
    max_requeues: int = 3  # submitit's requeue budget for timeouts and preemptions
    executor: Literal["auto", "slurm", "local"] = "auto"  # auto: SLURM when sbatch works, else local processes
    mem_gb: int = 0  # memory per node; 0 leaves it to the SLURM default
    exit_on_sigterm: bool = True  # SLURM's SIGTERM (requeue, scancel) ends a rank at once, not after KillWait

    def __post_init__(self):
        if self.nodes < 1 or self.gpus_per_node < 1:
            raise ValueError("launch.nodes and launch.gpus_per_node must be at least 1")

    @property
    def world_size(self) -> int:
        return self.nodes * self.gpus_per_node


@dataclass
class TrainConfig:
    name: str = "run"  # run name: fills {name} in paths
    model: str = "debug"  # model preset name (or a YAML path) handed to sigma.train.config.load_model_config
    model_overrides: dict = field(default_factory=dict)  # model config keys to change on top of the preset
    steps: int = 100  # optimiser steps of the whole run (a resumed run continues up to this)
    seed: int = 0  # parameter initialisation seed (identical on every rank)
    device: Literal["auto", "cpu", "cuda"] = "auto"  # auto: cuda when available
    dtype: Literal["float32", "bfloat16"] = "float32"  # autocast dtype of the forward pass
    threads: int = 2  # torch CPU threads per rank
    gc_every: int = 50  # automatic GC is disabled; collect every this many steps (and after each checkpoint)
    gc_manual: bool = True  # false: keep Python's automatic GC (unsynchronised pauses; to measure what manual GC buys)
    keep_freed_host_memory: bool = True  # CPU device: glibc keeps freed memory for the next step instead of unmapping it
    drop_page_cache: bool = False  # before start: drop the page cache (root) or evict the data shards (others)
    peak_flops: float = 0.0  # FLOP/s of one device for MFU; 0: datasheet table (GPUs) or `sigma train calibrate` (CPUs)
    data: DataConfig = field(default_factory=DataConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    kpi: KpiConfig = field(default_factory=KpiConfig)
    fault: FaultConfig = field(default_factory=FaultConfig)
    launch: LaunchConfig = field(default_factory=LaunchConfig)

    def __post_init__(self):
        if self.steps < 1:
            raise ValueError(f"steps must be at least 1, got {self.steps}")
        if self.gc_every < 0:
            raise ValueError("gc_every must not be negative")

    def path(self, template: str) -> Path:
        return Path(template.format(name=self.name)).expanduser()

    def to_dict(self) -> dict:
        return asdict(self)


def apply_overrides(data: dict, overrides: list[str]) -> dict:
    """`a.b=value` strings onto a nested dict; values are parsed as YAML (`steps=20`, `fault.nan_at_step=3`)."""
    data = copy.deepcopy(data)
    for item in overrides:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise ConfigError("<command line>", f"override {item!r} is not key=value")
        try:
            value = yaml.safe_load(raw) if raw != "" else ""
        except yaml.YAMLError:
            value = raw
        if isinstance(value, str) and re.fullmatch(r"[+-]?(\d+\.?\d*|\.\d+)[eE][+-]?\d+", value):
            value = float(value)  # YAML 1.1 reads 1e-3 (no dot) as a string; on a command line it is a number
        node = data
        parts = key.split(".")
        for part in parts[:-1]:
            if not isinstance(node.setdefault(part, {}), dict):
                raise ConfigError("<command line>", f"override {item!r}: {part!r} is not a section")
            node = node[part]
        node[parts[-1]] = value
    return data


def load_train_config(path: str | Path, overrides: list[str] | None = None) -> TrainConfig:
    data, source = load_yaml(path)
    data = data if data is not None else {}
    if not isinstance(data, dict):
        raise ConfigError(str(path), "a train config must be a mapping")
    if overrides:
        data = apply_overrides(data, overrides)
    return from_dict(TrainConfig, data, source)


def train_config_from_dict(data: dict) -> TrainConfig:
    return from_dict(TrainConfig, data, _Source("<train config>", ""))


def check_layout(cfg: TrainConfig, world_size: int, num_experts: int | None = None):
    """World size, parallel degrees, stage splits and batch divisibility; raise ConfigError naming the keys.

    Returns the validated ParallelDims (sigma/train/dims.py) when the model config can be loaded."""
    from sigma.train.config import load_model_config
    from sigma.train.dims import dims_from_config

    ep = cfg.parallel.ep
    if world_size % ep:
        raise ConfigError("[parallel.ep]", f"world size {world_size} (launch.nodes x launch.gpus_per_node) "
                                           f"is not divisible by parallel.ep={ep}")
    if num_experts is not None and num_experts % ep:
        raise ConfigError("[parallel.ep]", f"the model's {num_experts} routed experts cannot be split over "
                                           f"parallel.ep={ep} ranks")
    # dims also settles the micro-batches: data.micro_batch (size) and parallel.microbatches (count) agree
    return dims_from_config(cfg, world_size, load_model_config(cfg.model, cfg.model_overrides))
