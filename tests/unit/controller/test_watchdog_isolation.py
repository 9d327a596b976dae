"""Job watchdog (hang, throughput drop, history, crash loop) and peer/temporal isolation scoring."""

import numpy as np

from sigma.controller.config import WatchdogConfig
from sigma.controller.db import open_db
from sigma.controller.detect.features import job_matrices
from sigma.controller.detect.samples import bucket_stats
from sigma.controller.detect.isolation import Streaks, pick_outlier, score, score_nodes
from sigma.controller.detect.watchdog import JobInfo, check_job

from sigma.findings import Finding

from tests.unit.controller.helpers import add_event, add_kpi, calibrated, make_controller

NOW = 1_000_000.0
CFG = WatchdogConfig()


def telemetry(tmp_path, samples, nodes, window=120.0, history=600.0):
    """The samples through a controller database: (window buckets, history buckets) as the controller reads them."""
    conn = open_db(tmp_path / "t.db")
    with conn:
        conn.executemany("INSERT INTO samples (node, ts, metric, value, labels) VALUES (?, ?, ?, ?, ?)",
                         [(s["node"], s["ts"], s["metric"], s["value"], s["labels"]) for s in samples])
    return (bucket_stats(conn, nodes, NOW - window, NOW + 1e-6, 6),
            bucket_stats(conn, nodes, NOW - history, NOW - window, 12))


def kpi_rows(nodes, t0, t1, *, slow=None, stop=None, tps=1000.0, dt=1.0, ranks_per_node=2):
    """Synchronous training: every rank reports each step; `stop` = {node: ts} stops that node's ranks."""
    rows, step, t = [], 0, t0
    while t <= t1:
        for ni, node in enumerate(nodes):
            if stop and node in stop and t >= stop[node]:
                continue
            for r in range(ranks_per_node):
                v = tps * (0.5 if slow and node == slow[0] and t >= slow[1] else 1.0)
                rows.append({"node": node, "ts": t, "job_id": 1, "rank": ni * ranks_per_node + r, "step": step,
                             "tokens_per_s": v, "step_time_s": 1000.0 / v})
        if stop and any(t >= s for s in stop.values()):
            step = step  # the others block at the collective: no more steps for anyone
            t += dt
            continue
        step += 1
        t += dt
    return rows


def job(start=NOW - 1000, nodes=("node1", "node2", "node3")):
    return JobInfo(job_id=1, nodes=tuple(nodes), start_time=start)


def rule_ids(findings):
    return sorted(f.rule_id for f in findings)


def test_healthy_job_raises_nothing():
    rows = kpi_rows(["node1", "node2", "node3"], NOW - 900, NOW)
    assert check_job(job(), rows, NOW, CFG, ever_reported=True) == []


def test_hang_after_t_seconds_without_progress():
    rows = kpi_rows(["node1", "node2", "node3"], NOW - 900, NOW, stop={"node2": NOW - 130})
    found = check_job(job(), rows, NOW, CFG, ever_reported=True)
    assert rule_ids(found) == ["watchdog-hang"]
    assert found[0].evidence["stalled_s"] >= 120
    rows = kpi_rows(["node1", "node2", "node3"], NOW - 900, NOW, stop={"node2": NOW - 100})
    assert check_job(job(), rows, NOW, CFG, ever_reported=True) == []


def test_a_hung_job_is_one_hang_finding_not_also_a_throughput_drop():
    """Slow steps, then a stop: the recent window still holds enough slow rows for a drop, but the hang is what
    is decided (two findings for one job would pull isolation's rounds apart)."""
    cfg = WatchdogConfig(hang_timeout_s=20, recent_window_s=60)
    slow = kpi_rows(["node1", "node2"], NOW - 59, NOW - 25, tps=100.0)
    for r in slow:
        r["step"] += 10_000  # steps go on from the fast part's
    rows = kpi_rows(["node1", "node2"], NOW - 900, NOW - 60) + slow
    assert rule_ids(check_job(job(), rows, NOW, cfg, ever_reported=True)) == ["watchdog-hang"]


def test_job_that_never_steps_after_restart_is_hung_after_grace():
    assert rule_ids(check_job(job(start=NOW - 400), [], NOW, CFG, ever_reported=True)) == ["watchdog-hang"]
    assert check_job(job(start=NOW - 100), [], NOW, CFG, ever_reported=True) == []


def test_throughput_drop_against_own_baseline_and_history():
    rows = kpi_rows(["node1", "node2", "node3"], NOW - 900, NOW, slow=("node1", NOW - 200))
    # synchronous job: one slow node slows everybody
    for r in rows:
        if r["ts"] >= NOW - 200:
            r["tokens_per_s"] = 500.0
    assert rule_ids(check_job(job(), rows, NOW, CFG, ever_reported=True)) == ["watchdog-throughput-drop"]
    healthy = kpi_rows(["node1", "node2", "node3"], NOW - 900, NOW, tps=600.0)
    assert rule_ids(check_job(job(), healthy, NOW, CFG, ever_reported=True, history_median=1000.0)) == \
        ["watchdog-below-history"]


def test_a_straggler_that_mixes_long_and_fast_steps_is_a_throughput_drop():
    """Stopped 70 % of every second: one long step and one fast step per second. Most rows are fast, most of the
    time is slow: throughput is judged over time, not over rows."""
    rows, t, step = [], NOW - 600, 0
    while t < NOW:
        pattern = [0.1] if t < NOW - 100 else [0.8, 0.1, 0.1]
        for dt in pattern:
            t += dt
            rows.append({"node": "node1", "ts": t, "job_id": 1, "rank": 0, "step": step, "step_time_s": dt,
                         "tokens_per_s": 100 / dt})
            step += 1
    assert rule_ids(check_job(job(), rows, NOW, CFG, ever_reported=True)) == ["watchdog-throughput-drop"]


def straggled_rows(stop_fraction, since, dt=0.1, t0=NOW - 600):
    """0.1 s steps; from `since` the rank is stopped `stop_fraction` of every second (one long step a second)."""
    rows, t, step = [], t0, 0
    while t < NOW:
        pattern = [dt] if t < since else [dt + stop_fraction] + [dt] * (round((1 - stop_fraction) / dt) - 1)
        for d in pattern:
            t += d
            rows.append({"node": "node1", "ts": t, "job_id": 1, "rank": 0, "step": step, "step_time_s": d,
                         "tokens_per_s": 100 / d})
            step += 1
    return rows


def test_a_30_percent_straggler_is_a_drop_though_its_long_steps_fill_less_than_half_the_time():
    """Stopped 30 % of every second: 7 steps a second instead of 10, the one long step 40 % of the time. A median
    over time sees the fast steps; the work done over the time it took is 30 % lower."""
    from sigma.controller.detect.watchdog import throughput

    rows = straggled_rows(0.3, NOW - 100)
    recent = [r for r in rows if r["ts"] >= NOW - CFG.recent_window_s]
    assert abs(throughput(recent) / 1000 - 0.7) < 0.02
    assert rule_ids(check_job(job(), rows, NOW, CFG, ever_reported=True)) == ["watchdog-throughput-drop"]
    assert rule_ids(check_job(job(), straggled_rows(0.3, NOW + 1), NOW, CFG, ever_reported=True)) == []


def test_a_drop_is_found_once_it_fills_part_of_the_recent_window():
    """Judged on the work done: a 50 % straggler shows after it has lasted drop_fraction / 0.5 of the window."""
    window = CFG.recent_window_s
    late = straggled_rows(0.5, NOW - 0.6 * window)
    early = straggled_rows(0.5, NOW - 0.25 * window)
    assert rule_ids(check_job(job(), late, NOW, CFG, ever_reported=True)) == ["watchdog-throughput-drop"]
    assert rule_ids(check_job(job(), early, NOW, CFG, ever_reported=True)) == []


def test_crash_loop():
    found = check_job(job(), [], NOW, CFG, ever_reported=False, start_times=[NOW - 3000, NOW - 2000, NOW - 100])
    assert rule_ids(found) == ["watchdog-crash-loop"]
    assert check_job(job(), [], NOW, CFG, ever_reported=False, start_times=[NOW - 9000, NOW - 100]) == []


def test_isolation_finds_the_stopped_node_from_kpis():
    nodes = ["node1", "node2", "node3", "node4"]
    rows = kpi_rows(nodes, NOW - 300, NOW - 125, stop={"node3": NOW - 135})
    # peers finished the step node3 never reached
    rows += [{"node": n, "ts": NOW - 134, "job_id": 1, "rank": i, "step": 166, "tokens_per_s": 1000.0,
              "step_time_s": 1.0} for i, n in enumerate(nodes) if n != "node3"]
    names, cur, hist, jitter = job_matrices(nodes, NOW, 120, rows)
    verdict = pick_outlier(nodes, score_nodes(nodes, cur, hist, jitter=jitter), 6.0, 2.0)
    assert verdict.culprit == "node3" and verdict.ranked[0][0] == "node3"


def test_isolation_uses_telemetry_against_peers_and_own_history(tmp_path):
    rng = np.random.default_rng(0)
    nodes = [f"node{i}" for i in range(8)]
    samples, history = [], []
    for t in range(0, 600, 10):
        for n in nodes:
            for m in range(20):
                v = 50 + m + rng.normal(0, 1)
                if n == "node5" and m in (3, 7) and t >= 540:
                    v += 15  # the fault: two metrics of one node move
                row = {"node": n, "ts": NOW - 600 + t, "metric": f"m{m}", "value": v, "labels": "{}"}
                (samples if t >= 480 else history).append(row)
    names, cur, hist, jitter = job_matrices(nodes, NOW, 120, [], *telemetry(tmp_path, samples + history, nodes))
    scores = score_nodes(nodes, cur, hist, jitter=jitter)
    verdict = pick_outlier(nodes, scores, 4.0, 1.5)
    assert verdict.culprit == "node5"


def test_a_node_that_always_differs_is_not_an_outlier():
    """Spatially odd but unchanged against its own history (e.g. a different SKU): no isolation."""
    rng = np.random.default_rng(1)
    n, t, m = 8, 12, 10
    base = 50 + rng.normal(0, 1, (n, t, m))
    base[2] += 20  # node 2 always runs hotter
    current = base[:, -1, :] + rng.normal(0, 0.5, (n, m))
    scores = score_nodes([f"n{i}" for i in range(n)], current, base[:, :-1, :])
    assert pick_outlier([f"n{i}" for i in range(n)], scores, 6.0, 2.0).culprit is None


def test_several_outliers_are_escalated_unless_the_job_says_which_one():
    scores = np.array([1.0, 8.0, 7.5, 1.2])
    verdict = pick_outlier(["a", "b", "c", "d"], scores, 6.0, 2.0)
    assert verdict.culprit is None and verdict.ambiguous == ["b", "c"] and "cannot be told apart" in verdict.reason
    assert pick_outlier(["a", "b", "c", "d"], scores, 6.0, 2.0, hint="c").culprit == "c"
    assert pick_outlier(["a", "b", "c", "d"], scores, 6.0, 2.0, hint="a").culprit is None  # a hint makes none
    # one outlier, not dominant: no culprit, and nothing to escalate either
    verdict = pick_outlier(["a", "b", "c"], np.array([7.0, 5.0, 1.0]), 6.0, 1.5)
    assert verdict.culprit is None and verdict.ambiguous == []
    # two nodes scored on their own history: the one that moved
    assert pick_outlier(["a", "b"], np.array([0.0, 100.0]), 6.0, 2.0).culprit == "b"


def test_a_flat_metric_is_not_a_thousand_sigma_event():
    """0 on every node and in the history; 0.03 on one node now (a retransmit, one error count): a hint, never
    a culprit on its own."""
    rng = np.random.default_rng(3)
    n, t = 8, 30
    history = np.concatenate([50 + rng.normal(0, 1, (n, t, 5)), np.zeros((n, t, 3))], axis=2)
    current = np.concatenate([50 + rng.normal(0, 1, (n, 5)), np.zeros((n, 3))], axis=1)
    current[4, 6] = 0.03
    scores = score_nodes([f"n{i}" for i in range(n)], current, history)
    assert scores[4] < 6.0
    assert pick_outlier([f"n{i}" for i in range(n)], scores, 6.0, 1.5).culprit is None
    # a real fault on the noisy metrics of the same node is still found
    current[4, :3] += 12
    assert pick_outlier([f"n{i}" for i in range(n)], score_nodes([f"n{i}" for i in range(n)], current, history),
                        6.0, 1.5).culprit == "n4"


def test_the_noise_floor_is_the_resolution_of_the_metric():
    """A gauge on a 0.01 grid that mostly holds still: one step of its grid is one sigma, not a thousand."""
    from sigma.controller.detect.isolation import baseline

    history = np.full((4, 40, 1), 0.5)
    history[:, ::7, 0] = 0.51
    base = baseline(history)
    assert np.isclose(base.floor[0], 0.01) and not base.flat[0]
    z = score([f"n{i}" for i in range(4)], np.array([[0.52], [0.5], [0.5], [0.5]]), history).metric_z
    assert 0 < z[0, 0] <= 2.0 + 1e-9


def test_a_spiky_metric_weighs_less_than_a_steady_one():
    """Both move by the same amount now; the one that spikes on healthy nodes too is discounted."""
    rng = np.random.default_rng(8)
    history = 10 + rng.normal(0, 1, (6, 200, 2))
    history[:, :, 1] += 25 * (rng.random((6, 200)) < 0.1)  # healthy spikes, one sample in ten on each node
    current = 10 + rng.normal(0, 0.3, (6, 2))
    current[2] += 8
    z = score([f"n{i}" for i in range(6)], current, history).metric_z
    assert z[2, 0] > 2 * z[2, 1]


def test_a_single_node_job_is_scored_against_its_own_history():
    rng = np.random.default_rng(9)
    history = 20 + rng.normal(0, 1, (1, 60, 10))
    healthy = 20 + rng.normal(0, 1, (1, 10))
    sick = healthy.copy()
    sick[0, [1, 4, 7]] += 15
    assert pick_outlier(["n0"], score_nodes(["n0"], healthy, history), 6.0, 1.5).culprit is None
    verdict = pick_outlier(["n0"], score_nodes(["n0"], sick, history), 6.0, 1.5)
    assert verdict.culprit == "n0"
    top = score(["n0"], sick, history).top_metrics(0, [f"m{j}" for j in range(10)], n=3)
    assert sorted(name for name, _ in top) == ["m1", "m4", "m7"]


def test_gaps_late_joiners_and_metrics_that_appear_or_vanish_make_no_culprit():
    rng = np.random.default_rng(10)
    nodes = [f"n{i}" for i in range(5)]
    history = 30 + rng.normal(0, 1, (5, 40, 6))
    history[:, ::3, 0] = np.nan  # gaps
    history[3] = np.nan  # n3 joined late: no history at all
    history[:, :, 5] = np.nan  # a metric that appeared after a reload
    current = 30 + rng.normal(0, 1, (5, 6))
    current[1, 2] = np.nan  # a series missing now
    current[:, 4] = np.nan  # a metric that vanished
    current[2, :] = np.nan  # a node that reports nothing this window
    current[3, 5] = 1e6  # the late joiner's new metric: nothing to compare with
    scores = score_nodes(nodes, current, history)
    assert np.all(np.isfinite(scores))
    assert pick_outlier(nodes, scores, 6.0, 1.5).culprit is None
    # a real fault of the late joiner shows against its peers
    current[3, :3] += 40
    assert pick_outlier(nodes, score_nodes(nodes, current, history), 6.0, 1.5).culprit == "n3"
    # nothing at all: scores of zero, no crash
    empty = score_nodes(nodes, np.full((5, 0), np.nan), np.full((5, 4, 0), np.nan))
    assert np.all(empty == 0)
    assert np.all(score_nodes(nodes, np.full((5, 3), np.nan), None) == 0)


def test_counters_that_reset_are_read_as_gauges_not_as_huge_rates(tmp_path):
    """A counter restarts from 0 (a daemon restart): it is no longer monotonic, so no rate is taken, and the
    restarted node is not a culprit for it."""
    rows = []
    for n in ("a", "b", "c"):
        for t in range(0, 600, 10):
            v = 1e6 + 5.0 * t if not (n == "b" and t >= 550) else 5.0 * (t - 550)
            rows.append({"node": n, "ts": NOW - 600 + t, "metric": "host.net.rx_bytes", "value": v, "labels": "{}"})
    names, cur, hist, jitter = job_matrices(["a", "b", "c"], NOW, 120, [], *telemetry(tmp_path, rows, ["a", "b", "c"]))
    assert np.all(np.isfinite(cur[:, names.index("host.net.rx_bytes")]))
    scores = score_nodes(["a", "b", "c"], cur, hist, jitter=jitter)
    assert np.all(np.isfinite(scores))


def test_accelerators_reduce_to_their_node():
    current = np.ones((8, 4)) + np.random.default_rng(2).normal(0, 0.01, (8, 4))
    current[5, 1] = 5.0  # accelerator 1 of node 2 (2 per node)
    scores = score_nodes(["a", "b", "c", "d"], current, None, entity_node=np.repeat(np.arange(4), 2))
    assert int(np.argmax(scores)) == 2


def test_streaks_need_the_same_node_repeatedly():
    s = Streaks()
    assert [s.update("1", c) for c in ("a", "a", "b", "b", "b", None, "b")] == [1, 2, 1, 2, 3, 0, 1]


def test_a_scored_round_counts_once_its_window_has_moved_on():
    """Rounds a second apart over a 120 s window are one piece of evidence: the next counts 120 s later, and only
    if every round in between named the same node."""
    s = Streaks({"1": ["a", 1]})  # a state written before rounds had times
    assert s.update("1", "a", 0.0, 120.0) == 2
    assert [s.update("1", "a", t, 120.0) for t in (1.0, 60.0, 119.0, 120.0)] == [2, 2, 2, 3]
    assert [s.update("1", c, t, 120.0) for c, t in (("b", 121.0), ("b", 122.0), ("b", 241.0))] == [1, 1, 2]
    assert [s.update("1", c, t, 120.0) for c, t in ((None, 242.0), ("b", 243.0))] == [0, 1]


def test_controller_isolates_a_hung_node_after_repeated_rounds(tmp_path):
    ctl, slurm, clock = make_controller(tmp_path)
    calibrated(ctl)  # a cluster with a long healthy history: score verdicts may act
    ctl.cfg.isolation.rounds = 2
    nodes = ["node1", "node2", "node3"]
    slurm.run_job(1, nodes, start=clock() - 1000)
    now = clock()
    for r in kpi_rows(nodes, now - 300, now - 130, stop={"node2": now - 140}):
        add_kpi(ctl.conn, r["node"], r["ts"], 1, r["rank"], r["step"], r["tokens_per_s"], r["step_time_s"])
    for i, n in enumerate(["node1", "node3"]):
        add_kpi(ctl.conn, n, now - 139, 1, i * 2, 161)
    ctl.tick()
    assert slurm.count("drain") == 0  # one round is not enough
    clock.advance(1)
    ctl.tick()
    assert slurm.count("drain") == 0  # nor a second over the same window: the scores name node2, no rank does
    clock.advance(ctl.cfg.isolation.window_s - 1)
    ctl.tick()
    assert slurm.node("node2").drained and slurm.node("node2").reason.startswith("sigma: watchdog-hang")
    assert slurm.count("requeue") == 1
    inc = ctl.incidents.query(node="node2")[0]
    assert inc.source == "isolation" and inc.evidence["isolation"]["ranked"][0][0] == "node2"
    # steps of the old run (the culprit stopped, its peers finishing the step) confirm nothing
    for k in range(6):
        clock.advance(1)
        add_kpi(ctl.conn, "node1", clock(), 1, 0, 162 + k)
        ctl.tick()
    assert ctl.incidents.get(inc.id).status == "acted"
    # the job comes back on healthy nodes and makes progress: the isolation is confirmed
    slurm.set_job(1, state="RUNNING", nodes=("node1", "node3", "node4"), start_time=int(clock()) + 1)
    for i, n in enumerate(["node1", "node3", "node4"]):
        add_event(ctl.conn, n, clock() + 0.5, source="kpi", kind="resume", job_ids=[1])
    for k in range(6):
        clock.advance(1)
        for i, n in enumerate(["node1", "node3", "node4"]):
            add_kpi(ctl.conn, n, clock(), 1, i, 200 + k)
        ctl.tick()
    assert ctl.incidents.get(inc.id).status == "confirmed" and ctl.incidents.get(inc.id).closed_at is None
    # node2 is rebooted, validated and resumed: the confirmed incident is closed, so the same fault on the same
    # node and job later is a new incident, acted on again
    slurm.finish_reboot("node2", clock())
    for _ in range(10):
        clock.advance(5)
        ctl.tick()
        validation = [j for j in slurm.jobs() if j.name.startswith("sigma-validate-node2")]
        if validation:
            slurm.finish_job(validation[0].job_id, rc=0)
    assert ctl.remediator.get("node2").state == "resumed"
    assert ctl.incidents.get(inc.id).status == "confirmed" and ctl.incidents.get(inc.id).closed_at is not None


def test_a_notification_about_a_job_run_closes_when_the_job_restarts(tmp_path):
    ctl, slurm, clock = make_controller(tmp_path)
    nodes = ["node1", "node2", "node3"]
    slurm.run_job(1, nodes, start=clock() - 1000)
    now = clock()
    for r in kpi_rows(nodes, now - 900, now, slow=("node1", now - 100)):
        add_kpi(ctl.conn, r["node"], r["ts"], 1, r["rank"], r["step"], 500.0 if r["ts"] >= now - 100 else 1000.0,
                r["step_time_s"])
    ctl.tick()
    (inc,) = [i for i in ctl.incidents.query() if i.rule_id == "watchdog-throughput-drop"]
    assert inc.status == "notified" and inc.closed_at is None
    clock.advance(30)
    slurm.set_job(1, start_time=int(clock()))  # requeued: a new run
    ctl.tick()
    assert ctl.incidents.get(inc.id).closed_at is not None


def test_isolation_without_recovery_is_misdiagnosed_and_the_node_returned(tmp_path):
    ctl, slurm, clock = make_controller(tmp_path)
    calibrated(ctl)  # a cluster with a long healthy history: score verdicts may act
    ctl.cfg.isolation.verify_after_s = 60
    nodes = ["node1", "node2", "node3"]
    slurm.run_job(1, nodes, start=clock() - 1000)
    now = clock()
    for r in kpi_rows(nodes, now - 300, now - 130, stop={"node2": now - 140}):
        add_kpi(ctl.conn, r["node"], r["ts"], 1, r["rank"], r["step"], r["tokens_per_s"], r["step_time_s"])
    for i, n in enumerate(["node1", "node3"]):
        add_kpi(ctl.conn, n, now - 139, 1, i * 2, 161)
    for step in (1, ctl.cfg.isolation.window_s - 1, 1):  # two windows of evidence
        ctl.tick()
        clock.advance(step)
    inc = ctl.incidents.query(node="node2")[0]
    slurm.set_job(1, state="RUNNING", nodes=("node1", "node3", "node4"), start_time=int(clock()) + 1)
    clock.advance(61)
    ctl.tick()
    assert ctl.incidents.get(inc.id).status == "misdiagnosed"
    assert ctl.remediator.get("node2").state == "returned" and slurm.node("node2").available


def test_rank_start_events_of_one_restart_count_once():
    from sigma.controller.loop import distinct_starts

    assert distinct_starts([100.0, 100.4, 101.2, 500.0, 500.3, 900.0]) == [100.0, 500.0, 900.0]


def throttled_gpu_rounds(ctl, slurm, clock):
    """A 4-node job whose node3 GPU throttles (clocks and power down, hot) and whose throughput halves: three
    ticks, the third a window after the first."""
    import json

    nodes = ["node1", "node2", "node3", "node4"]
    slurm.run_job(1, nodes, start=clock() - 2000)
    now = clock()
    rng = np.random.default_rng(4)

    def stream(start: int, end: int):  # every 5 s: the steps and each node's GPU telemetry; node3 throttles
        rows = []
        for t in range(start, end, 5):
            for i, n in enumerate(nodes):
                slow = t >= now - 110
                add_kpi(ctl.conn, n, t, 1, i, (t - int(now) + 1000) // 5, tokens_per_s=500.0 if slow else 1000.0,
                        step_time_s=2.0 if slow else 1.0)
                for m, base in (("gpu.clock.sm_mhz", 1400.0), ("gpu.temp_c", 60.0), ("gpu.power_w", 300.0)):
                    v = base + rng.normal(0, base * 0.01)
                    if n == "node3" and slow:
                        v *= 0.6 if m != "gpu.temp_c" else 1.4  # a throttling GPU: clocks and power down, hot
                    rows.append((n, t, m, v, json.dumps({"gpu": "0"})))
        with ctl.conn:
            ctl.conn.executemany("INSERT INTO samples (node, ts, metric, value, labels) VALUES (?,?,?,?,?)", rows)

    stream(int(now) - 1000, int(now))
    ctl.tick()
    assert slurm.count("drain") == 0  # first round only
    clock.advance(1)
    ctl.tick()
    assert slurm.count("drain") == 0  # a second round over the same window is not a second piece of evidence
    window = int(ctl.cfg.isolation.window_s)
    stream(int(now), int(now) + window)
    clock.advance(window - 1)
    ctl.tick()


def test_throughput_drop_isolates_the_node_whose_telemetry_moved(tmp_path):
    ctl, slurm, clock = make_controller(tmp_path)
    calibrated(ctl)  # a cluster with a long healthy history: score verdicts may act
    throttled_gpu_rounds(ctl, slurm, clock)
    (inc,) = [i for i in ctl.incidents.query() if i.rule_id == "isolation-outlier"]
    assert inc.node == "node3" and inc.evidence["isolation"]["ranked"][0][0] == "node3"
    assert slurm.node("node3").reason.startswith("sigma: straggler (isolation-outlier)")
    assert slurm.count("requeue") == 1
    assert any(i.rule_id == "watchdog-throughput-drop" for i in ctl.incidents.query())
    budget = inc.evidence["isolation"]["budget"]
    assert budget["method"] == "empirical" and budget["per_1000_node_days"] == 1.0
    # the evidence in the units an admin reads: the metric, its value, the peers' median and its own usual value
    (text,) = [r["text"] for r in inc.evidence["isolation"]["explained"]["node3"] if
               r["metric"].startswith("gpu.clock.sm_mhz")]
    assert " MHz vs peers' " in text and " median, its own usual " in text and text.endswith(")")


def test_before_its_history_supports_the_budget_a_score_verdict_only_notifies(tmp_path):
    ctl, slurm, clock = make_controller(tmp_path)  # a new controller: no healthy history yet
    throttled_gpu_rounds(ctl, slurm, clock)
    assert slurm.count("drain") == 0 and slurm.count("requeue") == 0
    (inc,) = [i for i in ctl.incidents.query() if i.rule_id == "isolation-outlier"]
    assert inc.node == "node3" and inc.action == "notify" and "notify: too little history" in inc.summary
    budget = inc.evidence["isolation"]["budget"]
    assert budget["threshold"] is None and budget["needed"] > budget["n"]
    assert "a tail fit needs" in budget["detail"]


def test_counters_are_compared_by_rate_not_by_level(tmp_path):
    rows = [{"node": n, "ts": NOW - 100 + t, "metric": "host.cpu.seconds", "value": base + 2.0 * t, "labels": "{}"}
            for n, base in (("a", 0.0), ("b", 9e6)) for t in range(100)]
    rows += [{"node": n, "ts": NOW - 100 + t, "metric": "host.load1", "value": 1.0 + t % 2, "labels": "{}"}
             for n in ("a", "b") for t in range(100)]
    names, cur, _, _ = job_matrices(["a", "b"], NOW, 120, [], *telemetry(tmp_path, rows, ["a", "b"]))
    assert np.allclose(cur[:, names.index("host.cpu.seconds")], 2.0)  # the rate, whatever the uptime
    assert np.allclose(cur[:, names.index("host.load1")], 1.5)  # a gauge stays a level


def test_nodes_booted_at_different_times_are_not_outliers(tmp_path):
    """Cumulative counters differ by uptime; the sidecar's own timings are noise. Neither names a culprit."""
    rng = np.random.default_rng(5)
    nodes = ["node1", "node2", "node3"]
    samples = []
    for t in range(0, 120, 5):
        for n, uptime in zip(nodes, (9e5, 1e3, 4e4)):
            samples.append({"node": n, "ts": NOW - 120 + t, "metric": "host.cpu.seconds", "labels": "{}",
                            "value": uptime + 1.9 * t + rng.normal(0, 0.01)})
            samples.append({"node": n, "ts": NOW - 120 + t, "metric": "sidecar.collector.duration_s",
                            "labels": "{}", "value": abs(rng.normal(0.001, 0.001))})
    names, cur, hist, jitter = job_matrices(nodes, NOW, 120, kpi_rows(nodes, NOW - 120, NOW),
                                            *telemetry(tmp_path, samples, nodes))
    assert not any(n.startswith("sidecar.") for n in names)
    assert pick_outlier(nodes, score_nodes(nodes, cur, hist, jitter=jitter), 6.0, 1.5).culprit is None


def test_peers_that_agree_by_chance_do_not_make_sampling_noise_a_fault(tmp_path):
    """Three nodes sample a jittery gauge; two happen to average the same, the third a little off."""
    nodes = ["node1", "node2", "node3"]
    samples = [{"node": n, "ts": NOW - 100 + t, "metric": "host.procs.blocked", "labels": "{}",
                "value": float((t // 10) % 2 if n != "node1" else (t // 10 + 1) % 2 if t < 60 else 0)}
               for t in range(0, 100, 10) for n in nodes]
    names, cur, hist, jitter = job_matrices(nodes, NOW, 120, [], *telemetry(tmp_path, samples, nodes))
    assert len(set(cur[:, names.index("host.procs.blocked")])) == 2  # the peers agree, node1 is off by 0.4
    assert pick_outlier(nodes, score_nodes(nodes, cur, hist), 6.0, 1.5).culprit == "node1"  # without the jitter
    assert pick_outlier(nodes, score_nodes(nodes, cur, hist, jitter=jitter), 6.0, 1.5).culprit is None


def test_a_hung_job_drains_the_node_left_behind_even_when_telemetry_points_elsewhere(tmp_path):
    ctl, slurm, clock = make_controller(tmp_path)
    nodes = ["node1", "node2", "node3"]
    slurm.run_job(1, nodes, start=clock() - 1000)
    now = clock()
    for r in kpi_rows(nodes, now - 300, now - 130, stop={"node2": now - 140}):
        add_kpi(ctl.conn, r["node"], r["ts"], 1, r["rank"], r["step"], r["tokens_per_s"], r["step_time_s"])
    for rank, n in ((0, "node1"), (1, "node1"), (4, "node3"), (5, "node3")):
        add_kpi(ctl.conn, n, now - 139, 1, rank, 161)  # the peers finish the step node2 never reaches
    # node1's memory gauge jumps: a statistical outlier, but the ranks say node2 is the one they wait for
    with ctl.conn:
        ctl.conn.executemany("INSERT INTO samples (node, ts, metric, value, labels) VALUES (?,?,?,?,'{}')",
                             [(n, now - t, "host.mem.used_bytes", (9e9 if n == "node1" else 1e9) + t, )
                              for t in range(0, 100, 5) for n in nodes])
    for _ in range(2):
        ctl.tick()
        clock.advance(1)
    assert slurm.node("node2").drained and not slurm.node("node1").drained
    inc = ctl.incidents.query(node="node2")[0]
    assert "node2's ranks are behind" in inc.evidence["isolation"]["reason"]


def _two_node_job(ctl, slurm, clock, *, slow_wait):
    """A 2-node job, 2 s steps for 15 minutes, then 3 s steps for the last 40 s; slow_wait(t, node) -> the share
    of that step the node's ranks waited in collectives."""
    nodes = ["node1", "node2"]
    slurm.run_job(1, nodes, start=clock() - 2000)
    now = clock()
    step = 0
    for t in range(int(now) - 900, int(now), 2):
        slow = t >= now - 40
        for i, n in enumerate(nodes):
            dt = 3.0 if slow else 2.0
            wait = slow_wait(t, n) if slow else 0.05
            add_kpi(ctl.conn, n, t, 1, i, step, tokens_per_s=1000.0 / dt, step_time_s=dt,
                    payload={"wait_s": wait * dt})
        step += 1
    return nodes


def test_load_that_moves_between_the_nodes_of_a_2_node_job_drains_nothing(tmp_path):
    """Another process on the host slows one node's ranks, then the other's: the job is slower (a notification),
    the telemetry says nothing, and no node is drained."""
    ctl, slurm, clock = make_controller(tmp_path)
    _two_node_job(ctl, slurm, clock, slow_wait=lambda t, n: 0.4 if (n == "node1") == ((t // 8) % 2 == 0) else 0.02)
    for _ in range(3):
        ctl.tick()
        clock.advance(1)
    assert slurm.count("drain") == 0
    (inc,) = [i for i in ctl.incidents.query() if i.rule_id == "watchdog-throughput-drop"]
    assert inc.status == "notified"


def test_a_straggler_in_a_2_node_job_is_drained_and_confirmed_only_by_recovery(tmp_path):
    ctl, slurm, clock = make_controller(tmp_path)
    ctl.cfg.isolation.verify_after_s = 60
    _two_node_job(ctl, slurm, clock, slow_wait=lambda t, n: 0.4 if n == "node1" else 0.02)
    for _ in range(2):
        ctl.tick()
        clock.advance(1)
    (inc,) = [i for i in ctl.incidents.query() if i.rule_id == "isolation-outlier"]
    assert inc.node == "node2" and slurm.node("node2").drained and not slurm.node("node1").drained
    # the throughput before the fault (the 10 s of slow steps before the recent window count a little)
    assert abs(inc.evidence["verify"]["baseline"] - 500.0) < 5
    # the job restarts elsewhere but runs as slowly as before: no recovery, so no confirmation
    slurm.set_job(1, state="RUNNING", nodes=("node1", "node3"), start_time=int(clock()) + 1)
    for n in ("node1", "node3"):
        add_event(ctl.conn, n, clock() + 0.5, source="kpi", kind="resume", job_ids=[1])
    for k in range(8):
        clock.advance(3)
        for i, n in enumerate(("node1", "node3")):
            add_kpi(ctl.conn, n, clock(), 1, i, 1000 + k, tokens_per_s=1000.0 / 3, step_time_s=3.0)
        ctl.tick()
        assert ctl.incidents.get(inc.id).status != "confirmed"
    clock.advance(61)
    ctl.tick()
    assert ctl.incidents.get(inc.id).status == "misdiagnosed"


def test_recovery_needs_evidence():
    from sigma.controller.loop import recovered_after_move

    fast = [{"ts": float(t), "step_time_s": 2.0, "tokens_per_s": 500.0} for t in range(6)]
    slow = [{"ts": float(t), "step_time_s": 3.0, "tokens_per_s": 333.0} for t in range(6)]
    drop = {"kind": "watchdog-throughput-drop", "baseline": 500.0}
    assert recovered_after_move(drop, fast, 5, 0.8)
    assert not recovered_after_move(drop, slow, 5, 0.8)
    assert not recovered_after_move(drop, fast[:3], 5, 0.8)  # too few steps to tell
    assert not recovered_after_move({"kind": "watchdog-throughput-drop", "baseline": None}, fast, 5, 0.8)
    assert recovered_after_move({"kind": "watchdog-hang", "baseline": None}, fast, 5, 0.8)  # it steps again
    assert not recovered_after_move({"kind": "watchdog-hang", "baseline": 500.0}, slow, 5, 0.8)


def test_several_outliers_in_a_job_are_escalated_not_drained(tmp_path):
    import json

    from tests.unit.controller.fakes import FakeSlurm

    nodes = ["node1", "node2", "node3", "node4", "node5"]
    ctl, slurm, clock = make_controller(tmp_path, slurm=FakeSlurm(nodes=tuple(nodes) + ("node6",)))
    slurm.run_job(1, nodes, start=clock() - 2000)
    now = clock()
    rng = np.random.default_rng(12)
    rows = []
    for t in range(int(now) - 1000, int(now), 5):
        slow = t >= now - 40
        for i, n in enumerate(nodes):
            add_kpi(ctl.conn, n, t, 1, i, (t - int(now) + 1000) // 5, tokens_per_s=500.0 if slow else 1000.0,
                    step_time_s=2.0 if slow else 1.0)
            for m, base in (("gpu.clock.sm_mhz", 1400.0), ("gpu.temp_c", 60.0), ("gpu.power_w", 300.0)):
                v = base + rng.normal(0, base * 0.01)
                if n in ("node2", "node4") and slow:
                    v *= 0.6 if m != "gpu.temp_c" else 1.4  # two nodes throttle alike
                rows.append((n, t, m, v, json.dumps({"gpu": "0"})))
    with ctl.conn:
        ctl.conn.executemany("INSERT INTO samples (node, ts, metric, value, labels) VALUES (?,?,?,?,?)", rows)
    for _ in range(3):
        ctl.tick()
        clock.advance(1)
    assert slurm.count("drain") == 0
    (inc,) = [i for i in ctl.incidents.query() if i.rule_id == "isolation-ambiguous"]
    assert inc.status == "notified" and "cannot be told apart" in inc.summary
    assert {n for n, _ in inc.evidence["isolation"]["ranked"][:2]} == {"node2", "node4"}
    assert "gpu.clock.sm_mhz{\"gpu\": \"0\"}" in dict(inc.evidence["isolation"]["top_metrics"]["node2"])


def _shares_rows(wait, t1=30.0, dt=0.5):
    """2 ranks on each of node1/node2 stepping every dt s; wait(t, node) -> the share of the step in collectives."""
    return [{"node": n, "ts": t / 2, "rank": 2 * i + r, "step_time_s": dt, "payload": {"wait_s": wait(t / 2, n) * dt}}
            for t in range(int(2 * t1)) for i, n in enumerate(("node1", "node2")) for r in range(2)]


def test_on_a_busy_host_the_node_waited_for_is_told_by_its_busy_share():
    """Every rank already waits half of its step (CPU contention), and the straggler's ranks, stopped inside
    collectives too, wait 55 % against the others' 80 %: a wait ratio of 0.69, but busy 45 % against 20 %."""
    from sigma.controller.detect.laggard import waited_for_node

    node, shares = waited_for_node(["node1", "node2"], _shares_rows(lambda t, n: 0.55 if n == "node2" else 0.8))
    assert node == "node2" and round(shares["node2"], 2) == 0.55
    # the same host without a straggler: both sides wait alike, nobody is named
    assert waited_for_node(["node1", "node2"], _shares_rows(lambda t, n: 0.5 + 0.05 * (n == "node2")))[0] is None
    # ... and load that moves from one side to the other every 8 s names nobody either
    moving = _shares_rows(lambda t, n: 0.55 if (n == "node1") == ((t // 8) % 2 == 0) else 0.8)
    assert waited_for_node(["node1", "node2"], moving)[0] is None


def _held_rows(wait, held, t0=NOW - 900, t1=NOW, dt=0.5, disk=None, io_wait=True):
    """A 2-node job of 2 ranks per node, steps of dt s at a steady 1000 tokens/s (no throughput drop);
    wait(t, node) / held(t, node) -> the share of the step its ranks wait in collectives / are held off the CPU
    outside them (the KPI payload's wait_s, and blocked_s = wait_s + the held time); disk(t, node) -> the share
    they are blocked on the disk, also in blocked_s, and in io_wait_s (delay accounting on) or, with io_wait False,
    said only by the step's major faults (20 a step where the share is above 0)."""
    rows, step, t = [], 0, t0
    while t <= t1:
        for i, n in enumerate(("node1", "node2")):
            for r in range(2):
                w, h, d = wait(t, n) * dt, held(t, n) * dt, (disk(t, n) if disk else 0.0) * dt
                payload = {"wait_s": w, "blocked_s": w + h + d, "cpu_wait_s": 0.3 * dt, "majflt": 0}
                if io_wait:
                    payload["io_wait_s"] = d
                elif d > 0:
                    payload["majflt"] = 20
                rows.append({"node": n, "ts": t, "job_id": 1, "rank": 2 * i + r, "step": step,
                             "tokens_per_s": 1000.0, "step_time_s": dt, "payload": payload})
        step, t = step + 1, t + dt
    return rows


def test_a_node_held_off_the_cpu_and_waited_for_is_named_without_a_throughput_drop():
    """A busy host: the job runs as fast as before, but from 40 s ago node2's ranks are held (stopped) 10 % of their
    time outside collectives and node1's ranks wait for them: a straggler; the isolation names node2."""
    from sigma.controller.detect.laggard import waited_for_node

    rows = _held_rows(lambda t, n: 0.75 if n == "node1" and t >= NOW - 40 else 0.5,
                      lambda t, n: 0.12 if n == "node2" and t >= NOW - 40 else 0.03)
    two = job(nodes=("node1", "node2"))
    (f,) = check_job(two, rows, NOW, CFG, ever_reported=True)
    assert f.rule_id == "watchdog-straggler" and f.action == "notify" and f.evidence["waited_for"] == "node2"
    assert f.evidence["held_shares"] == {"node1": 0.03, "node2": 0.12}
    assert waited_for_node(["node1", "node2"], [r for r in rows if r["ts"] >= NOW - 30])[0] == "node2"


def test_cpu_contention_that_slows_one_node_names_nobody():
    """Another process takes node1's CPU: node2's ranks wait for node1's all along, but node1's ranks are runnable
    (queued for a CPU), not held: the node waited for is the least held one. Nothing is named, by the watchdog or
    by the rule that judges wait shares alone (which would name node1 here)."""
    from sigma.controller.detect.laggard import _waited_for, wait_shares, waited_for_node

    rows = _held_rows(lambda t, n: 0.78 if n == "node2" and t >= NOW - 40 else 0.5,
                      lambda t, n: 0.01 if n == "node1" else 0.04)
    recent = [r for r in rows if r["ts"] >= NOW - 30]
    assert _waited_for(["node1", "node2"], wait_shares(recent)) == "node1"
    assert waited_for_node(["node1", "node2"], recent)[0] is None
    assert check_job(job(nodes=("node1", "node2")), rows, NOW, CFG, ever_reported=True) == []
    # held as much as the other: not held either
    rows = _held_rows(lambda t, n: 0.78 if n == "node2" and t >= NOW - 40 else 0.5, lambda t, n: 0.05)
    assert check_job(job(nodes=("node1", "node2")), rows, NOW, CFG, ever_reported=True) == []


def test_a_held_straggler_without_a_throughput_drop_is_drained(tmp_path):
    """Through the controller: two ticks with the same node held and waited for drain it (rounds = 2); the
    drain's evidence names both shares."""
    ctl, slurm, clock = make_controller(tmp_path)
    slurm.run_job(1, ["node1", "node2"], start=clock() - 2000)
    now = clock()
    for r in _held_rows(lambda t, n: 0.75 if n == "node1" and t >= now - 40 else 0.5,
                        lambda t, n: 0.12 if n == "node2" and t >= now - 40 else 0.03, t0=now - 300, t1=now):
        add_kpi(ctl.conn, r["node"], r["ts"], 1, r["rank"], r["step"], tokens_per_s=r["tokens_per_s"],
                step_time_s=r["step_time_s"], payload=r["payload"])
    ctl.tick()
    assert slurm.count("drain") == 0  # one round is not enough
    clock.advance(1)
    ctl.tick()
    assert slurm.node("node2").drained and not slurm.node("node1").drained
    (inc,) = [i for i in ctl.incidents.query() if i.rule_id == "isolation-outlier"]
    assert inc.node == "node2" and "held off the CPU: node1 3%, node2 12%" in inc.evidence["isolation"]["reason"]
    assert inc.evidence["verify"]["kind"] == "watchdog-straggler" and inc.evidence["verify"]["baseline"] == 1000.0


def test_held_shares_need_every_row_of_a_node_and_fall_back_to_the_wait_shares_without():
    """A node some of whose rows lack blocked_s has no held share; without held shares for every node the node
    waited for is judged by the wait shares alone (ratio and slices), as for trainers that report only wait_s."""
    from sigma.controller.detect.laggard import held_shares, waited_for_node

    rows = _held_rows(lambda t, n: 0.8 if n == "node1" else 0.55, lambda t, n: 0.0, t0=NOW - 30)
    for r in rows[::7]:
        if r["node"] == "node1":
            r["payload"] = {"wait_s": r["payload"]["wait_s"]}
    assert set(held_shares(rows)) == {"node2"}
    # the wait shares alone name node2 (busy 45 % against 20 %), though it is not held at all
    assert waited_for_node(["node1", "node2"], rows)[0] == "node2"
    # ... while with held shares for both, a node waited for but not held is not named
    full = _held_rows(lambda t, n: 0.8 if n == "node1" else 0.55, lambda t, n: 0.0, t0=NOW - 30)
    assert waited_for_node(["node1", "node2"], full)[0] is None
    # and the watchdog raises no straggler finding without held shares for every node
    assert check_job(job(nodes=("node1", "node2")), rows, NOW, CFG, ever_reported=True) == []


def test_a_run_s_start_up_is_no_straggler():
    """The first steps of a run carry each rank's start-up (one node's ranks slower to import, compile and read the
    data's first pages): until the run has stepped for STEADY_S, nothing is named; the same shares later are."""
    from sigma.controller.detect.laggard import STEADY_S

    wait = lambda t, n: 0.75 if n == "node2" else 0.4  # noqa: E731
    held = lambda t, n: 0.12 if n == "node1" else 0.03  # noqa: E731
    young = _held_rows(wait, held, t0=NOW - STEADY_S + 5)
    assert check_job(job(start=NOW - STEADY_S, nodes=("node1", "node2")), young, NOW, CFG, ever_reported=True) == []
    old = _held_rows(wait, held, t0=NOW - STEADY_S - 5)
    (f,) = check_job(job(start=NOW - STEADY_S - 10, nodes=("node1", "node2")), old, NOW, CFG, ever_reported=True)
    assert f.rule_id == "watchdog-straggler" and f.evidence["waited_for"] == "node1"


def test_a_node_whose_ranks_block_on_its_disk_is_no_straggler(tmp_path):
    """Another process saturates node2's disk: node2's ranks block on it 10 % of their time outside collectives and
    node1's ranks wait for them, as they would for a stopped node. Time blocked on the disk is the disk's noise (as
    a CPU taken by another process is contention), not a held node: no straggler finding and no drain, whether the
    rank says it (io_wait_s, delay accounting on) or only its major faults do. A stopped node that also reads its
    disk a little is still named."""
    from sigma.controller.detect.laggard import held_shares, waited_for_node

    wait = lambda t, n: 0.75 if n == "node1" and t >= NOW - 40 else 0.5  # noqa: E731
    disk = lambda t, n: 0.1 if n == "node2" and t >= NOW - 40 else 0.0  # noqa: E731
    two = job(nodes=("node1", "node2"))
    for io_wait in (True, False):
        rows = _held_rows(wait, lambda t, n: 0.03, disk=disk, io_wait=io_wait)
        recent = [r for r in rows if r["ts"] >= NOW - 30]
        # node2's own 3 % held: known with io_wait_s; a step with a storm of major faults counts off the CPU as disk
        held = {"node1": 0.03, "node2": 0.03 if io_wait else 0.0}
        assert {n: round(v, 3) for n, v in held_shares(recent).items()} == held
        # the node's disk stalls (PSI) come off only where the ranks do not say their own disk time
        with_psi = {n: round(v, 3) for n, v in held_shares(recent, {"node1": 0.1, "node2": 0.1}).items()}
        assert with_psi == (held if io_wait else {"node1": -0.07, "node2": -0.1})
        assert waited_for_node(["node1", "node2"], recent)[0] is None
        assert check_job(two, rows, NOW, CFG, ever_reported=True) == []
    stopped = _held_rows(wait, lambda t, n: 0.12 if n == "node2" and t >= NOW - 40 else 0.03,
                         disk=lambda t, n: 0.02 if n == "node2" else 0.0)
    (f,) = check_job(two, stopped, NOW, CFG, ever_reported=True)
    assert f.rule_id == "watchdog-straggler" and f.evidence["waited_for"] == "node2"

    # through the controller: ticks a window apart drain nothing
    ctl, slurm, clock = make_controller(tmp_path)
    slurm.run_job(1, ["node1", "node2"], start=clock() - 2000)
    now = clock()
    for r in _held_rows(lambda t, n: 0.75 if n == "node1" and t >= now - 40 else 0.5, lambda t, n: 0.03,
                        t0=now - 300, t1=now, disk=lambda t, n: 0.1 if n == "node2" and t >= now - 40 else 0.0):
        add_kpi(ctl.conn, r["node"], r["ts"], 1, r["rank"], r["step"], tokens_per_s=r["tokens_per_s"],
                step_time_s=r["step_time_s"], payload=r["payload"])
    for _ in range(3):
        ctl.tick()
        clock.advance(1)
    assert slurm.count("drain") == 0
    assert not [i for i in ctl.incidents.query() if i.rule_id in ("isolation-outlier", "watchdog-straggler")]


def _disk_stall_samples(ctl, now, share):
    """share(t, node) -> the share of each second some task on the node is stalled on I/O: its PSI counter
    (host.pressure.io.some.total_us) sampled every second over the last 5 minutes."""
    rows, total = [], {}
    for t in range(int(now) - 300, int(now) + 1):
        for n in ("node1", "node2"):
            total[n] = total.get(n, 0.0) + share(t, n) * 1e6
            rows.append((n, float(t), "host.pressure.io.some.total_us", total[n], "{}"))
    with ctl.conn:
        ctl.conn.executemany("INSERT INTO samples (node, ts, metric, value, labels) VALUES (?, ?, ?, ?, ?)", rows)


def test_disk_stall_shares_read_the_psi_counter_per_node():
    from sigma.controller.detect.laggard import disk_stall_shares

    buckets = [("node1", "host.pressure.io.some.total_us", 5, 20, 0, 0, 1e6, 5e6, NOW - 20, NOW),
               ("node2", "host.pressure.io.some.total_us", 5, 20, 0, 0, 1e6, 1e6, NOW - 20, NOW),
               ("node1", "host.pressure.io.some.total_us", 1, 20, 0, 0, 0.0, 9e6, NOW - 100, NOW - 80),  # too old
               ("node2", "host.cpu.util_pct", 5, 20, 0, 0, 0.0, 90.0, NOW - 20, NOW)]
    assert disk_stall_shares(buckets, NOW - 30) == {"node1": 0.2, "node2": 0.0}


def test_a_node_held_while_its_disk_stalls_is_not_drained_without_delay_accounting(tmp_path):
    """node2's ranks are blocked writing to a disk another process saturates: held 13 % of their time and waited
    for, with neither io_wait_s (delay accounting off) nor major faults to say it was the disk. The node's PSI says
    some task was stalled on I/O 20 % of the time: that comes off its held share, and nothing is drained. A stall
    both nodes share (one disk, or a host under the same I/O) leaves a stopped node named and drained."""
    wait = lambda now: lambda t, n: 0.75 if n == "node1" and t >= now - 40 else 0.5  # noqa: E731
    for stall, held_node2, drained in ((lambda t, n: 0.2 if n == "node2" else 0.0, 0.13, False),
                                       (lambda t, n: 0.1, 0.12, True)):
        (tmp_path / str(drained)).mkdir()
        ctl, slurm, clock = make_controller(tmp_path / str(drained))
        slurm.run_job(1, ["node1", "node2"], start=clock() - 2000)
        now = clock()
        for r in _held_rows(wait(now), lambda t, n: held_node2 if n == "node2" and t >= now - 40 else 0.03,
                            t0=now - 300, t1=now):
            add_kpi(ctl.conn, r["node"], r["ts"], 1, r["rank"], r["step"], tokens_per_s=r["tokens_per_s"],
                    step_time_s=r["step_time_s"], payload={k: v for k, v in r["payload"].items() if k != "io_wait_s"})
        _disk_stall_samples(ctl, now, stall)
        ctl.tick()
        clock.advance(1)
        ctl.tick()
        assert slurm.node("node2").drained == drained and not slurm.node("node1").drained
        if drained:
            (inc,) = [i for i in ctl.incidents.query() if i.rule_id == "isolation-outlier"]
            assert "disk stalled: node1 10%, node2 10%" in inc.evidence["isolation"]["reason"]


def _pipeline_rows(busy, held, dt=0.5, t0=NOW - 60, t1=NOW):
    """A 3-stage pipeline, one rank per node: busy(node) / held(node) -> the share of the step its rank computes
    its stage / is held off the CPU outside any wait; the rest of the step it waits for its neighbours in the
    schedule's exchanges (pipeline_s less stage_busy_s; blocked there, as a rank blocked in a receive is), a
    little in collectives (wait_s)."""
    rows, step, t = [], 0, t0
    nodes = ("node1", "node2", "node3")
    while t <= t1:
        for i, n in enumerate(nodes):
            b, h, w = busy(n) * dt, held(n) * dt, 0.05 * dt
            exchange = dt - b - h - w
            rows.append({"node": n, "ts": t, "job_id": 1, "rank": i, "step": step, "tokens_per_s": 1000.0,
                         "step_time_s": dt, "payload": {"wait_s": w, "blocked_s": w + exchange + h,
                                                        "pipeline_s": b + exchange, "stage_busy_s": b}})
        step, t = step + 1, t + dt
    return rows


def test_a_pipeline_s_busier_last_stage_is_no_straggler_and_a_held_one_is():
    """The last stage computes the head and the loss, so the others wait for it in every step: that is the
    pipeline, not a straggler. Its rank stopped 30 % of the time (held off the CPU) is one."""
    from sigma.controller.detect.laggard import wait_shares, waited_for_node

    nodes = ["node1", "node2", "node3"]
    usual = _pipeline_rows(lambda n: 0.45 if n == "node3" else 0.2, lambda n: 0.0)
    assert wait_shares(usual)["node3"] < min(wait_shares(usual)[n] for n in ("node1", "node2")) - 0.2
    assert waited_for_node(nodes, usual)[0] is None
    stopped = _pipeline_rows(lambda n: 0.45 if n == "node3" else 0.2, lambda n: 0.3 if n == "node3" else 0.0)
    assert waited_for_node(nodes, stopped)[0] == "node3"


def _straggler_decided(tmp_path, announce=True):
    """node2 drained as the straggler of a 2-node job whose trainer announces its starts (a start event)."""
    ctl, slurm, clock = make_controller(tmp_path)
    ctl.cfg.isolation.verify_after_s = 60
    _two_node_job(ctl, slurm, clock, slow_wait=lambda t, n: 0.4 if n == "node1" else 0.02)
    if announce:
        for n in ("node1", "node2"):
            add_event(ctl.conn, n, clock() - 900, source="kpi", kind="start", job_ids=[1])
    for _ in range(2):
        ctl.tick()
        clock.advance(1)
    (inc,) = [i for i in ctl.incidents.query() if i.rule_id == "isolation-outlier"]
    assert inc.node == "node2" and slurm.node("node2").drained
    return ctl, slurm, clock, inc


def _steps(ctl, clock, nodes, n, tokens_per_s):
    for k in range(n):
        clock.advance(2)
        for i, node in enumerate(nodes):
            add_kpi(ctl.conn, node, clock(), 1, i, 2000 + k, tokens_per_s=tokens_per_s, step_time_s=2.0)
        ctl.tick()


def test_verification_waits_for_a_restart_longer_than_verify_after_s(tmp_path):
    """A requeued job that takes longer than verify_after_s to load its checkpoint has shown nothing yet: the
    deadline counts from its restart (the trainer's start event), so a slow restart is no misdiagnosis."""
    ctl, slurm, clock, inc = _straggler_decided(tmp_path)
    slurm.set_job(1, state="RUNNING", nodes=("node1", "node3"), start_time=int(clock()) + 1)
    for _ in range(5):  # five minutes loading the checkpoint, five times verify_after_s
        clock.advance(60)
        ctl.tick()
    assert ctl.incidents.get(inc.id).status == "acted" and slurm.node("node2").drained
    for n in ("node1", "node3"):
        add_event(ctl.conn, n, clock(), source="kpi", kind="start", job_ids=[1])
    _steps(ctl, clock, ("node1", "node3"), 8, 500.0)
    assert ctl.incidents.get(inc.id).status == "confirmed"
    # a job whose trainer announces nothing is judged verify_after_s after the decision, as before
    (tmp_path / "quiet").mkdir()
    ctl, slurm, clock, inc = _straggler_decided(tmp_path / "quiet", announce=False)
    clock.advance(61)
    ctl.tick()
    assert ctl.incidents.get(inc.id).status == "misdiagnosed"


def test_a_run_with_another_culprit_says_nothing_about_the_first(tmp_path):
    """The requeued job landed on a second faulty node and isolation took that one out too: that run is no
    evidence against the first decision; the run after the second decision is."""
    ctl, slurm, clock, inc = _straggler_decided(tmp_path)
    slurm.set_job(1, state="RUNNING", nodes=("node1", "node3"), start_time=int(clock()) + 1)
    for n in ("node1", "node3"):
        add_event(ctl.conn, n, clock() + 1, source="kpi", kind="start", job_ids=[1])
    clock.advance(20)
    second = ctl.incidents.open(Finding(rule_id="isolation-outlier", source="isolation", scope="node",
                                        severity="error", action="drain", summary="node3 is the culprit",
                                        first_ts=clock(), last_ts=clock(), node="node3", job_id=1,
                                        category="isolation", evidence={"verify": {"job_id": 1, "baseline": 500}}),
                                "acted")
    _steps(ctl, clock, ("node1", "node3"), 40, 1000.0 / 3)  # slow: node3 is faulty too; 80 s, past the deadline
    assert ctl.incidents.get(inc.id).status == "acted"  # not misdiagnosed on node3's run
    slurm.set_job(1, state="RUNNING", nodes=("node1", "node4"), start_time=int(clock()) + 1)
    for n in ("node1", "node4"):
        add_event(ctl.conn, n, clock() + 1, source="kpi", kind="start", job_ids=[1])
    _steps(ctl, clock, ("node1", "node4"), 8, 500.0)
    assert ctl.incidents.get(inc.id).status == "confirmed" and ctl.incidents.get(second.id).status == "confirmed"


def test_a_declared_pause_is_no_hang_until_its_max_and_counts_as_progress():
    """sigma.kpi's paused(): an evaluation of 10 minutes with heartbeats is no hang; an open pause past its max_s is;
    the hang timer starts again at the pause's end."""
    rows = kpi_rows(["node1", "node2"], NOW - 900, NOW - 600)
    assert rule_ids(check_job(job(nodes=("node1", "node2")), rows, NOW, CFG, ever_reported=True)) == ["watchdog-hang"]
    open_pause = (NOW - 599, NOW - 599 + 900)
    assert check_job(job(nodes=("node1", "node2")), rows, NOW, CFG, ever_reported=True, pause=open_pause) == []
    past = (NOW - 599, NOW - 599 + 300)
    assert rule_ids(check_job(job(nodes=("node1", "node2")), rows, NOW, CFG, ever_reported=True,
                              pause=past)) == ["watchdog-hang"]
    ended = (NOW - 60, NOW - 60)  # the pause_end a minute ago: 60 s without a step since, under the timeout
    assert check_job(job(nodes=("node1", "node2")), rows, NOW, CFG, ever_reported=True, pause=ended) == []
