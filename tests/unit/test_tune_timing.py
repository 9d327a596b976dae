"""Timing on a noisy machine (sigma.tune.measure's statistics and interleaved rounds) and the pipeline simulation
the cost model uses when ranks share cores (sigma.tune.schedule)."""

import pytest

from sigma.tune.measure import median_ci, paired_ratio, separated, spread, summarise
from sigma.tune.schedule import pipeline_time, rank_order


def test_the_median_confidence_interval_is_the_range_for_few_samples_and_narrows_with_more():
    assert median_ci([3.0, 1.0, 2.0]) == (1.0, 3.0)
    many = [float(x) for x in range(1, 101)]
    lo, hi = median_ci(many)
    assert 35 <= lo < 50.5 < hi <= 65  # ranks 50 -/+ 9.8


def test_drift_that_hits_every_layout_alike_does_not_hide_a_small_difference():
    """Load that doubles from one round to the next swamps a 5 % difference in the raw times, not in the
    per-round ratios of layouts timed in the same rounds."""
    load = [1.0, 2.0, 1.3, 3.0, 1.1, 2.5, 1.7]
    fast = [1.00 * x for x in load]
    slow = [1.05 * x for x in load]
    raw_fast, raw_slow = median_ci(fast), median_ci(slow)
    assert raw_fast[1] > raw_slow[0]  # the raw intervals overlap
    assert paired_ratio(fast, slow)["ci"][0] == pytest.approx(1.05)
    assert separated({"a": slow, "b": fast})
    assert not separated({"a": fast, "b": [x * (1.05 if i % 2 else 0.95) for i, x in enumerate(fast)]})


def test_a_summary_keeps_the_samples_and_the_spread():
    rec = summarise([1.0, 1.2, 1.1, 5.0], reference=[1.0, 1.0, 1.0, 1.0])
    assert rec["step_s"] == pytest.approx(1.15) and rec["min_s"] == 1.0 and rec["rounds"] == 4
    assert rec["spread"] == pytest.approx(spread([1.0, 1.2, 1.1, 5.0])) and rec["spread"] > 0.5  # the outlier
    assert rec["vs_reference"]["median"] == pytest.approx(1.15)


def test_every_rank_runs_each_forward_and_backward_once_forward_first():
    for pp, vpp, m in ((4, 1, 8), (4, 2, 8), (2, 2, 4), (4, 1, 2)):
        for r in range(pp):
            order = rank_order(r, pp, vpp, m)
            stages = [r + c * pp for c in range(vpp)]
            assert sorted(order) == sorted((k, s, i) for k in "FB" for s in stages for i in range(m))
            assert all(order.index(("F", s, i)) < order.index(("B", s, i)) for s in stages for i in range(m))


def test_the_simulated_pipeline_matches_the_closed_form_at_one_speed():
    assert pipeline_time([1.0] * 4, 4, 1, 8) == pytest.approx(8 + 3)  # m + p - 1 micro-batches
    assert pipeline_time([0.5] * 8, 4, 2, 8) == pytest.approx(8 + 3 / 2)  # m + (p - 1) / v
    assert pipeline_time([1.0, 2.0], 2, 1, 4) == pytest.approx(1 / 3 + 4 * 2 + 2 / 3)  # the slow stage paces
    assert pipeline_time([1.0] * 2, 2, 1, 4, p2p_s=0.1) > pipeline_time([1.0] * 2, 2, 1, 4)


def test_ranks_that_share_cores_pay_less_in_a_pipeline_than_without_idle_ranks():
    assert pipeline_time([1.0], 1, 1, 4, sharing=2.0) == pytest.approx(8.0)  # every rank always computes
    alone, shared = pipeline_time([1.0] * 4, 4, 1, 4), pipeline_time([1.0] * 4, 4, 1, 4, sharing=2.0)
    assert alone == pytest.approx(7.0)
    # the fill and drain run faster than the steady state; the whole lasts more than the work at the shared speed
    assert 2.0 * 4 < shared < 2.0 * alone


def test_phase1_layer_costs_are_cpu_seconds_at_phase1s_load_scaled_to_a_real_pipeline_step():
    from sigma.tune.tuner import fit_costs

    points = [{"kind": kind, "tokens": t, "seconds": 9.9, "alone": 9.9, "cpu": scale * t}
              for kind, scale in (("moe", 2e-4), ("head", 1e-4)) for t in (64, 128, 256)]
    points += [{"kind": "moe@tp2", "tokens": t, "seconds": 2e-4 * t} for t in (64, 128)]  # timed busy only
    raw = {"compute": points, "sharing": 2.0, "load": 3.0, "optimizer_s_per_param": 1e-9, "links": [],
           "bubbles": {}, "world": 4, "nodes": ["node1", "node2"]}
    costs = fit_costs(raw, 2, None)
    assert costs.compute["moe"] == pytest.approx([0.0, 3 * 2e-4])  # CPU seconds x the load, not the noisy wall
    assert costs.compute["moe@tp2"] == pytest.approx([0.0, 1e-4])  # busy seconds / sharing
    assert costs.optimizer_s_per_param == pytest.approx(3e-9) and costs.compute_scale == 1.0
    # the busiest rank of a real pp=2 step computed 2 MoE layers + the head on 2 micro-batches of 64 tokens in half
    # the time the layers timed one by one add up to (at the shared speed)
    one_by_one = 2 * (2 * 3 * 2e-4 * 64 + 3 * 1e-4 * 64) * 2.0
    raw["bubbles"] = {"1f1b": {"measured": 0.4, "theory": 1 / 3, "busy_s": one_by_one / 2, "microbatches": 2,
                               "tokens": 64, "layers": {"dense": 0, "moe": 2, "head": 1}}}
    scaled = fit_costs(raw, 2, None)
    assert scaled.compute_scale == pytest.approx(0.5)
    assert scaled.compute["moe"] == pytest.approx([0.0, 0.5 * 3 * 2e-4])


def test_a_layer_over_tp_ranks_costs_its_paired_ratio_to_the_whole_layer():
    """Timed in pairs with the whole layer (every rank busy in both), a tp layer's seconds at a moving load say
    little; its ratio to the whole layer times the whole layer's lone cost is what the model uses."""
    from sigma.tune.tuner import fit_costs

    points = [{"kind": "moe", "tokens": t, "seconds": 9.9, "alone": 9.9, "cpu": 2e-4 * t} for t in (64, 128, 256)]
    points += [{"kind": "moe@tp2", "tokens": t, "seconds": 5.0, "vs_tp1": 0.6} for t in (64, 128, 256)]
    raw = {"compute": points, "sharing": 2.0, "load": 3.0, "optimizer_s_per_param": 1e-9, "links": [],
           "bubbles": {}, "world": 4, "nodes": ["node1", "node2"]}
    assert fit_costs(raw, 2, None).compute["moe@tp2"] == pytest.approx([0.0, 0.6 * 3 * 2e-4])
