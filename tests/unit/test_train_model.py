"""The MoE decoder: config validation, presets, causality, init, FLOPs accounting, and that it learns."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from sigma.config import ConfigError
from sigma.train.config import ModelConfig, load_model_config, preset_names
from sigma.train.flops import (PeakUnknown, accelerator_peak, cpu_model, flops_per_token, hardware_flops_per_token,
                               mfu, param_counts, peak_flops, record_calibration)
from sigma.train.model import MoETransformer

torch.set_num_threads(min(2, torch.get_num_threads()))

REQUIRED_PRESETS = {"debug", "tiny", "sigma-200b-a20b", "17b-a2b", "moe-1b"}


# --- config -------------------------------------------------------------------------------------------------------

def test_unknown_key_is_located_and_lists_valid_keys(tmp_path):
    path = tmp_path / "m.yaml"
    path.write_text("dim: 64\nn_heads: 4\nnum_experts: 8\n")
    with pytest.raises(ConfigError) as err:
        load_model_config(path)
    message = str(err.value)
    assert f"{path}:3" in message and "unknown key 'num_experts'" in message
    assert "n_experts" in message and "expert_hidden" in message and "top_k" in message


@pytest.mark.parametrize("overrides, fragment", [
    ({"dim": 60, "n_heads": 8}, "dim (60) must be divisible by n_heads (8)"),
    ({"n_heads": 8, "n_kv_heads": 3}, "n_heads (8) must be divisible by n_kv_heads (3)"),
    ({"n_experts": 4, "top_k": 5}, "top_k (5) must be <= n_experts (4)"),
    ({"n_layers": 2, "n_dense_layers": 3}, "n_dense_layers (3) must be <= n_layers (2)"),
    ({"dim": 24, "n_heads": 8}, "head_dim = dim / n_heads = 3 must be even"),
    ({"expert_hidden": 0}, "expert_hidden must be a positive integer"),
    ({"aux_loss_coef": -1.0}, "aux_loss_coef must be >= 0"),
])
def test_invalid_shapes_are_rejected(overrides, fragment):
    with pytest.raises(ConfigError, match=fragment.replace("(", r"\(").replace(")", r"\)")) as err:
        load_model_config("debug", overrides)
    assert "debug.yaml" in str(err.value)


def test_choice_fields_list_their_options():
    with pytest.raises(ConfigError, match="'softmax', 'sigmoid'"):
        load_model_config("debug", {"score_func": "relu"})
    with pytest.raises(ValueError, match="balance must be one of 'aux_loss', 'aux_free', 'none'"):
        ModelConfig(balance="loss-free")
    with pytest.raises(ConfigError, match="expected int"):
        load_model_config("debug", {"dim": 64.5})


def test_string_overrides_are_parsed_and_unknown_presets_listed():
    cfg = load_model_config("debug", {"n_layers": "3", "score_func": "sigmoid", "tie_embeddings": "true"})
    assert cfg.n_layers == 3 and cfg.score_func == "sigmoid" and cfg.tie_embeddings is True
    with pytest.raises(ConfigError, match="unknown model preset; presets: .*debug.*tiny"):
        load_model_config("no-such-model")


@pytest.mark.parametrize("name", sorted(REQUIRED_PRESETS))
def test_presets_load_and_parameter_count_matches_model(name):
    assert REQUIRED_PRESETS <= set(preset_names())
    cfg = load_model_config(name)
    with torch.device("meta"):  # shapes only: the 200B preset is never materialised
        model = MoETransformer(cfg)
    assert model.num_params() == param_counts(cfg).total
    assert len(model.moe_layers()) == cfg.n_layers - cfg.n_dense_layers


def test_paper_preset_shape():
    cfg = load_model_config("sigma-200b-a20b")
    assert (cfg.n_layers, cfg.n_experts, cfg.top_k) == (63, 96, 8)
    assert cfg.n_kv_heads < cfg.n_heads
    counts = param_counts(cfg)
    assert 190e9 < counts.total < 210e9 and 18e9 < counts.active < 22e9


# --- model --------------------------------------------------------------------------------------------------------

def test_forward_shapes_and_aux_loss():
    torch.manual_seed(0)
    cfg = load_model_config("debug")
    model = MoETransformer(cfg)
    logits, aux = model(torch.randint(0, cfg.vocab_size, (2, 16)))
    assert logits.shape == (2, 16, cfg.vocab_size)
    assert aux.shape == () and float(aux.detach()) > 0
    for layer in model.moe_layers():
        assert int(layer.last_load.sum()) == 2 * 16 * cfg.top_k
    with pytest.raises(ValueError, match="exceeds max_seq_len"):
        model(torch.zeros(1, cfg.max_seq_len + 1, dtype=torch.long))


@pytest.mark.parametrize("impl", ["grouped_mm", "loop"])
def test_causal_future_tokens_do_not_change_past_logits(impl):
    torch.manual_seed(0)
    cfg = load_model_config("debug", {"expert_impl": impl})
    model = MoETransformer(cfg)
    tokens = torch.randint(0, cfg.vocab_size, (2, 24))
    changed = tokens.clone()
    changed[:, 12:] = torch.randint(0, cfg.vocab_size, (2, 12))
    a, _ = model(tokens)
    b, _ = model(changed)
    torch.testing.assert_close(a[:, :12], b[:, :12], rtol=1e-5, atol=1e-5)
    assert (a[:, 12:] - b[:, 12:]).abs().max() > 1e-3


def test_grouped_and_loop_models_have_equal_gradients():
    torch.manual_seed(0)
    cfg = load_model_config("debug", {"n_layers": 3})
    model = MoETransformer(cfg)
    tokens = torch.randint(0, cfg.vocab_size, (2, 16))
    grads = {}
    for impl in ("grouped_mm", "loop"):
        model.zero_grad()
        for layer in model.moe_layers():
            layer.experts.impl = impl
        logits, aux = model(tokens)
        (logits.logsumexp(-1).mean() + aux).backward()
        grads[impl] = {n: p.grad.clone() for n, p in model.named_parameters()}
    for name, g in grads["grouped_mm"].items():
        torch.testing.assert_close(g, grads["loop"][name], rtol=1e-5, atol=1e-6, msg=name)


@pytest.mark.parametrize("init", ["gaussian", "scaled"])
def test_init_output_projection_std(init):
    torch.manual_seed(0)
    cfg = load_model_config("tiny", {"init": init, "init_std": 0.02})
    model = MoETransformer(cfg)
    out_std = 0.02 / math.sqrt(2 * cfg.n_layers) if init == "scaled" else 0.02
    moe = model.moe_layers()[0]
    for w in (model.layers[0].attn.wo.weight, model.layers[0].ffn.w2.weight, moe.experts.w2, moe.shared.w2.weight):
        assert abs(float(w.detach().std()) - out_std) < 0.03 * out_std
    for w in (model.layers[0].attn.wq.weight, moe.experts.w1, model.tok_embeddings.weight):
        assert abs(float(w.detach().std()) - 0.02) < 0.03 * 0.02
    assert torch.all(model.norm.weight == 1)


def test_meta_model_materialises_with_to_empty_and_init_weights():
    cfg = load_model_config("debug")
    with torch.device("meta"):
        model = MoETransformer(cfg)
    model.to_empty(device="cpu")
    torch.manual_seed(0)
    model.init_weights()
    fresh = MoETransformer(cfg)
    torch.testing.assert_close(model.rope_cos, fresh.rope_cos)
    torch.testing.assert_close(model.rope_sin, fresh.rope_sin)
    assert all(float(layer.expert_bias.abs().sum()) == 0 for layer in model.moe_layers())
    logits, _ = model(torch.randint(0, cfg.vocab_size, (1, 8)))
    assert torch.isfinite(logits).all()


def test_tied_embeddings_share_one_tensor():
    model = MoETransformer(load_model_config("debug", {"tie_embeddings": True}))
    assert model.output.weight is model.tok_embeddings.weight


def test_debug_preset_learns_a_fixed_batch():
    torch.manual_seed(0)
    cfg = load_model_config("debug")
    model = MoETransformer(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    batch = torch.randint(0, cfg.vocab_size, (4, 33))
    inputs, targets = batch[:, :-1], batch[:, 1:]
    losses = []
    for _ in range(15):
        logits, aux = model(inputs)
        loss = F.cross_entropy(logits.reshape(-1, cfg.vocab_size), targets.reshape(-1))
        opt.zero_grad()
        (loss + aux).backward()
        opt.step()
        losses.append(loss.item())
    assert losses[0] == pytest.approx(math.log(cfg.vocab_size), rel=0.05)  # starts at chance
    assert losses[-1] < 0.8 * losses[0], losses


# --- FLOPs --------------------------------------------------------------------------------------------------------

def test_flops_per_token_by_hand():
    cfg = ModelConfig(vocab_size=100, dim=8, n_layers=2, n_heads=2, n_kv_heads=1, n_dense_layers=1, dense_hidden=12,
                      n_experts=4, top_k=2, expert_hidden=4, n_shared_experts=1)
    # head_dim 4. Attention per layer: q 8*8 + o 8*8 + k 8*4 + v 8*4 = 192; two layers 384.
    # Dense FFN (layer 0): 3*8*12 = 288. MoE layer 1: router 8*4 = 32, shared 3*8*4 = 96, routed 2 of 4 experts
    # of 3*8*4 = 96 each -> 192. Output head 100*8 = 800. Active = 384 + 288 + 32 + 96 + 192 + 800 = 1792.
    # Attention term: 12 * n_layers 2 * n_heads 2 * head_dim 4 * seq 16 = 3072.
    assert param_counts(cfg).active == 1792
    assert flops_per_token(cfg, 16) == 6 * 1792 + 3072
    # Total: embedding, head, norms (2 per layer + final: 5 * 8 = 40) and all four routed experts:
    # 800 emb + 800 head + 40 norms + 384 attn + 288 dense + 32 router + 96 shared + 4*96 routed = 2824.
    assert param_counts(cfg).total == 2824


def test_mfu_against_a_stated_peak_never_a_measured_one(monkeypatch, tmp_path):
    cfg = load_model_config("debug")
    assert mfu(1000.0, cfg, 64, 1e12) == pytest.approx(1000.0 * flops_per_token(cfg, 64) / 1e12)
    monkeypatch.setenv("SIGMA_PEAK_FILE", str(tmp_path / "peaks.json"))
    monkeypatch.delenv("SIGMA_PEAK_FLOPS", raising=False)
    with pytest.raises(PeakUnknown, match="sigma train calibrate"):
        peak_flops("cpu", torch.float32)  # nothing recorded: no MFU rather than a rate measured under load
    assert peak_flops("cpu", torch.float32, configured=5e11).flops == 5e11
    monkeypatch.setenv("SIGMA_PEAK_FLOPS", "1e12")
    assert peak_flops("cpu").flops == 1e12
    monkeypatch.delenv("SIGMA_PEAK_FLOPS")
    record_calibration([{"cpu": cpu_model(), "threads": torch.get_num_threads(), "dtype": "bfloat16", "flops": 3e11,
                         "measured_at": "2026-01-01T00:00:00+00:00"}])
    peak = peak_flops("cpu", torch.bfloat16)
    assert peak.flops == 3e11 and "sigma train calibrate" in peak.source
    with pytest.raises(PeakUnknown):
        peak_flops("cpu", torch.float32)  # recorded for bf16 only
    with pytest.raises(PeakUnknown, match="SIGMA_PEAK_FLOPS"):
        peak_flops("meta")


def test_hardware_flops_count_the_recomputed_forward():
    cfg = load_model_config("debug")
    assert hardware_flops_per_token(cfg, 64) == flops_per_token(cfg, 64)
    ckpt = load_model_config("debug", {"activation_checkpointing": True})
    extra = hardware_flops_per_token(ckpt, 64) - flops_per_token(ckpt, 64)
    head = cfg.vocab_size * cfg.dim
    assert extra == 2 * (param_counts(cfg).active - head) + 4 * cfg.n_layers * cfg.n_heads * cfg.head_dim * 64


@pytest.mark.parametrize("name, bf16, fp32", [
    ("NVIDIA H100 80GB HBM3", 989e12, 67e12),
    ("NVIDIA H100 PCIe", 756e12, 51e12),
    ("NVIDIA H200", 989e12, 67e12),
    ("NVIDIA GH200 480GB", 989e12, 67e12),
    ("NVIDIA A100-SXM4-80GB", 312e12, 19.5e12),
    ("NVIDIA L40S", 362e12, 91.6e12),
    ("NVIDIA L4", 121e12, 30.3e12),
    ("NVIDIA B200", 2.25e15, None),
    ("AMD Instinct MI300X", 1307e12, 163.4e12),
])
def test_accelerator_peak_by_reported_name(name, bf16, fp32):
    assert accelerator_peak(name, torch.bfloat16).flops == bf16
    assert "datasheet" in accelerator_peak(name).source or "data sheet" in accelerator_peak(name).source
    if fp32 is None:
        with pytest.raises(PeakUnknown, match="no float32 peak"):
            accelerator_peak(name, torch.float32)
    else:
        assert accelerator_peak(name, torch.float32).flops == fp32


def test_unknown_accelerator_names_the_override():
    with pytest.raises(ValueError, match="SIGMA_PEAK_FLOPS"):
        accelerator_peak("Imaginary TPU v9")


# --- docs ---------------------------------------------------------------------------------------------------------

def test_docs_cover_every_config_key_and_preset():
    import dataclasses
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[2] / "docs" / "train-model.md").read_text()
    for field in dataclasses.fields(ModelConfig):
        assert f"| `{field.name}` |" in doc, f"docs/train-model.md does not describe {field.name}"
    for name in preset_names():
        assert f"| `{name}` |" in doc, f"docs/train-model.md does not list preset {name}"
