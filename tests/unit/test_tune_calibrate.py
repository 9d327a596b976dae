"""The cost model calibrated on phase 1's own real steps, and pruning that does not trust the model further than its
error band: the fastest predicted layout of each pipeline depth and every layout within the band get measured."""

import math
from dataclasses import replace

import pytest

from sigma.train.config import load_model_config
from sigma.tune.calibrate import calibrate, phase1_dims, pipeline_part
from sigma.tune.cost import Costs, Link, predict
from sigma.tune.space import Layout
from sigma.tune.tuner import keep_despite_model, to_measure

TINY8 = load_model_config("tiny", {"n_layers": 8})
LONE = {"dense": [1e-3, 1e-5], "moe": [2e-3, 2e-5], "head": [1e-3, 4e-5]}


def platform(compute=LONE, sharing=2.0, optimizer=1e-8) -> Costs:
    links = {f"{op}/intra": Link(alpha=1e-4, beta=1e9) for op in ("all_reduce", "all_to_all", "p2p")}
    return Costs(compute={k: list(v) for k, v in compute.items()}, links=links, optimizer_s_per_param=optimizer,
                 bubble_factor={}, gpus_per_node=2, sharing=sharing)


def phase1_from(truth: Costs, spread: float = 0.05) -> dict:
    """What phase 1's real pp=2 steps on 4 ranks would record on a platform whose costs are `truth`."""
    bubbles = {}
    for schedule in ("1f1b", "interleaved_1f1b"):
        run = {"microbatches": 2, "dp": 2, "tokens": 64, "spread": spread}
        pred = predict(truth, TINY8, phase1_dims(run, schedule, 4, TINY8), 1, 64)
        bubbles[schedule] = {**run, "pipeline_s": pipeline_part(pred.parts),
                             "update_s": pred.parts["grad_sync"] + pred.parts["optimizer"]}
    run = {"microbatches": 2, "dp": 2, "ep": 2, "tokens": 64, "spread": spread}
    pred = predict(truth, TINY8, phase1_dims(run, "1f1b", 4, TINY8), 1, 64)
    ep_step = {**run, "pipeline_s": pipeline_part(pred.parts)}
    return {"bubbles": bubbles, "world": 4, "ep_step": ep_step}


def test_calibration_recovers_how_much_layers_and_the_update_cost_inside_a_real_step():
    # inside a step the layers cost 0.6x what they cost one by one, the update 2.5x its modelled sync + AdamW
    truth = platform({k: [a * 0.6, b * 0.6] for k, (a, b) in LONE.items()}, optimizer=2.5e-8)
    truth.links["all_reduce/intra"] = Link(alpha=2.5e-4, beta=0.4e9)
    lone = platform()
    got = calibrate(lone, phase1_from(truth), TINY8)
    assert got.compute_scale == pytest.approx(0.6, rel=0.02)
    assert got.compute["moe"][1] == pytest.approx(0.6 * LONE["moe"][1], rel=0.02)
    assert 1.5 < got.update_scale < 3.5
    assert got.band == pytest.approx(0.05, abs=0.02)  # the steps' spread: the schedules agree
    # the pipeline depth phase 1 never ran is predicted from the same simulation: pp4 as the truth has it
    pp4 = Layout(pp=4, mbs=2).dims(4, TINY8, 8)
    want = pipeline_part(predict(truth, TINY8, pp4, 2, 64).parts)
    assert pipeline_part(predict(got, TINY8, pp4, 2, 64).parts) == pytest.approx(want, rel=0.03)


def test_an_all_to_all_inside_a_real_step_costs_what_phase_1s_expert_parallel_step_says():
    truth = platform()
    truth.links["all_to_all/intra"] = Link(alpha=3e-3, beta=1e9)  # each call waits ~3 ms for a peer off its core
    got = calibrate(platform(), phase1_from(truth), TINY8)
    assert got.exchange_latency_s == pytest.approx(3e-3 - 1e-4, rel=0.05)
    assert got.links["all_to_all/intra"].alpha == pytest.approx(3e-3, rel=0.05)
    assert got.links["all_reduce/intra"].alpha == pytest.approx(1e-4)
    ep4 = Layout(ep=4, mbs=2).dims(4, TINY8, 8)
    assert predict(got, TINY8, ep4, 2, 64).parts["ep"] == pytest.approx(predict(truth, TINY8, ep4, 2, 64).parts["ep"],
                                                                        rel=0.05)
    assert calibrate(platform(), phase1_from(platform()), TINY8).exchange_latency_s == pytest.approx(0, abs=1e-6)


def test_calibration_counts_shared_cores_once():
    """Dividing the busiest rank's compute by the whole sharing, as if every rank computed all the time, takes a
    pp=2 step's fill and drain for slower layers; the simulated schedule does not."""
    truth = platform(sharing=2.0)
    got = calibrate(platform(sharing=2.0), phase1_from(truth), TINY8)
    assert got.compute_scale == pytest.approx(1.0, rel=0.02)


def test_an_older_phase1_without_real_step_figures_is_left_as_it_was():
    lone = platform()
    assert calibrate(lone, {"bubbles": {"1f1b": {"measured": 0.4, "theory": 1 / 3}}, "world": 4}, TINY8) is lone


def row(name: str, predicted: float, memory: float, status="ranked", why=""):
    kw = dict(tok.split("=") for tok in name.split())
    layout = Layout(**{k: int(v) for k, v in kw.items()})
    return {"layout": layout, "predicted_s": predicted, "memory_bytes": memory, "status": status, "why": why}


def test_the_fastest_of_each_pipeline_depth_and_those_within_the_band_are_kept_and_measured():
    rows = [row("pp=2 mbs=2", 1.00, 10), row("pp=1 mbs=2", 1.05, 20, "pruned", "dominated by tp1 pp2 ep1 mbs2"),
            row("pp=2 mbs=2 ep=2", 1.07, 11, "pruned", "dominated by tp1 pp2 ep1 mbs2"), row("pp=2 mbs=1", 1.08, 8),
            row("pp=4 mbs=2", 1.20, 12, "pruned", "dominated by tp1 pp2 ep1 mbs1"),
            row("pp=4 mbs=1", 1.25, 13, "pruned", "dominated by tp1 pp2 ep1 mbs1"),
            row("pp=1 mbs=1", 1.30, 25, "pruned", "dominated by tp1 pp2 ep1 mbs1")]
    rows += [row("pp=2 mbs=1 ep=2", 2.0 + i, 30, "pruned", "dominated") for i in range(24)]
    keep_despite_model(rows, band=0.1)
    status = {r["layout"].name(): (r["status"], r["why"]) for r in rows[:7]}
    assert status["tp1 pp2 ep2 mbs2"] == ("ranked", "kept: within the model's error band (10%) of the fastest "
                                                    "(dominated by tp1 pp2 ep1 mbs2)")
    assert status["tp1 pp1 ep1 mbs2"][1].startswith("kept: the fastest predicted with pp=1")
    assert status["tp1 pp4 ep1 mbs2"] == ("ranked", "kept: the fastest predicted with pp=4 (dominated by tp1 pp2 "
                                                    "ep1 mbs1)")
    assert status["tp1 pp4 ep1 mbs1"][0] == status["tp1 pp1 ep1 mbs1"][0] == "pruned"
    ranked = [r for r in rows if r["status"] == "ranked"]
    chosen = to_measure(ranked, 1, len(rows), band=0.1)
    assert [r["layout"].name() for r in chosen] == ["tp1 pp2 ep1 mbs2", "tp1 pp1 ep1 mbs2", "tp1 pp2 ep2 mbs2",
                                                    "tp1 pp2 ep1 mbs1", "tp1 pp4 ep1 mbs2"]
    # a wide band: at most a fifth of all layouts, the fastest of each depth first
    wide = to_measure(ranked, 1, 10, band=math.inf)
    assert len(wide) == 3 and {r["layout"].pp for r in wide} == {1, 2, 4}


def test_a_calibrated_costs_round_trips_through_its_dict():
    got = replace(platform(), update_scale=1.7, band=0.2)
    assert Costs.from_dict(got.as_dict()) == got


def test_zero1s_broadcasts_pay_the_in_step_latency_of_a_collective_call():
    plain, late = platform(), replace(platform(), exchange_latency_s=2e-3)
    dims = Layout(pp=2, mbs=2, zero=True).dims(4, TINY8, 8)
    extra = predict(late, TINY8, dims, 2, 64, zero=True).parts["optimizer"] - \
        predict(plain, TINY8, dims, 2, 64, zero=True).parts["optimizer"]
    tensors = 12 * 4 + 3  # per layer of the first pipeline rank's stage, and the embedding, norm and head
    assert extra == pytest.approx(tensors * 2e-3)
    no_zero = Layout(pp=2, mbs=2).dims(4, TINY8, 8)
    assert predict(late, TINY8, no_zero, 2, 64).parts["optimizer"] == \
        pytest.approx(predict(plain, TINY8, no_zero, 2, 64).parts["optimizer"])


def test_layers_over_tp_ranks_cost_what_phase_1s_tp_step_says():
    timed_alone = {**LONE, "moe@tp2": [1e-3, 1e-5], "dense@tp2": [5e-4, 5e-6]}
    truth = platform({k: [a * 2.5, b * 2.5] if "@tp" in k else [a, b] for k, (a, b) in timed_alone.items()})
    layout = Layout(tp=2, pp=2)
    run = {"layout": layout.as_dict(), "global_batch": 4, "tokens": 64, "spread": 0.05}
    raw = phase1_from(truth)
    raw["tp_step"] = {**run, "pipeline_s": pipeline_part(predict(truth, TINY8, layout.dims(4, TINY8, 4), 1,
                                                                 64).parts)}
    got = calibrate(platform(timed_alone), raw, TINY8)
    assert got.tp_scale == pytest.approx(2.5, rel=0.03)
    assert got.compute["moe@tp2"][1] == pytest.approx(2.5e-5, rel=0.03) and got.compute["moe"] == LONE["moe"]
