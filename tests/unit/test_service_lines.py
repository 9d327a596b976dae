"""Services' own lines (the telemetry section `services`): systemd's unit failures, Fabric Manager and file-system
clients saying they failed notify; a service's name is only claimed by its line, so no rule on them may drain; the
kernel's lines stay the kernel section's, so no line is two events. Lines from the corpus (tests/fixtures/catalogue)."""

from __future__ import annotations

import json
import time
from dataclasses import replace

import pytest

from sigma.paths import configs_dir
from sigma.rules.catalogue import sidecar_sections, try_line
from sigma.rules.loader import load_rules
from sigma.rules.schema import LogMatch, Rule
from sigma.telemetry.base import Context, Output
from sigma.telemetry.collectors.logtail import LogTailCollector

RULES = load_rules(configs_dir() / "rules")
BY_ID = {r.id: r for r in RULES}
SECTIONS = sidecar_sections(configs_dir() / "telemetry.yaml")
XID_79 = "NVRM: Xid (PCI:0000:3b:00): 79, pid=4242, name=python, GPU has fallen off the bus."


@pytest.mark.parametrize("line,actions", [
    ('Sep 18 03:19:01 gpu01 nvidia-fabricmanager-start.sh[4753]: "/usr/bin/nv-fabricmanager -c '
     '/usr/share/nvidia/nvswitch/fabricmanager.cfg" failed! Exit code: 1', ["notify"]),
    ("Sep 18 03:19:01 gpu01 systemd[1]: nvidia-fabricmanager.service: Control process exited, code=exited, "
     "status=1/FAILURE", ["notify"]),
    ("Sep 17 15:08:01 gpu01 beegfs-client[780929]: mount: /mnt/beegfs: mount(2) system call failed: Operation "
     "canceled.", ["notify"]),
    ("Sep 17 15:08:01 gpu01 systemd[1]: Failed to start beegfs-client.service - Start BeeGFS Client.", ["notify"]),
    ("May 10 15:17:51 gpu01 systemd[1]: media-672.mount: Failed with result 'timeout'.", ["notify"]),
    ("Mar  3 10:00:01 gpu01 (udev-worker)[2210]: nvidia: Process '/sbin/modprobe nvidia-uvm' failed with exit code 1.",
     ["notify"]),  # udev could not load the driver's module: it notifies, never drains (anyone can log as udev)
    # look-alikes: a service starting, Fabric Manager on a system without NVSwitches, a unit that exited cleanly
    ("Sep 17 15:12:54 gpu01 beegfs-client[781540]: Starting BeeGFS Client:", []),
    ("Sep 18 03:19:01 gpu01 nvidia-fabricmanager-start.sh[4753]: Detected Pre-NVL5 system", []),
    ("Sep 18 03:19:01 gpu01 systemd[1]: nvidia-fabricmanager.service: Control process exited, code=exited, "
     "status=0/SUCCESS", []),
    ("May 10 15:16:20 gpu01 systemd[1]: Mounting /media/672...", []),
])
def test_a_service_that_says_it_failed_notifies(line, actions):
    outcome = try_line(RULES, BY_ID["service-unit-failed"], line, "rfc3164", SECTIONS)
    assert sorted({f.action for f in outcome.findings}) == actions
    assert all(e["source"] == "service" for e in outcome.events)


@pytest.mark.parametrize("rule_id", ["service-unit-failed", "service-failed"])
def test_each_service_rule_fires_in_every_envelope_that_names_a_program(rule_id):
    from sigma.rules.catalogue import cases

    for rule, example, fmt in cases([BY_ID[rule_id]]):
        assert try_line(RULES, rule, example, fmt, SECTIONS).correct, (fmt, example)


def test_a_rule_on_a_services_line_cannot_drain(tmp_path):
    """Anyone can `logger -t systemd`: a rule on source 'service' that drains is refused, shipped or overridden."""
    with pytest.raises(ValueError, match="service-unit-failed.*may notify, not drain"):
        replace(BY_ID["service-unit-failed"], action="drain")
    with pytest.raises(ValueError, match="may notify, not drain\\+reboot"):
        Rule(id="fm-down", description="x", severity="error", action="drain+reboot",
             log=LogMatch(source=["log", "service"]))
    from sigma.config import ConfigError
    from sigma.rules.overrides import apply_overrides

    site = tmp_path / "overrides.yaml"
    site.write_text("version: 1\noverrides:\n  - rule: service-failed\n    action: drain\n")
    with pytest.raises(ConfigError, match="overrides.yaml:3.*may notify, not drain"):
        apply_overrides(RULES, site)


def section(name: str, log, tmp_path) -> LogTailCollector:
    (tmp_path / "proc").mkdir(exist_ok=True)
    (tmp_path / "proc" / "stat").write_text(f"btime {int(time.time() - 86400)}\n")
    params = replace(SECTIONS[name], files=[str(log)], source="files", start_at="start")
    return LogTailCollector(name, params, Context(node="node1", node_dir=str(tmp_path), host_root=str(tmp_path)))


def test_one_syslog_file_read_by_both_sections_gives_each_line_one_event(tmp_path):
    """rsyslog's /var/log/messages holds the kernel's lines and the services': each section takes only its own, so
    the kernel's Xid is one event (not two), and a line from a program neither names is acted on by none."""
    log = tmp_path / "messages"
    log.write_text(
        "Nov 27 10:15:30 gpu01 kernel: " + XID_79 + "\n"
        "Nov 27 10:15:31 gpu01 systemd[1]: nvidia-fabricmanager.service: Failed with result 'exit-code'.\n"
        "Nov 27 10:15:32 gpu01 mallory[4242]: nvidia-fabricmanager.service: Failed with result 'exit-code'.\n"
        + json.dumps({"MESSAGE": "mnt.mount: Failed with result 'timeout'.", "_TRANSPORT": "kernel",
                      "SYSLOG_IDENTIFIER": "systemd"}) + "\n")
    kinds = {}
    for name in ("kernel", "services"):
        out = Output()
        section(name, log, tmp_path).collect(out)
        kinds[name] = [(e[1], e[2]) for e in out.events if e[1] in ("log", "service")]
    # the kernel's transport is the kernel's, whatever program it names: only the kernel section reads it
    assert kinds["kernel"] == [("log", "xid"), ("log", "kernel_error")]
    assert kinds["services"] == [("service", "unit_failed")]


def test_the_services_log_status_is_its_own_not_the_kernel_logs(tmp_path):
    """`sigma nodes` shows the kernel log's status: the services section says whether it reads its log under its own
    name, so the kernel's status is never said twice (or overwritten by the services')."""
    params = replace(SECTIONS["services"], auto_order=["files"], files=[str(tmp_path / "absent")])
    out = Output()
    LogTailCollector("services", params, Context(node="node1", node_dir=str(tmp_path),
                                                 host_root=str(tmp_path))).collect(out)
    assert [e[2] for e in out.events if e[1] == "sidecar"] == ["service_log_unavailable"]
    assert [s[1] for s in out.samples] == ["log.service_source_ok"]


def test_an_emulated_node_reads_its_own_syslog_for_services(tmp_path, monkeypatch):
    from sigma.telemetry.config import load

    monkeypatch.setenv("SIGMA_CLUSTER_DIR", str(tmp_path))
    loaded = load(configs_dir() / "telemetry.yaml", node="n3")
    services, kernel = loaded.collectors["services"][1], loaded.collectors["kernel"][1]
    assert (services.auto_order, services.files) == (["files"], [str(tmp_path / "nodes" / "n3" / "syslog")])
    assert kernel.files == [str(tmp_path / "nodes" / "n3" / "kern.log")]
