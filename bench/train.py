"""Figures for the MoE model on one process: expert-layer speed against the strongest baseline, and model MFU/HFU.

Usage: python bench/train.py [--threads 2] [--tokens 4096] [--rounds 5] [--device cpu|cuda] [--skip-model]
                             [--shapes sigma,coarse] [--hf-impls batched_mm,grouped_mm] [--clock wall|cpu]
                             [--peak-flops F] [--host-malloc kept|default]

1. MoE layer forward+backward tokens/s, fp32 and bf16, in the dtype set-up training uses: fp32, and bf16 autocast
   over fp32 master weights. Interleaved rounds, best of --rounds (on a shared machine other processes only ever
   add time). Variants on the same router and expert weights:
   - ours:              MoELayer (expert-sorted tokens, torch._grouped_mm where supported)
   - titan-style:       torchtitan 0.3.0's GroupedExperts + local token dispatcher (argsort, gather, three
                        torch._grouped_mm calls, scatter_add combine), re-implemented here: the torchtitan package
                        needs spmd_types and its own distributed stack to import
   - hf-<impl>:         transformers' MixtralSparseMoeBlock with each experts implementation it offers (eager,
                        batched_mm, grouped_mm; one that would not fit in memory is skipped and says so); in bf16
                        also with bf16 weights (HF's grouped_mm casts activations to the weight dtype, so under
                        autocast with fp32 weights it computes in fp32)
   The strongest baseline is the fastest of the others in each row group; it is named, and ours is divided by it.
2. Model forward+backward (cross-entropy on logits + aux loss) tokens/s, MFU and HFU against a fixed stated peak
   (sigma.train.flops.peak_flops: the datasheet on GPUs, the `sigma train calibrate` record on CPUs, or
   --peak-flops); on CPU debug and tiny in fp32 and bf16 autocast, on a GPU tiny and moe-1b in bf16 autocast.
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
from sigma.train.flops import PeakUnknown, flops_per_token, hardware_flops_per_token, peak_flops  # noqa: E402
from sigma.train.host_malloc import kept_freed_memory  # noqa: E402
from sigma.train.model import MoETransformer  # noqa: E402
from sigma.train.moe import MoELayer  # noqa: E402

LAYER_SHAPES = {
    # name: (dim, n_experts, top_k, expert_hidden). sigma: the Sigma-MoE 200B-A20B proportions (96 experts top-8,
    # expert_hidden / dim = 2688 / 4096) at dim 512; coarse: Mixtral-like 8 experts top-2.
    "sigma": (512, 96, 8, 336),
    "coarse": (512, 8, 2, 1024),
}
CPU_MODEL_RUNS = {"debug": (8, 128), "tiny": (4, 512)}  # preset: (batch, seq_len)
GPU_MODEL_RUNS = {"tiny": (16, 512), "moe-1b": (8, 2048)}
HF_IMPLS = ("eager", "batched_mm", "grouped_mm")
DEFAULT_HF_IMPLS = "batched_mm,grouped_mm"  # eager (a per-expert Python loop) is HF's slowest: opt in with --hf-impls


def titan_style(layer: MoELayer, compute_dtype: torch.dtype):
    """torchtitan's routed experts on our router and weights: sort, gather, grouped GEMMs, weight, scatter_add."""
    ex = layer.experts

    def forward(x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        x = x.reshape(-1, shape[-1])
        ids, weights, _, _ = layer.router(x)
        flat = ids.reshape(-1)
        order = torch.argsort(flat, stable=True)
        counts = torch.zeros(ex.n_experts, dtype=torch.int64, device=x.device).scatter_add_(
            0, flat, torch.ones_like(flat))
        offs = torch.cumsum(counts, 0, dtype=torch.int32)
        token = order // layer.top_k
        xs = x[token].to(compute_dtype)
        w1, w2, w3 = (w.to(compute_dtype).transpose(-2, -1) for w in (ex.w1, ex.w2, ex.w3))
        h = F.silu(torch._grouped_mm(xs, w1, offs=offs)) * torch._grouped_mm(xs, w3, offs=offs)
        y = torch._grouped_mm(h, w2, offs=offs).to(x.dtype) * weights.reshape(-1)[order, None].to(x.dtype)
        out = torch.zeros_like(x).scatter_add_(0, token[:, None].expand(-1, x.shape[-1]), y)
        return out.reshape(shape)

    return forward


def hf_block(layer: MoELayer, dtype: torch.dtype, impl: str):
    from transformers import MixtralConfig
    from transformers.models.mixtral.modeling_mixtral import MixtralSparseMoeBlock

    ex = layer.experts
    cfg = MixtralConfig(hidden_size=ex.dim, intermediate_size=ex.hidden, num_local_experts=ex.n_experts,
                        num_experts_per_tok=layer.top_k, router_jitter_noise=0.0)
    cfg._experts_implementation = impl
    block = MixtralSparseMoeBlock(cfg).to(device=ex.w1.device, dtype=dtype)
    with torch.no_grad():
        block.gate.weight.copy_(layer.router.gate.weight)
        block.experts.gate_up_proj.copy_(torch.cat([ex.w1, ex.w3], dim=1))
        block.experts.down_proj.copy_(ex.w2)
    return block


def batched_mm_bytes(tokens: int, top_k: int, dim: int, hidden: int, element: int) -> int:
    """HF batched_mm gathers each routed token's expert weights: gate_up and down, kept for the backward."""
    return tokens * top_k * 3 * dim * hidden * element


def available_bytes(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    import psutil

    return psutil.virtual_memory().available


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


CLOCK = time.perf_counter  # --clock cpu: time.process_time, this process's CPU seconds (see main)


def time_fwd_bwd(fn, x: torch.Tensor, grad: torch.Tensor, autocast: torch.dtype | None) -> float:
    sync(x.device)
    t0 = CLOCK()
    with torch.autocast(x.device.type, dtype=autocast or torch.float32, enabled=autocast is not None):
        y = fn(x)
    y = y[0] if isinstance(y, tuple) else y
    y.backward(grad.to(y.dtype))
    sync(x.device)
    return CLOCK() - t0


def layer_variants(args, ours: MoELayer, device: torch.device, bf16: bool) -> dict:
    """name -> (callable, input dtype, autocast dtype or None)."""
    ex = ours.experts
    fp32, half = torch.float32, torch.bfloat16
    amp = half if bf16 else None
    variants = {"ours": (ours, fp32, amp), "titan-style": (titan_style(ours, half if bf16 else fp32), fp32, amp)}
    for impl in args.hf_impls.split(","):
        setups = [("", fp32, fp32, amp)] + ([(" bf16 weights", half, half, None)] if bf16 else [])
        for suffix, weight_dtype, input_dtype, autocast in setups:
            need = batched_mm_bytes(args.tokens, ours.top_k, ex.dim, ex.hidden, 2 if weight_dtype == half else 4)
            if impl == "batched_mm" and need > available_bytes(device) // 4:
                print(f"  (hf-batched_mm{suffix} skipped: it would hold ~{need / 2**30:.0f} GiB of gathered "
                      f"weights, over a quarter of the {available_bytes(device) / 2**30:.0f} GiB available)")
                continue
            variants[f"hf-{impl}{suffix}"] = (hf_block(ours, weight_dtype, impl), input_dtype, autocast)
    return variants


def bench_layers(args, device: torch.device) -> list[dict]:
    """Print the layer table; return its rows (bench/gpu_check.py keeps them in its report)."""
    rows = []
    print(f"\nMoE layer forward+backward, {args.tokens} tokens, {torch.get_num_threads()} threads, device {device}, "
          f"best of {args.rounds} interleaved rounds ({args.clock} clock); bf16 = autocast over fp32 master weights, "
          "as training runs")
    print(f"{'shape':34} {'dtype':5} {'variant':26} {'tokens/s':>10} {'ours vs it':>10}")
    for shape_name in args.shapes.split(","):
        dim, n_experts, top_k, hidden = LAYER_SHAPES[shape_name]
        label = f"{shape_name} ({n_experts} experts top-{top_k}, d{dim} h{hidden})"
        for bf16 in (False, True):
            torch.manual_seed(0)
            cfg = ModelConfig(vocab_size=64, dim=dim, n_layers=1, n_heads=4, n_kv_heads=4, n_dense_layers=0,
                              n_experts=n_experts, top_k=top_k, expert_hidden=hidden, balance="none")
            ours = MoELayer(cfg).to(device=device)
            for p in ours.parameters():
                torch.nn.init.normal_(p, 0.0, 0.02)
            variants = layer_variants(args, ours, device, bf16)
            x32 = torch.randn(1, args.tokens, dim, device=device)
            inputs = {dt: x32.to(dt).requires_grad_() for dt in (torch.float32, torch.bfloat16)}
            grad = torch.randn_like(x32)
            for name, (fn, dt, amp) in list(variants.items()):  # warm-up
                try:
                    time_fwd_bwd(fn, inputs[dt], grad, amp)
                except (RuntimeError, NotImplementedError, ValueError) as exc:
                    if name == "ours":
                        raise
                    print(f"  ({name} skipped: it fails on {device}: {str(exc).splitlines()[0][:160]})")
                    rows.append({"shape": label, "dtype": "bf16" if bf16 else "fp32", "variant": name,
                                 "error": str(exc).splitlines()[0][:300]})
                    del variants[name]
            times: dict[str, list[float]] = {name: [] for name in variants}
            for _ in range(args.rounds):
                for name, (fn, dt, amp) in variants.items():
                    times[name].append(time_fwd_bwd(fn, inputs[dt], grad, amp))
            rate = {name: args.tokens / min(ts) for name, ts in times.items()}
            strongest = max((n for n in rate if n != "ours"), key=rate.get)
            dtype = "bf16" if bf16 else "fp32"
            for name in variants:
                ratio = f"{rate['ours'] / rate[name]:9.2f}x" if name != "ours" else ""
                print(f"{label:34} {dtype:5} {name:26} {rate[name]:10.0f} {ratio:>10}")
                rows.append({"shape": label, "dtype": dtype, "variant": name, "tokens_per_s": round(rate[name])})
            print(f"{label:34} {dtype:5} -> strongest baseline {strongest}: ours is "
                  f"{rate['ours'] / rate[strongest]:.2f}x", flush=True)
            rows.append({"shape": label, "dtype": dtype, "strongest": strongest,
                         "ours_vs_strongest": round(rate["ours"] / rate[strongest], 3)})
    return rows


def bench_models(args, device: torch.device) -> None:
    print(f"\nModel forward+backward (CE + aux loss), {torch.get_num_threads()} threads, device {device}"
          + (f" ({torch.cuda.get_device_name(device)})" if device.type == "cuda" else "")
          + f", best of {args.rounds} steps; fp32 master weights, bf16 = autocast")
    print(f"{'preset':8} {'dtype':5} {'batch x seq':>11} {'tokens/s':>10} {'TFLOP/s':>8} {'peak TFLOP/s':>12} "
          f"{'MFU':>6} {'HFU':>6}  peak source")
    runs = GPU_MODEL_RUNS if device.type == "cuda" else CPU_MODEL_RUNS
    dtypes = (torch.bfloat16,) if device.type == "cuda" else (torch.float32, torch.bfloat16)
    for preset, (batch, seq) in runs.items():
        for dtype in dtypes:
            torch.manual_seed(0)
            cfg = load_model_config(preset)
            model = MoETransformer(cfg).to(device=device)
            tokens = torch.randint(0, cfg.vocab_size, (batch, seq + 1), device=device)
            inputs, targets = tokens[:, :-1], tokens[:, 1:]

            def step() -> float:
                sync(device)
                t0 = time.perf_counter()
                with torch.autocast(device.type, dtype=dtype, enabled=dtype != torch.float32):
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
            name = str(dtype).removeprefix("torch.").replace("float32", "fp32").replace("bfloat16", "bf16")
            try:
                peak = peak_flops(device, dtype, args.peak_flops)
            except PeakUnknown as exc:
                print(f"{preset:8} {name:5} {f'{batch} x {seq}':>11} {tps:10.0f} {achieved / 1e12:8.3f} "
                      f"{'-':>12} {'-':>6} {'-':>6}  no stated peak: {exc}")
                continue
            hw = tps * hardware_flops_per_token(cfg, seq)
            print(f"{preset:8} {name:5} {f'{batch} x {seq}':>11} {tps:10.0f} {achieved / 1e12:8.3f} "
                  f"{peak.flops / 1e12:12.3f} {achieved / peak.flops:6.1%} {hw / peak.flops:6.1%}  {peak.source}",
                  flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=2, help="torch CPU threads (default 2)")
    parser.add_argument("--tokens", type=int, default=4096, help="tokens per MoE layer call (default 4096)")
    parser.add_argument("--rounds", type=int, default=5, help="timed rounds per variant (default 5)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--skip-model", action="store_true", help="only the MoE layer table")
    parser.add_argument("--hf-impls", default=DEFAULT_HF_IMPLS, help=f"of {', '.join(HF_IMPLS)} (default: "
                                                                     "%(default)s)")
    parser.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                        help="layer table timer: wall, or this process's CPU time (with --threads 1 on a CPU shared "
                             "with other work: what the layer costs, without the time it waits for a core)")
    parser.add_argument("--shapes", default="sigma,coarse", help=f"layer shapes: {', '.join(LAYER_SHAPES)}")
    parser.add_argument("--peak-flops", type=float, default=0.0, help="stated peak FLOP/s of one device (default: "
                                                                       "datasheet or `sigma train calibrate`)")
    parser.add_argument("--host-malloc", choices=("kept", "default"), default="kept",
                        help="CPU: keep freed memory for reuse as the trainer does (keep_freed_host_memory, default), "
                             "or glibc's default (every large buffer mapped fresh)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    global CLOCK
    if args.clock == "cpu":
        if device.type != "cpu":
            parser.error("--clock cpu times CPU work only")
        CLOCK = time.process_time
    print(f"torch {torch.__version__}; load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs (others' work "
          "slows single rounds; best-of rounds filter it)")
    with kept_freed_memory(args.host_malloc == "kept" and device.type == "cpu") as kept:
        if device.type == "cpu":
            print("host memory: " + ("freed memory kept for reuse, as the trainer runs" if kept else
                                     "glibc's default (large buffers mapped fresh every time)"))
        bench_layers(args, device)
        if not args.skip_model:
            bench_models(args, device)
    print(f"\nload average at the end: {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
