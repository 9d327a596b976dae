"""The sequential statistic of isolation (detect/sequential.py): Page's CUSUM over a node's positions in its own long
healthy history of its gap to the peers, so a lasting fault accumulates and a node that always stands apart does not."""

import numpy as np
import pytest

from sigma.controller.detect import budget, sequential
from sigma.controller.detect.healthy import Sketches
from sigma.controller.detect.sequential import Cusum

NODES = ["n1", "n2", "n3", "n4", "n5"]
SERIES = ["gpu.util_pct", "gpu.clock.sm_mhz", "net.rx_bytes"]


def healthy_rounds(rng, t: int, offset: float = 8.0) -> np.ndarray:
    """[nodes, time, series]: a shared workload, each node's noise, n5 always `offset` above the others (a
    pipeline's last stage)."""
    common = 50 + 10 * np.sin(np.arange(t) / 20.0)
    x = common[None, :, None] + rng.normal(0, 1.0, (len(NODES), t, len(SERIES)))
    x[4] += offset
    return x


def learned(rng) -> Sketches:
    s = Sketches()
    h = healthy_rounds(rng, 2000)
    s.add(NODES, SERIES, h - np.median(h, axis=0, keepdims=True), np.ones(len(NODES), bool))
    return s


def positions(s: Sketches, x: np.ndarray) -> np.ndarray:
    return s.positions(NODES, SERIES, x - np.median(x, axis=0, keepdims=True))


def test_a_lasting_fault_accumulates_and_a_node_always_apart_from_its_peers_does_not():
    rng = np.random.default_rng(0)
    s, c = learned(rng), Cusum()
    x = healthy_rounds(rng, 90)
    x[1, 30:60] -= 12.0  # n2 far under its usual gap to the peers in every series for 30 rounds, then back
    stat = np.array([c.update("job", NODES, positions(s, x[:, t])) for t in range(90)])
    drift = sequential.CAP - sequential.REFERENCE  # what a round far out adds
    assert stat[:30].max() < drift and stat[:, 4].max() < drift  # healthy rounds, and n5's steady offset: about 0
    assert np.all(np.diff(stat[30:60, 1]) > 0) and stat[59, 1] > 0.8 * 30 * drift  # a linear drift
    assert stat[59, 1] > 5 * stat[:, [0, 2, 3, 4]].max()
    assert stat[60 + int(np.ceil(stat[59, 1] / sequential.REFERENCE)) + 2:, 1].max() == 0.0  # back: it resets


def test_the_budget_calibrated_on_healthy_rounds_of_the_statistic_acts_on_the_lasting_fault_only():
    rng = np.random.default_rng(1)
    s, c = learned(rng), Cusum()
    tail = budget.Tail()
    for t in range(3000):  # healthy rounds: what the controller's Calibrator keeps
        tail.add(c.update("job", NODES, positions(s, healthy_rounds(rng, 1)[:, 0])))
    cal = budget.calibrate(tail, rate=1e-3, floor=6.0)
    assert cal.acts
    x = healthy_rounds(rng, 40)
    x[2, 10:] += 12.0
    stat = np.array([c.update("job", NODES, positions(s, x[:, t])) for t in range(40)])
    over = stat >= cal.threshold
    assert over[:, 2].any() and not over[:, [0, 1, 3, 4]].any()
    assert not over[:10].any()


def test_one_spike_adds_at_most_the_cap_and_gaps_add_nothing():
    inc = sequential.increments(np.array([[1000.0, 1000.0, 1000.0], [np.nan, np.nan, np.nan], [1.0, np.nan, 9.0]]))
    assert inc[0] == sequential.CAP and inc[1] == 0.0 and inc[2] == pytest.approx(10.0 / 3)
    s = sequential.run(np.array([[sequential.CAP], [0.0], [0.0], [0.0]]))
    assert s[0, 0] == pytest.approx(sequential.CAP - sequential.REFERENCE)
    assert s[-1, 0] == 0.0  # falls by the reference a round, never below 0


def test_state_is_kept_per_job_and_node_and_read_back():
    c = Cusum()
    far = np.full((2, len(SERIES)), 50.0)
    first = c.update("7", ["a", "b"], far)
    again = Cusum(state=c.state).update("7", ["b", "c"], far)  # a restart; n "c" joined, "a" left
    assert again[0] == pytest.approx(2 * first[1]) and again[1] == pytest.approx(first[0])
    assert set(c.state["7"]) == {"a", "b"}
    c.forget("7")
    assert "7" not in c.state


@pytest.mark.parametrize("reference,cap", [(0.0, 12.0), (-1.0, 12.0), (4.0, 4.0), (float("nan"), 12.0)])
def test_bad_parameters_are_refused_naming_them(reference, cap):
    with pytest.raises(ValueError, match="cusum"):
        Cusum(reference, cap)
