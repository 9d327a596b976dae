"""MoE layer pieces: grouped GEMM guard and fallback, routing, aux loss, aux-loss-free bias balancing."""

from __future__ import annotations

import pytest
import torch

from sigma.train.config import ModelConfig
from sigma.train.moe import GroupedExperts, MoELayer, grouped_mm, grouped_mm_supported

torch.set_num_threads(min(2, torch.get_num_threads()))


def cfg(**kw) -> ModelConfig:
    base = dict(vocab_size=64, dim=32, n_layers=2, n_heads=4, n_kv_heads=2, n_dense_layers=0, n_experts=8, top_k=2,
                expert_hidden=16)
    base.update(kw)
    return ModelConfig(**base)


def test_grouped_mm_matches_per_group_matmul_with_stride0_gradient():
    """torch._grouped_mm's own backward rejects the expanded gradient of .sum(); our wrapper must not."""
    torch.manual_seed(0)
    x = torch.randn(10, 16, requires_grad=True)
    w = torch.randn(4, 8, 16, requires_grad=True)  # nn.Linear layout [G, out, in]
    counts = [3, 0, 4, 3]
    offs = torch.tensor(counts).cumsum(0).to(torch.int32)
    y = grouped_mm(x, w.transpose(1, 2), offs)
    ref = torch.cat([chunk @ w[g].T for g, chunk in enumerate(torch.split(x, counts))])
    torch.testing.assert_close(y, ref)
    y.sum().backward()
    gx, gw = x.grad.clone(), w.grad.clone()
    x.grad = w.grad = None
    ref = torch.cat([chunk @ w[g].T for g, chunk in enumerate(torch.split(x, counts))])
    ref.sum().backward()
    torch.testing.assert_close(gx, x.grad)
    torch.testing.assert_close(gw, w.grad)


def test_grouped_mm_support_rules():
    cpu = torch.device("cpu")
    assert grouped_mm_supported(cpu, torch.float32, 32, 16)
    assert grouped_mm_supported(cpu, torch.bfloat16, 32, 16)
    assert not grouped_mm_supported(cpu, torch.float64, 32, 16)  # not a grouped-GEMM dtype
    assert not grouped_mm_supported(cpu, torch.float32, 32, 10)  # 40-byte rows are not 16-byte aligned
    assert not grouped_mm_supported(cpu, torch.bfloat16, 32, 12)  # 24-byte rows


def test_auto_falls_back_to_loop_and_forced_grouped_mm_names_the_problem():
    experts = GroupedExperts(4, dim=32, hidden=10)
    x = torch.randn(6, 32)
    assert experts.resolved_impl(x) == "loop"
    assert experts.resolved_impl(x.double()) == "loop"
    experts.impl = "grouped_mm"
    with pytest.raises(ValueError, match="grouped_mm.*16-byte"):
        experts(x, torch.tensor([2, 2, 2, 0]))


def test_grouped_and_loop_agree_in_bf16():
    torch.manual_seed(0)
    experts = GroupedExperts(4, dim=32, hidden=16).to(torch.bfloat16)
    for p in experts.parameters():
        torch.nn.init.normal_(p, 0.0, 0.2)
    x = torch.randn(12, 32, dtype=torch.bfloat16)
    counts = torch.tensor([5, 0, 4, 3])
    assert experts.resolved_impl(x) == "grouped_mm"
    grouped = experts(x, counts)
    experts.impl = "loop"
    torch.testing.assert_close(grouped, experts(x, counts), rtol=2e-2, atol=2e-2)


def test_sigmoid_routing_weights_and_route_scale():
    torch.manual_seed(0)
    layer = MoELayer(cfg(score_func="sigmoid", route_scale=2.5, n_experts=8, top_k=3))
    ids, weights, scores, _ = layer.router(torch.randn(7, 32))
    assert ids.shape == weights.shape == (7, 3)
    torch.testing.assert_close(weights.sum(-1), torch.full((7,), 2.5))
    assert torch.all((scores > 0) & (scores < 1))
    # Chosen experts are the highest-scoring ones.
    assert torch.equal(ids.sort(-1).values, scores.topk(3, dim=-1).indices.sort(-1).values)


def test_aux_loss_is_switch_formula():
    torch.manual_seed(0)
    layer = MoELayer(cfg(balance="aux_loss", aux_loss_coef=0.5))
    x = torch.randn(40, 32)
    _, aux = layer(x)
    ids, _, scores, _ = layer.router(x)
    f = torch.bincount(ids.reshape(-1), minlength=8).float() / ids.numel()
    expected = 0.5 * 8 * (f * scores.mean(0)).sum()
    torch.testing.assert_close(aux, expected)
    # The loss reaches the router: it is what pushes probability mass off overloaded experts.
    aux.backward()
    assert layer.router.gate.weight.grad.abs().sum() > 0
    _, none_aux = MoELayer(cfg(balance="none"))(x)
    assert float(none_aux) == 0.0


@pytest.mark.parametrize("score_func", ["softmax", "sigmoid"])
def test_aux_free_bias_moves_toward_balance(score_func):
    torch.manual_seed(0)
    layer = MoELayer(cfg(balance="aux_free", bias_update_speed=0.003, n_experts=8, top_k=2, score_func=score_func))
    with torch.no_grad():  # a router that prefers experts 0 and 1
        layer.router.gate.weight.normal_(0.0, 0.1)
        layer.router.gate.weight[:2] += 0.1
    x = torch.randn(512, 32) + 0.5

    def imbalance() -> float:
        layer(x)
        return float(layer.last_load.max() / layer.last_load.mean())

    before = imbalance()
    initial = layer.last_load.clone()
    for _ in range(150):
        layer(x)
        layer.update_bias()
    after = imbalance()
    assert before > 2.5
    assert after < 1.2, (before, after, layer.last_load)
    # Overloaded experts were pushed below underloaded ones (only differences matter for the top-k choice).
    over, under = initial > 1.5 * initial.mean(), initial < 0.5 * initial.mean()
    assert over.any() and under.any()
    assert layer.expert_bias[over].max() < layer.expert_bias[under].min()


def test_update_bias_uses_given_global_load():
    layer = MoELayer(cfg(balance="aux_free", bias_update_speed=0.1, n_experts=4))
    layer.update_bias(torch.tensor([10.0, 0.0, 5.0, 5.0]))
    torch.testing.assert_close(layer.expert_bias, torch.tensor([-0.1, 0.1, 0.0, 0.0]))


def test_expert_bias_is_checkpointed_and_last_load_is_not():
    keys = MoELayer(cfg(balance="aux_free")).state_dict().keys()
    assert "expert_bias" in keys
    assert "last_load" not in keys


def test_compute_experts_is_the_expert_hook():
    """Replacing compute_experts (as expert parallelism does) changes the layer's expert computation."""
    torch.manual_seed(0)
    layer = MoELayer(cfg())
    x = torch.randn(5, 32)
    seen = {}

    def doubled(x_sorted, tokens_per_expert):
        seen["rows"], seen["counts"] = x_sorted.shape[0], tokens_per_expert.clone()
        return 2 * layer.experts(x_sorted, tokens_per_expert)

    base, _ = layer(x)
    layer.compute_experts = doubled
    out, _ = layer(x)
    assert seen["rows"] == 5 * 2 and int(seen["counts"].sum()) == 10
    torch.testing.assert_close(out, 2 * base)


def test_balancing_buffers_stay_float32_in_a_bf16_model():
    layer = MoELayer(cfg(balance="aux_free", bias_update_speed=1e-3, n_experts=4))
    layer.update_bias(torch.tensor([0.0, 1.0, 1.0, 1.0]))  # expert 0 underloaded: +1e-3
    layer.to(torch.bfloat16)
    assert layer.router.gate.weight.dtype == torch.bfloat16
    assert layer.expert_bias.dtype == layer.last_load.dtype == torch.float32
    for _ in range(300):  # 0.3 in 1e-3 steps: bf16 would stall at 2^-9 resolution near 0.25
        layer.update_bias(torch.tensor([0.0, 1.0, 1.0, 1.0]))
    assert float(layer.expert_bias[0]) == pytest.approx(0.301, abs=1e-5)
    out, _ = layer(torch.randn(5, 32, dtype=torch.bfloat16))
    assert out.dtype == torch.bfloat16


def test_shared_expert_is_added_to_every_token():
    torch.manual_seed(0)
    layer = MoELayer(cfg(n_shared_experts=2))
    assert layer.shared.w1.weight.shape == (2 * 16, 32)  # n_shared_experts * expert_hidden wide
    x = torch.randn(9, 32)
    out, _ = layer(x)
    shared, layer.shared = layer.shared, None
    routed, _ = layer(x)
    torch.testing.assert_close(out, routed + shared(x))
