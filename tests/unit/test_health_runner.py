"""Runner (per-check timeouts, total budget, errors), verdict policy, result file contract, watchdog."""

import json
import subprocess
import sys
import threading
import time

from sigma.health.config import HookConfig, load_health_config
from sigma.health.hooks import execute
from sigma.health.result import CheckRecord, Result, verdict
from sigma.health.runner import run_checks
from tests.unit.health_helpers import TEST_CONFIG, context, tree

HANG = threading.Event()  # never set: a check that blocks like a read from a hung filesystem


def hanging(ctx, args):
    HANG.wait()


def crashing(ctx, args):
    raise RuntimeError("bug in a check")


def passing(ctx, args):
    return Result("pass", "fine")


def failing(ctx, args):
    return Result("fail", "xid-79 GPU has fallen off the bus", "gpu")


def config_with(**checks):
    config = load_health_config(TEST_CONFIG)
    from sigma.health.config import CheckConfig
    for name, timeout in checks.items():
        config.checks[name] = CheckConfig(timeout_s=timeout)
    return config


def test_hanging_check_is_abandoned_at_its_timeout_and_others_still_run(tmp_path):
    config = config_with(mounts=0.3)
    ctx = context(tree(tmp_path, "healthy"), "gpu01", tmp_path / "n", config=config)
    custom = {"mounts": (hanging, "mount"), "disk": (passing, "storage")}
    out = run_checks(ctx, ["mounts", "disk"], deadline=time.monotonic() + 5, custom=custom)
    assert [(r.name, r.status) for r in out.records] == [("mounts", "timeout"), ("disk", "pass")]
    assert "timeout 0.3s" in out.records[0].message
    assert out.verdict == "accept" and out.issues[0]["blocking"] is False


def test_budget_spent_marks_the_rest_not_run(tmp_path):
    config = config_with(mounts=30)
    ctx = context(tree(tmp_path, "healthy"), "gpu01", tmp_path / "n", config=config)
    custom = {"mounts": (hanging, "mount"), "disk": (passing, "storage")}
    out = run_checks(ctx, ["mounts", "disk"], deadline=time.monotonic() + 1.0, custom=custom)
    assert out.records[0].status == "timeout" and "total budget spent" in out.records[0].message
    assert out.records[1].status == "timeout" and out.records[1].message == "not run: total budget spent"


def test_crash_is_error_in_tool_category_and_policy_decides(tmp_path):
    ctx = context(tree(tmp_path, "healthy"), "gpu01", tmp_path / "n")
    out = run_checks(ctx, ["disk"], deadline=time.monotonic() + 5, custom={"disk": (crashing, "storage")})
    rec = out.records[0]
    assert (rec.status, rec.category, rec.message) == ("error", "tool", "RuntimeError: bug in a check")
    assert "Traceback" in out.tracebacks["disk"]
    assert verdict(out.records, "ignore")[0] == "accept"
    assert verdict(out.records, "reject")[0] == "reject"


def test_verdict_warn_checks_do_not_reject():
    recs = [CheckRecord("page_cache", "fail", "big cache", "host-noise", 0.0, blocking=False),
            CheckRecord("kernel_log", "pass", "", "kernel", 0.0)]
    decision, issues = verdict(recs)
    assert decision == "accept" and issues == [{"check": "page_cache", "status": "fail", "category": "host-noise",
                                                "message": "big cache", "blocking": False}]
    recs.append(CheckRecord("kernel_log", "fail", "xid-79", "gpu", 0.0))
    assert verdict(recs)[0] == "reject"


def test_result_file_follows_the_contract(tmp_path):
    config = load_health_config(TEST_CONFIG)
    node_dir = tmp_path / "node"
    report, code = execute(config, "prolog", config.prolog, started=time.monotonic(), node="gpu01",
                           root=str(tree(tmp_path, "faulty")), node_dir=str(node_dir), job_id=42,
                           custom={"accelerators": (passing, "gpu")})
    assert code == 1
    files = list((node_dir / "health").glob("*-prolog.json"))
    assert len(files) == 1 and files[0].name == f"{int(report['ts'] * 1000)}-prolog.json"
    data = json.loads(files[0].read_text())
    assert {"node", "ts", "suite", "job_id", "verdict", "duration_s", "checks"} <= set(data)
    assert (data["node"], data["suite"], data["job_id"], data["verdict"]) == ("gpu01", "prolog", 42, "reject")
    for c in data["checks"]:
        assert set(c) >= {"name", "status", "message", "category", "duration_s"}
        assert c["status"] in ("pass", "fail", "skip", "error", "timeout")
    cats = {i["category"] for i in data["issues"] if i["blocking"]}
    assert {"gpu", "host-memory", "mount", "network", "infiniband"} <= cats
    assert "host-noise" not in cats  # page_cache is on_fail: warn


def test_healthy_prolog_accepts(tmp_path):
    config = load_health_config(TEST_CONFIG)
    report, code = execute(config, "prolog", config.prolog, started=time.monotonic(), node="gpu01",
                           root=str(tree(tmp_path, "healthy")), node_dir=str(tmp_path / "node"),
                           custom={"accelerators": (passing, "gpu")})
    assert code == 0 and report["verdict"] == "accept" and report["issues"] == []


WATCHDOG_SCRIPT = """
import sys, time, threading
from sigma.health import hooks
from sigma.health.config import load_health_config
from sigma.health.context import Context
ctx = Context.create(load_health_config(sys.argv[1]), "gpu01", sys.argv[2], sys.argv[3])
t = time.monotonic()
hooks._watchdog(ctx, "prolog", 7, t, t + 0.2, 0, True, time.time())
threading.Event().wait(30)  # the main thread itself is stuck
sys.exit(5)
"""


def test_watchdog_ends_a_stuck_process_and_leaves_a_result(tmp_path):
    proc = subprocess.run([sys.executable, "-c", WATCHDOG_SCRIPT, str(TEST_CONFIG), str(tmp_path),
                           str(tmp_path / "node")], capture_output=True, text=True, timeout=20)
    assert proc.returncode == 0  # tool_failure ignore
    assert "watchdog fired" in proc.stderr
    (result,) = (tmp_path / "node" / "health").glob("*-prolog.json")
    data = json.loads(result.read_text())
    assert data["verdict"] == "accept" and data["issues"][0]["check"] == "watchdog"


def test_hook_config_defaults_match_the_issue():
    hook = HookConfig()
    assert hook.budget_s == 10.0 and hook.drop_caches and hook.tool_failure == "ignore"
