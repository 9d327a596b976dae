"""At scale the job checks take most of a tick: a known fault is acted on before they run, and each job's newest
data is read for all its nodes in one statement."""

from __future__ import annotations

from tests.unit.controller.helpers import add_kpi, make_controller, xid79


def test_a_known_fault_is_drained_before_the_job_checks_start(tmp_path):
    ctl, slurm, clock = make_controller(tmp_path)
    slurm.run_job(1, ["node1", "node2"], start=clock() - 600)
    for t in range(30):
        for rank, node in enumerate(("node1", "node2")):
            add_kpi(ctl.conn, node, clock() - 30 + t, 1, rank, t)
    xid79(ctl.conn, "node1", clock() - 1)
    seen = []
    watch = ctl._watch

    def watching(job, *a, **k):  # what the decisions table holds when the watchdog starts on a job
        seen.append([tuple(r) for r in ctl.conn.execute("SELECT kind, target, state FROM actions ORDER BY id")])
        return watch(job, *a, **k)

    ctl._watch = watching
    found = ctl.tick()
    assert seen and ("drain", "node1", "done") in seen[0]
    assert slurm.node("node1").drained
    assert [f.rule_id for f in found if f.node == "node1"] == ["gpu-xid-79"]
    incidents = ctl.conn.execute("SELECT rule_id, node, status FROM incidents").fetchall()
    assert [tuple(r) for r in incidents] == [("gpu-xid-79", "node1", "acted")]  # decided once, not again


def test_newest_data_per_node_in_one_read(tmp_path):
    ctl, _, clock = make_controller(tmp_path)
    with ctl.conn:
        ctl.conn.executemany("INSERT INTO samples (node, ts, metric, value) VALUES (?, ?, 'gpu.util', 1.0)",
                             [("node1", 10.0), ("node1", 30.0), ("node2", 20.0), ("node10", 5.0)])
    assert ctl._newest_data({"node1", "node2", "node3"}) == {"node1": 30.0, "node2": 20.0, "node3": None}
    assert ctl._newest_data(set()) == {}
