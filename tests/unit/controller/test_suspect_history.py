"""A node's suspected times are not its healthy history (detect/suspect.py): an anomaly that lasts keeps scoring
instead of becoming the node's own normal, which the budget's persistence (`rounds`) relies on."""

import numpy as np

from sigma.controller.detect.isolation import baseline, score
from sigma.controller.detect.suspect import SuspectTimes


def row(node, first, last):
    return (node, "cpu", 0, 1, 0.0, 0.0, 0.0, 0.0, first, last)


def test_marked_windows_merge_leave_others_alone_and_expire():
    s = SuspectTimes(keep_s=3600)
    s.mark(["a", "b"], [7.0, 2.0], 6.0, 0, 120)
    s.mark(["a", "b"], [9.0, 2.0], 6.0, 60, 180)  # the next round's window overlaps: one span
    assert s.spans == {"a": [[0, 180]]}
    assert s.healthy_rows([row("a", 100, 110), row("a", 200, 210), row("b", 100, 110)]) == [
        row("a", 200, 210), row("b", 100, 110)]
    s.mark(["a"], [1.0], 6.0, 5000, 5120)  # an hour later the old span is no longer history
    assert s.spans == {} and not s.suspected("a", 0, 200)


def test_a_lasting_shift_keeps_its_score_when_its_suspected_history_is_left_out():
    rng = np.random.default_rng(0)
    hist = rng.normal(50.0, 1.0, (5, 30, 4))
    hist[0, 10:, :2] += 12.0  # node 0 shifted 20 rounds ago, and still is
    cur = rng.normal(50.0, 1.0, (5, 4))
    cur[0, :2] += 12.0
    absorbed = score(list("abcde"), cur, base=baseline(hist)).total[0]
    masked = hist.copy()
    masked[0, 10:] = np.nan  # the rounds it scored at the floor
    kept = score(list("abcde"), cur, base=baseline(masked)).total[0]
    assert absorbed < 6.0 <= kept
