"""A site changes what a shipped rule does in its own file, without editing configs/rules; `sigma controller rules`
shows the effective action and where it came from, and the controller acts on it."""

from __future__ import annotations

import json

import pytest

from sigma.cli import main
from sigma.config import ConfigError
from sigma.paths import configs_dir
from sigma.rules.loader import load_rules

RULES = configs_dir() / "rules"


def write(path, text):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_an_override_changes_the_action_and_says_where_it_came_from(tmp_path):
    site = write(tmp_path / "rules.d" / "site.yaml", "version: 1\noverrides:\n"
                 "  - rule: nic-bond-member-down\n    action: notify\n    why: our bonds have a spare link\n"
                 "  - rule: gpu-xid-power-smoothing\n    action: drain+ticket\n    requeue_jobs: false\n")
    shipped = {r.id: r for r in load_rules(RULES)}
    rules = {r.id: r for r in load_rules(RULES, overrides=tmp_path / "rules.d")}
    bond = rules["nic-bond-member-down"]
    assert (bond.action, bond.shipped_action, bond.overridden) == (
        "notify", "drain+ticket", f"{site}:3 [overrides.0.rule]: our bonds have a spare link")
    assert (rules["gpu-xid-power-smoothing"].action, rules["gpu-xid-power-smoothing"].requeue_jobs) == (
        "drain+ticket", False)
    assert bond != shipped["nic-bond-member-down"]  # a running controller re-reads that rule's window
    assert all(rules[i] == shipped[i] for i in shipped if i not in ("nic-bond-member-down", "gpu-xid-power-smoothing"))


@pytest.mark.parametrize("text,where,message", [
    ("version: 1\noverrides:\n  - rule: no-such-rule\n    action: notify\n", ":3 [overrides.0.rule]",
     "no rule 'no-such-rule'"),
    ("version: 1\noverrides:\n  - rule: nccl-watchdog-timeout\n    action: drain\n", ":3 [overrides.0.rule]",
     "scope job cannot drain"),
    ("version: 1\noverrides:\n  - rule: disk-full\n    log: {}\n", ":4 [overrides.0.log]", "unknown key"),
    ("version: 1\noverrides:\n  - rule: disk-full\n    action: explode\n", ":4 [overrides.0.action]", "explode"),
])
def test_a_bad_override_names_its_file_and_line(tmp_path, text, where, message):
    site = write(tmp_path / "site.yaml", text)
    with pytest.raises(ConfigError) as exc:
        load_rules(RULES, overrides=site)
    assert str(exc.value).startswith(f"{site}{where}") and message in str(exc.value)


def test_controller_rules_shows_the_effective_action_and_its_origin(tmp_path, capsys):
    write(tmp_path / "rules.d" / "site.yaml", "version: 1\noverrides:\n  - rule: nic-tx-hang\n    action: notify\n")
    args = ["controller", "rules", "--config", "configs/controller.yaml", "--db", str(tmp_path / "none.db"),
            "--overrides", str(tmp_path / "rules.d")]
    assert main([*args, "--json"]) == 0
    rows = {r["id"]: r for r in json.loads(capsys.readouterr().out)}
    assert (rows["nic-tx-hang"]["action"], rows["nic-tx-hang"]["shipped_action"]) == ("notify", "drain+ticket")
    assert rows["nic-tx-hang"]["action_from"].startswith(f"override {tmp_path / 'rules.d' / 'site.yaml'}:3")
    assert rows["disk-full"]["action_from"].endswith("host.yaml:" + rows["disk-full"]["action_from"].split(":")[-1])
    assert main([*args, "--check"]) == 0
    write(tmp_path / "rules.d" / "bad.yaml", "version: 1\noverrides:\n  - rule: nope\n")
    assert main([*args, "--check"]) == 1
    assert "no rule 'nope'" in capsys.readouterr().out


def test_the_controller_acts_on_the_sites_action_and_picks_up_a_new_override(tmp_path):
    """A site override of the Xid 79 rule to notify: the controller keeps the node and tells an admin; removing the
    override is picked up at the next tick (as any rule file edit)."""
    from sigma.controller.config import ControllerConfig
    from tests.unit.controller.helpers import make_controller, xid79

    site = write(tmp_path / "rules.d" / "site.yaml", "version: 1\noverrides:\n  - rule: gpu-xid-79\n    action: notify\n")
    from sigma.controller.act.decisionlog import DecisionLog
    from sigma.controller.db import open_db
    from sigma.controller.loop import Controller

    cfg = ControllerConfig(db=str(tmp_path / "c.db"), log_dir=str(tmp_path / "log"), rules=str(RULES),
                           rule_overrides=str(tmp_path / "rules.d"))
    (tmp_path / "x").mkdir()
    shaped, slurm, clock = make_controller(tmp_path / "x")  # the fakes and playbooks the controller tests use
    ctl = Controller(cfg, conn=open_db(cfg.db), slurm=slurm, remediation=shaped.rcfg, log=DecisionLog(cfg.log_dir),
                     clock=clock, root=tmp_path)
    assert {r.id: r.action for r in ctl.rules}["gpu-xid-79"] == "notify"
    xid79(ctl.conn, "node3", clock() - 1)
    ctl.tick()
    assert not slurm.node("node3").drained
    assert ctl.incidents.query(node="node3")[0].action == "notify"
    site.unlink()
    clock.advance(700)
    ctl.tick()
    assert {r.id: r.action for r in ctl.rules}["gpu-xid-79"] == "drain+reboot"
