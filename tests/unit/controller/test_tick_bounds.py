"""Bounded tick cost and rules that fail at run time: one noisy node or one broken rule cannot hold up the rest."""

import json

from sigma.cli import main
from sigma.rules.matcher import MAX_EVIDENCE_ROWS
from sigma.rules.schema import LogMatch, Rule
from sigma.paths import configs_dir
from sigma.rules.loader import load_rules

from tests.unit.controller.helpers import add_event, make_controller, xid79


def noise(conn, node, t0, n, xid=63):
    """n matching events (Xid 63: a record-only rule) from one node, 1 ms apart."""
    with conn:
        conn.executemany("INSERT INTO events (node, ts, source, kind, message, fields) VALUES (?,?,?,?,?,?)",
                         [(node, t0 + i / 1000, "log", "xid", f"NVRM: Xid (PCI:0000:3b:00): {xid}, pid={i}",
                           json.dumps({"xid": xid})) for i in range(n)])


def test_a_noisy_node_does_not_stop_another_nodes_rule_and_its_evidence_is_capped(tmp_path):
    ctl, slurm, clock = make_controller(tmp_path)
    noise(ctl.conn, "node1", clock() - 30, 3000)
    ctl.tick()  # the first tick reads the rule windows
    noise(ctl.conn, "node1", clock() - 20, 3000)  # ... later ticks only what arrived since
    xid79(ctl.conn, "node2", clock() - 1)
    ctl.tick()
    assert slurm.node("node2").drained and slurm.node("node2").reason.startswith("sigma: gpu-xid-79")
    (noisy,) = ctl.incidents.query(node="node1")
    assert noisy.rule_id == "gpu-xid-record" and noisy.status == "recorded"
    found = [f for f in ctl.detect(clock(), {n.name: n for n in slurm.nodes()}, []) if f.node == "node1"]
    assert len(found) == 1  # one finding per node and rule, however many events
    assert found[0].evidence["count"] == 6000 and found[0].evidence["evidence_capped"]
    assert len(found[0].evidence["events"]) == MAX_EVIDENCE_ROWS
    assert found[0].evidence["events"][-1]["message"].endswith("pid=2999")  # the newest rows are kept
    assert len(noisy.evidence["events"]) <= MAX_EVIDENCE_ROWS
    assert ctl.counts()["evidence_capped", "gpu-xid-record"] == 1


def test_events_age_out_of_the_window_and_counts_stay_exact(tmp_path):
    ctl, slurm, clock = make_controller(tmp_path)
    ctl.tick()
    noise(ctl.conn, "node3", clock() - 5, 50)
    ctl.tick()
    count = lambda: [f.evidence["count"] for f in ctl.detect(clock(), {n.name: n for n in slurm.nodes()}, [])
                     if f.node == "node3"]
    assert count() == [50]
    clock.advance(601)  # gpu-xid-record's window is 600 s
    assert count() == []


def broken_rule():
    """Passes no loader (a scalar where a list belongs): what a rule with a bad value does at run time."""
    rule = Rule(id="flaky-rule", description="d", severity="error", action="drain", category="gpu",
                log=LogMatch(source="log", kinds=["xid"], fields={"xid": 79}))
    rule.origin = "configs/rules/extra.yaml:3 [rules.0.id]"
    return rule


def test_a_rule_that_raises_is_disabled_alone_and_reported(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "400")  # one table row per line
    rules = [broken_rule()] + load_rules(configs_dir() / "rules")
    ctl, slurm, clock = make_controller(tmp_path, rules=rules)
    xid79(ctl.conn, "node2", clock() - 1)
    ctl.tick()
    assert slurm.node("node2").drained  # every other rule kept working in the same tick
    assert "flaky-rule" in ctl.disabled and "TypeError" in ctl.disabled["flaky-rule"]["error"]
    assert ctl.counts()["rule_error", "flaky-rule"] == 1
    log = (tmp_path / "log" / "decisions.log").read_text()
    assert "RULE_ERROR flaky-rule (configs/rules/extra.yaml:3 [rules.0.id]) disabled: TypeError" in log
    xid79(ctl.conn, "node3", clock())
    ctl.tick()
    assert ctl.counts()["rule_error", "flaky-rule"] == 1  # disabled: not evaluated (or counted) again
    kb = tmp_path / "kb"
    kb.mkdir()
    (kb / "extra.yml").write_text("version: 1\nrules:\n  - id: flaky-rule\n    description: d\n    severity: error\n"
                                  "    action: drain\n    log: {source: log, kinds: [xid], fields: {xid: [79]}}\n")
    capsys.readouterr()
    assert main(["controller", "rules", "--rules", str(kb), "--db", ctl.cfg.db]) == 0
    assert "disabled at run time: TypeError" in capsys.readouterr().out


def test_reload_swaps_rules_and_policy_and_keeps_the_running_set_when_the_new_one_is_bad(tmp_path):
    kb = tmp_path / "kb"
    kb.mkdir()
    rule = ("version: 1\nrules:\n  - id: {id}\n    description: d\n    severity: error\n    action: drain\n"
            "    log: {{source: log, kinds: [xid], fields: {{xid: {xid}}}}}\n")
    (kb / "a.yaml").write_text(rule.format(id="xid-79", xid="[79]"))
    policy = tmp_path / "controller.yaml"
    policy.write_text(f"db: {tmp_path / 'c.db'}\nlog_dir: {tmp_path / 'log'}\nrules: {kb}\nremediation: "
                      f"{configs_dir() / 'remediation.yaml'}\nbreaker: {{max_nodes: 2, max_fraction: 0.5}}\n")
    ctl, slurm, clock = make_controller(tmp_path, rules=load_rules(kb))
    assert ctl.reload(str(policy)) and [r.id for r in ctl.rules] == ["xid-79"]
    (kb / "a.yaml").write_text(rule.format(id="xid-48", xid="48"))  # scalar where a list belongs
    assert not ctl.reload(str(policy))
    assert [r.id for r in ctl.rules] == ["xid-79"] and ctl.counts()["reload", "rejected"] == 1
    jsonl = (tmp_path / "log" / "controller.jsonl").read_text()
    assert "RELOAD rejected" in jsonl and "a.yaml:7 [rules.0.log.fields.xid]: expected a list" in jsonl
    (kb / "a.yaml").write_text(rule.format(id="xid-48", xid="[48]"))
    policy.write_text(policy.read_text().replace("max_nodes: 2", "max_nodes: 1")
                      .replace(f"log_dir: {tmp_path / 'log'}", "log_dir: /elsewhere"))
    assert ctl.reload(str(policy))
    assert [r.id for r in ctl.rules] == ["xid-48"] and ctl.decider.cfg.breaker.max_nodes == 1
    assert ctl.cfg.log_dir == str(tmp_path / "log")  # needs a restart: the running value is kept
    assert "log_dir need a restart" in (tmp_path / "log" / "decisions.log").read_text()
    ctl.tick()
    add_event(ctl.conn, "node1", clock(), kind="xid", fields={"xid": 48})
    ctl.tick()
    assert slurm.node("node1").drained and slurm.node("node1").reason.startswith("sigma: xid-48")


def test_sighup_reloads_the_running_daemon_and_a_bad_set_is_refused(tmp_path):
    """The real daemon process and a real signal. No SLURM needed: its slurmctld is a closed port, so every tick
    fails at once and is logged, and the daemon keeps going (as it does while a real slurmctld restarts)."""
    import os
    import signal
    import subprocess
    import sys
    import time

    kb = tmp_path / "kb"
    kb.mkdir()
    good = ("version: 1\nrules:\n  - id: xid-79\n    description: d\n    severity: error\n    action: drain\n"
            "    log: {source: log, kinds: [xid], fields: {xid: [79]}}\n")
    (kb / "a.yaml").write_text(good)
    policy = tmp_path / "controller.yaml"
    policy.write_text(f"db: {tmp_path / 'c.db'}\nlog_dir: {tmp_path / 'log'}\nrules: {kb}\nremediation: "
                      f"{configs_dir() / 'remediation.yaml'}\nlisten: 127.0.0.1:0\ningest_secret_file: ''\ningest_keys_file: ''\n"
                      f"slurm_conf: {tmp_path / 'slurm.conf'}\npoll_s: 0.2\n")
    (tmp_path / "slurm.conf").write_text("ClusterName=none\nSlurmctldHost=localhost\nSlurmctldPort=1\n"
                                         "MessageTimeout=1\nNodeName=n1 CPUs=1\nPartitionName=p Nodes=n1\n")
    jsonl = tmp_path / "log" / "controller.jsonl"

    def wait_log(text, timeout=30.0):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if jsonl.exists() and text in jsonl.read_text():
                return
            time.sleep(0.1)
        raise AssertionError(f"{text!r} not in the controller log")

    proc = subprocess.Popen([sys.executable, "-m", "sigma.cli", "controller", "run", "--config", str(policy)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_log("LISTEN")
        (kb / "a.yaml").write_text(good + "    severity: warning\n")  # a duplicate key
        os.kill(proc.pid, signal.SIGHUP)
        wait_log("RELOAD rejected, running rules and policy kept")
        assert "a.yaml:8 [rules.0.severity]: duplicate key 'severity'" in jsonl.read_text()
        (kb / "b.yml").write_text(good.replace("xid-79", "xid-79-copy"))
        (kb / "a.yaml").write_text(good)
        os.kill(proc.pid, signal.SIGHUP)
        wait_log("RELOAD applied: 2 rules")
        assert proc.poll() is None
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_a_reload_keeps_the_windows_of_unchanged_rules_and_reads_those_of_new_ones(tmp_path):
    kb = tmp_path / "kb"
    kb.mkdir()
    shipped = (configs_dir() / "rules" / "gpu.yaml").read_text()
    (kb / "gpu.yaml").write_text(shipped)
    policy = tmp_path / "controller.yaml"
    policy.write_text(f"db: {tmp_path / 'c.db'}\nlog_dir: {tmp_path / 'log'}\nrules: {kb}\nremediation: "
                      f"{configs_dir() / 'remediation.yaml'}\n")
    ctl, slurm, clock = make_controller(tmp_path, rules=load_rules(kb))
    ctl.tick()
    noise(ctl.conn, "node1", clock() - 10, 500)
    ctl.tick()
    kept = ctl.windows.groups["gpu-xid-record"][("node1", ())]
    (kb / "extra.yml").write_text("version: 1\nrules:\n  - id: xid-63-burst\n    description: many Xid 63\n"
                                  "    severity: warning\n    action: notify\n"
                                  "    log: {source: log, kinds: [xid], fields: {xid: [63]}, count: 400}\n")
    assert ctl.reload(str(policy))
    assert ctl.windows.groups["gpu-xid-record"][("node1", ())] is kept  # not read again
    found = {f.rule_id: f for f in ctl.detect(clock(), {n.name: n for n in slurm.nodes()}, [])}
    assert found["xid-63-burst"].evidence["count"] == 500  # the new rule's window was read at the reload
    assert found["gpu-xid-record"].evidence["count"] == 500


def test_at_start_the_windows_are_read_newest_first_a_slice_per_tick(tmp_path, monkeypatch):
    from sigma.controller import loop

    monkeypatch.setattr(loop, "BACKFILL_EVENTS_PER_TICK", 100)
    ctl, slurm, clock = make_controller(tmp_path)
    noise(ctl.conn, "node1", clock() - 60, 1000)
    xid79(ctl.conn, "node2", clock() - 1)
    ctl.tick()  # the newest slice holds node2's fault: drained in the first tick, the flood not read yet
    assert slurm.node("node2").drained
    count = lambda: [f.evidence["count"] for f in ctl.detect(clock(), {n.name: n for n in slurm.nodes()}, [])
                     if f.node == "node1"]
    assert count() and count()[0] < 1000
    for _ in range(12):
        ctl.tick()
    assert count() == [1000] and ctl._backfill is None  # every event counted once
