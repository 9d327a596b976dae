"""Figures for the MoE model on one process: expert-layer throughput against baselines, and model MFU.

Usage: python bench/train.py [--threads 2] [--tokens 4096] [--rounds 5] [--device cpu|cuda] [--skip-model]

1. MoE layer forward+backward tokens/s, fp32 and bf16, same run and interleaved rounds (best of --rounds: on a
   shared machine other processes only ever add time, so the fastest round is the least disturbed one):
   - ours:        MoELayer with expert_impl=auto (tokens sorted by expert, torch._grouped_mm where supported)
   - ours-loop:   MoELayer with expert_impl=loop (our fallback: per-expert GEMMs on contiguous slices)
   - naive-loop:  our router and weights, dispatch by a boolean mask per expert and index_add (textbook loop)
   - hf-mixtral:  transformers' MixtralSparseMoeBlock (eager experts), same weights
   for a fine-grained shape (many small experts, as in the paper's models) and a coarse Mixtral-like shape.
   Ratios are against hf-mixtral (goal: ours >= 1.3x).
2. Model forward+backward (cross-entropy on logits + aux loss) tokens/s and MFU (sigma.train.flops):
   on CPU debug and tiny in fp32 and bf16 against the measured GEMM peak in the same dtype; on a GPU tiny and
   moe-1b (~1B total) in bf16 against the datasheet bf16 peak.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sigma.train.config import ModelConfig, load_model_config  # noqa: E402
from sigma.train.flops import flops_per_token, peak_flops  # noqa: E402
from sigma.train.model import MoETransformer  # noqa: E402
from sigma.train.moe import MoELayer  # noqa: E402

LAYER_SHAPES = {
    # name: (dim, n_experts, top_k, expert_hidden)
    "fine (64 experts top-8)": (512, 64, 8, 128),
    "coarse (8 experts top-2)": (512, 8, 2, 1024),
}
CPU_MODEL_RUNS = {"debug": (8, 128), "tiny": (4, 512)}  # preset: (batch, seq_len)
GPU_MODEL_RUNS = {"tiny": (16, 512), "moe-1b": (8, 2048)}


def naive_loop(layer: MoELayer):
    """The textbook MoE loop on the same router and weights: mask, gather, FFN, weight, index_add per expert."""

    def forward(x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        x = x.reshape(-1, shape[-1])
        ids, weights, _ = layer.router(x)
        out = torch.zeros_like(x)
        ex = layer.experts
        for e in range(ex.n_experts):
            token, slot = (ids == e).nonzero(as_tuple=True)
            if token.numel() == 0:
                continue
            h = x[token]
            y = (F.silu(h @ ex.w1[e].T) * (h @ ex.w3[e].T)) @ ex.w2[e].T
            out.index_add_(0, token, y * weights[token, slot, None].to(y.dtype))
        return out.reshape(shape)

    return forward


def hf_block(layer: MoELayer, dtype: torch.dtype):
    from transformers import MixtralConfig
    from transformers.models.mixtral.modeling_mixtral import MixtralSparseMoeBlock

    ex = layer.experts
    cfg = MixtralConfig(hidden_size=ex.dim, intermediate_size=ex.hidden, num_local_experts=ex.n_experts,
                        num_experts_per_tok=layer.top_k, router_jitter_noise=0.0)
    cfg._experts_implementation = "eager"
    block = MixtralSparseMoeBlock(cfg).to(device=ex.w1.device, dtype=dtype)
    with torch.no_grad():
        block.gate.weight.copy_(layer.router.gate.weight)
        block.experts.gate_up_proj.copy_(torch.cat([ex.w1, ex.w3], dim=1))
        block.experts.down_proj.copy_(ex.w2)
    return block


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def time_fwd_bwd(fn, x: torch.Tensor, grad: torch.Tensor) -> float:
    sync(x.device)
    t0 = time.perf_counter()
    y = fn(x)
    y = y[0] if isinstance(y, tuple) else y
    y.backward(grad)
    sync(x.device)
    return time.perf_counter() - t0


def bench_layers(args, device: torch.device) -> None:
    print(f"\nMoE layer forward+backward, {args.tokens} tokens, {torch.get_num_threads()} threads, device {device}, "
          f"best of {args.rounds} interleaved rounds")
    print(f"{'shape':26} {'dtype':9} {'variant':18} {'tokens/s':>10} {'vs hf':>7}")
    for shape_name, (dim, n_experts, top_k, hidden) in LAYER_SHAPES.items():
        for dtype in (torch.float32, torch.bfloat16):
            torch.manual_seed(0)
            cfg = ModelConfig(vocab_size=64, dim=dim, n_layers=1, n_heads=4, n_kv_heads=4, n_dense_layers=0,
                              n_experts=n_experts, top_k=top_k, expert_hidden=hidden, balance="none")
            ours = MoELayer(cfg).to(device=device, dtype=dtype)
            for p in ours.parameters():
                torch.nn.init.normal_(p, 0.0, 0.02)
            loop = MoELayer(cfg).to(device=device, dtype=dtype)
            loop.load_state_dict(ours.state_dict())
            loop.experts.impl = "loop"
            variants = {"ours": ours, "ours-loop": loop, "naive-loop": naive_loop(ours),
                        "hf-mixtral": hf_block(ours, dtype)}
            impl = ours.experts.resolved_impl(torch.empty(0, device=device, dtype=dtype))
            x = torch.randn(1, args.tokens, dim, device=device, dtype=dtype, requires_grad=True)
            grad = torch.randn_like(x)
            times: dict[str, list[float]] = {name: [] for name in variants}
            for name, fn in variants.items():  # warm-up
                time_fwd_bwd(fn, x, grad)
            for _ in range(args.rounds):
                for name, fn in variants.items():
                    times[name].append(time_fwd_bwd(fn, x, grad))
            rate = {name: args.tokens / min(ts) for name, ts in times.items()}
            for name in variants:
                label = f"{name} ({impl})" if name == "ours" else name
                print(f"{shape_name:26} {str(dtype).removeprefix('torch.'):9} {label:18} {rate[name]:10.0f} "
                      f"{rate[name] / rate['hf-mixtral']:6.2f}x")


def bench_models(args, device: torch.device) -> None:
    print(f"\nModel forward+backward (CE + aux loss), {torch.get_num_threads()} threads, device {device}, "
          f"best of {args.rounds} steps")
    print(f"{'preset':8} {'dtype':9} {'batch x seq':>11} {'expert impl':>11} {'tokens/s':>10} {'TFLOP/s':>8} "
          f"{'peak TFLOP/s':>12} {'MFU':>6}")
    runs = GPU_MODEL_RUNS if device.type == "cuda" else CPU_MODEL_RUNS
    dtypes = (torch.bfloat16,) if device.type == "cuda" else (torch.float32, torch.bfloat16)
    for preset, (batch, seq) in runs.items():
        for dtype in dtypes:
            torch.manual_seed(0)
            cfg = load_model_config(preset)
            model = MoETransformer(cfg).to(device=device, dtype=dtype)
            tokens = torch.randint(0, cfg.vocab_size, (batch, seq + 1), device=device)
            inputs, targets = tokens[:, :-1], tokens[:, 1:]

            def step() -> float:
                sync(device)
                t0 = time.perf_counter()
                logits, aux = model(inputs)
                loss = F.cross_entropy(logits.reshape(-1, cfg.vocab_size).float(), targets.reshape(-1))
                (loss + aux).backward()
                model.zero_grad(set_to_none=True)
                sync(device)
                return time.perf_counter() - t0

            step()
            elapsed = min(step() for _ in range(args.rounds))
            tps = batch * seq / elapsed
            achieved = tps * flops_per_token(cfg, seq)
            peak = peak_flops(device, dtype)
            impl = model.moe_layers()[0].experts.resolved_impl(torch.empty(0, device=device, dtype=dtype))
            print(f"{preset:8} {str(dtype).removeprefix('torch.'):9} {f'{batch} x {seq}':>11} {impl:>11} {tps:10.0f} "
                  f"{achieved / 1e12:8.3f} {peak / 1e12:12.3f} {achieved / peak:6.1%}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=2, help="torch CPU threads (default 2)")
    parser.add_argument("--tokens", type=int, default=4096, help="tokens per MoE layer call (default 4096)")
    parser.add_argument("--rounds", type=int, default=5, help="timed rounds per variant (default 5)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--skip-model", action="store_true", help="only the MoE layer table")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    print(f"torch {torch.__version__}; load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs (others' work "
          "slows single rounds; best-of rounds filter it)")
    bench_layers(args, device)
    if not args.skip_model:
        bench_models(args, device)
    print(f"\nload average at the end: {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
