"""Training in bf16 (autocast over fp32 master weights) runs the expert GEMMs in bf16 and tracks the fp32 loss."""

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from sigma.paths import configs_dir
from sigma.train.config import ModelConfig
from sigma.train.moe import MoELayer
from sigma.train.train_config import load_train_config

DEBUG = configs_dir() / "train" / "debug.yaml"


class GemmDtypes(TorchDispatchMode):
    """Records the operand dtypes of every aten matmul-family call that reaches the kernels."""

    OPS = {"_grouped_mm", "mm", "addmm", "bmm", "matmul"}

    def __init__(self):
        super().__init__()
        self.calls: list[tuple[str, tuple[torch.dtype, ...]]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        if name in self.OPS:
            self.calls.append((name, tuple(a.dtype for a in args[:2] if isinstance(a, torch.Tensor))))
        return func(*args, **(kwargs or {}))


def overrides(train_data, tmp_path, dtype, steps):
    return [f"data.path={train_data}", "data.prepare_if_missing=false", "data.seq_len=32", "data.global_batch=8",
            "threads=1", "kpi.progress_every=0", f"checkpoint.dir={tmp_path / dtype}", "checkpoint.every=0",
            f"steps={steps}", "optim.warmup_steps=2", f"dtype={dtype}", "device=cpu", "kpi.heartbeat_s=0",
            "model_overrides.expert_impl=grouped_mm", "eval.every=0"]


def test_moe_layer_under_autocast_feeds_bf16_to_the_grouped_gemm():
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=64, dim=64, n_layers=1, n_heads=4, n_kv_heads=4, n_dense_layers=0, n_experts=8,
                      top_k=2, expert_hidden=32, expert_impl="grouped_mm")
    layer = MoELayer(cfg)  # fp32 master weights
    x = torch.randn(2, 16, 64, requires_grad=True)
    with GemmDtypes() as seen:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            y, aux = layer(x)
        (y.float().sum() + aux).backward()
    grouped = [dtypes for name, dtypes in seen.calls if name == "_grouped_mm"]
    assert len(grouped) == 3 + 6  # forward: gate, up, down; backward: input and weight gradient of each
    assert all(d == (torch.bfloat16, torch.bfloat16) for d in grouped), grouped
    assert layer.experts.w1.grad.dtype == torch.float32  # gradients reach the fp32 master weights
    assert layer.experts.w1.grad.abs().sum() > 0


def test_bf16_training_runs_the_experts_in_bf16_and_tracks_fp32_loss(train_data, tmp_path, monkeypatch):
    from sigma.train.trainer import train

    monkeypatch.setenv("SIGMA_KPI_DIR", str(tmp_path / "kpi"))
    steps = 12
    fp32 = train(load_train_config(DEBUG, overrides(train_data, tmp_path, "float32", steps)))
    with GemmDtypes() as seen:
        bf16 = train(load_train_config(DEBUG, overrides(train_data, tmp_path, "bfloat16", steps)))
    grouped = [dtypes for name, dtypes in seen.calls if name == "_grouped_mm"]
    # one MoE layer: 3 grouped GEMMs forward + 6 backward per step, every one on bf16 operands
    assert len(grouped) == 9 * steps
    assert set(grouped) == {(torch.bfloat16, torch.bfloat16)}
    for step in range(1, steps + 1):
        # bf16 keeps 8 mantissa bits: a relative error of a few 1e-3 per op, compounded over the run
        assert bf16.losses[step] == pytest.approx(fp32.losses[step], rel=2e-2), step
    assert bf16.losses[steps] < bf16.losses[1] - 0.3  # and it learns like the fp32 run
    assert fp32.losses != bf16.losses  # the two runs really took different arithmetic


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_bf16_autocast_takes_the_grouped_path_without_host_sync():
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=64, dim=256, n_layers=1, n_heads=4, n_kv_heads=4, n_dense_layers=0, n_experts=16,
                      top_k=4, expert_hidden=128)
    layer = MoELayer(cfg).cuda()
    x = torch.randn(4, 128, 256, device="cuda", requires_grad=True)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        assert layer.experts.resolved_impl(x) == "grouped_mm"
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")  # any device-to-host synchronisation raises
        try:
            with GemmDtypes() as seen:
                y, aux = layer(x)
                (y.float().square().mean() + aux).backward()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    grouped = [d for name, d in seen.calls if name == "_grouped_mm"]
    assert len(grouped) == 9 and set(grouped) == {(torch.bfloat16, torch.bfloat16)}
    loop = MoELayer(cfg).cuda()
    loop.load_state_dict(layer.state_dict())
    loop.experts.impl = "loop"
    with torch.autocast("cuda", dtype=torch.bfloat16):
        ref, _ = loop(x.detach())
    torch.testing.assert_close(y.float(), ref.float(), rtol=2e-2, atol=2e-3)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_float32_takes_the_grouped_path_where_the_device_runs_it_and_matches_the_loop():
    from sigma.train.moe import grouped_mm_supported

    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=64, dim=256, n_layers=1, n_heads=4, n_kv_heads=4, n_dense_layers=0, n_experts=16,
                      top_k=4, expert_hidden=128)
    layer = MoELayer(cfg).cuda()
    x = torch.randn(4, 128, 256, device="cuda", requires_grad=True)
    if not grouped_mm_supported(x.device, torch.float32, 256, 128):
        assert layer.experts.resolved_impl(x) == "loop"
        pytest.skip(f"torch {torch.__version__} runs no float32 torch._grouped_mm on this GPU: the loop serves")
    assert layer.experts.resolved_impl(x) == "grouped_mm"
    y, aux = layer(x)
    (y.square().mean() + aux).backward()
    loop = MoELayer(cfg).cuda()
    loop.load_state_dict(layer.state_dict())
    loop.experts.impl = "loop"
    x2 = x.detach().requires_grad_()
    ref, ref_aux = loop(x2)
    (ref.square().mean() + ref_aux).backward()
    torch.testing.assert_close(y, ref, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(x.grad, x2.grad, rtol=1e-4, atol=1e-6)
