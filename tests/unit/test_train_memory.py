"""The memory model against a measured step, in-flight micro-batches per schedule, and selective recompute."""

import pytest
import torch

from sigma.train.config import load_model_config
from sigma.train.dims import ParallelDims
from sigma.train.memory import PeakTracker, estimate, in_flight_microbatches, stage_param_counts, tensor_bytes


def dims(world=1, **kw):
    return ParallelDims.build(world, n_layers=8, n_experts=8, global_batch=8, **kw)


def test_in_flight_microbatches_per_schedule():
    assert in_flight_microbatches(dims(), 0) == 1
    assert [in_flight_microbatches(dims(4, pp=4, microbatches=8), r) for r in range(4)] == [4, 3, 2, 1]
    assert in_flight_microbatches(dims(4, pp=4, microbatches=8, schedule="gpipe"), 3) == 8
    # interleaved, p=2, v=2, m=4: rank 0 warms up 2*(2-0-1) + (2-1)*2 + 1 = 5 chunks of half its layers
    assert in_flight_microbatches(dims(2, pp=2, vpp=2, microbatches=4), 0) == 2.5


def test_parameters_split_over_stages_tp_and_ep():
    cfg = load_model_config("tiny", {"n_layers": 8})
    whole, _ = stage_param_counts(cfg, dims(), 0)
    from sigma.train.flops import param_counts

    assert whole == param_counts(cfg).total
    pp = dims(2, pp=2, pp_layers=[5, 3])
    assert stage_param_counts(cfg, pp, 0)[0] + stage_param_counts(cfg, pp, 1)[0] == whole
    _, experts = stage_param_counts(cfg, dims(4, ep=4), 0)
    assert experts == param_counts(cfg).routed_experts // 4
    sharded = estimate(cfg, dims(4, ep=4), shard_optimizer=True)
    assert sharded.optimizer < estimate(cfg, dims(4, ep=4)).optimizer


def test_prediction_within_ten_percent_of_a_measured_step():
    from sigma.train.parallelize import build_optimizer, build_parallel, train_step
    from sigma.train.train_config import OptimConfig

    torch.set_num_threads(1)
    cfg = load_model_config("debug")
    layout = ParallelDims.build(1, n_layers=cfg.n_layers, n_experts=cfg.n_experts, global_batch=8)
    run = build_parallel(cfg, layout)
    optimizer, named, _ = build_optimizer(run, OptimConfig(fused=False))
    batch = torch.randint(0, cfg.vocab_size, (8, 65), generator=torch.Generator().manual_seed(0))
    train_step(run, optimizer, named, batch)
    static = list(run.module.parameters()) + [s for st in optimizer.state.values() for s in st.values()]
    tracker = PeakTracker(tensor_bytes(static)).ignore(static)
    with tracker:
        train_step(run, optimizer, named, batch)
    predicted = estimate(cfg, layout, micro_batch=8, seq_len=64).peak
    assert predicted == pytest.approx(tracker.peak, rel=0.10)


def test_recompute_keeps_gradients_and_picks_balanced_layers():
    from sigma.config import ConfigError
    from sigma.train.model import MoETransformer
    from sigma.train.recompute import Recompute, most_balanced

    cfg = load_model_config("debug", {"n_layers": 3})
    tokens = torch.randint(0, cfg.vocab_size, (2, 16), generator=torch.Generator().manual_seed(1))
    grads = []
    for layers in ([], [1, 2]):
        torch.manual_seed(0)
        model = MoETransformer(cfg)
        Recompute(model, layers)
        logits, aux = model(tokens)
        (logits.float().pow(2).mean() + aux).backward()
        grads.append([p.grad.clone() for p in model.parameters()])
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(*grads))
    loads = {1: torch.tensor([10.0, 10, 10, 10]), 2: torch.tensor([40.0, 0, 0, 0]), 3: torch.tensor([12.0, 8, 10, 10])}
    assert most_balanced(loads, 2) == [1, 3]
    with pytest.raises(ConfigError, match=r"layers \[0\] are not MoE layers; the MoE layers are \[1, 2\]"):
        Recompute(MoETransformer(cfg), [0])
    with pytest.raises(ConfigError, match="count"):
        Recompute(MoETransformer(cfg), policy="balanced", count=5)


def test_sigma_train_with_balanced_recompute_trains_the_same_losses(train_data, tmp_path, monkeypatch):
    from sigma.paths import configs_dir
    from sigma.train.train_config import load_train_config
    from sigma.train.trainer import train

    monkeypatch.setenv("SIGMA_KPI_DIR", str(tmp_path / "kpi"))
    base = [f"data.path={train_data}", "data.prepare_if_missing=false", "data.seq_len=32", "data.global_batch=4",
            "threads=1", "kpi.progress_every=0", "steps=4", "model_overrides.n_layers=3"]
    debug = configs_dir() / "train" / "debug.yaml"
    plain = train(load_train_config(debug, base + [f"checkpoint.dir={tmp_path / 'a'}"]))
    recomputed = train(load_train_config(debug, base + [f"checkpoint.dir={tmp_path / 'b'}",
                                                        "parallel.recompute.policy=balanced",
                                                        "parallel.recompute.count=1"]))
    assert recomputed.losses == pytest.approx(plain.losses, abs=1e-6)
