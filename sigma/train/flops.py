"""Analytic FLOPs per token, accelerator peaks and MFU.

FLOPs per trained token = 6 x (matmul parameters a token passes through) + the attention score/value term
12 x n_layers x n_heads x head_dim x seq_len (PaLM appendix B convention; causal masking is not discounted,
as in PaLM, Megatron and torchtitan, so figures compare across frameworks). Matmul parameters a token passes
through: attention projections, dense FFNs, routers, shared experts, top_k of the n_experts routed experts,
and the output head; the input embedding is a lookup and costs no FLOPs. torch's FlopCounterMode is not used:
on CPU it counts neither SDPA nor grouped GEMMs.
"""

from __future__ import annotations

import functools
import os
import time
from dataclasses import dataclass

import torch

from sigma.train.config import ModelConfig

# Dense (no sparsity) bf16 tensor-core peaks in FLOP/s, from the vendors' datasheets. Matched on the device name
# in order, so more specific names come first.
ACCELERATOR_PEAKS_BF16: tuple[tuple[str, float], ...] = (
    ("GB200", 2.5e15),
    ("B200", 2.25e15),
    ("B100", 1.75e15),
    ("H200", 989e12),
    ("GH200", 989e12),
    ("H100 PCIe", 756e12),
    ("H100 NVL", 835e12),
    ("H100", 989e12),  # SXM
    ("H800", 989e12),
    ("H20", 148e12),
    ("A100", 312e12),
    ("A800", 312e12),
    ("L40S", 362e12),
    ("L40", 181e12),
    ("L4", 121e12),
    ("A10G", 70e12),
    ("A10", 125e12),
    ("A6000", 155e12),
    ("V100", 125e12),  # fp16: V100 has no bf16
    ("MI300X", 1307e12),
    ("MI250X", 383e12),
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


def _as_device(device) -> torch.device:
    return device if isinstance(device, torch.device) else torch.device(device)


def peak_flops(device, dtype: torch.dtype | None = None) -> float:
    """Peak FLOP/s of one device. Accelerators: bf16 dense datasheet figure. CPUs: a measured GEMM rate in dtype
    (default float32) with the current torch thread count, cached per process. $SIGMA_PEAK_FLOPS overrides."""
    override = os.environ.get("SIGMA_PEAK_FLOPS")
    if override:
        return float(override)
    device = _as_device(device)
    if device.type == "cpu":
        return measured_cpu_peak(dtype or torch.float32, torch.get_num_threads())
    if device.type == "cuda":
        return accelerator_peak(torch.cuda.get_device_name(device))
    raise ValueError(f"no peak FLOP/s known for device type {device.type!r}; set SIGMA_PEAK_FLOPS")


def accelerator_peak(name: str) -> float:
    """Dense bf16 peak of an accelerator from its reported name, e.g. 'NVIDIA H100 80GB HBM3'."""
    for key, peak in ACCELERATOR_PEAKS_BF16:
        if key.lower() in name.lower():
            return peak
    raise ValueError(f"no peak FLOP/s known for {name!r}; set SIGMA_PEAK_FLOPS to its bf16 dense peak")


@functools.cache
def measured_cpu_peak(dtype: torch.dtype, threads: int, n: int = 1024, seconds: float = 0.3) -> float:
    """Best-of GEMM rate of an n x n x n matmul on this CPU: what the CPU can actually deliver to a trainer."""
    a = torch.randn(n, n).to(dtype)
    b = torch.randn(n, n).to(dtype)
    out = torch.empty(n, n, dtype=dtype)
    torch.mm(a, b, out=out)  # warm-up
    best = 0.0
    deadline = time.perf_counter() + seconds
    while True:
        t0 = time.perf_counter()
        torch.mm(a, b, out=out)
        dt = time.perf_counter() - t0
        best = max(best, 2.0 * n**3 / dt)
        if time.perf_counter() > deadline:
            return best


def mfu(tokens_per_s: float, cfg: ModelConfig, seq_len: int, device, dtype: torch.dtype | None = None) -> float:
    """Model FLOPs utilisation of one device processing tokens_per_s tokens per second (0..1)."""
    return tokens_per_s * flops_per_token(cfg, seq_len) / peak_flops(device, dtype)
