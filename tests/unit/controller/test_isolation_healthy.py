"""The long healthy memory of isolation (detect/healthy.py): bounded histograms of each node's deviation from its
peers, what may teach them, their persistence, and the lone-metric weights the score takes from them."""

from types import SimpleNamespace

import numpy as np
import pytest

from sigma.controller.db import open_db
from sigma.controller.detect import healthy
from sigma.controller.detect.healthy import GAMMA, MIN_VALUES, HealthyFeed, Sketches, lone_weights
from sigma.controller.detect.isolation import baseline, score
from sigma.findings import Finding

NODES = ["n1", "n2", "n3", "n4"]


def fed(values: np.ndarray, series=("m",), nodes=NODES) -> Sketches:
    """values [nodes, time, series], all healthy."""
    s = Sketches()
    s.add(list(nodes), list(series), values, np.ones(len(nodes), bool))
    return s


def test_quantiles_are_within_the_bucket_resolution():
    rng = np.random.default_rng(0)
    v = rng.normal(0, 2.0, (4, 5000, 1))
    s = fed(v)
    q = s.quantiles(NODES, ["m"], (0.005, 0.5, 0.995))
    for k, p in enumerate((0.005, 0.995)):
        truth = np.quantile(v[:, :, 0], p, axis=1)
        ratio = q[2 * k, :, 0] / truth
        assert np.all((ratio > 1 / GAMMA) & (ratio < GAMMA)), (p, q[2 * k], truth)
    assert np.all(np.abs(q[1]) < 0.5)


def test_memory_is_fixed_per_histogram_for_256_nodes_by_200_metrics():
    s = Sketches()
    nodes, series = [f"node{i:03d}" for i in range(256)], [f"metric{j}" for j in range(200)]
    rng = np.random.default_rng(1)
    for _ in range(3):
        s.add(nodes, series, rng.normal(size=(256, 200)), np.ones(256, bool))
    before = s.nbytes
    s.add(nodes, series, rng.normal(size=(256, 50, 200)) * 1e6, np.ones(256, bool))  # more values, same memory
    assert len(s) == 256 * 200
    assert s.nbytes == before == 256 * 200 * (healthy.BUCKETS * 2 + 2 + 1)  # about 8.4 MB
    assert s.counts[:len(s)].sum(axis=1).max() <= healthy.CAP + 50


def test_counts_are_halved_past_the_cap_so_old_behaviour_fades():
    s = fed(np.full((4, int(healthy.CAP) + 10, 1), 1.0))
    total = s.counts[:len(s)].sum(axis=1)
    assert np.all(total <= healthy.CAP) and np.all(total > healthy.CAP / 4)


def test_nan_and_gaps_add_nothing():
    v = np.full((4, 10, 1), np.nan)
    v[:, ::2, 0] = 1.0
    s = fed(v)
    assert s.counts[:len(s)].sum() == 4 * 5
    assert fed(np.full((4, 3, 1), np.nan)).counts.sum() == 0


def test_a_node_under_suspicion_teaches_nothing():
    s = Sketches()
    s.add(NODES, ["m"], np.ones((4, 1)), np.array([True, True, False, True]))
    totals = {key: int(s.counts[row].sum()) for key, row in s.index.items()}
    assert totals == {("n1", "m"): 1, ("n2", "m"): 1, ("n3", "m"): 0, ("n4", "m"): 1}


def test_a_metric_that_appears_late_has_no_quantiles_until_it_has_enough_values():
    rng = np.random.default_rng(2)
    s = fed(rng.normal(size=(4, MIN_VALUES, 1)), ("old",))
    s.add(NODES, ["new"], rng.normal(size=(4, 10, 1)), np.ones(4, bool))
    q = s.quantiles(NODES, ["old", "new", "never"], (0.5,))
    assert np.isfinite(q[0, :, 0]).all() and np.isnan(q[0, :, 1:]).all()
    # one that vanishes keeps its own: quantiles of the others do not move it
    before = s.quantiles(NODES, ["old"], (0.995,))
    s.add(NODES, ["new"], rng.normal(size=(4, 600, 1)) * 100, np.ones(4, bool))
    assert np.array_equal(before, s.quantiles(NODES, ["old"], (0.995,)))


def test_state_survives_a_restart_and_a_corrupt_one_starts_empty():
    rng = np.random.default_rng(3)
    s = fed(rng.normal(size=(4, 700, 2)), ("a", "b"))
    s.kinds["a"] = True
    back = Sketches.loads(s.dumps())
    assert back.index == s.index and back.kinds == {"a": True}
    assert np.array_equal(back.quantiles(NODES, ["a", "b"], (0.01, 0.99)), s.quantiles(NODES, ["a", "b"],
                                                                                        (0.01, 0.99)))
    for bad in ("", "{", '{"keys": "zz", "arrays": "!"}', "[]"):
        assert len(Sketches.loads(bad)) == 0


def test_lone_weight_is_lower_for_a_metric_whose_healthy_spikes_jump_past_its_99th_percentile():
    rng = np.random.default_rng(4)
    T = 4000
    gauss = rng.normal(size=(4, T))
    spiky = rng.normal(size=(4, T))
    spiky[rng.random((4, T)) < 0.004] += 12.0  # a rare event of a discrete size, on each node now and then
    history = np.stack([gauss, spiky], axis=2)
    s = Sketches()
    for t in range(T):
        s.add(NODES, ["gauss", "spiky"], healthy.residuals(history[:, t, :]), np.ones(4, bool))
    base = baseline(history)
    w = lone_weights(s, NODES, ["gauss", "spiky"], base.peer_center, base.peer_scale)
    assert 0.5 < w[0] <= 1.0 and w[1] < 0.6 * w[0]


def test_one_metric_alone_names_a_node_only_with_the_long_healthy_history():
    rng = np.random.default_rng(5)
    T, M = 2000, 6
    history = rng.normal(size=(4, T, M))
    s = Sketches()
    series = [f"m{j}" for j in range(M)]
    s.add(NODES, series, healthy.residuals(history), np.ones(4, bool))
    base = baseline(history)
    current = rng.normal(size=(4, M)) * 0.3
    current[2, 0] += 9.0  # one metric of n3, far beyond anything its healthy history did
    weights = lambda b: lone_weights(s, NODES, series, b.peer_center, b.peer_scale)
    without = score(NODES, current, base=base)
    with_lone = score(NODES, current, base=base, lone=weights)
    assert without.total[2] < 6.0 <= with_lone.total[2]
    assert np.argmax(with_lone.total) == 2 and with_lone.top_metrics(2, series)[0][0] == "m0"
    # no histogram has enough values yet (a fresh controller): exactly the score without it
    empty = score(NODES, current, base=base, lone=lambda b: lone_weights(Sketches(), NODES, series,
                                                                         b.peer_center, b.peer_scale))
    assert np.array_equal(empty.total, without.total)


def learned(T=MIN_VALUES * 2, M=4, seed=7) -> tuple[Sketches, list[str]]:
    """Histograms of M Gaussian series on every node, with enough values for their quantiles to count."""
    series = [f"m{j}" for j in range(M)]
    values = np.random.default_rng(seed).normal(size=(4, T, M))
    values[:, 0, :] = 1.0  # a histogram's range is centred on its first value: one of the usual size
    return fed(values, tuple(series)), series


def test_positions_put_a_healthy_99_5th_percentile_at_3_and_say_nothing_without_history():
    s, series = learned()
    q995 = s.quantiles(NODES, series, (0.995,))[0]
    pos = s.positions(NODES, series, q995)
    assert np.allclose(pos, healthy.CALIBRATION_Z)
    assert np.all(s.positions(NODES, series, np.zeros((4, 4))) < 0.5)
    assert np.isnan(s.positions(NODES, ["never"], np.ones((4, 1)))).all()
    assert np.isnan(s.positions(NODES, series, np.full((4, 4), np.nan))).all()


def test_a_node_far_out_in_its_own_histograms_does_not_teach_even_below_the_action_threshold():
    s, series = learned()
    values = np.random.default_rng(8).normal(size=(4, 4))
    values[2, :3] = 12.0  # n3: three series far past anything healthy (12 sigma), not under suspicion
    before = s.counts[:len(s)].sum(axis=1).copy()
    added = s.teach(NODES, series, values, np.ones(4, bool))
    grown = {key[0] for key, row in s.index.items() if s.counts[row].sum() > before[row]}
    assert added == 3 * 4 and grown == {"n1", "n2", "n4"}


def test_a_healthy_node_teaches_and_so_does_its_rare_spike_in_one_series():
    s, series = learned()
    values = np.random.default_rng(9).normal(size=(4, 4))
    values[1, 0] = 12.0  # one series of n2 alone: a rare healthy spike the 99.95th percentile is made of
    assert s.teach(NODES, series, values, np.ones(4, bool)) == 4 * 4
    assert s.teach(NODES, series, values, np.array([True, True, True, False])) == 3 * 4  # the caller's word too
    # over time, [nodes, time, series]: each slice judged alone
    over = np.random.default_rng(10).normal(size=(4, 5, 4))
    over[0, 2, :] = 15.0
    assert s.teach(NODES, series, over, np.ones(4, bool)) == 4 * 5 * 4 - 4


def test_a_fresh_histogram_learns_everything_until_its_quantiles_count():
    s = Sketches()
    values = np.full((4, 3), 50.0)
    assert s.teach(NODES, ["a", "b", "c"], values, np.ones(4, bool)) == 12


def test_the_evidence_ranks_a_metric_beyond_its_long_history_above_one_within_the_hours_noise():
    rng = np.random.default_rng(11)
    T, M = 2000, 4
    series = [f"m{j}" for j in range(M)]
    history = rng.normal(size=(4, T, M))
    s = Sketches()
    s.add(NODES, series, healthy.residuals(history), np.ones(4, bool))
    base = baseline(history)
    current = rng.normal(size=(4, M)) * 0.1
    current[2, 1] += 2.0  # n3's m1 a little apart from the peers ...
    current[2, 3] += 1.5
    s.counts[s.index[("n3", "m3")]] = 0  # ... m3 of a node whose healthy m3 never moved from the peers
    s.counts[s.index[("n3", "m3")], healthy.ZERO] = 1000
    position = lambda deviation: s.positions(NODES, series, deviation)
    plain = score(NODES, current, base=base)
    ranked = score(NODES, current, base=base, position=position)
    assert np.array_equal(plain.total, ranked.total)  # evidence only: it decides nothing
    assert plain.top_metrics(2, series)[0][0] == "m1" and ranked.top_metrics(2, series)[0][0] == "m3"


# ---------- the controller's feed, from its samples table ----------
def insert(conn, rows):
    with conn:
        conn.executemany("INSERT INTO samples (node, ts, metric, value, labels) VALUES (?, ?, ?, ?, '{}')", rows)


def job(job_id=1, nodes=tuple(NODES)):
    return SimpleNamespace(job_id=job_id, nodes=nodes)


@pytest.fixture
def conn(tmp_path):
    return open_db(tmp_path / "c.db")


def test_feed_reads_slices_and_keeps_only_healthy_nodes_of_jobs_with_peers(conn):
    t0 = 10_000.0
    rng = np.random.default_rng(6)
    for k in range(4):  # a slice every window; 1 Hz samples of a gauge
        ts = t0 + k * 120.0
        insert(conn, [(n, ts - s, "gpu.temp", 60 + i + rng.normal()) for i, n in enumerate(NODES) for s in range(20)])
    feed = HealthyFeed(conn, 120.0, lambda: t0)
    finding = Finding(rule_id="x", source="rule", scope="node", severity="error", action="drain", summary="",
                      first_ts=t0, last_ts=t0, node="n2")
    added = [feed.update(t0 + k * 120.0 + 1, [job(), job(2, ("a", "b"))], [finding], lambda n: n == "n4")
             for k in range(4)]
    assert added[0] == 0  # the first slice only tells counters from gauges for the next
    assert added[1:] == [2, 2, 2]  # n1, n3: n2 is named in a finding, n4 is being remediated; no 2-node job
    taught = {key for key, row in feed.sketches.index.items() if feed.sketches.counts[row].sum()}
    assert taught == {("n1", "gpu.temp"), ("n3", "gpu.temp")}
    # nothing new until the next window
    assert feed.update(t0 + 3 * 120.0 + 2, [job()], [], lambda n: False) == 0
    # a job with a finding teaches nothing at all
    insert(conn, [(n, t0 + 480 - s, "gpu.temp", 60.0) for n in NODES for s in range(20)])
    jf = Finding(rule_id="watchdog-throughput-drop", source="watchdog", scope="job", severity="warning",
                 action="notify", summary="", first_ts=t0, last_ts=t0, job_id=1)
    assert feed.update(t0 + 481, [job()], [jf], lambda n: False) == 0


def test_feed_keeps_a_node_far_out_in_its_histograms_from_teaching_though_no_finding_names_it(conn):
    t0 = 30_000.0
    rng = np.random.default_rng(12)
    for k in range(2):  # n3 reads 40 degrees above its peers in the second slice: far past its healthy spread
        ts = t0 + k * 120.0
        insert(conn, [(n, ts - s, "gpu.temp", 60 + rng.normal(0, 0.1) + (40 if k and n == "n3" else 0))
                      for n in NODES for s in range(20)])
    feed = HealthyFeed(conn, 120.0, lambda: t0)
    history = rng.normal(0, 0.5, (4, 2 * MIN_VALUES, 1))
    history[:, 0] = 0.5  # a histogram's range is centred on its first value: one of the usual size
    feed.sketches.add(NODES, ["gpu.temp"], history, np.ones(4, bool))  # a long healthy memory, a degree wide
    before = {key: int(feed.sketches.counts[row].sum()) for key, row in feed.sketches.index.items()}
    assert [feed.update(t0 + k * 120.0 + 1, [job()], [], lambda n: False) for k in range(2)] == [0, 3]
    grown = {key[0] for key, row in feed.sketches.index.items() if feed.sketches.counts[row].sum() > before[key]}
    assert grown == {"n1", "n2", "n4"}
    # the same positions rank a round's evidence, on the quantiles kept with the job's weights
    base = baseline(history)
    feed.weights(NODES, ["gpu.temp"], base)
    deviation = np.array([[0.1], [-0.1], [20.0], [0.0]])
    assert np.array_equal(feed.positions(NODES, ["gpu.temp"], deviation),
                          feed.sketches.positions(NODES, ["gpu.temp"], deviation))
    assert feed.positions(NODES, ["gpu.temp"], deviation)[2, 0] > healthy.SUSPECT_Z


def test_feed_keeps_a_counter_as_rates_and_skips_the_slice_where_it_reset(conn):
    t0 = 20_000.0
    rows, level = [], {n: 1000.0 * i for i, n in enumerate(NODES)}
    for k in range(5):
        for s in range(20):
            ts = t0 + k * 120.0 - 20 + s
            for i, n in enumerate(NODES):
                if k == 3 and n == "n1" and s == 0:
                    level[n] = 0.0  # the counter reset (a driver reload)
                level[n] += 10.0 + i  # bytes per second, a little different per node
                rows.append((n, ts, "net.rx_bytes", level[n]))
        # the counter also moves between slices (samples not read): the rate is what matters
        for n in NODES:
            level[n] += 100 * 10.0
    insert(conn, rows)
    feed = HealthyFeed(conn, 120.0, lambda: t0)
    added = [feed.update(t0 + k * 120.0, [job()], [], lambda n: False) for k in range(5)]
    assert feed.sketches.kinds == {"net.rx_bytes": True}
    assert added == [0, 4, 4, 0, 4]  # the reset slice reads as a gauge: skipped
    # every value kept is a rate deviation (a few bytes per second), none a level (thousands)
    q = feed.sketches.counts[:len(feed.sketches)]
    values = healthy._value(np.nonzero(q)[1], feed.sketches.anchor[np.nonzero(q)[0]].astype(np.int64))
    assert np.all(np.abs(values) < 10)


def test_feed_saves_its_histograms_and_a_new_controller_reads_them_back(conn):
    clock = [30_000.0]
    feed = HealthyFeed(conn, 120.0, lambda: clock[0])
    feed.sketches.add(NODES, ["m"], np.arange(4.0)[:, None], np.ones(4, bool))
    feed.save()
    again = HealthyFeed(conn, 120.0, lambda: clock[0])
    assert again.sketches.index == feed.sketches.index
    assert np.array_equal(again.sketches.counts[:4], feed.sketches.counts[:4])


def test_a_jobs_lone_weights_are_kept_until_the_history_is_read_again(conn):
    clock = [40_000.0]
    feed = HealthyFeed(conn, 120.0, lambda: clock[0])
    rng = np.random.default_rng(7)
    history = rng.normal(size=(4, MIN_VALUES, 1))
    feed.sketches.add(NODES, ["m"], healthy.residuals(history), np.ones(4, bool))
    base = baseline(history)
    first = feed.weights(NODES, ["m"], base)
    assert np.isfinite(first).all()
    feed.sketches.add(NODES, ["m"], rng.normal(size=(4, 3 * MIN_VALUES, 1)) * 50, np.ones(4, bool))
    assert feed.weights(NODES, ["m"], base) is first
    clock[0] += healthy.WEIGHTS_S
    assert feed.weights(NODES, ["m"], base)[0] < first[0]


def test_a_large_cluster_is_read_a_few_nodes_a_tick(conn):
    per = healthy.NODES_PER_TICK // 2
    jobs = [job(i, tuple(f"j{i}n{k}" for k in range(per))) for i in range(3)]
    feed = HealthyFeed(conn, 120.0, lambda: 0.0)
    feed.update(1000.0, jobs, [], lambda n: False)
    assert set(feed.next_at) == {0, 1}  # two jobs fill the budget
    feed.update(1001.0, jobs, [], lambda n: False)
    assert set(feed.next_at) == {0, 1, 2} and feed.next_at[2] == 1121.0
    feed.update(1002.0, jobs, [], lambda n: False)
    assert feed.next_at[0] == 1120.0  # nothing due before its window has passed


def test_the_controller_feeds_its_jobs_healthy_nodes_each_window_and_keeps_them_across_a_restart(tmp_path):
    from tests.unit.controller.helpers import make_controller

    ctl, slurm, clock = make_controller(tmp_path)
    nodes = ["node1", "node2", "node3", "node4"]
    slurm.run_job(7, nodes, start=clock.t - 600)
    rng = np.random.default_rng(8)
    for k in range(3):
        insert(ctl.conn, [(n, clock.t - s, "gpu.power_w", 300 + 5 * i + rng.normal()) for i, n in enumerate(nodes)
                          for s in range(20)])
        ctl.tick()
        clock.advance(120.0)
    taught = {key for key, row in ctl.healthy.sketches.index.items() if ctl.healthy.sketches.counts[row].sum()}
    assert taught == {(n, "gpu.power_w") for n in nodes}
    clock.advance(healthy.SAVE_S)
    ctl.tick()  # saved with this tick's feed
    again, _, _ = make_controller(tmp_path, slurm=slurm, clock=clock, conn=ctl.conn)
    assert set(again.healthy.sketches.index) >= taught


def test_a_gap_in_the_round_is_never_a_lone_metric_culprit():
    rng = np.random.default_rng(9)
    history = rng.normal(size=(4, 1000, 3))
    s = fed(healthy.residuals(history), ("a", "b", "c"))
    base = baseline(history)
    current = rng.normal(size=(4, 3)) * 0.3
    current[1, 0] = np.nan  # n2 did not report `a` in this window
    current[3, :] = np.nan  # n4 reported nothing
    out = score(NODES, current, base=base,
                lone=lambda b: lone_weights(s, NODES, ["a", "b", "c"], b.peer_center, b.peer_scale))
    assert np.isfinite(out.total).all() and out.total.max() < 6.0
    assert out.metric_z[3].sum() == 0 and out.metric_z[1, 0] == 0
