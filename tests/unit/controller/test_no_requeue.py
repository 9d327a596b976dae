"""A job submitted with --no-requeue (SLURM's Requeue=0) is never requeued by the controller: it is notified."""

from tests.unit.controller.helpers import add_event, make_controller, xid79


def test_job_rule_notifies_instead_of_requeueing_an_opted_out_job(tmp_path):
    ctl, slurm, clock = make_controller(tmp_path)
    slurm.run_job(9, ["node1"], start=clock() - 50)
    slurm.set_job(9, requeue=False)
    add_event(ctl.conn, "node1", clock() - 1, source="kpi", kind="nan_loss", job_ids=[9])
    ctl.tick()
    assert slurm.count("requeue") == 0
    (inc,) = ctl.incidents.query(job_id=9)
    assert inc.status == "notified"
    assert "opted out of requeue" in (tmp_path / "log" / "decisions.log").read_text()


def test_drained_node_keeps_an_opted_out_job_and_requeues_the_others(tmp_path):
    ctl, slurm, clock = make_controller(tmp_path)
    slurm.run_job(7, ["node2", "node3"], start=clock() - 100)
    slurm.run_job(8, ["node3"], start=clock() - 100)
    slurm.set_job(8, requeue=False)
    xid79(ctl.conn, "node3", clock() - 1)
    ctl.tick()
    assert slurm.node("node3").drained
    assert [c[1] for c in slurm.calls if c[0] == "requeue"] == [7]
