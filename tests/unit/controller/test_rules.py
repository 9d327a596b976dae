"""The knowledge base loads, rejects bad rules with located errors, and each rule family matches its rows."""

import json
import math

import pytest

from sigma.config import ConfigError
from sigma.paths import configs_dir
from sigma.rules.loader import load_rules
from sigma.rules.matcher import evaluate

NOW = 1_000_000.0
RULES = {r.id: r for r in load_rules(configs_dir() / "rules")}


def ev(node, message="", kind="line", source="log", ts=NOW - 5, severity="info", fields=None, job_ids=(), id=1):
    return {"id": id, "node": node, "ts": ts, "source": source, "kind": kind, "severity": severity,
            "message": message, "fields": json.dumps(fields or {}), "job_ids": json.dumps(list(job_ids))}


def sample(node, metric, value, ts, labels=None):
    return {"node": node, "ts": ts, "metric": metric, "value": value, "labels": json.dumps(labels or {})}


def hits(rule_ids, **rows):
    found = evaluate([RULES[r] for r in rule_ids], now=NOW, **rows)
    return [(f.rule_id, f.node, f.job_id, f.action) for f in found]


def test_knowledge_base_has_the_builtin_signatures():
    for rid in ("gpu-xid-79", "gpu-xid-repair", "gpu-xid-74", "gpu-xid-restart-app", "gpu-xid-record", "gpu-ecc-uncorrectable",
                "gpu-nvml-unresponsive", "gpu-count-changed", "ib-port-down", "ib-port-flapping", "nic-lost-carrier",
                "disk-full", "kernel-hung-task", "health-prolog-failed", "health-epilog-failed",
                "kpi-nonfinite-loss", "kpi-nan-loss-event"):
        assert rid in RULES, rid
    assert RULES["gpu-xid-79"].action == "drain+reboot" and RULES["gpu-xid-restart-app"].scope == "job"


@pytest.mark.parametrize("xid,rule,action", [(79, "gpu-xid-79", "drain+reboot"), (48, "gpu-xid-repair", "drain"),
                                             (64, "gpu-xid-repair", "drain"), (95, "gpu-xid-reset", "drain+reboot"),
                                             (74, "gpu-xid-74", "drain+ticket"), (63, "gpu-xid-record", "record"),
                                             (92, "gpu-xid-record", "record")])
def test_xid_buckets(xid, rule, action):
    line = f"NVRM: Xid (PCI:0000:3b:00): {xid}, pid=1234, name=python"
    found = hits(RULES, events=[ev("node3", line, kind="xid", fields={"xid": xid})])
    assert found == [(rule, "node3", None, action)]


def test_xid_94_restarts_only_the_job():
    found = hits(["gpu-xid-restart-app"], events=[ev("node2", "NVRM: Xid 94", kind="xid", fields={"xid": "94"},
                                            job_ids=[77])])
    assert found == [("gpu-xid-restart-app", None, 77, "requeue")]


def test_xid_94_without_job_ids_uses_jobs_on_the_node():
    found = evaluate([RULES["gpu-xid-restart-app"]], now=NOW, events=[ev("node2", kind="xid", fields={"xid": 94})],
                     jobs_on_node={"node2": [5, 6]})
    assert sorted(f.job_id for f in found) == [5, 6]


@pytest.mark.parametrize("rule,line", [
    ("gpu-nvml-unresponsive", "nvidia-smi: Unable to determine the device handle for GPU 0000:3b:00.0: Unknown Error"),
    ("nic-lost-carrier", "systemd-networkd[812]: enp65s0: Lost carrier"),
    ("disk-full", "EXT4-fs warning (device nvme0n1p1): ext4_dx_add_entry: No space left on device"),
    ("kernel-hung-task", "INFO: task python:4242 blocked for more than 120 seconds."),
    ("ib-port-down", "mlx5_core 0000:17:00.0: mlx5_port_module_event: Port 1 state changed to DOWN, link down"),
])
def test_log_signatures(rule, line):
    kind = {"disk-full": "disk_full"}.get(rule, "line")  # the kind the sidecar's pattern gives the line
    assert hits([rule], events=[ev("node1", line, kind=kind)]) == [(rule, "node1", None, RULES[rule].action)]
    assert hits([rule], events=[ev("node1", "kernel: usb 1-1: new high-speed USB device")]) == []


def test_nvml_sources():
    assert hits(["gpu-xid-79"], events=[ev("node1", "GPU 0: Xid 79", kind="xid", source="nvml",
                                           fields={"xid": 79})]) == [("gpu-xid-79", "node1", None, "drain+reboot")]
    lost = ev("node2", "GPU 3: GPU is lost", kind="gpu_error", source="nvml")
    assert hits(["gpu-nvml-unresponsive"], events=[lost]) == [("gpu-nvml-unresponsive", "node2", None, "drain+reboot")]
    ecc = ev("node2", "NVRM: uncorrectable ECC error detected", kind="ecc_uncorrectable")
    assert hits(["gpu-ecc-uncorrectable-log"], events=[ecc]) == [("gpu-ecc-uncorrectable-log", "node2", None, "drain")]


def test_ib_flapping_needs_repeats_in_window():
    lines = ["mlx5_core 0000:17:00.0: link down", "mlx5_core 0000:17:00.0: link up"] * 2
    events = [ev("node4", m, ts=NOW - 200 + i * 30, id=i) for i, m in enumerate(lines)]
    assert hits(["ib-port-flapping"], events=events[:3]) == []
    assert hits(["ib-port-flapping"], events=events) == [("ib-port-flapping", "node4", None, "drain+ticket")]
    old = [ev("node4", m, ts=NOW - 1000 + i, id=i) for i, m in enumerate(lines)]
    assert hits(["ib-port-flapping"], events=old) == []


def test_uncorrectable_ecc_increase_per_gpu():
    rows = [sample("node2", "gpu.ecc.volatile.uncorrected", 0, NOW - 100, {"gpu": "0"}),
            sample("node2", "gpu.ecc.volatile.uncorrected", 0, NOW - 100, {"gpu": "1"}),
            sample("node2", "gpu.ecc.volatile.uncorrected", 0, NOW - 10, {"gpu": "0"}),
            sample("node2", "gpu.ecc.volatile.uncorrected", 2, NOW - 10, {"gpu": "1"}),
            sample("node1", "gpu.ecc.volatile.uncorrected", 5, NOW - 100, {"gpu": "0"}),
            sample("node1", "gpu.ecc.volatile.uncorrected", 5, NOW - 10, {"gpu": "0"})]
    found = evaluate([RULES["gpu-ecc-uncorrectable"]], now=NOW, samples=rows)
    assert [(f.node, f.evidence["series"][0]["labels"]) for f in found] == [("node2", {"gpu": "1"})]


def test_gpu_count_changed():
    rows = [sample("node1", "gpu.count", 8, NOW - 60), sample("node1", "gpu.count", 7, NOW - 5),
            sample("node2", "gpu.count", 8, NOW - 60), sample("node2", "gpu.count", 8, NOW - 5)]
    assert hits(["gpu-count-changed"], samples=rows) == [("gpu-count-changed", "node1", None, "drain+reboot")]


def test_prolog_verdict_drains_not_a_check_the_suite_forgave():
    reject = ev("node3", "prolog: reject; gpu_count: nvidia-smi found 7 GPUs, expected 8", kind="suite.prolog",
                source="health", severity="reject", fields={"suite": "prolog", "category": "gpu"})
    # a timed-out check under tool_failure: ignore, and a warn-only failure: the prolog kept these nodes
    timeout = ev("node2", "did not finish within 2.0s", kind="kernel_log", source="health", severity="timeout",
                 fields={"suite": "prolog"})
    warn = ev("node1", "page cache 80%", kind="page_cache", source="health", severity="fail",
              fields={"suite": "prolog"})
    accept = [ev(n, "prolog: accept", kind="suite.prolog", source="health", severity="accept",
                 fields={"suite": "prolog"}) for n in ("node1", "node2")]
    assert hits(["health-prolog-failed", "health-epilog-failed"], events=[reject, timeout, warn, *accept]) == \
        [("health-prolog-failed", "node3", None, "drain")]


def test_nonfinite_loss_from_kpis_and_from_events():
    kpis = [{"node": "node1", "ts": NOW - 10, "job_id": 9, "rank": 0, "step": 5, "loss": 2.5},
            {"node": "node1", "ts": NOW - 5, "job_id": 9, "rank": 0, "step": 6, "loss": math.inf},
            {"node": "node2", "ts": NOW - 5, "job_id": 10, "rank": 0, "step": 6, "loss": 2.1}]
    assert hits(["kpi-nonfinite-loss"], kpis=kpis) == [("kpi-nonfinite-loss", None, 9, "requeue")]
    nan_payload = [{"node": "node1", "ts": NOW - 5, "job_id": 11, "rank": 0, "step": 6, "loss": None,
                    "payload": json.dumps({"loss": "nan"})}]
    assert hits(["kpi-nonfinite-loss"], kpis=nan_payload) == [("kpi-nonfinite-loss", None, 11, "requeue")]
    ingested = [{"node": "node1", "ts": NOW - 5, "job_id": 12, "rank": 0, "step": 6, "loss": None,
                 "payload": json.dumps({"nonfinite": {"loss": "nan"}})}]
    assert hits(["kpi-nonfinite-loss"], kpis=ingested) == [("kpi-nonfinite-loss", None, 12, "requeue")]
    event = ev("node1", "loss is nan at step 6", kind="nan_loss", source="kpi", job_ids=[9])
    assert hits(["kpi-nan-loss-event"], events=[event]) == [("kpi-nan-loss-event", None, 9, "requeue")]


def test_evidence_older_than_return_to_service_or_requeue_is_ignored():
    line = ev("node3", kind="xid", fields={"xid": 79}, ts=NOW - 30)
    assert evaluate([RULES["gpu-xid-79"]], now=NOW, events=[line], since={"node3": NOW - 20}) == []
    assert evaluate([RULES["gpu-xid-79"]], now=NOW, events=[line], since={"node3": NOW - 40}) != []
    nan = ev("node1", kind="nan_loss", source="kpi", job_ids=[9], ts=NOW - 30)
    assert evaluate([RULES["kpi-nan-loss-event"]], now=NOW, events=[nan], since_job={9: NOW - 20}) == []


def _write(tmp_path, text, name="r.yaml"):
    p = tmp_path / name
    p.write_text(text)
    return p


def test_unknown_key_is_located(tmp_path):
    p = _write(tmp_path, "version: 1\nrules:\n  - id: a\n    description: d\n    severity: info\n    action: record\n"
                         "    log: {source: log}\n    colour: red\n")
    with pytest.raises(ConfigError, match=r"r.yaml:8 \[rules.0.colour\]: unknown key 'colour'"):
        load_rules(p)


def test_bad_regex_and_two_matches_are_located(tmp_path):
    p = _write(tmp_path, "version: 1\nrules:\n  - id: a\n    description: d\n    severity: info\n    action: record\n"
                         "    log: {message: '(unclosed'}\n")
    with pytest.raises(ConfigError, match=r"r.yaml:7 \[rules.0.log\]: message: invalid regex"):
        load_rules(p)
    p = _write(tmp_path, "version: 1\nrules:\n  - id: a\n    description: d\n    severity: info\n    action: record\n"
                         "    log: {}\n    metric: {metric: m, op: '>', value: 1}\n")
    with pytest.raises(ConfigError, match=r"exactly one of log, metric, health, kpi"):
        load_rules(p)


def test_duplicate_ids_across_files_are_located(tmp_path):
    body = "version: 1\nrules:\n  - id: same\n    description: d\n    severity: info\n    action: record\n    log: {}\n"
    _write(tmp_path, body, "a.yaml")
    _write(tmp_path, body, "b.yaml")
    with pytest.raises(ConfigError, match=r"b.yaml:3 \[rules.0.id\]: duplicate rule id 'same' \(first defined in .*a.yaml:3"):
        load_rules(tmp_path)


def test_job_scope_cannot_drain(tmp_path):
    p = _write(tmp_path, "version: 1\nrules:\n  - id: a\n    description: d\n    severity: info\n    action: drain\n"
                         "    scope: job\n    log: {}\n")
    with pytest.raises(ConfigError, match="scope job cannot drain"):
        load_rules(p)
