"""Decisions through the guard rails, the journal's crash safety and the remediation state machine."""

import json

import pytest

from sigma.controller.act.journal import Journal
from sigma.controller.config import Playbook, RemediationConfig, ValidationConfig
from sigma.controller.db import open_db
from sigma.controller.act.guards import breaker_limit, breaker_trips, crash_looping

from tests.unit.controller.helpers import add_event, make_controller, xid79


def actions(conn, kind=None):
    sql = "SELECT kind, target, state FROM actions" + (" WHERE kind = ?" if kind else "") + " ORDER BY id"
    return [tuple(r) for r in conn.execute(sql, (kind,) if kind else ())]


def test_xid79_drains_requeues_and_starts_the_job_on_other_nodes(tmp_path):
    ctl, slurm, clock = make_controller(tmp_path)
    slurm.run_job(7, ["node2", "node3"], start=clock() - 100)
    xid79(ctl.conn, "node3", clock() - 1)
    ctl.tick()
    node3 = slurm.node("node3")
    assert node3.drained and node3.reason.startswith("sigma: gpu-xid-79 ")
    assert slurm.job(7).state == "PENDING" and slurm.count("requeue") == 1
    assert slurm.count("start_now") == 1  # node3 already drained, job pending: BeginTime cleared
    inc = ctl.incidents.query(node="node3")[0]
    assert inc.status == "acted" and inc.rule_id == "gpu-xid-79" and inc.evidence["events"][0]["fields"]["xid"] == 79
    ctl.tick()
    ctl.tick()
    assert slurm.count("drain") == 1 and slurm.count("requeue") == 1  # same evidence: nothing twice
    log = (tmp_path / "log" / "decisions.log").read_text()
    assert "DRAIN node3 (gpu-xid-79)" in log and "requeued [7]" in log
    assert json.loads((tmp_path / "log" / "controller.jsonl").read_text().splitlines()[-1])


def test_admin_drained_node_is_left_alone_and_never_resumed(tmp_path):
    ctl, slurm, clock = make_controller(tmp_path)
    slurm.set_node("node4", flags=("DRAIN",), reason="admin: bad fan")
    xid79(ctl.conn, "node4", clock() - 1)
    ctl.tick()
    assert slurm.count("drain") == 0 and slurm.count("resume") == 0
    assert ctl.incidents.query(node="node4")[0].status == "notified"
    assert ctl.remediator.get("node4") is None


def test_admin_takes_over_during_remediation(tmp_path):
    ctl, slurm, clock = make_controller(tmp_path)
    xid79(ctl.conn, "node3", clock() - 1)
    ctl.tick()
    slurm.set_node("node3", reason="admin: sending to vendor")
    ctl.tick()
    assert ctl.remediator.get("node3").state == "admin"
    for _ in range(3):
        clock.advance(400)
        ctl.tick()
    assert slurm.count("resume") == 0 and slurm.count("reboot") == 0


def test_circuit_breaker_escalates_instead_of_draining_every_node(tmp_path):
    ctl, slurm, clock = make_controller(tmp_path)  # max_nodes=2, max_fraction=0.5 of 4 nodes -> 2
    for node in ("node1", "node2", "node3", "node4"):
        xid79(ctl.conn, node, clock() - 1)
    ctl.tick()
    drained = [n.name for n in slurm.nodes() if n.drained]
    assert len(drained) == 2
    statuses = sorted(i.status for i in ctl.incidents.query())
    assert statuses == ["acted", "acted", "escalated", "escalated"]
    assert "BREAKER" in (tmp_path / "log" / "decisions.log").read_text()


def test_breaker_limit_is_the_smaller_limit_and_at_least_one():
    assert breaker_limit(4, 8, 0.25) == 1
    assert breaker_limit(1000, 8, 0.25) == 8
    assert breaker_limit(2, 8, 0.1) == 1
    assert not breaker_trips("n1", [], 4, 8, 0.25)
    assert breaker_trips("n2", ["n1"], 4, 8, 0.25)
    assert not breaker_trips("n1", ["n1"], 4, 8, 0.25)
    assert crash_looping([0, 10, 20], 30, 3, 100) and not crash_looping([0, 10, 200], 230, 3, 100)


def test_shadow_mode_records_but_does_not_act(tmp_path):
    ctl, slurm, clock = make_controller(tmp_path)
    ctl.cfg.shadow_rules = ["gpu-xid-79"]
    slurm.run_job(7, ["node3"], start=clock() - 100)
    xid79(ctl.conn, "node3", clock() - 1)
    ctl.tick()
    assert slurm.calls == []
    assert ctl.incidents.query()[0].status == "shadow"
    assert actions(ctl.conn) == [("drain", "node3", "shadow"), ("requeue", "7", "shadow")]
    assert "SHADOW node3 (gpu-xid-79): would drain" in (tmp_path / "log" / "decisions.log").read_text()


def test_observe_mode_changes_nothing_in_slurm_but_act_rules_act(tmp_path):
    """Observe mode: every action any code path plans is recorded, none runs (drain, requeue, release of held jobs);
    a rule of act_rules acts, and its node goes through remediation as in act mode."""
    ctl, slurm, clock = make_controller(tmp_path)
    ctl.cfg.mode = "observe"
    slurm.run_job(7, ["node3"], start=clock() - 100)
    slurm.run_job(5, ["node1"])
    slurm.set_job(5, state="PENDING", reason="launch failed requeued held", restarts=1, nodes=())
    xid79(ctl.conn, "node3", clock() - 1)
    ctl.tick()
    assert slurm.calls == []
    assert actions(ctl.conn) == [("drain", "node3", "shadow"), ("requeue", "7", "shadow"), ("release", "5", "shadow")]
    assert "observe mode" in ctl.incidents.query(node="node3")[0].status_note
    ctl.cfg.act_rules = ["gpu-xid-79"]  # the rule enabled alone (a reload does the same)
    clock.advance(700)  # node3's Xid has left the rule's window: closed, not acted on (test_observe_to_act.py)
    xid79(ctl.conn, "node2", clock() - 1)
    assert run_until(ctl, clock, lambda: slurm.count("reboot") == 1)
    assert slurm.node("node2").drained and not slurm.node("node3").drained and slurm.count("release") == 0
    ctl.cfg.mode = "act"  # what was only observed and is still wanted now runs: the held job is released
    ctl.tick()
    assert slurm.count("release") == 1 and ("release", "5", "done") in actions(ctl.conn)


def test_a_node_without_kernel_log_is_said_in_the_controllers_log(tmp_path):
    ctl, slurm, clock = make_controller(tmp_path)
    add_event(ctl.conn, "node2", clock() - 1, source="sidecar", kind="kernel_log_unavailable", severity="error",
              fields={"source": "none", "reasons": {"journal": "permission denied", "/dev/kmsg": "not there"}})
    add_event(ctl.conn, "node3", clock() - 1, source="sidecar", kind="kernel_log_source", fields={"source": "journal"})
    ctl.tick()
    log = (tmp_path / "log" / "decisions.log").read_text()
    assert ("DEGRADED node2: kernel-log fault detection is OFF, its sidecar reads no kernel log (journal: permission "
            "denied; /dev/kmsg: not there)") in log and "node3" not in log
    clock.advance(60)
    add_event(ctl.conn, "node2", clock() - 1, source="sidecar", kind="kernel_log_source", fields={"source": "kmsg"})
    ctl.tick()
    assert "RESTORED node2: kernel log from kmsg" in (tmp_path / "log" / "decisions.log").read_text()


def test_the_start_line_says_the_mode(tmp_path):
    ctl, slurm, clock = make_controller(tmp_path)
    ctl.cfg.mode, ctl.cfg.act_rules = "observe", ["gpu-xid-79"]
    ctl.start()
    assert ("START controller in OBSERVE mode: records what it would do (drain, requeue, remediate) and changes "
            "nothing in SLURM; acting rules: gpu-xid-79") in (tmp_path / "log" / "decisions.log").read_text()


def test_older_shadow_key_means_observe_mode(tmp_path):
    from sigma.config import ConfigError
    from sigma.controller.config import load_controller_config

    path = tmp_path / "c.yaml"
    path.write_text("shadow: true\n")
    assert load_controller_config(path).mode == "observe"
    path.write_text("mode: watch\n")
    with pytest.raises(ConfigError, match="mode"):
        load_controller_config(path)
    path.write_text("act_rules: [a]\nshadow_rules: [a]\n")
    with pytest.raises(ConfigError, match="both act_rules and shadow_rules"):
        load_controller_config(path)


def test_record_only_rule_does_nothing_to_slurm(tmp_path):
    ctl, slurm, clock = make_controller(tmp_path)
    add_event(ctl.conn, "node2", clock() - 1, kind="xid", fields={"xid": 63})
    ctl.tick()
    assert slurm.calls == [] and ctl.incidents.query()[0].status == "recorded"


def test_journal_replays_an_action_planned_before_a_crash(tmp_path):
    ctl, slurm, clock = make_controller(tmp_path)
    ctl.journal.plan("drain:node2:i1", "drain", "node2", params={"reason": "gpu-xid-79 test"})
    assert slurm.count("drain") == 0  # "crash" here: planned, never run
    ctl2, _, _ = make_controller(tmp_path, slurm=slurm, clock=clock)  # restart over the same database
    ctl2.start()
    assert slurm.count("drain") == 1 and slurm.node("node2").drained
    assert ctl2.journal.get("drain:node2:i1").state == "done"
    ctl2.start()
    assert slurm.count("drain") == 1


def test_journal_does_not_repeat_an_action_that_ran_before_the_crash(tmp_path):
    ctl, slurm, clock = make_controller(tmp_path)
    slurm.run_job(7, ["node3"], start=clock() - 100)
    ctl.journal.plan("requeue:7:i1", "requeue", "7", params={"restarts_before": 0})
    slurm.requeue(7)  # the command ran, then the controller died before marking it done
    ctl2, _, _ = make_controller(tmp_path, slurm=slurm, clock=clock)
    ctl2.start()
    assert slurm.count("requeue") == 1
    assert ctl2.journal.get("requeue:7:i1").result.startswith("already requeued")


def test_crash_after_decision_before_drain_is_finished_on_restart(tmp_path):
    ctl, slurm, clock = make_controller(tmp_path)
    slurm.run_job(7, ["node3"], start=clock() - 100)
    xid79(ctl.conn, "node3", clock() - 1)
    slurm.fail_next = "drain"  # the drain command dies with the controller ...
    ctl.journal.replay = lambda: []  # ... which does not live to retry it
    ctl.tick()
    assert ctl.journal.get("drain:node3:i1").state == "planned"
    assert not slurm.node("node3").drained
    ctl2, _, _ = make_controller(tmp_path, slurm=slurm, clock=clock)
    ctl2.start()
    ctl2.tick()
    assert slurm.node("node3").drained and slurm.count("requeue") == 1
    assert len(ctl2.incidents.query()) == 1


def test_failing_action_is_retried_then_marked_failed(tmp_path):
    conn = open_db(tmp_path / "j.db")
    calls = []

    def boom(kind, target, params, key):
        calls.append(key)
        raise RuntimeError("slurmctld unreachable")
    j = Journal(conn, boom, max_attempts=3)
    j.run("k", "drain", "node1")
    for _ in range(5):
        j.replay()
    assert len(calls) == 3 and j.get("k").state == "failed"


def test_requeue_only_rule_restarts_job_and_stops_on_crash_loop(tmp_path):
    ctl, slurm, clock = make_controller(tmp_path)
    ctl.cfg.watchdog.crash_loop_restarts = 2
    slurm.run_job(9, ["node1"], start=clock() - 50)
    for round_ in range(3):
        add_event(ctl.conn, "node1", clock() - 1, source="kpi", kind="nan_loss", job_ids=[9])
        ctl.tick()
        slurm.set_job(9, state="RUNNING", nodes=("node1",), start_time=int(clock()) + 1)
        clock.advance(10)
    assert slurm.count("requeue") == 2
    statuses = [i.status for i in ctl.incidents.query(job_id=9)]
    assert statuses == ["acted", "acted", "escalated"]
    assert not any(n.drained for n in slurm.nodes())
    # the job is crash-looping, but a bad node under it is still taken out and the job moved off it
    clock.advance(10)
    xid79(ctl.conn, "node1", clock() - 1)
    ctl.tick()
    assert slurm.node("node1").drained and slurm.count("requeue") == 3


def test_unrelated_job_faults_are_not_a_crash_loop(tmp_path):
    """A NCCL timeout, then a NaN, then a NCCL timeout again within the hour: three faults of two kinds, each
    requeued; the crash loop is the same fault coming back (crash_loop_restarts of them)."""
    ctl, slurm, clock = make_controller(tmp_path)
    ctl.cfg.watchdog.crash_loop_restarts = 2
    slurm.run_job(9, ["node1"], start=clock() - 50)
    for kind, source in (("nccl_timeout", "log"), ("nan_loss", "kpi"), ("nccl_timeout", "log"),
                         ("nan_loss", "kpi"), ("nan_loss", "kpi")):
        add_event(ctl.conn, "node1", clock() - 1, source=source, kind=kind, job_ids=[9])
        ctl.tick()
        slurm.set_job(9, state="RUNNING", nodes=("node1",), start_time=int(clock()) + 1)
        clock.advance(400)  # past the rules' windows, well inside the crash-loop window
    assert [(i.rule_id, i.status) for i in ctl.incidents.query(job_id=9)] == [
        ("nccl-watchdog-timeout", "acted"), ("kpi-nan-loss-event", "acted"), ("nccl-watchdog-timeout", "acted"),
        ("kpi-nan-loss-event", "acted"), ("kpi-nan-loss-event", "escalated")]
    assert slurm.count("requeue") == 4


def test_a_requeue_a_node_fault_explains_is_not_the_jobs_failure(tmp_path):
    """NaN twice on a run whose node was then drained for an Xid: the NaNs were the node's, not the job's."""
    ctl, slurm, clock = make_controller(tmp_path)
    ctl.cfg.watchdog.crash_loop_restarts = 1
    slurm.run_job(9, ["node1", "node2"], start=clock() - 50)
    add_event(ctl.conn, "node1", clock() - 1, source="kpi", kind="nan_loss", job_ids=[9])
    ctl.tick()
    slurm.set_job(9, state="RUNNING", nodes=("node1", "node2"), start_time=int(clock()) + 1)
    clock.advance(60)
    xid79(ctl.conn, "node2", clock() - 1)  # the node under the job was bad
    ctl.tick()
    slurm.set_job(9, state="RUNNING", nodes=("node1", "node3"), start_time=int(clock()) + 1)
    clock.advance(400)
    add_event(ctl.conn, "node1", clock() - 1, source="kpi", kind="nan_loss", job_ids=[9])
    ctl.tick()
    assert [i.status for i in ctl.incidents.query(job_id=9) if i.rule_id == "kpi-nan-loss-event"] == [
        "acted", "acted"]


def nan_failed_job(tmp_path, **seen_after_requeue):
    """A controller whose job 9 failed on a NaN loss, with SLURM showing `seen_after_requeue` right after
    `scontrol requeue`, after one tick."""
    ctl, slurm, clock = make_controller(tmp_path)
    slurm.run_job(9, ["node1"], start=clock() - 50)
    slurm.set_job(9, state="FAILED")
    requeue = slurm.requeue

    def requeue_seen(job_id, hold=False):
        requeue(job_id, hold)
        slurm.set_job(job_id, **seen_after_requeue)

    slurm.requeue = requeue_seen
    add_event(ctl.conn, "node1", clock() - 1, source="kpi", kind="nan_loss", job_ids=[9])
    ctl.tick()
    return ctl, slurm, clock


def test_failed_job_is_started_even_when_its_requeue_shows_late(tmp_path):
    """A trainer that stops on a NaN loss has failed before the rule sees it; SLURM may still list the job as
    FAILED right after `scontrol requeue`: start_now waits for it to be pending instead of giving up."""
    ctl, slurm, clock = nan_failed_job(tmp_path, state="FAILED")
    assert slurm.count("requeue") == 1 and slurm.count("start_now") == 0
    slurm.set_job(9, state="PENDING", reason="BeginTime")  # slurmctld catches up
    clock.advance(5)
    ctl.tick()
    assert slurm.count("start_now") == 1


def test_a_requeued_job_still_showing_its_old_reason_is_started_at_once(tmp_path):
    """Pending for NonZeroExitCode (a failed job) or for no reason (requeued off a node that went DOWN) until the
    scheduler's next pass over it: StartTime=now is issued then, not after that pass."""
    ctl, slurm, clock = nan_failed_job(tmp_path, state="PENDING", reason="NonZeroExitCode")
    assert slurm.count("requeue") == 1 and slurm.count("start_now") == 1


def run_until(ctl, clock, predicate, ticks=20, step=5.0, each=None):
    for _ in range(ticks):
        if each:
            each()
        ctl.tick()
        if predicate():
            return True
        clock.advance(step)
    return False


def test_remediation_reboot_validate_resume(tmp_path):
    ctl, slurm, clock = make_controller(tmp_path)
    xid79(ctl.conn, "node3", clock() - 1)
    ctl.tick()
    assert ctl.remediator.get("node3").state in ("waiting_jobs", "remediating", "drained")
    assert run_until(ctl, clock, lambda: slurm.count("reboot") == 1)
    slurm.finish_reboot("node3", clock())
    assert run_until(ctl, clock, lambda: slurm.count("submit") == 1)
    assert slurm.reservations() == ["sigma-maint-node3-c1-f0"]
    job = next(j for j in slurm.jobs() if j.name.startswith("sigma-validate-node3"))
    slurm.finish_job(job.job_id, rc=0)
    assert run_until(ctl, clock, lambda: ctl.remediator.get("node3").state == "resumed")
    assert slurm.reservations() == [] and slurm.node("node3").available
    assert ctl.incidents.query(node="node3")[0].status == "resolved"
    states = [r[0] for r in ctl.conn.execute("SELECT to_state FROM lifecycle_transitions WHERE node='node3' ORDER BY id")]
    assert states == ["drained", "waiting_jobs", "remediating", "validating", "resumed"]
    # the old evidence does not take the node out again
    for _ in range(3):
        ctl.tick()
        clock.advance(5)
    assert slurm.count("drain") == 1


def test_a_reboot_done_within_the_second_it_was_planned_in_is_seen(tmp_path):
    """SLURM stamps slurmd's start in whole seconds: a reboot that took less than a second carries the very second
    it was planned in, and is the reboot all the same (it was once waited for until the remediation timed out)."""
    ctl, slurm, clock = make_controller(tmp_path)
    xid79(ctl.conn, "node3", clock() - 1)
    assert run_until(ctl, clock, lambda: slurm.count("reboot") == 1)
    planned = json.loads(ctl.conn.execute("SELECT params FROM actions WHERE kind = 'reboot'").fetchone()[0])
    slurm.finish_reboot("node3", clock())
    slurm.set_node("node3", slurmd_start_time=int(planned["planned_at"]))
    assert run_until(ctl, clock, lambda: slurm.count("submit") == 1)
    assert ctl.remediator.get("node3").state == "validating"


def test_remediation_survives_restart_and_escalates_after_k_failures(tmp_path):
    ctl, slurm, clock = make_controller(tmp_path)  # max_failures=2
    xid79(ctl.conn, "node3", clock() - 1)
    for attempt in range(2):
        assert run_until(ctl, clock, lambda: slurm.count("reboot") == attempt + 1)
        slurm.finish_reboot("node3", clock())
        ctl, _, _ = make_controller(tmp_path, slurm=slurm, clock=clock)  # restart mid-remediation
        ctl.start()
        assert run_until(ctl, clock, lambda: slurm.count("submit") == attempt + 1)
        job = next(j for j in slurm.jobs() if j.name == f"sigma-validate-node3-c1-f{attempt}")
        slurm.finish_job(job.job_id, rc=1)
        ctl.tick()
    assert ctl.remediator.get("node3").state == "escalated"
    assert slurm.node("node3").drained and slurm.reservations() == []
    assert slurm.count("submit") == 2 and slurm.count("reboot") == 2
    assert ctl.incidents.query(node="node3")[0].status == "escalated"


def test_reboot_timeout_counts_as_failure(tmp_path):
    ctl, slurm, clock = make_controller(tmp_path)
    xid79(ctl.conn, "node3", clock() - 1)
    assert run_until(ctl, clock, lambda: slurm.count("reboot") == 1)
    clock.advance(301)
    ctl.tick()
    lc = ctl.remediator.get("node3")
    assert lc.failures == 1 and lc.state == "remediating"


def test_manual_playbook_waits_for_admin_mark(tmp_path):
    ctl, slurm, clock = make_controller(tmp_path)
    add_event(ctl.conn, "node2", clock() - 1, source="health", kind="suite.prolog", severity="reject",
              fields={"suite": "prolog"})
    assert run_until(ctl, clock, lambda: ctl.remediator.get("node2").state == "remediating")
    for _ in range(3):
        ctl.tick()
    assert ctl.remediator.get("node2").state == "remediating" and slurm.count("submit") == 0
    ctl.remediator.mark_repaired("node2", by="alice")
    assert run_until(ctl, clock, lambda: slurm.count("submit") == 1)


def test_a_node_resumed_outside_sigma_ends_its_remediation(tmp_path):
    ctl, slurm, clock = make_controller(tmp_path)
    add_event(ctl.conn, "node2", clock() - 1, source="health", kind="suite.prolog", severity="reject",
              fields={"suite": "prolog"})
    assert run_until(ctl, clock, lambda: ctl.remediator.get("node2").state == "remediating")
    slurm.resume(["node2"], force=True)  # `scontrol update state=resume` by an admin
    ctl.tick()
    assert ctl.remediator.get("node2").state == "admin"
    assert ctl.incidents.query(node="node2")[0].status == "closed"
    with pytest.raises(ValueError, match="not waiting for a repair"):
        ctl.remediator.mark_repaired("node2")
    for _ in range(3):
        ctl.tick()
    assert slurm.count("submit") == 0 and slurm.count("drain") == 1  # no validation, no second drain


def test_prolog_error_drain_is_adopted_but_admin_drain_is_not(tmp_path):
    ctl, slurm, clock = make_controller(tmp_path)
    slurm.set_node("node2", flags=("DRAIN",), reason="Prolog error")
    add_event(ctl.conn, "node2", clock() - 1, source="health", kind="suite.prolog", severity="reject",
              fields={"suite": "prolog", "category": "gpu"})
    ctl.tick()
    assert slurm.node("node2").reason.startswith("sigma: prolog-check (health-prolog-failed)")
    assert ctl.remediator.get("node2").state != "admin"


def test_after_repair_command_runs_before_validation(tmp_path):
    from sigma.controller.config import Playbook, RemediationConfig, ValidationConfig

    marker = tmp_path / "acked"
    script = tmp_path / "v.sbatch"
    script.write_text("#!/bin/sh\n")
    rem = RemediationConfig(ack_kernel_log=False, after_repair=["sh", "-c", f"echo {{node}} > {marker}"],
                            validation=ValidationConfig(script=str(script)),
                            playbooks=[Playbook(name="reboot", kind="reboot", categories=["gpu-reset"]),
                                       Playbook(name="manual", kind="manual")])
    ctl, slurm, clock = make_controller(tmp_path, remediation=rem)
    xid79(ctl.conn, "node3", clock() - 1)
    assert run_until(ctl, clock, lambda: slurm.count("reboot") == 1)
    slurm.finish_reboot("node3", clock())
    assert run_until(ctl, clock, lambda: slurm.count("submit") == 1)
    assert marker.read_text().strip() == "node3"


def test_jobs_held_after_a_launch_failure_are_released_once(tmp_path):
    ctl, slurm, clock = make_controller(tmp_path)
    slurm.run_job(5, ["node1"])
    slurm.set_job(5, state="PENDING", reason="launch failed requeued held", restarts=1, nodes=())
    ctl.tick()
    ctl.tick()
    assert slurm.count("release") == 1


def test_parse_since():
    from sigma.controller.cli import parse_since

    assert parse_since("2h", now=10_000.0) == 10_000.0 - 7200
    assert parse_since("30m", now=10_000.0) == 10_000.0 - 1800
    assert parse_since(None) is None
    with pytest.raises(Exception, match="use e.g. 30m"):
        parse_since("yesterday")


class Killed(BaseException):
    """Stands for kill -9: nothing after it runs."""


def die_when_planning(ctl, when):
    """The controller process dies (Killed) as the journal plans an action: when(key, n-th plan) says which."""
    real_plan, keys = ctl.journal.plan, []

    def dying_plan(*args, **kwargs):
        keys.append(args[0])
        if when(args[0], len(keys)):
            raise Killed()
        return real_plan(*args, **kwargs)
    ctl.journal.plan = dying_plan


@pytest.mark.parametrize("die_at_plan", [1, 2, 3])
def test_kill_at_any_point_of_a_decision_loses_and_repeats_nothing(tmp_path, die_at_plan):
    """die_at_plan 1: before the drain is planned; 2: before the requeue; 3: before start_now."""
    ctl, slurm, clock = make_controller(tmp_path)
    slurm.run_job(7, ["node2", "node3"], start=clock() - 100)
    xid79(ctl.conn, "node3", clock() - 1)
    die_when_planning(ctl, lambda key, n: n == die_at_plan)
    with pytest.raises(Killed):
        ctl.tick()
    ctl2, _, _ = make_controller(tmp_path, slurm=slurm, clock=clock)
    ctl2.start()
    for _ in range(3):
        ctl2.tick()
    assert slurm.node("node3").drained
    assert slurm.count("drain") == 1 and slurm.count("requeue") == 1 and slurm.count("start_now") == 1
    (inc,) = ctl2.incidents.query()
    assert inc.status == "acted" and ctl2.remediator.get("node3").incident_id == inc.id


def test_kill_between_requeue_and_start_now_of_a_job_rule(tmp_path):
    ctl, slurm, clock = make_controller(tmp_path)
    slurm.run_job(9, ["node1"], start=clock() - 50)
    add_event(ctl.conn, "node1", clock() - 1, source="kpi", kind="nan_loss", job_ids=[9])
    die_when_planning(ctl, lambda key, n: key.startswith("start_now"))
    with pytest.raises(Killed):
        ctl.tick()
    ctl2, _, _ = make_controller(tmp_path, slurm=slurm, clock=clock)
    ctl2.start()
    ctl2.tick()
    ctl2.tick()
    assert slurm.count("requeue") == 1 and slurm.count("start_now") == 1
    assert [i.status for i in ctl2.incidents.query()] == ["acted"]


def test_ticket_posts_evidence_with_idempotency_key(tmp_path):
    import http.server
    import threading

    from sigma.controller.act.actions import SlurmActions

    got = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self):
            body = self.rfile.read(int(self.headers["Content-Length"]))
            got.append((self.headers["Idempotency-Key"], json.loads(body)))
            self.send_response(201)
            self.end_headers()

        def log_message(self, *a):
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        actions = SlurmActions(None)
        out = actions("ticket", "node3", {"url": f"http://127.0.0.1:{server.server_address[1]}/t",
                                          "payload": {"node": "node3", "rule": "gpu-xid-74"}}, "ticket:node3:c1:f0")
    finally:
        server.shutdown()
    assert out == "ticket posted: HTTP 201"
    assert got == [("ticket:node3:c1:f0", {"node": "node3", "rule": "gpu-xid-74"})]


def dead_node(tmp_path, job_id=4, requeue=True):
    """Job `job_id` on node1 and node2; node2's slurmd stopped answering (SLURM flags it NOT_RESPONDING). As on a
    real cluster, a requeued job stays COMPLETING on the silent node until that node is DOWN."""
    ctl, slurm, clock = make_controller(tmp_path)
    slurm.run_job(job_id, ["node1", "node2"], start=clock() - 100)
    slurm.set_job(job_id, requeue=requeue)
    slurm.set_node("node2", flags=("NOT_RESPONDING",))
    requeue_call = slurm.requeue

    def requeue_completing(job, hold=False):
        nodes = slurm.job(job).nodes
        requeue_call(job, hold)
        slurm.set_job(job, state="COMPLETING", nodes=nodes)

    slurm.requeue = requeue_completing
    return ctl, slurm, clock


def test_a_silent_node_is_set_down_after_its_job_is_requeued_and_the_job_starts_at_once(tmp_path):
    ctl, slurm, clock = dead_node(tmp_path)
    ctl.tick()
    # DOWN only once the job is requeued; SLURM then ends its steps on the node and the job is pending at once
    assert [c[0] for c in slurm.calls] == ["drain", "requeue", "set_down", "start_now"]
    node2 = slurm.node("node2")
    assert node2.state == "down" and node2.drained and node2.reason.startswith("sigma: slurmd-silent ")
    assert actions(ctl.conn, "set_down") == [("set_down", "node2", "done")]
    clock.advance(1)
    ctl.tick()
    assert slurm.count("start_now") == 1 and slurm.count("set_down") == 1
    assert "requeued [4]; set DOWN once requeued (slurmd not responding)" in (
        tmp_path / "log" / "decisions.log").read_text()
    assert ctl.incidents.query(node="node2")[0].status == "acted"
    from tests.unit.controller.test_jit_checkpoint import explain

    explained = explain(tmp_path, ctl, 1)  # `sigma explain` names the action and what it did
    assert "set_down" in explained and "set DOWN (slurmd not responding)" in explained


def test_set_down_waits_for_the_just_in_time_checkpoint_of_the_healthy_node(tmp_path):
    from tests.unit.controller.test_jit_checkpoint import running_trainer

    ctl, slurm, clock = dead_node(tmp_path)
    slurm.job_map.clear()
    running_trainer(ctl, slurm, clock, job_id=4, nodes=("node1", "node2"))
    ctl.tick()
    assert slurm.count("requeue") == 0 and slurm.count("set_down") == 0  # the checkpoint is asked of node1
    row = ctl.journal.get("set_down:node2:i1")
    assert row.state == "planned" and "job(s) [4] not requeued yet" in row.result
    req = ctl.conn.execute("SELECT id FROM checkpoint_requests").fetchone()[0]
    add_event(ctl.conn, "node1", clock(), source="kpi", kind="checkpoint", job_ids=[4],
              fields={"step": 11, "kind": "jit", "request": req})
    clock.advance(1)
    ctl.tick()
    assert [c[0] for c in slurm.calls] == ["drain", "requeue", "set_down"]
    assert slurm.node("node2").state == "down"
    clock.advance(1)
    ctl.tick()
    assert slurm.count("start_now") == 1


def test_a_silent_node_that_answers_again_before_the_requeue_is_left_drained(tmp_path):
    from tests.unit.controller.test_jit_checkpoint import running_trainer

    ctl, slurm, clock = dead_node(tmp_path)
    slurm.job_map.clear()
    running_trainer(ctl, slurm, clock, job_id=4, nodes=("node1", "node2"))
    ctl.tick()
    slurm.set_node("node2", flags=("DRAIN",))  # slurmd registered again
    clock.advance(31)  # no answer: the requeue goes ahead at the deadline
    ctl.tick()
    assert slurm.count("requeue") == 1 and slurm.count("set_down") == 0
    row = ctl.journal.get("set_down:node2:i1")
    assert row.state == "skipped" and row.result == "slurmd answers again; left drained"
    assert slurm.node("node2").drained and slurm.node("node2").state != "down"


def test_a_job_that_is_not_requeued_keeps_the_silent_node_up_to_slurm(tmp_path):
    """--no-requeue: setting the node DOWN would end that job; whether it is lost stays SlurmdTimeout's call."""
    ctl, slurm, clock = dead_node(tmp_path, requeue=False)
    ctl.tick()
    assert slurm.node("node2").drained and slurm.count("requeue") == 0 and slurm.count("set_down") == 0
    assert actions(ctl.conn, "set_down") == []
    assert "not set DOWN, job(s) [4] not requeued" in (tmp_path / "log" / "decisions.log").read_text()


def test_observe_mode_records_the_set_down_it_would_do(tmp_path):
    ctl, slurm, clock = dead_node(tmp_path)
    ctl.cfg.mode = "observe"
    ctl.tick()
    assert slurm.calls == []
    assert actions(ctl.conn) == [("drain", "node2", "shadow"), ("requeue", "4", "shadow"),
                                 ("set_down", "node2", "shadow")]


def test_a_drain_of_a_responding_node_never_sets_it_down(tmp_path):
    ctl, slurm, clock = make_controller(tmp_path)
    slurm.run_job(7, ["node2", "node3"], start=clock() - 100)
    xid79(ctl.conn, "node3", clock() - 1)
    ctl.tick()
    assert slurm.count("requeue") == 1 and slurm.count("set_down") == 0 and actions(ctl.conn, "set_down") == []


def test_set_down_never_touches_a_rebooting_or_admin_node(tmp_path):
    ctl, slurm, clock = make_controller(tmp_path)
    slurm.set_node("node2", flags=("DRAIN", "NOT_RESPONDING", "REBOOT_ISSUED"), reason="sigma: xid-79 reboot")
    slurm.set_node("node3", flags=("DRAIN", "NOT_RESPONDING"), reason="admin: replacing a DIMM")
    for node in ("node2", "node3"):
        row = ctl.journal.run(f"set_down:{node}:i9", "set_down", node, params={"reason": "slurmd-silent"})
        assert row.state == "skipped"
    assert "reboot" in ctl.journal.get("set_down:node2:i9").result
    assert "someone else" in ctl.journal.get("set_down:node3:i9").result
    assert slurm.count("set_down") == 0


def test_a_node_set_down_comes_back_only_through_validation(tmp_path):
    """slurmd registering again leaves our DOWN node drained (SLURM keeps the DRAIN flag and our reason): the
    remediation waits for the repair and validates it before it is resumed, never taking it for an admin's."""
    ctl, slurm, clock = dead_node(tmp_path)
    ctl.tick()
    assert slurm.node("node2").state == "down"
    slurm.set_job(4, state="RUNNING", nodes=("node1", "node3"))  # started elsewhere
    slurm.set_node("node2", flags=("DRAIN",))  # the host is back, slurmd answers; SLURM keeps it DOWN + drained
    assert run_until(ctl, clock, lambda: ctl.remediator.get("node2").state == "remediating")
    for _ in range(3):
        ctl.tick()
    assert ctl.remediator.get("node2").state == "remediating" and slurm.count("resume") == 0
    ctl.remediator.mark_repaired("node2")
    assert run_until(ctl, clock, lambda: slurm.count("submit") == 1)
    assert slurm.count("resume") == 1 and slurm.reservations() == ["sigma-maint-node2-c1-f0"]
    job = next(j for j in slurm.jobs() if j.name.startswith("sigma-validate-node2"))
    slurm.finish_job(job.job_id, rc=0)
    assert run_until(ctl, clock, lambda: ctl.remediator.get("node2").state == "resumed")
    assert slurm.node("node2").available and slurm.count("set_down") == 1


def test_a_reboot_that_fails_validation_hands_the_node_to_people(tmp_path):
    """The reboot playbook's `then`: a node still failing validation after its reboot has a fault a reboot cannot
    fix (a part), so the next attempt waits for hands (manual), not for another reboot."""
    script = tmp_path / "validate.sbatch"
    rcfg = RemediationConfig(max_failures=3, ack_kernel_log=False, validation=ValidationConfig(script=str(script)),
                             playbooks=[Playbook(name="reboot", kind="reboot", categories=["gpu-reset"],
                                                 then="manual"), Playbook(name="manual", kind="manual")])
    ctl, slurm, clock = make_controller(tmp_path, remediation=rcfg)
    xid79(ctl.conn, "node3", clock() - 1)
    assert run_until(ctl, clock, lambda: slurm.count("reboot") == 1)
    slurm.finish_reboot("node3", clock())
    assert run_until(ctl, clock, lambda: slurm.count("submit") == 1)
    slurm.finish_job(next(j.job_id for j in slurm.jobs() if j.name.startswith("sigma-validate")), rc=1)
    assert run_until(ctl, clock, lambda: ctl.remediator.get("node3").playbook == "manual")
    for _ in range(5):
        ctl.tick()
        clock.advance(600)
    assert slurm.count("reboot") == 1 and ctl.remediator.get("node3").state == "remediating"
    assert "waiting for an admin" in (tmp_path / "log" / "decisions.log").read_text()
    ctl.remediator.mark_repaired("node3")
    assert run_until(ctl, clock, lambda: slurm.count("submit") == 2)
    slurm.finish_job(next(j.job_id for j in slurm.jobs() if j.name == "sigma-validate-node3-c1-f1"), rc=0)
    assert run_until(ctl, clock, lambda: ctl.remediator.get("node3").state == "resumed")
    assert ctl.incidents.query(node="node3")[0].status == "resolved"
    with pytest.raises(ValueError, match="then 'rma' is not one of the playbooks"):
        RemediationConfig(playbooks=[Playbook(name="reboot", kind="reboot", then="rma"),
                                     Playbook(name="manual", kind="manual")])
