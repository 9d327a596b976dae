"""bench/chaos_soak.py's fault selection and exit condition, and bench/ingest_abuse.py's per-round ratios (the
parts that decide what a soak runs and what it reports; the soak itself runs in tests/integration/test_soak.py)."""

from __future__ import annotations

import sys

import pytest

from tests.conftest import REPO, load_bench


soak = load_bench("chaos_soak")
KINDS = list(soak.KINDS)
SIGS = ["gpu-xid-reset", "ib-port-down", "nic-lost-carrier", "disk-full", "nccl-watchdog-timeout"]


def test_shards_together_run_every_kind_and_signature_once():
    seen: list[str] = []
    for i in range(1, 4):
        kinds, sigs = soak.shard(KINDS, SIGS, f"{i}/3")
        assert ("log" in kinds) == bool(sigs)
        seen += [k for k in kinds if k != "log"] + [f"log:{s}" for s in sigs]
    assert sorted(seen) == sorted([k for k in KINDS if k != "log"] + [f"log:{s}" for s in SIGS])


def test_one_shard_is_the_whole_run():
    kinds, sigs = soak.shard(KINDS, SIGS, "1/1")
    assert sorted(kinds) == sorted(KINDS) and sorted(sigs) == sorted(SIGS)


def test_shard_without_the_log_kind_runs_no_signature():
    kinds, sigs = soak.shard(["xid", "hang"], SIGS, "1/1")
    assert kinds == ["hang", "xid"] and sigs == []


@pytest.mark.parametrize("spec", ["0/3", "4/3", "1", "a/b", "1/0"])
def test_bad_shard_is_refused_with_its_text(spec):
    with pytest.raises(ValueError, match=f"--shard '{spec}'"):
        soak.shard(KINDS, SIGS, spec)


def row(kind: str, signature: str = "") -> "soak.FaultRow":
    return soak.FaultRow(kind, "node1", 0.0, 1, signature=signature)


def test_exit_condition_names_every_kind_and_signature_that_never_ran():
    rows = [row("xid"), row("hang"), row("log", "ib-port-down")]
    missing = soak.not_run(["xid", "hang", "nan", "log"], ["ib-port-down", "nic-lost-carrier"], rows)
    assert missing == ["log:nic-lost-carrier", "nan"]
    assert soak.not_run(["xid", "hang", "log"], ["ib-port-down"], rows) == []


def test_abuse_ratio_compares_each_loaded_round_with_the_unloaded_rounds_around_it():
    abuse = load_bench("ingest_abuse")
    unloaded = [{"samples_s": v} for v in (100.0, 200.0, 100.0)]
    loaded = [{"samples_s": v} for v in (135.0, 150.0)]
    assert abuse.round_ratios(unloaded, loaded) == pytest.approx([0.9, 1.0])


def test_job_level_faults_wait_until_the_crash_loop_guard_would_let_the_requeue_through():
    window, restarts = 300.0, 3
    assert soak.crash_loop_wait([], 1000.0, restarts, window) == 0.0
    assert soak.crash_loop_wait([900.0, 950.0], 1000.0, restarts, window) == 0.0  # the third is still requeued
    # three in the window: the next waits until the oldest of them leaves it (and a second more)
    assert soak.crash_loop_wait([800.0, 900.0, 950.0], 1000.0, restarts, window) == pytest.approx(101.0)
    assert soak.crash_loop_wait([100.0, 900.0, 950.0], 1000.0, restarts, window) == 0.0  # one is long past


def test_soak_site_program_runs_the_disk_cleanup_playbook_here(tmp_path):
    """disk-full's playbook runs the site's scratch cleanup; where it is not installed the soak writes one for the
    emulated nodes, so the signature runs and its node comes back."""
    import subprocess

    from sigma.controller.config import load_remediation_config

    path = soak.write_site_remediation(tmp_path)
    playbook = load_remediation_config(path).playbook_for("disk-full", "disk", "drain")
    assert playbook.kind == "command" and playbook.command[0] == str(tmp_path / "site" / "disk-cleanup")
    scratch = tmp_path / "nodes" / "node3" / "scratch"
    scratch.mkdir(parents=True)
    (scratch / "checkpoint.tmp").write_text("x")
    argv = [a.replace("{node}", "node3") for a in playbook.command]
    assert subprocess.run(argv, capture_output=True, text=True, check=True).stdout.strip() == f"cleaned {scratch}"
    assert list(scratch.iterdir()) == []
    assert "disk-full" in soak.runnable_signatures(say=lambda s: None)


def test_shared_data_sets_are_found_through_sigma_data(monkeypatch, tmp_path):
    """A fresh machine keeps the data sets elsewhere than ../shared/data: SIGMA_DATA names the directory, and a bench
    without it says which path it looked at."""
    import subprocess

    from sigma.simulate.cli import lanl_path

    monkeypatch.setenv("SIGMA_DATA", str(tmp_path))
    assert lanl_path(None) == tmp_path / "lanl" / "failures-systems-2-10.csv"
    proc = subprocess.run([sys.executable, str(REPO / "bench" / "simulate.py"), "--only", "speed"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1 and f"no LANL failure records at {tmp_path}/lanl" in proc.stderr


def _controller_db(tmp_path):
    from sigma.controller.db import open_db

    return open_db(tmp_path / "controller.db")


def _incident(db, iid: int, opened_at: float, node: str) -> None:
    db.execute("INSERT INTO incidents (id, key, opened_at, updated_at, rule_id, source, scope, node, severity, "
               "action, fault_ts, status) VALUES (?, ?, ?, ?, 'gpu-xid-79', 'rule', 'node', ?, 'error', "
               "'drain+reboot', ?, 'acted')", (iid, f"k{iid}", opened_at, opened_at, node, opened_at))


def _drain(db, key: str, node: str, at: float, incident: int) -> None:
    db.execute("INSERT INTO actions (key, incident_id, kind, target, state, created_at, updated_at) "
               "VALUES (?, ?, 'drain', ?, 'done', ?, ?)", (key, incident, node, at, at))


def test_a_remediation_draining_an_earlier_faults_node_again_is_not_acting_on_this_fault(tmp_path):
    """Seen in the full soak: node3's validation failed after its hang, the remediation drained it again while
    node2's fault was handled, and the soak counted node3 as acted on for node2's fault."""
    db = _controller_db(tmp_path)
    _incident(db, 1, 100.0, "node3")
    _drain(db, "drain:node3:i1", "node3", 100.5, 1)
    _incident(db, 2, 200.0, "node2")
    _drain(db, "drain:node2:i2", "node2", 200.5, 2)
    _drain(db, "drain:node3:c1:f0:failed", "node3", 210.0, 1)  # node3's validation failed: drained again
    db.commit()
    assert [d[0] for d in soak.drains_since(db, 199.0)] == ["node2"]
    assert [d[0] for d in soak.drains_since(db, 99.0)] == ["node3", "node2", "node3"]


def test_a_node_waiting_for_an_admin_is_marked_repaired_once(tmp_path):
    """Seen in the full soak: the soak marked node4 repaired, read it as still remediating before the controller's
    next tick, marked it again after the controller had moved it to validating, and stopped on the error."""
    import json

    db = _controller_db(tmp_path)
    db.execute("INSERT INTO node_lifecycle (node, state, playbook, entered_at, data, updated_at) "
               "VALUES ('node4', 'remediating', 'nvlink-ticket', 0, '{}', 0)")
    db.commit()
    assert soak.waits_for_admin(db, "node4")
    db.execute("UPDATE node_lifecycle SET data = ? WHERE node = 'node4'", (json.dumps({"repaired_at": 5.0}),))
    db.commit()
    assert not soak.waits_for_admin(db, "node4")
    db.execute("UPDATE node_lifecycle SET state = 'remediating', playbook = 'reboot', data = '{}'")
    assert not soak.waits_for_admin(db, "node4")  # the controller reboots it: nothing for a person to do
    assert not soak.waits_for_admin(db, "node1")


def test_every_name_a_bench_imports_from_the_package_exists():
    """`make bench` on a fresh machine stopped at bench/parallel.py: it imported a function sigma.train.flops no
    longer has (imports inside functions run only when the bench does)."""
    import ast
    import importlib

    missing = []
    for path in sorted((REPO / "bench").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] in ("sigma", "tests"):
                module = importlib.import_module(node.module)
                missing += [f"{path.name}: {node.module}.{a.name}" for a in node.names
                            if not hasattr(module, a.name) and not _is_submodule(node.module, a.name)]
    assert missing == []


def _is_submodule(package: str, name: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(f"{package}.{name}") is not None


def test_a_cluster_step_that_hangs_is_a_cluster_error_naming_its_log(tmp_path):
    """At load 200 `mariadb-install-db` ran past its timeout and `sigma cluster up` printed a traceback."""
    from sigma.slurm import cluster

    with pytest.raises(cluster.ClusterError, match=r"initialising the data directory did not finish within 0.5 s"):
        cluster._checked(["sleep", "5"], tmp_path / "install.log", "initialising the data directory", timeout_s=0.5)


def test_a_drain_that_lets_jobs_finish_does_not_wait_for_the_job_to_restart():
    """disk-full drains its node with requeue_jobs: false (the running job may finish): the soak waited for a
    restart that the rule never asks for."""
    rules = {r.id: r for r in soak._load_rules()}
    assert rules["disk-full"].requeue_jobs is False
    drain_only = soak.FaultRow("log", "node2", 0.0, 1, signature="disk-full", expected_action="drain",
                               requeues=False)
    assert drain_only.node_fault and not drain_only.job_affected and drain_only.recovered
    xid = soak.FaultRow("log", "node2", 0.0, 1, signature="gpu-xid-79", expected_action="drain+reboot")
    assert xid.job_affected and not xid.recovered


def test_an_evaluation_step_is_training_and_a_stall_of_the_same_length_is_not():
    """Steps 0.3 s apart; step 5 carries a 1.8 s evaluation (2.1 s in all), step 9 came 2.1 s late without one."""
    points, t = [], 0.0
    for step in range(1, 13):
        t += 2.1 if step in (5, 9) else 0.3
        points.append((t, step, 1.8 if step == 5 else None))
    share = soak.effective_share(points, [], 0.0, t)
    assert share.evaluations == [(5, 1.8)]
    (stall,) = share.lost_outside
    assert stall[2:4] == (8, 9) and stall[4] == pytest.approx(2.1)
    assert share.overall == pytest.approx((t - 0.3 - 2.1) / (t - 0.3))  # from the first step, less the stall
    # a redone step never counts, evaluation or not; a fault window takes its span out of "outside"
    redo = soak.effective_share([(0.0, 1, None), (0.3, 2, None), (0.6, 2, 0.1), (0.9, 3, None)], [(0.3, 0.6)], 0, 0.9)
    assert redo.evaluations == [] and redo.outside == pytest.approx(0.6 / 0.6)
