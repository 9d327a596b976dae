"""bfloat16 autocast under tp, pp and ZeRO-1 layouts (4 gloo ranks) trains like one process in bfloat16, and like
one process in float32 within bfloat16's precision: loss and gradient norm at every step."""

import pytest
import torch

from tests.unit.gloo_ranks import run_ranks
from tests.unit.test_train_layouts import OVERRIDES, STEPS, WORLD, batches, make_dims

LAYOUTS = {
    "tp2-dp2": dict(tp=2),
    "pp2-dp2-1f1b": dict(pp=2),
    "tp2-ep2-zero1": dict(tp=2, ep=2, shard_optimizer=True),
}
# bf16 keeps 8 bits of mantissa (relative rounding 2^-9 ~ 2e-3); the loss is computed in float32 from bf16
# logits, the gradient norm sums bf16-rounded products in another order under each layout
BF16_LOSS_ABS, BF16_GNORM_REL = 2e-3, 2e-2


def run_steps(layout, rank, amp_dtype):
    from sigma.train.config import load_model_config
    from sigma.train.parallelize import build_optimizer, build_parallel, train_step
    from sigma.train.train_config import OptimConfig

    model_cfg = load_model_config("debug", OVERRIDES)
    dims = make_dims(layout, model_cfg)
    run = build_parallel(model_cfg, dims, rank, seed=0, amp_dtype=amp_dtype)
    optimizer, named, _ = build_optimizer(run, OptimConfig(fused=False, lr=3e-3, warmup_steps=0),
                                          shard=layout.get("shard_optimizer", False))
    return [train_step(run, optimizer, named, batch, max_norm=1.0)[::2] for batch in batches()[:STEPS]]


def bf16_layouts(rank):
    return {name: run_steps(layout, rank, torch.bfloat16) for name, layout in LAYOUTS.items()}


@pytest.fixture(scope="module")
def results():
    return {(name, rank): steps for rank, by_name in run_ranks(bf16_layouts, WORLD).items()
            for name, steps in by_name.items()}


@pytest.fixture(scope="module")
def single():
    torch.set_num_threads(1)
    return {dtype: run_steps({"world": 1}, 0, dtype) for dtype in (torch.bfloat16, torch.float32)}


@pytest.mark.parametrize("name", LAYOUTS)
def test_bf16_layout_matches_one_process(results, single, name):
    bf16, fp32 = single[torch.bfloat16], single[torch.float32]
    for rank in range(WORLD):
        for step, ((loss, gnorm), (ref_loss, ref_gnorm), (f_loss, f_gnorm)) in enumerate(
                zip(results[name, rank], bf16, fp32)):
            assert loss == pytest.approx(ref_loss, abs=BF16_LOSS_ABS), (name, rank, step)
            assert gnorm == pytest.approx(ref_gnorm, rel=BF16_GNORM_REL), (name, rank, step)
            assert loss == pytest.approx(f_loss, abs=BF16_LOSS_ABS), (name, rank, step)
            assert gnorm == pytest.approx(f_gnorm, rel=BF16_GNORM_REL), (name, rank, step)
    # bf16 really ran, in one process and under the layout: the gradient norms differ from float32's by more than
    # the float32 layouts differ from one process (1e-4, tests/unit/test_train_layouts.py)
    assert any(abs(a[1] - b[1]) > 1e-3 * b[1] for a, b in zip(bf16, fp32))
    assert any(abs(a[1] - b[1]) > 1e-3 * b[1] for a, b in zip(results[name, 0], fp32))
