"""Our MoE layer and decoder against independent references: HuggingFace transformers' Mixtral and DeepSeek-V3.

Mixtral routes with softmax over all experts, picks the top-k and renormalises them; that is our
score_func=softmax, norm_topk_prob=True, no shared expert. Mixtral stores each expert's gate and up projections
concatenated as gate_up_proj [E, 2H, D] and the down projection as down_proj [E, D, H].
DeepSeek-V3 with one expert group is our score_func=sigmoid, balance=aux_free (e_score_correction_bias is the
expert bias), route_scale (routed_scaling_factor) and shared experts.
"""

from __future__ import annotations

import pytest
import torch

from sigma.train.config import ModelConfig
from sigma.train.model import MoETransformer
from sigma.train.moe import MoELayer

mixtral = pytest.importorskip("transformers.models.mixtral.modeling_mixtral")
from transformers import MixtralConfig  # noqa: E402

torch.set_num_threads(min(2, torch.get_num_threads()))

DIM, HIDDEN, EXPERTS, TOP_K = 32, 16, 8, 2


def hf_config(**kw) -> MixtralConfig:
    cfg = MixtralConfig(hidden_size=DIM, intermediate_size=HIDDEN, num_local_experts=EXPERTS,
                        num_experts_per_tok=TOP_K, router_jitter_noise=0.0, **kw)
    cfg._experts_implementation = "eager"  # the reference per-expert loop, not transformers' own grouped kernels
    cfg._attn_implementation = "eager"
    return cfg


def our_config(**kw) -> ModelConfig:
    base = dict(vocab_size=64, dim=DIM, n_layers=2, n_heads=4, n_kv_heads=2, n_dense_layers=0, n_experts=EXPERTS,
                top_k=TOP_K, expert_hidden=HIDDEN, n_shared_experts=0, score_func="softmax", norm_topk_prob=True,
                balance="none", init="gaussian", init_std=0.1)
    base.update(kw)
    return ModelConfig(**base)


def copy_moe_weights(ours: MoELayer, block) -> None:
    with torch.no_grad():
        block.gate.weight.copy_(ours.router.gate.weight)
        block.experts.gate_up_proj.copy_(torch.cat([ours.experts.w1, ours.experts.w3], dim=1))
        block.experts.down_proj.copy_(ours.experts.w2)


def make_pair(impl: str, seed: int = 0):
    torch.manual_seed(seed)
    ours = MoELayer(our_config(expert_impl=impl))
    for p in ours.parameters():
        torch.nn.init.normal_(p, 0.0, 0.2)
    block = mixtral.MixtralSparseMoeBlock(hf_config())
    copy_moe_weights(ours, block)
    return ours, block


@pytest.mark.parametrize("impl", ["grouped_mm", "loop"])
@pytest.mark.parametrize("loss_kind", ["weighted", "sum"])  # "sum" gives a stride-0 output gradient
def test_moe_layer_matches_mixtral_forward_and_backward(impl, loss_kind):
    ours, block = make_pair(impl)
    assert ours.experts.resolved_impl(torch.empty(0)) == impl
    x = torch.randn(3, 20, DIM)
    x_ours, x_hf = x.clone().requires_grad_(), x.clone().requires_grad_()

    y_ours, _ = ours(x_ours)
    y_hf = block(x_hf)
    torch.testing.assert_close(y_ours, y_hf, rtol=1e-5, atol=1e-5)
    # Every expert got tokens, so every expert weight has a gradient to compare.
    assert int((ours.last_load > 0).sum()) == EXPERTS
    assert int(ours.last_load.sum()) == 3 * 20 * TOP_K

    if loss_kind == "sum":
        y_ours.sum().backward()
        y_hf.sum().backward()
    else:
        g = torch.randn_like(y_hf)
        (y_ours * g).sum().backward()
        (y_hf * g).sum().backward()
    torch.testing.assert_close(x_ours.grad, x_hf.grad, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ours.router.gate.weight.grad, block.gate.weight.grad, rtol=1e-5, atol=1e-5)
    gate_up = block.experts.gate_up_proj.grad
    torch.testing.assert_close(ours.experts.w1.grad, gate_up[:, :HIDDEN], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ours.experts.w3.grad, gate_up[:, HIDDEN:], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ours.experts.w2.grad, block.experts.down_proj.grad, rtol=1e-5, atol=1e-5)


def test_moe_layer_with_idle_experts_matches_mixtral():
    """Few tokens: some experts receive none (empty groups in the grouped GEMM)."""
    ours, block = make_pair("grouped_mm", seed=1)
    x = torch.randn(1, 2, DIM)
    y_ours, _ = ours(x)
    assert int((ours.last_load == 0).sum()) >= EXPERTS - 2 * TOP_K
    torch.testing.assert_close(y_ours, block(x), rtol=1e-5, atol=1e-5)


def test_decoder_matches_mixtral_causal_lm():
    """Whole model: embeddings, RMSNorm, RoPE, GQA attention, MoE blocks and the head, logits to 1e-4."""
    torch.manual_seed(0)
    cfg = our_config(rope_theta=10000.0)
    ours = MoETransformer(cfg).eval()
    ref = mixtral.MixtralForCausalLM(hf_config(
        vocab_size=cfg.vocab_size, num_hidden_layers=cfg.n_layers, num_attention_heads=cfg.n_heads,
        num_key_value_heads=cfg.n_kv_heads, max_position_embeddings=cfg.max_seq_len, rms_norm_eps=cfg.norm_eps,
        rope_parameters={"rope_type": "default", "rope_theta": cfg.rope_theta}, tie_word_embeddings=False)).eval()
    with torch.no_grad():
        ref.model.embed_tokens.weight.copy_(ours.tok_embeddings.weight)
        ref.model.norm.weight.copy_(torch.rand(cfg.dim) + 0.5)
        ours.norm.weight.copy_(ref.model.norm.weight)
        ref.lm_head.weight.copy_(ours.output.weight)
        for mine, theirs in zip(ours.layers, ref.model.layers):
            for name in ("q", "k", "v", "o"):
                getattr(theirs.self_attn, f"{name}_proj").weight.copy_(getattr(mine.attn, f"w{name}").weight)
            theirs.input_layernorm.weight.copy_(mine.attn_norm.weight)
            theirs.post_attention_layernorm.weight.copy_(mine.ffn_norm.weight)
            copy_moe_weights(mine.ffn, theirs.mlp)
    tokens = torch.randint(0, cfg.vocab_size, (2, 24))
    logits, _ = ours(tokens)
    expected = ref(input_ids=tokens).logits
    torch.testing.assert_close(logits, expected, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("impl", ["grouped_mm", "loop"])
def test_sigmoid_aux_free_shared_layer_matches_deepseek_v3(impl):
    deepseek = pytest.importorskip("transformers.models.deepseek_v3.modeling_deepseek_v3")
    from transformers import DeepseekV3Config

    torch.manual_seed(0)
    ours = MoELayer(our_config(expert_impl=impl, score_func="sigmoid", balance="aux_free", route_scale=2.5,
                               n_shared_experts=2))
    for p in ours.parameters():
        torch.nn.init.normal_(p, 0.0, 0.2)
    with torch.no_grad():
        ours.expert_bias.copy_(torch.randn(EXPERTS) * 0.3)  # changes which experts are picked
    cfg = DeepseekV3Config(hidden_size=DIM, moe_intermediate_size=HIDDEN, n_routed_experts=EXPERTS,
                           num_experts_per_tok=TOP_K, n_group=1, topk_group=1, n_shared_experts=2,
                           routed_scaling_factor=2.5, norm_topk_prob=True)
    cfg._experts_implementation = "eager"
    ref = deepseek.DeepseekV3MoE(cfg)
    with torch.no_grad():
        ref.gate.weight.copy_(ours.router.gate.weight)
        ref.gate.e_score_correction_bias.copy_(ours.expert_bias)
        ref.experts.gate_up_proj.copy_(torch.cat([ours.experts.w1, ours.experts.w3], dim=1))
        ref.experts.down_proj.copy_(ours.experts.w2)
        ref.shared_experts.gate_proj.weight.copy_(ours.shared.w1.weight)
        ref.shared_experts.up_proj.weight.copy_(ours.shared.w3.weight)
        ref.shared_experts.down_proj.weight.copy_(ours.shared.w2.weight)

    x = torch.randn(2, 24, DIM)
    x_ours, x_ref = x.clone().requires_grad_(), x.clone().requires_grad_()
    y_ours, aux = ours(x_ours)
    y_ref = ref(x_ref)
    assert float(aux) == 0.0  # aux-free: no auxiliary loss
    torch.testing.assert_close(y_ours, y_ref, rtol=1e-5, atol=1e-5)
    g = torch.randn_like(y_ref)
    (y_ours * g).sum().backward()
    (y_ref * g).sum().backward()
    torch.testing.assert_close(x_ours.grad, x_ref.grad, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ours.router.gate.weight.grad, ref.gate.weight.grad, rtol=1e-5, atol=1e-5)
    gate_up = ref.experts.gate_up_proj.grad
    torch.testing.assert_close(ours.experts.w1.grad, gate_up[:, :HIDDEN], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ours.experts.w3.grad, gate_up[:, HIDDEN:], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ours.experts.w2.grad, ref.experts.down_proj.grad, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ours.shared.w2.weight.grad, ref.shared_experts.down_proj.weight.grad,
                               rtol=1e-5, atol=1e-5)
