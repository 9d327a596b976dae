"""The tuner's parts: the layout space, the cost model's fits and predictions, the what-if search at the paper's
scale, bad input, and one small run end to end on local processes (submitit's local executor) with --resume."""

import json
import math

import pytest

from sigma.config import ConfigError
from sigma.paths import configs_dir
from sigma.train.config import load_model_config
from sigma.tune.cost import Costs, Link, fit_affine, fit_links, predict
from sigma.tune.space import Layout, Space, enumerate_layouts

TINY8 = load_model_config("tiny", {"n_layers": 8})


def test_every_enumerated_layout_is_valid_and_the_space_is_complete():
    layouts = enumerate_layouts(4, TINY8, 8, Space(max_tp=2))
    names = {layout.name() for layout, _ in layouts}
    assert len(names) == len(layouts)  # no duplicates
    for layout, dims in layouts:
        assert dims.tp * dims.pp * dims.dp == 4 and dims.microbatches * layout.mbs * dims.dp == 8
        assert layout.tp <= 2 and (dims.pp > 1 or layout.vpp == 1)
    for expected in ("tp1 pp1 ep1 mbs2", "tp2 pp2 ep1 mbs1", "tp1 pp2 ep2 vpp2 mbs2", "tp1 pp1 ep4 mbs1 zero1",
                     "tp1 pp4 ep1 vpp2 mbs1"):
        assert expected in names
    assert "tp4 pp1 ep1 mbs2" not in names  # max_tp
    assert "tp1 pp4 ep1 mbs4" not in names  # 2 micro-batches of 4 cannot fill 4 stages


def test_layout_overrides_are_a_valid_trainer_config():
    from sigma.train.train_config import check_layout, load_train_config

    layout = Layout(tp=1, pp=2, ep=2, vpp=2, mbs=1, zero=True, recompute=True)
    model = load_model_config("debug", {"n_layers": 4})
    cfg = load_train_config(configs_dir() / "train" / "debug.yaml",
                            ["model_overrides.n_layers=4", "data.global_batch=8"] + layout.overrides(model))
    dims = check_layout(cfg, 8, model.n_experts)
    assert (dims.pp, dims.vpp, dims.ep, dims.dp, dims.microbatches) == (2, 2, 2, 4, 2)
    assert cfg.parallel.shard_optimizer and cfg.parallel.recompute.moe_layers == [1, 2, 3]


def test_fits_recover_the_costs_they_were_made_from():
    assert fit_affine([(1, 3.0), (2, 5.0), (4, 9.0)]) == pytest.approx([1.0, 2.0])
    samples = [{"op": op, "n": n, "bytes": b, "inter": inter,
                "seconds": alpha + {"all_reduce": 2 * (n - 1) / n, "all_to_all": (n - 1) / n, "p2p": 1}[op] * b / beta}
               for op in ("all_reduce", "all_to_all", "p2p") for n in (2, 4) for b in (1e3, 1e5, 1e6)
               for inter, alpha, beta in ((False, 1e-5, 1e9), (True, 1e-4, 1e8))]
    links = fit_links(samples)
    assert links["all_to_all/inter"].alpha == pytest.approx(1e-4, rel=1e-6)
    assert links["all_reduce/intra"].beta == pytest.approx(1e9, rel=1e-6)


def free_links():
    return {f"{op}/intra": Link(alpha=0.0, beta=math.inf) for op in ("all_reduce", "all_to_all", "p2p")}


def compute_only(bubble=None):
    return Costs(compute={"dense": [0.0, 1e-6], "moe": [0.0, 2e-6], "head": [0.0, 1e-6]}, links=free_links(),
                 optimizer_s_per_param=0.0, bubble_factor=bubble or {}, gpus_per_node=4)


def test_prediction_splits_compute_over_tp_and_adds_the_pipeline_bubble():
    one = predict(compute_only(), TINY8, Layout(mbs=8).dims(1, TINY8, 8), 8, 64)
    tp2 = predict(compute_only(), TINY8, Layout(tp=2, mbs=8).dims(2, TINY8, 8), 8, 64)
    head = 8 * 64 * 1e-6  # replicated under tp
    assert tp2.parts["compute"] == pytest.approx((one.parts["compute"] - head) / 2 + head)
    dims = Layout(pp=2, mbs=1).dims(2, TINY8, 8)  # 8 micro-batches, even split [4, 4]
    pipe = predict(compute_only(), TINY8, dims, 1, 64)
    assert pipe.parts["bubble"] / pipe.step_s == pytest.approx(1 / (8 + 1))  # (p - 1) / (v m + p - 1)
    slow = predict(compute_only({"1f1b": 2.0}), TINY8, dims, 1, 64)
    assert slow.parts["bubble"] == pytest.approx(2 * pipe.parts["bubble"])


def test_recompute_trades_memory_for_compute():
    dims = Layout(pp=2, mbs=2).dims(2, TINY8, 8)
    plain = predict(compute_only(), TINY8, dims, 2, 64)
    again = predict(compute_only(), TINY8, dims, 2, 64, recompute=True)
    assert again.memory_bytes < plain.memory_bytes and again.step_s > plain.step_s


def test_what_if_at_the_papers_scale_keeps_tp1_and_ep_inside_a_node(tmp_path):
    from sigma.tune.tuner import Request, Tuner

    req = Request(config=str(configs_dir() / "train" / "tiny.yaml"), nodes=256, gpus_per_node=8, global_batch=4096,
                  out=tmp_path, overrides=["model=sigma-200b-a20b", "data.seq_len=4096"],
                  what_if=str(configs_dir() / "tune" / "fabric-2048.yaml"))
    result = Tuner(req).run()
    pick = result["pick"]["keys"]
    assert pick["tp"] == 1 and pick["ep"] == 8 and pick["vpp"] > 1 and pick["recompute"]
    assert result["pick"]["memory_gib"] <= 64
    by_name = {c["layout"]: c for c in result["candidates"]}
    assert by_name["tp1 pp8 ep8 vpp2 mbs1"]["why"].startswith("memory: ")  # without recompute it does not fit
    assert any(line.startswith("TP>1 never pays here") for line in result["constraints"])
    assert any(line.startswith("EP across nodes never pays here") for line in result["constraints"])
    import yaml

    written = yaml.safe_load((tmp_path / "tiny-tuned.yaml").read_text())
    assert written["parallel"]["recompute"]["moe_layers"] == list(range(1, 63))
    assert (written["parallel"]["ep"], written["launch"]["nodes"], written["data"]["global_batch"]) == (8, 256, 4096)


def test_bad_input_is_a_clear_error(tmp_path):
    from sigma.tune.tuner import Request, Tuner, TuneError

    fabric = str(configs_dir() / "tune" / "fabric-2048.yaml")
    base = dict(config=str(configs_dir() / "train" / "tiny.yaml"), nodes=1, gpus_per_node=4, out=tmp_path,
                what_if=fabric)
    with pytest.raises(ConfigError, match=r"\[--global-batch\]: no layout of 4 ranks is valid for global batch 3"):
        Tuner(Request(global_batch=3, overrides=["model_overrides.n_layers=2"], max_tp=1, **base)).run()
    with pytest.raises(TuneError, match=r"sigma-200b-a20b fits no layout of 4 ranks: the smallest, .* needs "
                                         r"[0-9.]+ GiB per rank, the limit is 64.0 GiB"):
        Tuner(Request(global_batch=8, overrides=["model=sigma-200b-a20b"], **base)).run()
    bad = tmp_path / "fabric.yaml"
    bad.write_text("gpus_per_node: 8\n")
    with pytest.raises(ConfigError, match=r"fabric.yaml: peak_flops\]: missing"):
        Tuner(Request(global_batch=8, **{**base, "what_if": str(bad)})).run()


def test_tune_on_local_processes_measures_the_best_and_resumes(tmp_path, capsys):
    """Phase 1 and 2 for real on 2 local ranks (submitit's local executor); --resume keeps what was measured."""
    from sigma.cli import main

    def tune(measure, *extra):
        argv = ["tune", "--config", str(configs_dir() / "train" / "debug.yaml"), "--nodes", "1", "--gpus-per-node",
                "2", "--global-batch", "4", "--steps", "1", "--out", str(tmp_path), "--measure", str(measure),
                "--json", *extra, "launch.executor=local", "data.seq_len=32"]
        assert main(argv) == 0
        return json.loads(capsys.readouterr().out)

    first = tune(1)
    top = next(c for c in first["candidates"] if c.get("rank") == 1)
    gauge = first["gauge"]  # plain data parallelism, timed in the same rounds as the best ranked
    assert gauge["keys"]["tp"] == gauge["keys"]["pp"] == gauge["keys"]["ep"] == 1 and gauge["status"] == "measured"
    measured = [c for c in first["candidates"] if c["status"] == "measured"]
    assert top["status"] == "measured"
    # besides the best ranked and the gauge, the fastest predicted of every pipeline depth: the model's error is
    # largest between depths
    assert {c["keys"]["pp"] for c in measured} == {c["keys"]["pp"] for c in first["candidates"] if "rank" in c}
    assert first["counts"]["measured"] <= max(3, len(first["candidates"]) // 5 + 1)
    assert first["pick"]["status"] == "measured"
    assert {"compute", "links", "bubbles"} <= set(json.loads((tmp_path / "phase1.json").read_text()))
    before = (tmp_path / "measured.jsonl").read_text().splitlines()
    again = tune(3, "--resume")
    after = (tmp_path / "measured.jsonl").read_text().splitlines()
    assert after[:len(before)] == before  # what was timed is kept, not timed again
    assert again["counts"]["measured"] == len(after) >= 3
    assert again["costs"] == first["costs"]  # phase 1 kept
    ranked = sorted((c for c in again["candidates"] if "rank" in c), key=lambda c: c["rank"])
    # the three best ranked are timed (how many survive pruning depends on the phase-1 timings)
    assert [c["status"] for c in ranked[:3]] == ["measured"] * min(3, len(ranked))
    assert again["pick"]["measured_s"] == min(c["measured_s"] for c in again["candidates"] if "measured_s" in c)
    assert 0 <= again["cost_model_median_error"] and 0 <= again["cost_model_median_error_seconds"]
    assert all(c["timing"]["rounds"] >= 1 for c in again["candidates"] if c["status"] == "measured")
    config = (tmp_path / "debug-tuned.yaml").read_text()
    assert f"tp: {again['pick']['keys']['tp']}" in config and "global_batch: 4" in config


def test_a_layout_that_fails_is_recorded_and_the_job_goes_on(tmp_path, monkeypatch):
    """MeasureTask in this process (one rank): the failing layout's error is kept, the next one is measured."""
    from sigma.tune.measure import MeasureTask
    from sigma.tune.tuner import read_measured

    for key in ("RANK", "WORLD_SIZE", "SLURM_PROCID", "SLURM_NTASKS", "SUBMITIT_LOCAL_JOB_ID"):
        monkeypatch.delenv(key, raising=False)
    results = tmp_path / "measured.jsonl"
    MeasureTask({"model": "debug", "seq_len": 16, "global_batch": 2, "min_rounds": 2, "max_rounds": 2,
                 "results": str(results),
                 "layouts": [Layout(tp=2).as_dict(), Layout(mbs=2).as_dict()]})()
    got = read_measured(results)
    assert "world size 1 (launch.nodes x launch.gpus_per_node) is not divisible" in got["tp2 pp1 ep1 mbs1"]["error"]
    ok = got["tp1 pp1 ep1 mbs2"]
    assert ok["step_s"] > 0 and ok["rounds"] == 2 and len(ok["samples_s"]) == 2


def test_shared_cores_slow_a_layout_without_idle_ranks_more_than_a_pipeline():
    shared = compute_only({"1f1b": 1.0})
    shared.sharing = 2.0
    dp = Layout(mbs=2).dims(4, TINY8, 8)
    alone, both = predict(compute_only(), TINY8, dp, 2, 64), predict(shared, TINY8, dp, 2, 64)
    assert both.step_s == pytest.approx(2 * alone.step_s)  # every rank computes all the time
    pipe = Layout(pp=4, mbs=1).dims(4, TINY8, 8)  # 8 micro-batches over 4 stages: (8 + 3) / 8 of the compute
    p_alone, p_both = predict(compute_only({"1f1b": 1.0}), TINY8, pipe, 1, 64), predict(shared, TINY8, pipe, 1, 64)
    assert p_alone.step_s < p_both.step_s < 2 * p_alone.step_s
