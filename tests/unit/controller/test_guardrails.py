"""Guard rails under a wave and around nodes someone else took out of service."""

import pytest

from sigma.controller.act.actions import SlurmActions
from sigma.controller.act.guards import admin_hold
from sigma.controller.act.journal import Skip
from sigma.controller.config import BreakerConfig, ControllerConfig
from sigma.findings import Finding
from sigma.slurm.types import Node

from tests.unit.controller.fakes import FakeSlurm
from tests.unit.controller.helpers import add_event, make_controller, xid79


def wave_cfg(tmp_path, **breaker):
    return ControllerConfig(db=str(tmp_path / "c.db"), log_dir=str(tmp_path / "log"),
                            breaker=BreakerConfig(**{"max_nodes": 2, "max_fraction": 0.5, **breaker}))


def test_admin_hold_covers_down_drain_and_fail_with_a_foreign_reason():
    assert admin_hold(Node("n", "down", reason="admin: PSU swap")) == "admin: PSU swap"
    assert admin_hold(Node("n", "idle", flags=("DRAIN",), reason="bad fan")) == "bad fan"
    assert admin_hold(Node("n", "down", flags=("DRAIN", "FAIL"), reason="rma")) == "rma"
    assert admin_hold(Node("n", "down", reason="sigma: gpu-xid-79 remediation reboot")) is None
    assert admin_hold(Node("n", "down", flags=("NOT_RESPONDING",), reason="Not responding")) is None
    assert admin_hold(Node("n", "idle", flags=("DRAIN",), reason="Prolog error"), ["Prolog error"]) is None
    assert admin_hold(Node("n", "idle", reason="stale text from an earlier drain")) is None  # in service


def test_a_node_an_admin_set_down_is_never_drained_or_rebooted(tmp_path):
    ctl, slurm, clock = make_controller(tmp_path)
    slurm.set_node("node2", state="down", reason="admin: PSU swap")  # DOWN, no DRAIN flag
    xid79(ctl.conn, "node2", clock() - 1)
    for _ in range(4):
        ctl.tick()
        clock.advance(60)
    assert slurm.count("drain") == slurm.count("reboot") == slurm.count("resume") == 0
    assert slurm.node("node2").reason == "admin: PSU swap"
    assert ctl.incidents.query(node="node2")[0].status == "notified"
    assert ctl.remediator.get("node2") is None and ctl.counts()["guard", "admin_hold"] >= 1
    assert "left alone, taken out by admin (DOWN: admin: PSU swap)" in (tmp_path / "log" / "decisions.log").read_text()


def test_an_admin_setting_down_during_remediation_stops_the_planned_reboot(tmp_path):
    ctl, slurm, clock = make_controller(tmp_path)
    xid79(ctl.conn, "node3", clock() - 1)
    ctl.tick()  # drained; remediation begins
    ctl.tick()  # waiting_jobs
    assert ctl.remediator.get("node3").state in ("waiting_jobs", "remediating")
    slurm.set_node("node3", state="down", flags=(), reason="admin: reseating the GPU")
    for _ in range(4):
        ctl.tick()
        clock.advance(60)
    assert slurm.count("reboot") == 0 and slurm.count("resume") == 0
    assert ctl.remediator.get("node3").state == "admin"
    assert slurm.node("node3").reason == "admin: reseating the GPU"


def test_executors_refuse_a_node_taken_out_by_someone_else_at_run_time(tmp_path):
    ctl, slurm, clock = make_controller(tmp_path)
    actions = SlurmActions(slurm)
    slurm.set_node("node1", state="down", flags=("DRAIN", "FAIL"), reason="rma ticket 42")
    for kind, params in (("reboot", {"planned_at": clock(), "reason": "x"}), ("drain", {"reason": "x"}),
                         ("resume", {})):
        with pytest.raises(Skip):
            actions(kind, "node1", params, f"{kind}:node1")
    assert slurm.calls == []


def test_a_wave_seen_through_several_rules_stops_at_the_global_limit(tmp_path):
    # per rule: 2 nodes; globally: 2 nodes out of 4. Three different rules and the watchdog see one wave.
    ctl, slurm, clock = make_controller(tmp_path, cfg=wave_cfg(tmp_path, wave_max_nodes=2, wave_max_fraction=0.5))
    xid79(ctl.conn, "node1", clock() - 3)
    add_event(ctl.conn, "node2", clock() - 2, kind="xid", fields={"xid": 48}, message="NVRM: Xid 48")
    add_event(ctl.conn, "node3", clock() - 1, kind="xid", fields={"xid": 74}, message="NVRM: Xid 74")
    ctl.tick()
    drained = sorted(n.name for n in slurm.nodes() if n.drained)
    assert len(drained) == 2  # no rule reached its own limit of 2: only the global one holds
    (escalated,) = [i for i in ctl.incidents.query() if i.status == "escalated"]
    assert escalated.evidence["guard"]["guard"] == "wave"
    assert escalated.evidence["guard"]["nodes_out"] == drained
    assert escalated.evidence["events"]  # the person gets the evidence
    ticket = ctl.conn.execute("SELECT params FROM actions WHERE kind='ticket' AND incident_id=?",
                              (escalated.id,)).fetchone()
    assert ticket is not None and '"guard": "wave"' in ticket[0]
    # the watchdog/isolation go through the same limit
    f = Finding(rule_id="isolation-outlier", source="isolation", scope="node", severity="error", action="drain",
                summary="outlier", first_ts=clock(), last_ts=clock(), node="node4", category="isolation")
    (inc,) = ctl.decider.decide([f], {n.name: n for n in slurm.nodes()}, slurm.jobs())
    assert inc.status == "escalated" and not slurm.node("node4").drained
    assert ctl.counts()["guard", "wave"] == 2
    assert "WAVE node4 (isolation-outlier): global limit" in (tmp_path / "log" / "decisions.log").read_text()


def test_nodes_back_in_service_are_no_longer_part_of_a_wave(tmp_path):
    # faults one after another (each node repaired before the next) are not a wave: only nodes still out count
    ctl, slurm, clock = make_controller(tmp_path, cfg=wave_cfg(tmp_path, max_nodes=4, max_fraction=1.0,
                                                                wave_max_nodes=2, wave_max_fraction=0.5))
    xid79(ctl.conn, "node1", clock() - 2)
    add_event(ctl.conn, "node2", clock() - 1, kind="xid", fields={"xid": 48}, message="NVRM: Xid 48")
    ctl.tick()
    assert sorted(n.name for n in slurm.nodes() if n.drained) == ["node1", "node2"]
    for node in ("node1", "node2"):  # both came back (a resumed transition after their incidents)
        ctl.conn.execute("INSERT INTO lifecycle_transitions (node, cycle, ts, from_state, to_state) "
                         "VALUES (?, 1, ?, 'validating', 'resumed')", (node, clock() + 1))
        ctl.conn.execute("DELETE FROM node_lifecycle WHERE node = ?", (node,))
    f = Finding(rule_id="isolation-outlier", source="isolation", scope="node", severity="error", action="drain",
                summary="outlier", first_ts=clock(), last_ts=clock(), node="node3", category="isolation")
    (inc,) = ctl.decider.decide([f], {n.name: n for n in slurm.nodes()}, slurm.jobs())
    assert inc.status == "acted" and slurm.node("node3").drained


def test_the_per_rule_breaker_still_holds_under_a_high_global_limit(tmp_path):
    ctl, slurm, clock = make_controller(tmp_path, cfg=wave_cfg(tmp_path, max_nodes=1, wave_max_nodes=16,
                                                                   wave_max_fraction=1.0))
    xid79(ctl.conn, "node1", clock() - 2)
    xid79(ctl.conn, "node2", clock() - 1)
    ctl.tick()
    assert sum(n.drained for n in slurm.nodes()) == 1
    assert ctl.counts()["guard", "rule"] == 1


def test_an_escalation_is_visible_in_explain_and_on_metrics(tmp_path, capsys, monkeypatch):
    from prometheus_client import CollectorRegistry, generate_latest

    from sigma.cli import main
    from sigma.controller.daemon import CountsCollector

    monkeypatch.setenv("COLUMNS", "400")
    ctl, slurm, clock = make_controller(tmp_path, cfg=wave_cfg(tmp_path, wave_max_nodes=1))
    xid79(ctl.conn, "node1", clock() - 2)
    add_event(ctl.conn, "node2", clock() - 1, kind="xid", fields={"xid": 48}, message="NVRM: Xid 48")
    ctl.tick()
    (escalated,) = [i for i in ctl.incidents.query() if i.status == "escalated"]
    capsys.readouterr()
    assert main(["explain", str(escalated.id), "--db", ctl.cfg.db]) == 0
    out = capsys.readouterr().out
    assert "escalated global limit: 2 nodes out of service" in out and "NVRM: Xid 48" in out
    reg = CollectorRegistry()
    reg.register(CountsCollector(ctl))
    assert 'sigma_controller_guard_total{guard="wave"} 1.0' in generate_latest(reg).decode()


def test_nodes_in_a_long_repair_are_not_a_wave_but_count_against_the_share_out(tmp_path):
    """A wave is nodes taken out inside the window: nodes still waiting for hands-on repair from days ago are
    not one (a large cluster always has some), but they count toward wave_max_fraction of the cluster out."""
    nodes = tuple(f"node{i}" for i in range(1, 9))
    ctl, slurm, clock = make_controller(tmp_path, slurm=FakeSlurm(nodes), cfg=wave_cfg(
        tmp_path, max_nodes=8, max_fraction=1.0, wave_max_nodes=2, wave_max_fraction=0.5))
    for node in ("node1", "node2", "node3"):  # a day ago, still in remediation (manual playbook: parts)
        add_event(ctl.conn, node, clock() - 1, kind="xid", fields={"xid": 74}, message="NVRM: Xid 74")
    ctl.tick()
    assert sum(n.drained for n in slurm.nodes()) == 2  # two at once: the wave limit
    clock.advance(86400)
    add_event(ctl.conn, "node3", clock() - 1, kind="xid", fields={"xid": 74}, message="NVRM: Xid 74 again")
    xid79(ctl.conn, "node4", clock() - 1)
    ctl.tick()
    assert slurm.node("node4").drained  # node1, node2 still out since yesterday: not a wave
    out = sorted(n.name for n in slurm.nodes() if n.drained)
    assert len(out) == 3 and all(ctl.remediator.active(n) for n in out)
    for node in ("node5", "node6"):  # hours apart: no wave; the 5th of 8 nodes out is more than half
        clock.advance(7200)
        xid79(ctl.conn, node, clock() - 1)
        ctl.tick()
    assert slurm.node("node5").drained
    (inc,) = ctl.incidents.query(node="node6")
    assert inc.status == "escalated" and not slurm.node("node6").drained
    assert "5 nodes out of service" in inc.status_note and "50% of the cluster" in inc.status_note
