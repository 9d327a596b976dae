"""Isolation's false-drain budget (detect/budget.py): the threshold it calibrates from healthy history, when it may
act at all, the controller keeping and reporting it, and the units its verdicts are explained in."""

import json
import math

import numpy as np

from sigma.cli import main
from sigma.controller.detect import budget
from sigma.controller.detect.budget import CLUSTER, Calibrator, Tail, allowed_rate, calibrate
from sigma.controller.detect.explain import explain_nodes, fmt, unit
from sigma.controller.detect.isolation import baseline, score

from tests.unit.controller.helpers import add_kpi, make_controller
from tests.unit.controller.test_watchdog_isolation import throttled_gpu_rounds

RATE = allowed_rate(0.001, 120.0)  # one false drain per 1,000 node-days at 120 s rounds


def tail_of(values) -> Tail:
    t = Tail()
    for chunk in np.array_split(np.asarray(values), max(1, len(values) // 100_000)):
        t.add(chunk)
    return t


def test_the_rate_is_the_budget_per_round():
    assert math.isclose(RATE, 0.001 * 120 / 86400)


def test_a_tail_keeps_the_largest_values_and_counts_them_all():
    t = Tail()
    t.add(np.arange(10_000.0))
    t.add([np.nan, np.inf, 5.0])  # not values
    assert t.n == 10_001 and t.top.size == budget.KEEP and t.top[0] == 9999.0 and np.all(np.diff(t.top) <= 0)
    assert Tail.loads(t.dumps()).n == t.n and np.allclose(Tail.loads(t.dumps()).top, t.top, atol=1e-4)


def test_too_little_history_notifies_and_says_how_much_it_needs():
    rng = np.random.default_rng(0)
    cal = calibrate(tail_of(rng.exponential(1.0, 5_000)), RATE, 6.0)
    assert not cal.acts and cal.threshold is None and cal.method == "too little history"
    assert cal.needed == math.ceil(budget.MIN_TAIL / (budget.MAX_EXTRAPOLATION * RATE)) > cal.n


def test_the_tail_fit_keeps_the_exceedance_rate_within_the_budget():
    """Healthy scores from known distributions: the calibrated threshold's true exceedance probability is at most
    the allowed rate (an upper confidence bound: usually well below it), and the floor holds."""
    rng = np.random.default_rng(1)
    for draw, survival in ((lambda n: rng.exponential(1.0, n), lambda x: math.exp(-x)),
                           (lambda n: np.abs(rng.normal(0, 1, n)), lambda x: math.erfc(x / math.sqrt(2))),
                           (lambda n: rng.pareto(4.0, n), lambda x: (1 + x) ** -4.0)):
        cal = calibrate(tail_of(draw(200_000)), RATE, 0.0)
        assert cal.method == "tail fit" and survival(cal.threshold) <= RATE, (cal.detail, survival(cal.threshold))
    assert calibrate(tail_of(rng.exponential(0.1, 200_000)), RATE, 6.0).threshold == 6.0  # never below the floor


def test_with_enough_history_the_largest_value_seen_is_the_threshold():
    values = np.random.default_rng(2).exponential(1.0, 2_200_000)
    cal = calibrate(tail_of(values), RATE, 0.0)
    assert cal.method == "empirical" and cal.threshold == values.max()


def test_a_round_under_suspicion_breaks_the_run_and_rounds_count_once_per_window():
    cal = Calibrator(0.001, 120.0, rounds=2, floor=6.0)
    nodes = ("a", "b", "c")
    assert cal.observe("1", "train x3", nodes, [1.0, 2.0, 3.0], True, 0.0) == 0  # one round: no statistic yet
    assert cal.observe("1", "train x3", nodes, [9.0, 9.0, 9.0], True, 60.0) == 0  # within the window: not counted
    assert cal.observe("1", "train x3", nodes, [5.0, 1.0, 4.0], True, 120.0) == 3
    assert sorted(cal.tails[CLUSTER].top) == [1.0, 1.0, 3.0] and cal.tails["train x3"].n == 3  # min of 2 rounds
    assert cal.observe("1", "train x3", nodes, [], False, 240.0) == 0  # under suspicion
    assert cal.observe("1", "train x3", nodes, [7.0, 7.0, 7.0], True, 360.0) == 0  # the run starts again
    assert cal.tails[CLUSTER].n == 3


def test_the_budget_is_spent_only_where_isolation_is_asked():
    """Isolation judges only jobs the watchdog found anomalous: the allowed exceedance per asked round is the
    rate over the (upper bound of the) share of node time it is asked about."""
    cal = Calibrator(0.001, 120.0, rounds=2, floor=6.0)
    assert cal.asked_share == 1.0
    for t in range(1000):
        cal.exposure(100, t * 120.0)
    for t in range(10):
        cal.asked("7", 4, t * 120.0)
    cal.asked("7", 4, 9 * 120.0 + 1)  # the same window again: not counted
    assert cal.node_rounds == 100_000 and cal.asked_rounds == 40
    assert math.isclose(cal.asked_share, (math.sqrt(41) + 1) ** 2 / 100_000)
    cal.tails[CLUSTER] = tail_of(np.random.default_rng(3).exponential(1.0, 100_000))
    fresh = Calibrator(0.001, 120.0, rounds=2, floor=0.0)
    fresh.tails[CLUSTER] = cal.tails[CLUSTER]
    cal.floor = 0.0
    assert cal.calibration().threshold < fresh.calibration().threshold


def test_a_job_shape_that_differs_more_asks_more_and_the_state_survives_a_restart():
    cal = Calibrator(0.001, 120.0, rounds=1, floor=6.0)
    rng = np.random.default_rng(5)
    cal.tails[CLUSTER] = tail_of(rng.exponential(1.0, 3_000_000))
    cal.tails["pipeline x4"] = tail_of(rng.exponential(3.0, 300_000))
    (own, key), (plain, other) = cal.for_shape("pipeline x4"), cal.for_shape("other x8")
    assert key == "pipeline x4" and other == CLUSTER and own.threshold > plain.threshold
    again = Calibrator(0.001, 120.0, rounds=1, floor=6.0)
    again.load(cal.dumps(), (1, 120.0))
    assert again.tails[CLUSTER].n == cal.tails[CLUSTER].n and again.for_shape("pipeline x4")[1] == "pipeline x4"
    other_statistic = Calibrator(0.001, 120.0, rounds=3, floor=6.0)
    other_statistic.load(cal.dumps(), (3, 120.0))  # rounds changed: another statistic, not its history
    assert not other_statistic.tails


def test_peers_that_do_not_help_leave_a_node_to_its_own_history_and_constants_abstain():
    rng = np.random.default_rng(6)
    n, t = 5, 400
    common = np.sin(np.arange(t) / 5)[None, :, None] * 10  # the job's phases: peers remove them
    history = np.concatenate([50 + common + rng.normal(0, 0.5, (n, t, 1)),  # m0: shared workload
                              50 + rng.normal(0, 1.0, (n, t, 1)),  # m1: unrelated noise on each node
                              np.zeros((n, t, 1))], axis=2)  # m2: a constant
    base = baseline(history)
    assert base.comparable[:, 0].all() and not base.comparable[:, 1].any() and base.flat[2]
    current = np.array([[50.0, 50.0, 0.0]] * n)
    current[2] = [50.0, 58.0, 3.0]  # m1 far from its own usual on node 2; m2 moved off its constant
    s = score([f"n{i}" for i in range(n)], current, base=base)
    assert s.metric_z[2, 2] == 0  # no variance in history: not scored
    rows = {r["metric"]: r for r in explain_nodes(s, ["m0", "m1", "m2"], current, base, ["n2"],
                                                   [f"n{i}" for i in range(n)])["n2"]}
    assert rows["m1"]["judged"] == "own history" and "against its own history" in rows["m1"]["text"]
    assert rows["m2"]["judged"] == "not scored" and "never moved in the history" in rows["m2"]["text"]


def test_units_an_admin_reads():
    assert fmt(41.23, unit('gpu.util_pct{"gpu": "0"}')) == "41.2%"
    assert fmt(3.2e10, unit("gpu.mem.used_bytes")) == "29.8 GiB"
    assert fmt(1395.7, unit("gpu.clock.sm_mhz")) == "1,396 MHz"
    assert fmt(12000, unit("host.stat.context_switches")) == "12,000/s"
    assert fmt(3.5, unit("host.cpu.seconds")) == "3.5 s/s"
    assert fmt(15321.5, unit("kpi.tokens_per_s")) == "15,322 tokens/s"
    assert fmt(float("nan"), "%") == "n/a"


def test_the_budget_is_reported_by_rules_and_explain(tmp_path, capsys):
    ctl, slurm, clock = make_controller(tmp_path)
    throttled_gpu_rounds(ctl, slurm, clock)
    (inc,) = [i for i in ctl.incidents.query() if i.rule_id == "isolation-outlier"]
    ctl._save_state("isolation.budget", ctl.calibrator.dumps(), raw=True)
    db = ctl.cfg.db
    assert main(["explain", str(inc.id), "--db", db]) == 0
    out = capsys.readouterr().out
    assert "budget: at most 1.0 false drains per 1,000 node-days; notifies only (too little history" in out
    assert "gpu.clock.sm_mhz" in out and "vs peers'" in out
    assert main(["controller", "rules", "--db", db]) == 0
    out = capsys.readouterr().out
    assert "isolation-outlier (detector): false drains at most 1 per 1,000 node-days" in out
    assert "cluster: too little history, notifies only (needs" in out
    assert main(["controller", "rules", "--db", db, "--json"]) == 0
    (row,) = [r for r in json.loads(capsys.readouterr().out) if r["id"] == "isolation-outlier"]
    assert row["action"] == "notify" and row["budget"]["budget_per_1000_node_days"] == 1.0
    assert row["budget"]["asked_node_rounds"] > 0


def test_the_controller_learns_its_budget_from_rounds_of_jobs_nothing_flagged(tmp_path):
    """A healthy 4-node job: every window the controller scores it as a verdict would, and each node's smallest of
    its last `rounds` scores goes into the cluster's tail and its shape's; the node time is counted; the state is
    saved for a restart."""
    ctl, slurm, clock = make_controller(tmp_path)
    nodes = ["node1", "node2", "node3", "node4"]
    slurm.run_job(1, nodes, start=clock() - 2000)
    rng = np.random.default_rng(7)
    t0 = int(clock())

    def stream(start, end):
        rows = []
        for t in range(start, end, 5):
            for i, n in enumerate(nodes):
                add_kpi(ctl.conn, n, t, 1, i, (t - t0 + 2000) // 5)
                rows += [(n, t, m, base + rng.normal(0, base * 0.01), '{"gpu": "0"}')
                         for m, base in (("gpu.clock.sm_mhz", 1400.0), ("gpu.power_w", 300.0))]
        with ctl.conn:
            ctl.conn.executemany("INSERT INTO samples (node, ts, metric, value, labels) VALUES (?,?,?,?,?)", rows)

    stream(t0 - 1000, t0)
    window = int(ctl.cfg.isolation.window_s)
    for k in range(4):
        ctl.tick()
        stream(t0 + k * window, t0 + (k + 1) * window)
        clock.advance(window)
    tails = ctl.calibrator.tails
    assert tails[CLUSTER].n == tails["job1 x4"].n >= 2 * len(nodes)  # rounds 2: from the second round on
    assert ctl.calibrator.node_rounds >= 4 * len(nodes) and ctl.calibrator.asked_rounds == 0
    clock.advance(600)
    ctl.tick()
    again = make_controller(tmp_path, cfg=ctl.cfg, conn=ctl.conn)[0]
    assert again.calibrator.tails[CLUSTER].n >= tails[CLUSTER].n - 4
