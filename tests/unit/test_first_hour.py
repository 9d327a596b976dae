"""What a new user meets first: which controller config the commands read, per-checkout clusters, short drain
reasons, injected kernel-line times, and a description behind every `--help`."""

import argparse
import socket
import subprocess
import sys
import time

import pytest

from sigma.cli import build_parser, main


def test_every_command_has_a_description():
    def walk(parser, prefix="sigma"):
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    yield f"{prefix} {name}", sub.description
                    yield from walk(sub, f"{prefix} {name}")

    missing = [name for name, description in walk(build_parser()) if not description]
    assert not missing, f"commands without a --help description: {missing}"


def test_controller_config_found_without_flags(tmp_path, monkeypatch, capsys):
    from sigma.controller.cli import SITE_CONFIG, config_path
    from sigma.paths import configs_dir

    monkeypatch.delenv("SIGMA_CONTROLLER_CONFIG", raising=False)
    monkeypatch.setenv("SIGMA_CLUSTER_DIR", str(tmp_path))
    stack_config = tmp_path / "etc" / "controller.yaml"
    assert config_path() in (configs_dir() / "controller.yaml", SITE_CONFIG)  # no stack yet
    stack_config.parent.mkdir()
    stack_config.write_text(f"db: {tmp_path / 'controller.db'}\n")
    assert config_path() == stack_config  # what `sigma stack up` wrote for this checkout's cluster
    monkeypatch.setenv("SIGMA_CONTROLLER_CONFIG", "/elsewhere.yaml")
    assert str(config_path()) == "/elsewhere.yaml" and str(config_path("/given.yaml")) == "/given.yaml"
    monkeypatch.delenv("SIGMA_CONTROLLER_CONFIG")
    assert main(["incidents"]) == 2  # the stack's config, but its controller never ran
    err = capsys.readouterr().err
    assert f"no controller database at {tmp_path / 'controller.db'}" in err and "sigma stack up" in err


def test_cluster_env_exports_the_controller_config(tmp_path, capsys):
    assert main(["cluster", "env", "--state-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert f"export SIGMA_CONTROLLER_CONFIG={tmp_path / 'etc' / 'controller.yaml'}" in out
    assert f"export SLURM_CONF={tmp_path / 'etc' / 'slurm.conf'}" in out


def test_local_cluster_defaults_are_per_checkout(monkeypatch):
    from sigma.paths import checkout_id, default_cluster_dir, default_port_base
    from sigma.slurm.cluster import ClusterSpec

    monkeypatch.delenv("SIGMA_CLUSTER_DIR", raising=False)
    assert default_cluster_dir().name == f"cluster-{checkout_id()}"
    assert 10000 <= ClusterSpec().port_base == default_port_base() < 20000  # tests use 20000 and up


def test_busy_port_names_the_cluster_that_owns_it(tmp_path):
    from sigma.slurm.cluster import port_owner

    (tmp_path / "cluster.json").write_text("{}")
    (tmp_path / "etc").mkdir()
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    # a listener started the way the stack starts its controller: `... --config <state>/etc/controller.yaml`
    code = f"import socket,time; s=socket.socket(); s.bind(('127.0.0.1',{port})); s.listen(); time.sleep(30)"
    proc = subprocess.Popen([sys.executable, "-c", code, "--config", str(tmp_path / "etc" / "controller.yaml")])
    try:
        deadline = time.monotonic() + 10
        while port_owner(port) is None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert port_owner(port) == str(tmp_path)
        # a second checkout's cluster whose slurmctld would need that port is refused, naming the owner
        from sigma.slurm.cluster import ClusterError, ClusterSpec, LocalCluster

        with pytest.raises(ClusterError, match=f"ports in use: {port} \\(slurmctld\\); they belong to the local "
                                               f"cluster under {tmp_path}"):
            LocalCluster(tmp_path / "other")._check_ports_free(ClusterSpec(port_base=port))
    finally:
        proc.kill()
        proc.wait()


def test_drain_reasons_name_the_rule_within_sinfo_width():
    from sigma.controller.act.reason import SINFO_REASON_WIDTH, drain_reason, short_rule
    from sigma.paths import configs_dir
    from sigma.rules.loader import load_rules

    ids = [r.id for r in load_rules(configs_dir() / "rules")] + [
        "isolation-outlier", "watchdog-hang", "watchdog-crash-loop", "watchdog-throughput-drop",
        "watchdog-below-history", "slurm-node-not-responding"]
    for rule_id in ids:
        shown = drain_reason(rule_id, "a long summary of what happened " * 5)[:SINFO_REASON_WIDTH]
        assert shown.startswith("sigma: " + short_rule(rule_id)), (rule_id, shown)
        assert short_rule(rule_id) in shown and len(short_rule(rule_id)) <= SINFO_REASON_WIDTH - len("sigma: ")
    assert drain_reason("gpu-xid-79", "GPU has  fallen off the bus") == "sigma: gpu-xid-79 GPU has fallen off the bus"
    assert drain_reason("isolation-outlier", "node3 slow").startswith("sigma: straggler (isolation-outlier) node3")
    assert len(set(map(short_rule, ids))) >= len(ids) - 2  # aliases stay distinct (two nan-loss, two ecc rules)


def test_injected_kernel_line_carries_its_exact_time():
    """The fault time the platform records for an injected Xid is the injection's own, to the microsecond, so the
    demo's table, `sigma explain` and `sigma report` measure detection from the same moment."""
    from sigma.chaos.inject import kernel_log_line, xid_line
    from sigma.telemetry.logformats import parse

    now = 1_795_000_000.123456
    parsed = parse(kernel_log_line("node2", xid_line(79), now=now), now=now + 0.5)
    assert parsed.ts == pytest.approx(now, abs=1e-5) and parsed.message.startswith("NVRM: Xid")


def test_health_refuses_a_node_the_local_cluster_does_not_have(tmp_path, monkeypatch, capsys):
    (tmp_path / "cluster.json").write_text("{}")  # a local cluster of the default 4 nodes
    monkeypatch.setenv("SIGMA_CLUSTER_DIR", str(tmp_path))
    monkeypatch.delenv("SIGMA_NODE_DIR", raising=False)
    assert main(["health", "run", "--node", "node9"]) == 2
    err = capsys.readouterr().err
    assert "unknown node 'node9' on the local cluster" in err and "node1, node2, node3, node4" in err
    assert not (tmp_path / "nodes").exists()


def test_train_refuses_local_processes_when_the_local_cluster_is_down(tmp_path, monkeypatch, capsys):
    import os

    from sigma.paths import configs_dir

    if os.path.exists("/etc/slurm/slurm.conf"):
        pytest.skip("this machine has a site SLURM config: sigma train submits there")
    (tmp_path / "cluster.json").write_text("{}")
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc" / "slurm.conf").write_text("# a local cluster that is not running\n")
    monkeypatch.setenv("SIGMA_CLUSTER_DIR", str(tmp_path))
    monkeypatch.delenv("SLURM_CONF", raising=False)
    monkeypatch.chdir(tmp_path)
    assert main(["train", "--config", str(configs_dir() / "train" / "debug.yaml")]) == 2
    err = capsys.readouterr().err
    assert f"the local SLURM cluster under {tmp_path} is not running" in err and "sigma cluster up" in err
    assert not (tmp_path / "runs").exists()


def test_rule_and_key_listings_have_json(tmp_path, monkeypatch, capsys):
    import json

    from sigma.paths import configs_dir

    monkeypatch.delenv("SIGMA_CONTROLLER_CONFIG", raising=False)
    monkeypatch.setenv("SIGMA_CLUSTER_DIR", str(tmp_path))
    assert main(["controller", "rules", "--config", str(configs_dir() / "controller.yaml"), "--json"]) == 0
    rules = json.loads(capsys.readouterr().out)
    xid79 = [r for r in rules if "79" in r["id"]]
    assert xid79 and {"id", "scope", "match", "action", "status"} <= set(xid79[0]) and xid79[0]["status"] == "ok"

    table = tmp_path / "keys.json"
    assert main(["keys", "issue", "node1", "--table", str(table), "--out", str(tmp_path / "k")]) == 0
    capsys.readouterr()
    assert main(["keys", "list", "--table", str(table), "--json"]) == 0
    (key,) = json.loads(capsys.readouterr().out)
    assert key["node"] == "node1" and key["active"] and "secret" not in key
