"""Collapse precursors: what the trainer measures (sigma/train/precursors.py) and how `sigma collapse check` judges
them (attention-logit growth, output log Z drift, router collapse)."""

import math

import pytest
import torch

from sigma.paths import configs_dir
from sigma.train.collapse import Thresholds, assess, read_metrics
from sigma.train.config import load_model_config
from sigma.train.kpi import KpiWriter, read_kpis
from sigma.train.model import MoETransformer
from sigma.train import precursors
from sigma.train.precursors import PrecursorProbe, attention_logit_max
from sigma.train.train_config import load_train_config


def debug_model(**overrides) -> MoETransformer:
    torch.manual_seed(0)
    return MoETransformer(load_model_config("debug", {"n_layers": 3, **overrides}))


def probe_values(model, tokens):
    with PrecursorProbe(model) as probe:
        model(tokens)
    return probe.values()


def test_attention_logit_max_is_the_largest_causal_logit(monkeypatch):
    model = debug_model()
    attn, x = model.layers[0].attn, torch.randn(2, 16, model.cfg.dim)
    cos, sin = model.rope_cos[:16], model.rope_sin[:16]
    q, k = attn.queries_keys(x, cos, sin)
    k = k.repeat_interleave(attn.n_heads // attn.n_kv_heads, dim=1)
    logits = q @ k.transpose(-1, -2) / math.sqrt(attn.head_dim)
    causal = torch.ones(16, 16, dtype=torch.bool).tril()
    expected = float(logits[..., causal].abs().max())
    assert attention_logit_max(attn, x, cos, sin) == pytest.approx(expected, rel=1e-5)
    monkeypatch.setattr(precursors, "CHUNK", 16 * 16)  # one (row, head) at a time: the same maximum
    assert attention_logit_max(attn, x, cos, sin) == pytest.approx(expected, rel=1e-5)


def test_mean_log_z_in_chunks(monkeypatch):
    logits = torch.randn(2, 8, 512) * 3
    expected = float(torch.logsumexp(logits, -1).mean())
    monkeypatch.setattr(precursors, "CHUNK", 3 * 512)  # three tokens at a time, the last chunk shorter
    assert precursors.mean_log_z(logits) == pytest.approx(expected, rel=1e-6)


def test_probe_reports_each_precursor_and_follows_the_weights():
    tokens = torch.randint(0, 512, (2, 32))
    model = debug_model()
    before = probe_values(model, tokens)
    assert len(before["attn_logit_max"]) == 3 and len(before["router_entropy"]) == 2  # one dense, two MoE layers
    with torch.no_grad():
        model.layers[1].attn.wq.weight.mul_(10)  # logits are linear in the queries without qk-norm
        model.output.weight.zero_()  # every logit 0: log Z = log(vocab)
        model.layers[2].ffn.router.gate.weight.mul_(1000)  # a saturated router: one expert per token
    after = probe_values(model, tokens)
    assert after["attn_logit_max"][1] == pytest.approx(10 * before["attn_logit_max"][1], rel=1e-3)
    assert after["attn_logit_max"][0] == before["attn_logit_max"][0]
    assert after["output_log_z"] == pytest.approx(math.log(512), abs=1e-3)
    assert after["router_entropy"][1] < 0.05 < 0.9 < after["router_entropy"][0] <= 1.0


def test_qk_norm_bounds_the_logits_the_probe_sees():
    tokens = torch.randint(0, 512, (2, 32))
    model = debug_model(qk_norm=True)
    before = probe_values(model, tokens)["attn_logit_max"]
    with torch.no_grad():
        model.layers[1].attn.wq.weight.mul_(10)  # RMSNorm on the queries undoes the scale
    assert probe_values(model, tokens)["attn_logit_max"] == pytest.approx(before, rel=1e-3)


def test_probe_leaves_the_step_unchanged_and_removes_its_hooks():
    tokens = torch.randint(0, 512, (2, 33))
    grads = []
    for enabled in (False, True):
        model = debug_model()
        with PrecursorProbe(model, enabled=enabled) as probe:
            logits, aux = model(tokens[:, :-1])
            torch.nn.functional.cross_entropy(logits.reshape(-1, 512), tokens[:, 1:].reshape(-1)).backward()
        grads.append([p.grad.clone() for p in model.parameters()])
        assert bool(probe.values()) == enabled
        assert not any(m._forward_hooks for m in model.modules())
    assert all(torch.equal(a, b) for a, b in zip(*grads))


def test_trainer_writes_the_precursors_on_the_norm_steps(train_data, tmp_path, monkeypatch):
    from sigma.train.trainer import train

    monkeypatch.setenv("SIGMA_KPI_DIR", str(tmp_path / "kpi"))
    monkeypatch.setenv("SIGMA_JOB_ID", "9")
    cfg = load_train_config(configs_dir() / "train" / "debug.yaml", [
        f"data.path={train_data}", "data.prepare_if_missing=false", "data.seq_len=32", "data.global_batch=4",
        "threads=1", "kpi.progress_every=0", f"checkpoint.dir={tmp_path / 'ckpt'}", "checkpoint.every=0",
        "eval.every=0", "steps=4", "kpi.param_norm_every=2"])
    metrics = [r for r in read_kpis(train(cfg).kpi_path) if "event" not in r]
    assert [("attn_logit_max" in m, "output_log_z" in m, "router_entropy" in m) for m in metrics] == \
        [(False,) * 3, (True,) * 3, (False,) * 3, (True,) * 3]
    assert len(metrics[1]["attn_logit_max"]) == 2 and len(metrics[1]["router_entropy"]) == 1
    assert 0 < metrics[1]["router_entropy"][0] <= 1 and math.isfinite(metrics[1]["output_log_z"])


def write(tmp_path, rows):
    writer = KpiWriter(0, tmp_path, job_id=3, node="n1")
    for step, fields in enumerate(rows, 1):
        writer.metrics(step, loss=5.0 - 0.001 * step, grad_norm=1.0, **fields)
    writer.close()
    return read_metrics([writer.path])


def every_fifth(value_at):
    return [value_at(step) if step % 5 == 0 else {} for step in range(1, 101)]


def test_attention_logits_fire_on_the_second_report_above_the_threshold(tmp_path):
    th = Thresholds()
    rows = every_fifth(lambda s: {"attn_logit_max": [5.0, th.attn_logit * (1.5 if s >= 40 else 0.5)]})
    verdict = assess(write(tmp_path, rows), th)
    assert verdict.state == "warning" and verdict.first == {"attn_logits": 45}
    assert "(layer 1)" in verdict.evidence["attn_logits"]
    one_report = every_fifth(lambda s: {"attn_logit_max": [th.attn_logit * (2 if s == 40 else 0.5)]})
    assert assess(write(tmp_path / "b", one_report), th).state == "healthy"


def test_log_z_drift_is_measured_from_the_first_report(tmp_path):
    th = Thresholds()
    rows = every_fifth(lambda s: {"output_log_z": 6.2 - (th.log_z + 0.5 if s >= 60 else 0.1)})
    verdict = assess(write(tmp_path, rows), th)
    assert verdict.first == {"log_z_drift": 65} and "drifted -" in verdict.evidence["log_z_drift"]


def test_router_collapse(tmp_path):
    th = Thresholds()
    low = th.router_entropy / 2
    rows = every_fifth(lambda s: {"router_entropy": [0.9, low if s in (20, 30) or s >= 70 else 0.9]})
    verdict = assess(write(tmp_path, rows), th)  # two reports in a row: not the single dips at 20 and 30
    assert verdict.first == {"router_collapse": 75} and "MoE layer 1" in verdict.evidence["router_collapse"]


def test_non_finite_precursors_are_not_judged(tmp_path):
    rows = every_fifth(lambda s: {"attn_logit_max": ["nan", 1e9], "router_entropy": ["inf"], "output_log_z": "nan"})
    assert assess(write(tmp_path, rows)).state == "healthy"
