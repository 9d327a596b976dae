"""From observing to acting: what observe mode (or a rule in shadow) only recorded is decided again once its rule
acts, while it is still current, and closed with a note when it is not; an observed fault never hides a hang."""

import pytest

from tests.unit.controller.helpers import add_kpi, make_controller, xid79
from tests.unit.controller.test_watchdog_isolation import kpi_rows


def actions(conn):
    return [tuple(r) for r in conn.execute("SELECT kind, target, state, incident_id FROM actions ORDER BY id")]


def observing(ctl, how):
    """The controller observing gpu-xid-79 (observe mode, or the rule in shadow in act mode)."""
    if how == "shadow_rules":
        ctl.cfg.shadow_rules = ["gpu-xid-79"]
    else:
        ctl.cfg.mode = "observe"


def acting(ctl, how):
    """The switch an admin makes (a reload applies it): act mode, the rule in act_rules, or out of shadow_rules."""
    if how == "mode":
        ctl.cfg.mode = "act"
    elif how == "act_rules":
        ctl.cfg.act_rules = ["gpu-xid-79"]
    else:
        ctl.cfg.shadow_rules = []


@pytest.mark.parametrize("how", ["mode", "act_rules", "shadow_rules"])
def test_a_fault_observed_and_still_current_is_acted_on_when_its_rule_acts(tmp_path, how):
    ctl, slurm, clock = make_controller(tmp_path)
    observing(ctl, how)
    slurm.run_job(7, ["node2", "node3"], start=clock() - 100)
    xid79(ctl.conn, "node3", clock() - 1)
    ctl.tick()
    clock.advance(60)
    ctl.tick()
    observed = ctl.incidents.query(node="node3")[0]
    assert observed.status == "shadow" and slurm.calls == []

    acting(ctl, how)
    clock.advance(5)
    ctl.tick()
    assert slurm.node("node3").drained and slurm.count("requeue") == 1
    old, new = ctl.incidents.query(node="node3")
    assert old.id == observed.id and old.status == "shadow" and old.closed_at is not None
    assert f"decided again as incident {new.id}" in old.status_note
    assert new.status == "acted" and new.evidence["observed_incident"] == old.id
    assert new.fault_ts == observed.fault_ts  # the fault is the one observed, not a new one
    # what observe mode recorded stays recorded; what runs is the new incident's
    rows = actions(ctl.conn)
    assert ("drain", "node3", "shadow", old.id) in rows and ("drain", "node3", "done", new.id) in rows
    log = (tmp_path / "log" / "decisions.log").read_text()
    assert f"REDECIDE node3 (gpu-xid-79): observed as incident {old.id}" in log
    assert "DRAIN node3 (gpu-xid-79)" in log
    for _ in range(3):
        clock.advance(5)
        ctl.tick()
    assert slurm.count("drain") == 1 and slurm.count("requeue") == 1 and len(ctl.incidents.query(node="node3")) == 2


def test_a_fault_observed_that_is_no_longer_current_is_closed_with_a_note_not_acted_on(tmp_path):
    ctl, slurm, clock = make_controller(tmp_path)
    ctl.cfg.mode = "observe"
    xid79(ctl.conn, "node3", clock() - 1)
    ctl.tick()
    rule = next(r for r in ctl.rules if r.id == "gpu-xid-79")
    clock.advance(rule.window_s + 10)  # its evidence has left the rule's window
    ctl.tick()
    observed = ctl.incidents.query(node="node3")[0]
    assert observed.status == "shadow" and observed.closed_at is None  # kept open a while for `sigma incidents`

    ctl.cfg.mode = "act"
    ctl.tick()
    assert slurm.calls == []
    inc = ctl.incidents.get(observed.id)
    assert inc.closed_at is not None and "no longer current" in inc.status_note and "not acted on" in inc.status_note
    assert f"CLOSED node3 (gpu-xid-79): incident {inc.id} observed only" in (
        tmp_path / "log" / "decisions.log").read_text()


def test_observed_faults_of_rules_that_still_observe_stay_as_they_are(tmp_path):
    ctl, slurm, clock = make_controller(tmp_path)
    ctl.cfg.mode = "observe"
    xid79(ctl.conn, "node3", clock() - 1)
    ctl.tick()
    ctl.cfg.act_rules = ["gpu-xid-reset"]  # another rule enabled: gpu-xid-79 still observes
    clock.advance(5)
    ctl.tick()
    assert slurm.calls == []
    inc = ctl.incidents.query(node="node3")[0]
    assert inc.status == "shadow" and inc.closed_at is None


def hung_job_on(ctl, slurm, clock, culprit="node2"):
    """Job 1 on node1-3 hangs: the culprit's ranks stopped stepping, the others wait for it at the next step."""
    nodes = ["node1", "node2", "node3"]
    slurm.run_job(1, nodes, start=clock() - 1000)
    now = clock()
    for r in kpi_rows(nodes, now - 300, now - 130, stop={culprit: now - 140}):
        add_kpi(ctl.conn, r["node"], r["ts"], 1, r["rank"], r["step"], r["tokens_per_s"], r["step_time_s"])
    for rank, n in ((0, "node1"), (1, "node1"), (4, "node3"), (5, "node3")):
        add_kpi(ctl.conn, n, now - 139, 1, rank, 161)  # the peers finish the step the culprit never reaches


def test_an_observed_fault_on_the_node_does_not_hide_a_hang_from_isolation(tmp_path):
    """Before: a rule that only observed an Xid on node2 counted as 'a rule already names the culprit', so the hung
    job on node2 was neither requeued nor node2 drained."""
    ctl, slurm, clock = make_controller(tmp_path)
    ctl.cfg.shadow_rules = ["gpu-xid-79"]
    xid79(ctl.conn, "node2", clock() - 1)
    hung_job_on(ctl, slurm, clock)
    for _ in range(2):
        ctl.tick()
        clock.advance(1)
    assert slurm.node("node2").drained and slurm.node("node2").reason.startswith("sigma: watchdog-hang")
    assert slurm.count("requeue") == 1
    by_rule = {i.rule_id: i for i in ctl.incidents.query(node="node2")}
    assert by_rule["gpu-xid-79"].status == "shadow" and by_rule["watchdog-hang"].status == "acted"


def test_an_acting_rule_on_the_node_still_takes_the_hang_over(tmp_path):
    ctl, slurm, clock = make_controller(tmp_path)
    xid79(ctl.conn, "node2", clock() - 1)
    hung_job_on(ctl, slurm, clock)
    for _ in range(2):
        ctl.tick()
        clock.advance(1)
    assert slurm.node("node2").reason.startswith("sigma: gpu-xid-79") and slurm.count("requeue") == 1
    assert [i.rule_id for i in ctl.incidents.query(node="node2")] == ["gpu-xid-79"]
