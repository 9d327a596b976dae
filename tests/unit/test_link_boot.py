"""Links at boot: the sidecar stamps each log event with how long after its boot it was logged (`uptime_s`), and a
link that goes down in the first minutes after boot notifies instead of draining (configs/rules/network.yaml)."""

from __future__ import annotations

import json
import time
from dataclasses import replace
from datetime import datetime
from pathlib import Path

import pytest

from sigma.paths import configs_dir
from sigma.rules.catalogue import sidecar_sections
from sigma.rules.loader import load_rules
from sigma.rules.matcher import evaluate
from sigma.telemetry import logformats
from sigma.telemetry.base import Context, Output
from sigma.telemetry.collectors.logtail import LogTailCollector

RULES = load_rules(configs_dir() / "rules")
KERNEL = sidecar_sections(configs_dir() / "telemetry.yaml")["kernel"]

# dmesg --decode --time-format iso of a GPU node's boot (its first lines are PCI enumeration, seconds into the boot),
# leptonai/gpud's pkg/dmesg/testdata/dmesg.decode.iso.log.1 at commit ae6f858 (tests/fixtures/catalogue/corpus.yaml
# cites its address)
GPUD_BOOT = """\
kern  :info  : 2025-01-17T15:36:15,345155+00:00 ACPI: PCI Root Bridge [PC16] (domain 0000 [bus 80-96])
kern  :info  : 2025-01-17T15:37:28,650514+00:00 mlx5_core 0000:9d:00.1 enp157s0f1np1: Link down
kern  :info  : 2025-01-17T15:37:30,565853+00:00 mlx5_core 0000:1b:00.0 bootnet: Link up
"""
GPUD_BOOTED = datetime.fromisoformat("2025-01-17T15:36:10+00:00").timestamp()


def read(tmp_path: Path, text: str, booted: float, *, kmsg: bool = False) -> list[dict]:
    """The kernel section's events for `text`, on a node that booted at `booted`."""
    (tmp_path / "proc").mkdir(exist_ok=True)
    (tmp_path / "proc" / "stat").write_text(f"cpu 0 0 0 0\nbtime {int(booted)}\n")
    log = tmp_path / "kern.log"
    log.write_text(text)
    params = replace(KERNEL, files=[] if kmsg else [str(log)], source="kmsg" if kmsg else "files",
                     kmsg_path=str(log), start_at="start")
    collector = LogTailCollector("kernel", params, Context(node="node1", node_dir=str(tmp_path),
                                                          host_root=str(tmp_path)))
    out = Output(ts=max(time.time(), booted + 3600))
    try:
        collector.collect(out)
    finally:
        collector.close()
    return [{"id": i, "node": "node1", "ts": out.ts, "source": e[1], "kind": e[2], "severity": e[3],
             "message": e[4], "fields": json.loads(e[5]), "job_ids": []} for i, e in enumerate(out.events)
            if e[1] == "log"]


def decided(events: list[dict]) -> list[tuple[str, str]]:
    return sorted((f.rule_id, f.action) for f in evaluate(RULES, now=events[0]["ts"] + 1, events=events))


@pytest.mark.parametrize("fmt", ["dmesg", "rfc3164", "kmsg", "journal-json", "rfc3339"])
def test_every_envelope_gives_the_time_since_boot(tmp_path, fmt):
    """From the line's own boot-relative stamp (dmesg, a kernel syslog line's [stamp], kmsg, the journal's
    monotonic time), else from its time and the node's boot time."""
    booted = float(int(time.time()) - 7200)  # /proc/stat's btime has whole seconds
    line = logformats.render("mlx5_core 0000:9d:00.1 enp157s0f1np1: Link down", fmt, ts=booted + 73.4,
                             uptime=73.4)
    if fmt == "journal-json":
        entry = json.loads(line)
        line = json.dumps({**entry, "__MONOTONIC_TIMESTAMP": "73400000"})
    (event,) = read(tmp_path, line + "\n", booted, kmsg=fmt == "kmsg")
    assert event["fields"]["uptime_s"] == 73


def test_a_line_from_before_this_boot_has_no_time_since_boot(tmp_path):
    booted = time.time() - 600
    line = logformats.render("mlx5_core 0000:9d:00.1 enp157s0f1np1: Link down", "rfc3339", ts=booted - 60)
    (event,) = read(tmp_path, line + "\n", booted)
    assert "uptime_s" not in event["fields"]
    assert decided([event]) == [("ib-port-down", "drain+ticket")]  # unknown: acted on as before


def test_unused_ports_link_down_in_a_public_boot_log_notifies_and_the_same_line_later_drains(tmp_path):
    """gpud's boot log: a port with nothing plugged in says `Link down` 78 s after boot. Read on the node that
    wrote it, an admin is told; on a node up for a day (the bench's reading of the corpus), it drains."""
    events = read(tmp_path, GPUD_BOOT, GPUD_BOOTED)
    down = next(e for e in events if e["message"].endswith("Link down"))
    assert down["kind"] == "ib_link" and down["fields"]["uptime_s"] == 78
    assert decided(events) == [("link-down-at-boot", "notify")]
    assert decided(read(tmp_path, GPUD_BOOT, GPUD_BOOTED - 86400)) == [("ib-port-down", "drain+ticket")]


def test_a_sata_link_down_is_not_a_network_port(tmp_path):
    booted = time.time() - 7200
    line = logformats.render("ata1: SATA link down (SStatus 0 SControl F300)", "dmesg", ts=booted + 35, uptime=35)
    events = read(tmp_path, line + "\n", booted)
    assert [e["kind"] for e in events] == ["ata_link"] and decided(events) == [("sata-link-down", "notify")]
