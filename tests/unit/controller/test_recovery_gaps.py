"""Faults one after another on one long training job: what a soak under load showed the controller must handle."""

import json

from sigma.controller.loop import own_restarts

from tests.unit.controller.helpers import make_controller, xid79


def test_requeues_for_bad_nodes_do_not_make_a_crash_loop(tmp_path):
    ctl, slurm, clock = make_controller(tmp_path)
    ctl.cfg.watchdog.crash_loop_restarts = 1  # one restart of the job's own making would already be a loop
    slurm.run_job(7, ["node2", "node3"], start=clock() - 100)
    for bad, next_nodes in (("node3", ("node1", "node2")), ("node2", ("node1", "node4"))):
        xid79(ctl.conn, bad, clock() - 1)
        ctl.tick()
        slurm.set_job(7, state="RUNNING", nodes=next_nodes, start_time=int(clock()) + 1)
        clock.advance(30)
    assert slurm.count("requeue") == 2
    assert [i.status for i in ctl.incidents.query()] == ["acted", "acted"]


def test_restarts_after_node_requeues_are_not_the_jobs_own():
    starts = [100.0, 500.0, 900.0, 1300.0]  # first start, then three restarts
    assert own_restarts(starts, our_requeues=[495.0, 890.0]) == [100.0, 1300.0]
    assert own_restarts(starts, our_requeues=[]) == starts
    assert own_restarts([100.0], our_requeues=[2000.0]) == [100.0]


def test_a_job_that_stopped_on_a_nan_loss_is_requeued(tmp_path):
    from tests.unit.controller.helpers import add_event

    ctl, slurm, clock = make_controller(tmp_path)
    slurm.run_job(9, ["node1", "node2"], start=clock() - 50)
    slurm.set_job(9, state="FAILED")  # the trainer stops on the NaN loss before the controller's next tick
    add_event(ctl.conn, "node1", clock() - 1, source="kpi", kind="nan_loss", job_ids=[9])
    ctl.tick()
    assert slurm.count("requeue") == 1 and slurm.job(9).state == "PENDING"
    assert ctl.incidents.query(job_id=9)[0].status == "acted"
    assert not any(n.drained for n in slurm.nodes())


def test_a_failed_job_is_not_requeued_for_a_node_fault(tmp_path):
    ctl, slurm, clock = make_controller(tmp_path)
    slurm.run_job(9, ["node3"], start=clock() - 50)
    slurm.set_job(9, state="FAILED")
    xid79(ctl.conn, "node3", clock() - 1)
    ctl.tick()
    assert slurm.count("drain") == 1 and slurm.count("requeue") == 0


def test_the_silent_node_is_the_hung_one():
    from sigma.controller.detect.laggard import silent_node

    now = 1000.0
    assert silent_node(["node1", "node2"], {"node1": 998.0, "node2": 970.0}, now) == "node2"
    assert silent_node(["node1", "node2"], {"node1": 970.0, "node2": 970.0}, now) is None  # both: job-wide
    assert silent_node(["node1", "node2"], {"node1": 998.0, "node2": 997.0}, now) is None  # both alive
    assert silent_node(["node1", "node2"], {}, now) is None  # a trainer without heartbeats: no claim


def _kpi(node, step_time, wait, ts=0.0):
    return {"node": node, "ts": ts, "step_time_s": step_time, "payload": json.dumps({"wait_s": wait})}


def _steps(pairs, n=10):
    """n synchronous steps, one second apart; pairs: ((node, step_time, wait), ...) per step."""
    return [_kpi(node, st, w, float(t)) for t in range(n) for node, st, w in pairs]


def test_the_node_the_others_wait_for_is_the_straggler():
    from sigma.controller.detect.laggard import waited_for_node

    slow = _steps((("node1", 1.0, 0.75), ("node2", 1.0, 0.02)))
    assert waited_for_node(["node1", "node2"], slow)[0] == "node2"
    stopped_in_collectives = _steps((("node1", 1.0, 0.8), ("node2", 1.0, 0.37)))  # measured under SIGSTOP
    assert waited_for_node(["node1", "node2"], stopped_in_collectives)[0] == "node2"
    assert waited_for_node(["node1", "node2"], _steps((("node1", 1.0, 0.6), ("node2", 1.0, 0.5))))[0] is None
    even = _steps((("node1", 0.2, 0.03), ("node2", 0.2, 0.02)))  # a job-wide slowdown: nobody waits much
    assert waited_for_node(["node1", "node2"], even)[0] is None
    assert waited_for_node(["node1", "node2"], slow[:1])[0] is None  # a node without KPIs: no claim
    assert waited_for_node(["node1", "node2"], [dict(k, ts=None) for k in slow])[0] is None  # no time: no claim


def test_a_30_percent_straggler_among_many_fast_steps_is_waited_for():
    """Stopped 0.3 s of every second: one long step and many fast ones a second. Counted by steps the others
    hardly wait; counted by time they wait 30 %."""
    from sigma.controller.detect.laggard import waited_for_node

    rows = []
    for t in range(30):
        rows += [_kpi("node1", 0.35, 0.31, t), _kpi("node2", 0.35, 0.01, t)]
        rows += [_kpi(n, 0.05, 0.005, t + 0.4 + i / 20) for i in range(12) for n in ("node1", "node2")]
    assert waited_for_node(["node1", "node2"], rows)[0] == "node2"


def test_load_that_moves_between_nodes_names_nobody():
    """Another process takes the CPU from one node's ranks, then from the other's: on average one side waited
    more, but not all along, so no node is named."""
    from sigma.controller.detect.laggard import waited_for_node

    rows = []
    for t in range(30):
        hit = "node2" if t % 9 < 6 else "node1"  # two thirds of the time node2's ranks lose the CPU
        rows += [_kpi(n, 1.0, 0.05 if n == hit else 0.6, t) for n in ("node1", "node2")]
    from sigma.controller.detect.laggard import wait_shares

    shares = wait_shares(rows)
    assert shares["node1"] - shares["node2"] >= 0.15  # the average alone would name node2
    assert waited_for_node(["node1", "node2"], rows)[0] is None


def test_a_two_node_hang_drains_the_node_that_stopped_beating(tmp_path):
    from tests.unit.controller.helpers import add_event, add_kpi

    ctl, slurm, clock = make_controller(tmp_path)
    ctl.cfg.watchdog.hang_timeout_s = 20
    now = clock()
    slurm.run_job(5, ["node1", "node2"], start=now - 200)
    for i in range(100):  # healthy steps, then both ranks stop stepping at t-60
        for rank, node in enumerate(("node1", "node2")):
            add_kpi(ctl.conn, node, now - 160 + i, 5, rank, i + 1)
    for t in range(0, 200, 5):  # node1 keeps beating, node2 stopped at t-60
        add_event(ctl.conn, "node1", now - 200 + t, source="kpi", kind="heartbeat", job_ids=[5])
        if t < 140:
            add_event(ctl.conn, "node2", now - 200 + t, source="kpi", kind="heartbeat", job_ids=[5])
    for _ in range(3):
        ctl.tick()
        clock.advance(1)
    assert slurm.node("node2").drained and not slurm.node("node1").drained
    inc = ctl.incidents.query(node="node2")[0]
    assert inc.rule_id == "watchdog-hang" and "heartbeat" in inc.evidence["isolation"]["reason"]


def test_a_node_whose_slurmd_stops_answering_is_drained_and_its_job_restarted(tmp_path):
    ctl, slurm, clock = make_controller(tmp_path)
    slurm.run_job(4, ["node1", "node2"], start=clock() - 100)
    slurm.set_node("node2", flags=("NOT_RESPONDING",))
    ctl.tick()
    assert slurm.node("node2").drained and slurm.count("requeue") == 1
    inc = ctl.incidents.query(node="node2")[0]
    assert inc.rule_id == "slurm-node-not-responding" and inc.status == "acted"
    assert ctl.remediator.get("node2").playbook == "manual"
    ctl.tick()
    assert slurm.count("drain") == 1  # one incident while it stays down


def test_our_own_reboot_is_not_a_dead_node(tmp_path):
    ctl, slurm, clock = make_controller(tmp_path)
    slurm.set_node("node3", flags=("NOT_RESPONDING", "REBOOT_ISSUED"))
    ctl.tick()
    assert slurm.count("drain") == 0 and ctl.incidents.query() == []


def test_the_node_left_behind_is_the_hung_one():
    from sigma.controller.detect.laggard import behind_node

    ranks = {"0": {"node": "node1"}, "1": {"node": "node1"}, "2": {"node": "node2"}, "3": {"node": "node3"}}
    assert behind_node({"node2": [2]}, ranks) == "node2"
    assert behind_node({"node1": [0, 1]}, ranks) == "node1"
    assert behind_node({"node1": [0]}, ranks) is None  # one of its ranks reached the step: not stuck as a node
    assert behind_node({"node1": [0, 1], "node2": [2]}, ranks) is None  # two nodes behind: no single culprit
    assert behind_node({}, ranks) is None


def test_heartbeats_are_read_only_once_each_node_is_clearly_alive_or_silent():
    from sigma.controller.detect.laggard import heartbeats_settled

    now = 1000.0
    assert heartbeats_settled(["node1", "node2"], {}, now)  # no heartbeats: nothing to wait for
    assert heartbeats_settled(["node1", "node2"], {"node1": 998.0, "node2": 970.0}, now)
    assert not heartbeats_settled(["node1", "node2"], {"node1": 998.0, "node2": 987.0}, now)  # node2 may be stopping
