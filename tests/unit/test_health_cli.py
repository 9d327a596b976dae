"""`sigma health ...` end to end on fixture roots (real CLI process where exit codes matter)."""

import json
import os
import subprocess
import sys

from sigma.cli import main
from tests.unit.health_helpers import TEST_CONFIG, tree


def sigma(*args, env=None):
    return subprocess.run([sys.executable, "-m", "sigma.cli", *args], capture_output=True, text=True, timeout=120,
                          env={**os.environ, **(env or {})})


def test_run_rejects_faulty_node_with_json_verdict(tmp_path):
    root = tree(tmp_path, "faulty")
    proc = sigma("health", "run", "--config", str(TEST_CONFIG), "--root", str(root), "--node", "gpu02",
                 "--node-dir", str(tmp_path / "node"), "--json")
    assert proc.returncode == 1, proc.stderr
    report = json.loads(proc.stdout)
    assert report["verdict"] == "reject" and report["suite"] == "prolog"
    by_name = {c["name"]: c for c in report["checks"]}
    assert by_name["accelerators"]["status"] == "fail"  # 8 GPUs expected, no NVML here
    assert by_name["kernel_log"]["category"] == "gpu"
    assert list((tmp_path / "node" / "health").glob("*-prolog.json"))


def test_run_single_check_on_healthy_node(tmp_path, capsys):
    root = tree(tmp_path, "healthy")
    code = main(["health", "run", "--config", str(TEST_CONFIG), "--root", str(root), "--node", "gpu01",
                 "--node-dir", str(tmp_path / "node"), "--check", "infiniband", "--check", "mounts"])
    out = capsys.readouterr().out
    assert code == 0
    assert "infiniband" in out and "mounts" in out and "kernel_log" not in out and "verdict: accept" in out
    assert list((tmp_path / "node" / "health").glob("*-prolog-checks.json"))


def test_unknown_check_is_a_usage_error(tmp_path, capsys):
    code = main(["health", "run", "--config", str(TEST_CONFIG), "--check", "gpu_burn", "--no-record"])
    assert code == 2 and "unknown check 'gpu_burn'" in capsys.readouterr().err


def test_log_ack_clears_a_repaired_fault(tmp_path, capsys):
    root = tree(tmp_path, "faulty")
    args = ["--config", str(TEST_CONFIG), "--root", str(root), "--node", "gpu02", "--node-dir", str(tmp_path / "n")]
    assert main(["health", "run", *args, "--check", "kernel_log", "--no-record"]) == 1
    assert main(["health", "log-ack", *args]) == 0
    assert "acknowledged 7 fatal kernel-log line(s)" in capsys.readouterr().out
    assert main(["health", "run", *args, "--check", "kernel_log", "--no-record"]) == 0


def test_prolog_entry_point_own_failure_follows_policy(tmp_path):
    bad = tmp_path / "broken.yaml"
    bad.write_text("suites: [not, a, mapping]\n")
    env = {"SLURMD_NODENAME": "gpu01", "SIGMA_NODE_DIR": str(tmp_path / "n"), "SIGMA_HEALTH_CONFIG": str(bad)}
    proc = sigma("health", "prolog", env=env)
    assert proc.returncode == 0 and "SIGMA FAILED ITSELF" in proc.stderr
    assert "SIGMA FAILED ITSELF" in (tmp_path / "n" / "health" / "health.log").read_text()
    proc = sigma("health", "prolog", env={**env, "SIGMA_HEALTH_TOOL_FAILURE": "reject"})
    assert proc.returncode == 1


def test_prolog_entry_point_rejects_on_node_fault(tmp_path):
    root = tree(tmp_path, "faulty")
    env = {"SLURMD_NODENAME": "gpu02", "SLURM_JOB_ID": "77", "SIGMA_NODE_DIR": str(tmp_path / "n"),
           "SIGMA_HEALTH_CONFIG": str(TEST_CONFIG), "SIGMA_HEALTH_ROOT": str(root)}
    proc = sigma("health", "prolog", env=env)
    assert proc.returncode == 1 and "sigma prolog: reject" in proc.stderr
    (result,) = (tmp_path / "n" / "health").glob("*-prolog.json")
    assert json.loads(result.read_text())["job_id"] == 77


def test_list_shows_checks_and_suites(capsys):
    assert main(["health", "list", "--config", str(TEST_CONFIG)]) == 0
    out = capsys.readouterr().out
    assert "kernel_log" in out and "collective" in out and "suites: prolog, epilog, comprehensive" in out
