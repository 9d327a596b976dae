"""Faults one after another on one long training job: what a soak under load showed the controller must handle."""

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
    assert own_restarts(starts, node_requeues=[495.0, 890.0]) == [100.0, 1300.0]
    assert own_restarts(starts, node_requeues=[]) == starts
    assert own_restarts([100.0], node_requeues=[2000.0]) == [100.0]


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
