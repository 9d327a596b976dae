"""Before a requeue the controller asks the job's healthy nodes for a just-in-time checkpoint (through the ingest
reply and the sidecar's control file), waits for the answer up to jit_checkpoint_timeout_s, and records the steps
and time the fault cost once the new run is back."""

import json

from sigma.controller.act.jit import pending_for_node
from sigma.controller.report.losses import losses, record_losses
from sigma.controller.report.metrics import report
from sigma.telemetry.control import request_path, write_checkpoint_requests
from sigma.train.jit import read_request
from tests.unit.controller.helpers import add_event, add_kpi, make_controller, xid79


def running_trainer(ctl, slurm, clock, job_id=7, nodes=("node2", "node3"), steps=10, poll=1):
    slurm.run_job(job_id, list(nodes), start=clock() - 100)
    for rank, node in enumerate(nodes):
        add_event(ctl.conn, node, clock() - 90, source="kpi", kind="start", fields={"step": 0, "jit_poll_every": poll},
                  job_ids=[job_id])
        for step in range(1, steps + 1):
            add_kpi(ctl.conn, node, clock() - steps - 1 + step, job_id, rank, step)


def test_requeue_waits_for_the_checkpoint_asked_of_the_healthy_node(tmp_path):
    ctl, slurm, clock = make_controller(tmp_path)
    running_trainer(ctl, slurm, clock)
    xid79(ctl.conn, "node3", clock() - 1)
    ctl.tick()
    assert slurm.node("node3").drained
    assert slurm.count("requeue") == 0  # waiting for the checkpoint
    rows = ctl.conn.execute("SELECT job_id, node, deadline FROM checkpoint_requests").fetchall()
    assert [(r[0], r[1]) for r in rows] == [(7, "node2")]  # the bad node is not asked
    assert rows[0][2] == clock() + 30.0

    # the ingest reply carries it to node2's sidecar, which writes the trainer's control file
    (req,) = pending_for_node(ctl.conn, "node2", clock())
    assert pending_for_node(ctl.conn, "node3", clock()) == []
    kpi_dir = tmp_path / "kpi"
    assert write_checkpoint_requests(kpi_dir, "node2", [req]) == []
    assert read_request(request_path(kpi_dir, 7, "node2"), clock()) == (req["id"], clock() + 30.0)

    clock.advance(2)
    ctl.tick()
    assert slurm.count("requeue") == 0
    # a rank answers (the rank on node3 learnt the request from node2's through the all-reduce)
    add_event(ctl.conn, "node3", clock(), source="kpi", kind="checkpoint", job_ids=[7],
              fields={"step": 11, "kind": "jit", "request": req["id"]})
    clock.advance(1)
    ctl.tick()
    assert slurm.count("requeue") == 1
    (row,) = ctl.conn.execute("SELECT result FROM actions WHERE kind = 'requeue'").fetchall()
    assert "just-in-time checkpoint of step 11 saved" in row[0]
    assert ctl.conn.execute("SELECT ack_step FROM checkpoint_requests").fetchone()[0] == 11
    assert pending_for_node(ctl.conn, "node2", clock()) == []  # answered: no longer handed out


def test_no_answer_requeues_when_the_deadline_passes(tmp_path):
    ctl, slurm, clock = make_controller(tmp_path)
    running_trainer(ctl, slurm, clock)
    xid79(ctl.conn, "node3", clock() - 1)
    ctl.tick()
    clock.advance(29)
    ctl.tick()
    assert slurm.count("requeue") == 0
    clock.advance(2)
    ctl.tick()
    assert slurm.count("requeue") == 1
    result = ctl.conn.execute("SELECT result FROM actions WHERE kind = 'requeue'").fetchone()[0]
    assert "no just-in-time checkpoint within 30.0s" in result


def test_a_trainer_that_does_not_poll_is_requeued_at_once(tmp_path):
    ctl, slurm, clock = make_controller(tmp_path)
    running_trainer(ctl, slurm, clock, poll=0)
    xid79(ctl.conn, "node3", clock() - 1)
    ctl.tick()
    assert slurm.count("requeue") == 1
    assert ctl.conn.execute("SELECT COUNT(*) FROM checkpoint_requests").fetchone()[0] == 0


def test_sidecar_reports_a_malformed_request_and_writes_the_rest(tmp_path):
    problems = write_checkpoint_requests(tmp_path, "node1", [{"id": 1}, {"id": 2, "job_id": 5, "deadline": 9.0}])
    assert len(problems) == 1 and "malformed" in problems[0]
    assert json.loads(request_path(tmp_path, 5, "node1").read_text()) == {"id": 2, "job_id": 5, "deadline": 9.0}


def test_steps_and_time_lost_are_recorded_once_the_job_is_back(tmp_path):
    ctl, slurm, clock = make_controller(tmp_path)
    running_trainer(ctl, slurm, clock, steps=10)
    fault = clock() - 1
    xid79(ctl.conn, "node3", fault)
    ctl.tick()
    req = ctl.conn.execute("SELECT id FROM checkpoint_requests").fetchone()[0]
    add_event(ctl.conn, "node2", clock(), source="kpi", kind="checkpoint", job_ids=[7],
              fields={"step": 10, "kind": "jit", "request": req})
    clock.advance(1)
    ctl.tick()
    assert slurm.count("requeue") == 1
    assert record_losses(ctl.conn, clock()) == 0  # the new run has not started
    # the new run on node1 + node2 resumes from the just-in-time checkpoint of step 10
    clock.advance(5)
    for rank, node in enumerate(("node1", "node2")):
        add_event(ctl.conn, node, clock(), source="kpi", kind="resume", job_ids=[7],
                  fields={"step": 10, "checkpoint_kind": "jit"})
        add_event(ctl.conn, node, clock() + 0.1, source="kpi", kind="start", job_ids=[7], fields={"step": 10})
    assert record_losses(ctl.conn, clock()) == 0  # not back yet
    add_kpi(ctl.conn, "node1", clock() + 1, 7, 0, 11)
    assert record_losses(ctl.conn, clock() + 2) == 1
    assert record_losses(ctl.conn, clock() + 3) == 0  # once
    lost = losses(ctl.conn, 0)
    (f,) = lost["faults"]
    assert (f["step_reached"], f["resume_step"], f["steps_lost"], f["source"]) == (10, 10, 0, "jit")
    assert f["time_lost_s"] == round(clock() + 1 - fault, 2)
    assert lost["total"]["steps_lost"] == 0 and lost["jobs"][0]["faults"] == 1
    assert report(ctl.conn, since=0, now=clock() + 5)["losses"]["total"]["faults"] == 1
    explained = explain(tmp_path, ctl, f["incident"])
    assert "job 7: 0 step(s) lost (reached 10, resumed from a jit checkpoint of step 10)" in explained
    assert "requeued; just-in-time checkpoint of step 10 saved" in explained


def explain(tmp_path, ctl, incident):
    import subprocess
    import sys

    ctl.conn.commit()
    proc = subprocess.run([sys.executable, "-m", "sigma.cli", "explain", str(incident), "--db", ctl.cfg.db],
                          capture_output=True, text=True, env={**__import__("os").environ, "COLUMNS": "250"})
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_a_resume_from_an_older_checkpoint_counts_the_redone_steps(tmp_path):
    ctl, slurm, clock = make_controller(tmp_path)
    running_trainer(ctl, slurm, clock, steps=18, poll=0)
    xid79(ctl.conn, "node3", clock() - 1)
    ctl.tick()
    clock.advance(5)
    add_event(ctl.conn, "node1", clock(), source="kpi", kind="resume", job_ids=[7], fields={"step": 10})
    add_event(ctl.conn, "node1", clock() + 0.1, source="kpi", kind="start", job_ids=[7], fields={"step": 10})
    for step in range(11, 19):
        add_kpi(ctl.conn, "node1", clock() + step - 10, 7, 0, step)
    assert record_losses(ctl.conn, clock() + 20) == 1
    (f,) = losses(ctl.conn, 0)["faults"]
    assert (f["steps_lost"], f["source"]) == (8, "periodic")
    assert f["time_lost_s"] == round(clock() + 8 - f["fault_ts"], 2)


def test_a_trainer_that_stopped_on_nan_is_not_waited_for(tmp_path):
    ctl, slurm, clock = make_controller(tmp_path)
    running_trainer(ctl, slurm, clock)
    # every rank stops on the NaN (saving its last healthy step first) while SLURM still shows the job running
    add_event(ctl.conn, "node2", clock() - 1, source="kpi", kind="nan_loss", job_ids=[7], fields={"step": 11})
    ctl.tick()
    assert slurm.count("requeue") == 1
    assert ctl.conn.execute("SELECT COUNT(*) FROM checkpoint_requests").fetchone()[0] == 0


def test_a_hung_job_is_requeued_without_asking(tmp_path):
    ctl, slurm, clock = make_controller(tmp_path)
    running_trainer(ctl, slurm, clock)
    clock.advance(31)  # no step for longer than the timeout: the ranks are stuck and could not save
    xid79(ctl.conn, "node3", clock() - 1)
    ctl.tick()
    assert slurm.count("requeue") == 1
    assert ctl.conn.execute("SELECT COUNT(*) FROM checkpoint_requests").fetchone()[0] == 0


def hung_trainer(ctl, slurm, clock, nodes=("node2", "node3")):
    """A job whose trainer answers while blocked (replicas on) and has made no step for longer than the timeout."""
    running_trainer(ctl, slurm, clock, nodes=nodes)
    for node in nodes:
        add_event(ctl.conn, node, clock() - 89, source="kpi", kind="start", job_ids=[7],
                  fields={"step": 0, "jit_poll_every": 1, "jit_when_blocked": True})
    clock.advance(31)


def blocked_answer(ctl, clock, node, req, ranks, missing=()):
    add_event(ctl.conn, node, clock(), source="kpi", kind="checkpoint", job_ids=[7],
              fields={"step": 10, "kind": "jit-blocked", "request": req, "blocked": True, "ranks": list(ranks),
                      "missing": list(missing)})


def test_a_hung_job_whose_ranks_answer_while_blocked_is_asked_and_waited_for(tmp_path):
    ctl, slurm, clock = make_controller(tmp_path)
    hung_trainer(ctl, slurm, clock)
    xid79(ctl.conn, "node3", clock() - 1)  # the node of the hung rank is taken out: only node2 is asked
    ctl.tick()
    assert slurm.count("requeue") == 0
    (req,) = [r[0] for r in ctl.conn.execute("SELECT id FROM checkpoint_requests WHERE node = 'node2'")]
    blocked_answer(ctl, clock, "node2", req, ranks=[0, 1])
    clock.advance(1)
    ctl.tick()
    assert slurm.count("requeue") == 1
    result = ctl.conn.execute("SELECT result FROM actions WHERE kind = 'requeue'").fetchone()[0]
    assert "just-in-time checkpoint of step 10 saved while the job was blocked by a hung rank" in result
    assert "the hung rank's from its peer replica" in result


def test_answers_while_blocked_count_once_every_asked_node_gave_one(tmp_path):
    ctl, slurm, clock = make_controller(tmp_path)
    hung_trainer(ctl, slurm, clock, nodes=("node1", "node2", "node3"))
    xid79(ctl.conn, "node3", clock() - 1)
    ctl.tick()
    ids = dict(ctl.conn.execute("SELECT node, id FROM checkpoint_requests").fetchall())
    assert sorted(ids) == ["node1", "node2"]
    blocked_answer(ctl, clock, "node1", ids["node1"], ranks=[0], missing=[2])
    clock.advance(1)
    ctl.tick()
    assert slurm.count("requeue") == 0  # node2's ranks are still writing theirs
    blocked_answer(ctl, clock, "node2", ids["node2"], ranks=[1])
    clock.advance(1)
    ctl.tick()
    assert slurm.count("requeue") == 1
    result = ctl.conn.execute("SELECT result FROM actions WHERE kind = 'requeue'").fetchone()[0]
    assert "rank(s) 2 not kept; the resume takes the newest complete replica set or the periodic checkpoint" in result
