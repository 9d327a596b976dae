"""Page-cache drop, baselines, and the small real measurements (membw, train step) on this host."""

import json

import pytest

from sigma.cli import main
from sigma.health import baselines
from sigma.health.checks import membw, train_step
from sigma.health.dropcache import drop_page_cache
from tests.unit.health_helpers import TEST_CONFIG, context, tree


def test_drop_cache_writes_mode_on_fixture_root(tmp_path):
    root = tree(tmp_path, "healthy")
    out = drop_page_cache(root, 3)
    assert out.dropped and (root / "proc/sys/vm/drop_caches").read_text() == "3\n"
    assert out.before_kb == out.after_kb == 8000000 - 200000 + 100000
    assert "no visible effect" in out.message  # the fixture's meminfo does not change


def test_drop_cache_missing_file_is_reported_not_raised(tmp_path):
    root = tree(tmp_path, "healthy")
    (root / "proc/sys/vm/drop_caches").unlink()
    out = drop_page_cache(root, 1)
    assert not out.dropped and "does not exist" in out.message


def test_drop_cache_rejects_bad_mode(tmp_path):
    with pytest.raises(ValueError, match="mode must be 1, 2 or 3"):
        drop_page_cache(tree(tmp_path, "healthy"), 4)


def test_baseline_compare_and_median_over_nodes(tmp_path):
    path = tmp_path / "b.json"
    baselines.record(path, "gpu-8x", "gpu01", {"gemm_tflops:H100": (700.0, "TFLOP/s")})
    baselines.record(path, "gpu-8x", "gpu02", {"gemm_tflops:H100": (720.0, "TFLOP/s")})
    data = baselines.record(path, "gpu-8x", "gpu03", {"gemm_tflops:H100": (100.0, "TFLOP/s")})
    entry = baselines.lookup(data, "gpu-8x", "gemm_tflops:H100")
    assert entry["value"] == 700.0 and len(entry["nodes"]) == 3
    ok = baselines.check_against(650.0, entry, "gemm_tflops:H100", "TFLOP/s", 0.2, "gpu-8x")
    slow = baselines.check_against(500.0, entry, "gemm_tflops:H100", "TFLOP/s", 0.2, "gpu-8x")
    none = baselines.check_against(500.0, None, "gemm_tflops:H100", "TFLOP/s", 0.2, "gpu-8x")
    assert (ok.status, slow.status, none.status) == ("pass", "fail", "skip")
    assert slow.category == "performance" and "71% of baseline 700" in slow.message


def test_baseline_record_then_membw_compares(tmp_path, capsys):
    node_dir = tmp_path / "node"
    args = ["--config", str(TEST_CONFIG), "--root", str(tree(tmp_path, "healthy")), "--node", "cpu1",
            "--node-dir", str(node_dir)]
    assert main(["health", "baseline", "record", *args, "--runs", "1", "--check", "membw"]) == 0
    data = json.loads((node_dir / "baselines.json").read_text())
    assert data["types"]["cpu"]["membw_gbps:host"]["nodes"]["cpu1"] > 0
    assert main(["health", "baseline", "show", *args]) == 0
    assert "membw_gbps:host" in capsys.readouterr().out
    ctx = context(tree(tmp_path, "faulty"), "cpu1", node_dir)
    r = membw.run(ctx, {"size_mb": 16, "repeats": 2, "tolerance": 0.99})
    assert r.status == "pass" and r.data["baseline"] > 0
    # a baseline far above anything this host can do must fail
    baselines.record(node_dir / "baselines.json", "cpu", "cpu1", {"membw_gbps:host": (1e6, "GB/s")})
    ctx = context(ctx.root, "cpu1", node_dir)  # fresh context: baselines are cached per run
    assert membw.run(ctx, {"size_mb": 16, "repeats": 2}).status == "fail"


def test_train_step_matches_float64_reference_and_fails_on_corruption():
    import torch

    torch.set_num_threads(1)
    losses = train_step.train(torch, torch.device("cpu"), torch.float32, 5, 0.5)
    reference = train_step.train(torch, torch.device("cpu"), torch.float64, 5, 0.5)
    assert train_step.check_train_step(losses, reference, reference[-1], 1e-3).status == "pass"
    bad = list(losses)
    bad[2] *= 1.01
    r = train_step.check_train_step(bad, reference, None, 1e-3)
    assert r.status == "fail" and "step 2" in r.message
    r = train_step.check_train_step(losses, reference, reference[-1] * 2, 1e-3)
    assert r.status == "fail" and "differs from the known" in r.message
    assert train_step.check_train_step([float("nan")] * 5, reference, None, 1e-3).status == "fail"


def test_train_step_golden_loss_in_repo_config_holds_on_this_host(tmp_path):
    from sigma.health.config import load_health_config
    from sigma.paths import configs_dir

    config = load_health_config(configs_dir() / "health.yaml")
    config.torch_threads = 1
    ctx = context(tree(tmp_path, "healthy"), "node1", tmp_path / "n", config=config)
    r = train_step.run(ctx, dict(config.check("train_step").args))
    assert r.status == "pass", r.message
