"""Analytic FLOPs per token, accelerator peaks and MFU.

FLOPs per trained token = 6 x (matmul parameters a token passes through) + the attention score/value term
12 x n_layers x n_heads x head_dim x seq_len (PaLM appendix B convention; causal masking is not discounted,
as in PaLM, Megatron and torchtitan, so figures compare across frameworks). Matmul parameters a token passes
through: attention projections, dense FFNs, routers, shared experts, top_k of the n_experts routed experts,
and the output head; the input embedding is a lookup and costs no FLOPs. torch's FlopCounterMode is not used:
on CPU it counts neither SDPA nor grouped GEMMs.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from sigma.train.config import ModelConfig

NVIDIA_H100 = "NVIDIA H100 Tensor Core GPU datasheet (SXM / PCIe / NVL columns)"
NVIDIA_H200 = "NVIDIA H200 Tensor Core GPU datasheet (SXM / NVL columns)"
NVIDIA_A100 = "NVIDIA A100 Tensor Core GPU datasheet"
NVIDIA_BLACKWELL = "NVIDIA DGX/HGX B200 and GB200 NVL72 datasheets (per-GPU share of the system figure)"
AMD_MI300 = "AMD Instinct MI300X / MI325X data sheets (peak matrix FP32, BF16 dense)"


@dataclass(frozen=True)
class DevicePeak:
    """Dense (no structured sparsity) peak FLOP/s of one accelerator from its vendor datasheet."""

    name: str  # matched case-insensitively inside the name the driver reports
    bf16: float  # bf16/fp16 tensor-core peak
    fp32: float | None  # plain fp32 peak (no TF32); None where the datasheet gives none
    source: str


# Matched in order on the reported name, so more specific names come first (GH200 before H200, H100 PCIe before H100).
ACCELERATOR_PEAKS: tuple[DevicePeak, ...] = (
    DevicePeak("GB200", 2.5e15, None, NVIDIA_BLACKWELL),
    DevicePeak("B200", 2.25e15, None, NVIDIA_BLACKWELL),
    DevicePeak("B100", 1.75e15, None, NVIDIA_BLACKWELL),
    DevicePeak("GH200", 989e12, 67e12, "NVIDIA GH200 Grace Hopper Superchip datasheet"),
    DevicePeak("H200 NVL", 835e12, 60e12, NVIDIA_H200),
    DevicePeak("H200", 989e12, 67e12, NVIDIA_H200),
    DevicePeak("H100 PCIe", 756e12, 51e12, NVIDIA_H100),
    DevicePeak("H100 NVL", 835e12, 60e12, NVIDIA_H100),
    DevicePeak("H100", 989e12, 67e12, NVIDIA_H100),
    DevicePeak("H800", 989e12, 67e12, "NVIDIA H800 datasheet (SXM)"),
    DevicePeak("H20", 148e12, 44e12, "NVIDIA H20 datasheet"),
    DevicePeak("A100", 312e12, 19.5e12, NVIDIA_A100),
    DevicePeak("A800", 312e12, 19.5e12, "NVIDIA A800 datasheet"),
    DevicePeak("L40S", 362e12, 91.6e12, "NVIDIA L40S datasheet"),
    DevicePeak("L40", 181e12, 90.5e12, "NVIDIA L40 datasheet"),
    DevicePeak("L4", 121e12, 30.3e12, "NVIDIA L4 datasheet"),
    DevicePeak("A10G", 70e12, None, "AWS EC2 G5 instance documentation"),
    DevicePeak("A10", 125e12, 31.2e12, "NVIDIA A10 datasheet"),
    DevicePeak("A6000", 155e12, 38.7e12, "NVIDIA RTX A6000 datasheet"),
    DevicePeak("V100", 125e12, 15.7e12, "NVIDIA V100 datasheet (SXM2; fp16: V100 has no bf16)"),
    DevicePeak("MI325X", 1307e12, 163.4e12, AMD_MI300),
    DevicePeak("MI300X", 1307e12, 163.4e12, AMD_MI300),
    DevicePeak("MI250X", 383e12, 95.7e12, "AMD Instinct MI250X data sheet"),
)


@dataclass(frozen=True)
class ParamCounts:
    total: int  # every parameter (tied embeddings counted once)
    active: int  # matmul parameters one token passes through (for FLOPs)
    embedding: int  # input embedding table
    routed_experts: int  # all routed expert weights, all layers
    attention: int  # q, k, v, o projections, all layers


def param_counts(cfg: ModelConfig) -> ParamCounts:
    hd = cfg.head_dim
    attn = cfg.dim * cfg.n_heads * hd * 2 + cfg.dim * cfg.n_kv_heads * hd * 2
    norms = 2 * cfg.dim
    dense_ffn = 3 * cfg.dim * cfg.dense_hidden
    expert = 3 * cfg.dim * cfg.expert_hidden
    router = cfg.dim * cfg.n_experts
    shared = cfg.n_shared_experts * expert
    n_moe = cfg.n_moe_layers
    embedding = cfg.vocab_size * cfg.dim
    head = 0 if cfg.tie_embeddings else cfg.vocab_size * cfg.dim
    total = (embedding + head + cfg.dim + cfg.n_layers * (attn + norms) + cfg.n_dense_layers * dense_ffn
             + n_moe * (router + shared + cfg.n_experts * expert))
    active = (cfg.vocab_size * cfg.dim + cfg.n_layers * attn + cfg.n_dense_layers * dense_ffn
              + n_moe * (router + shared + cfg.top_k * expert))
    return ParamCounts(total=total, active=active, embedding=embedding,
                       routed_experts=n_moe * cfg.n_experts * expert, attention=cfg.n_layers * attn)


def flops_per_token(cfg: ModelConfig, seq_len: int) -> float:
    """Training (forward + backward) FLOPs per token at this sequence length."""
    attention_term = 12 * cfg.n_layers * cfg.n_heads * cfg.head_dim * seq_len
    return 6.0 * param_counts(cfg).active + attention_term


def hardware_flops_per_token(cfg: ModelConfig, seq_len: int) -> float:
    """FLOPs per token the hardware executes: the model FLOPs plus, with activation checkpointing, the blocks'
    forward pass again in the backward (2 x the blocks' active parameters + the forward attention term)."""
    model = flops_per_token(cfg, seq_len)
    if not cfg.activation_checkpointing:
        return model
    head = cfg.vocab_size * cfg.dim
    return model + 2.0 * (param_counts(cfg).active - head) + 4 * cfg.n_layers * cfg.n_heads * cfg.head_dim * seq_len


class PeakUnknown(ValueError):
    """No stated peak for this device and dtype: MFU cannot be computed honestly."""


@dataclass(frozen=True)
class Peak:
    flops: float  # FLOP/s of one device
    source: str  # where the figure comes from, stated in the run's start event


def peak_file() -> Path:
    """Where `sigma train calibrate` records CPU peaks ($SIGMA_PEAK_FILE overrides)."""
    return Path(os.environ.get("SIGMA_PEAK_FILE") or "~/.cache/sigma/peak-flops.json").expanduser()


def cpu_model() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine() or "unknown CPU"


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def peak_flops(device, dtype: torch.dtype | None = None, configured: float = 0.0) -> Peak:
    """The fixed peak of one device in dtype (default float32), never measured here: configured (> 0) first, then
    $SIGMA_PEAK_FLOPS, then the datasheet table (accelerators) or the `sigma train calibrate` record for this CPU
    model and thread count. Raises PeakUnknown saying how to state one."""
    dtype = dtype or torch.float32
    if configured > 0:
        return Peak(float(configured), "peak_flops in the run config")
    override = os.environ.get("SIGMA_PEAK_FLOPS")
    if override:
        return Peak(float(override), "$SIGMA_PEAK_FLOPS")
    device = device if isinstance(device, torch.device) else torch.device(device)
    if device.type == "cuda":
        return accelerator_peak(torch.cuda.get_device_name(device), dtype)
    if device.type == "cpu":
        return calibrated_cpu_peak(dtype, torch.get_num_threads())
    raise PeakUnknown(f"no peak FLOP/s known for device type {device.type!r}; set peak_flops or SIGMA_PEAK_FLOPS")


def accelerator_peak(name: str, dtype: torch.dtype = torch.bfloat16) -> Peak:
    """Dense datasheet peak of an accelerator from its reported name, e.g. 'NVIDIA H100 80GB HBM3'."""
    for entry in ACCELERATOR_PEAKS:
        if entry.name.lower() in name.lower():
            value = entry.fp32 if dtype == torch.float32 else entry.bf16
            if value is None:
                raise PeakUnknown(f"the {entry.name} datasheet table has no {_dtype_name(dtype)} peak; set "
                                  "peak_flops or SIGMA_PEAK_FLOPS")
            return Peak(value, f"{entry.name} {_dtype_name(dtype)} dense peak, {entry.source}")
    raise PeakUnknown(f"no peak FLOP/s known for {name!r}; set peak_flops or SIGMA_PEAK_FLOPS to its dense peak")


def load_calibration(path: Path | None = None) -> list[dict]:
    path = path or peak_file()
    if not path.exists():
        return []
    try:
        entries = json.loads(path.read_text())["entries"]
    except (ValueError, KeyError, TypeError) as exc:
        raise PeakUnknown(f"{path}: not a peak calibration file ({exc}); run `sigma train calibrate` again") from None
    return entries


def calibrated_cpu_peak(dtype: torch.dtype, threads: int, path: Path | None = None) -> Peak:
    path = path or peak_file()
    model = cpu_model()
    for entry in load_calibration(path):
        if entry["cpu"] == model and entry["threads"] == threads and entry["dtype"] == _dtype_name(dtype):
            return Peak(float(entry["flops"]), f"`sigma train calibrate` on {model}, {threads} thread(s), "
                                               f"{_dtype_name(dtype)}, {entry['measured_at']} ({path})")
    raise PeakUnknown(f"no CPU peak recorded for {model}, {threads} thread(s), {_dtype_name(dtype)} in {path}: "
                      f"run `sigma train calibrate --threads {threads}` on an idle machine, or set peak_flops")


def measure_gemm_peak(dtype: torch.dtype, threads: int, runs: int = 5, seconds: float = 1.0,
                      n: int = 2048) -> list[float]:
    """Rates (FLOP/s) of `runs` runs of square n^3 GEMMs with this many threads: each run the best call of
    `seconds`. Only `sigma train calibrate` calls this, on an idle machine; training never measures."""
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        a = torch.randn(n, n).to(dtype)
        b = torch.randn(n, n).to(dtype)
        out = torch.empty(n, n, dtype=dtype)
        torch.mm(a, b, out=out)  # warm-up
        rates = []
        for _ in range(runs):
            best = 0.0
            deadline = time.perf_counter() + seconds
            while time.perf_counter() < deadline:
                t0 = time.perf_counter()
                torch.mm(a, b, out=out)
                best = max(best, 2.0 * n**3 / (time.perf_counter() - t0))
            rates.append(best)
        return rates
    finally:
        torch.set_num_threads(previous)


def record_calibration(entries: list[dict], path: Path | None = None) -> Path:
    """Merge entries into the calibration file (replacing the same CPU model, threads and dtype), atomically."""
    path = path or peak_file()
    key = lambda e: (e["cpu"], e["threads"], e["dtype"])  # noqa: E731
    merged = {key(e): e for e in load_calibration(path)}
    merged.update({key(e): e for e in entries})
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(json.dumps({"entries": sorted(merged.values(), key=key)}, indent=2) + "\n")
    os.replace(tmp, path)
    return path


def mfu(tokens_per_s: float, cfg: ModelConfig, seq_len: int, peak: float) -> float:
    """Model FLOPs utilisation of one device processing tokens_per_s tokens per second (0..1) against peak FLOP/s."""
    return tokens_per_s * flops_per_token(cfg, seq_len) / peak


def hfu(tokens_per_s: float, cfg: ModelConfig, seq_len: int, peak: float) -> float:
    """Hardware FLOPs utilisation: like mfu, counting recomputed FLOPs too (activation checkpointing)."""
    return tokens_per_s * hardware_flops_per_token(cfg, seq_len) / peak
