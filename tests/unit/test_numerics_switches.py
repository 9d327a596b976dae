"""The model switches the stability experiments use: qk_norm and dropout, both off by default."""

import pytest
import torch

from sigma.train.config import load_model_config
from sigma.train.model import MoETransformer


def build(**overrides):
    torch.manual_seed(0)
    return MoETransformer(load_model_config("debug", overrides))


def test_defaults_leave_the_model_as_it_was():
    model = build()
    assert not any("q_norm" in k or "k_norm" in k for k in model.state_dict())
    assert model.cfg.dropout == 0.0 and model.cfg.qk_norm is False


def test_qk_norm_adds_per_head_norms_and_trains():
    model = build(qk_norm=True)
    assert model.layers[0].attn.q_norm.weight.shape == (model.cfg.head_dim,)
    tokens = torch.randint(0, model.cfg.vocab_size, (2, 16))
    logits, aux = model(tokens)
    (logits.float().square().mean() + aux).backward()
    assert model.layers[0].attn.k_norm.weight.grad is not None


def test_dropout_only_in_training():
    model = build(dropout=0.5)
    tokens = torch.randint(0, model.cfg.vocab_size, (2, 16))
    model.eval()
    assert torch.equal(model(tokens)[0], model(tokens)[0])
    model.train()
    assert not torch.equal(model(tokens)[0], model(tokens)[0])
    with pytest.raises(ValueError, match=r"dropout must be in \[0, 1\)"):
        build(dropout=1.0)
