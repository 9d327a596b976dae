"""Who wrote a line: every envelope a node writes is read by its own parser, whole or not at all, and the kernel
section acts only on lines whose writer is established (fail closed). Lines from the corpus of real reports
(tests/fixtures/catalogue) where one exists."""

from __future__ import annotations

import json
import time

import pytest

from sigma.paths import configs_dir
from sigma.rules.catalogue import sidecar_sections
from sigma.telemetry import logformats
from sigma.telemetry.base import Output
from tests.unit.telemetry_helpers import make, samples

SECTIONS = sidecar_sections(configs_dir() / "telemetry.yaml")
XID_79 = "NVRM: Xid (PCI:0000:3b:00): 79, pid=4242, name=python, GPU has fallen off the bus."


@pytest.mark.parametrize("line,fmt,ident,facility,message", [
    ("[wo jul 28 05:19:43 2021] EXT4-fs (sda1): Remounting filesystem read-only",  # Dutch dmesg -T
     "dmesg-T", "", "", "EXT4-fs (sda1): Remounting filesystem read-only"),
    ("jan. 29 20:50:17 kevin kernel: pcieport 0000:00:1c.5: AER: Corrected error received: id=00e5",  # Norwegian
     "rfc3164", "kernel", "", "pcieport 0000:00:1c.5: AER: Corrected error received: id=00e5"),
    ("11月 15 14:15:47 leon-NF5468M6 nv-fabricmanager[4177]: request failed",  # Chinese journalctl
     "rfc3164", "nv-fabricmanager", "", "request failed"),
    ("aug 16 23:01:35 kernel: NVRM: Xid (PCI:0000:01:00): 8, pid=709378, name=llama-server, channel 0x00000027",
     "rfc3164", "kernel", "", "NVRM: Xid (PCI:0000:01:00): 8, pid=709378, name=llama-server, channel 0x00000027"),
    ("[    3.475734][   T96] nvme nvme0: pci function 0000:01:00.0", "dmesg", "", "",
     "nvme nvme0: pci function 0000:01:00.0"),  # CONFIG_PRINTK_CALLER
    ("[  +0.000041] pcieport 0000:00:03.0: AER: device recovery failed", "dmesg", "", "",
     "pcieport 0000:00:03.0: AER: device recovery failed"),  # dmesg -H
    ("2023-12-22T12:26:24,559615-08:00 device vethab20cf5 entered promiscuous mode", "dmesg-iso", "", "",
     "device vethab20cf5 entered promiscuous mode"),  # dmesg --time-format iso: a comma before the fraction
    ("[17159596.699613] [Fri Dec 22 12:26:24 2023] [  +0.000000] 2023-12-22T12:26:24,559615-08:00 device x up",
     "dmesg-T", "", "", "device x up"),  # several --time-format at once
    ("2022-11-04T14:09:31 server kernel:[75215.928881] NETDEV WATCHDOG: eth1 (r8152): transmit queue 0 timed out",
     "rfc3339", "kernel", "", "NETDEV WATCHDOG: eth1 (r8152): transmit queue 0 timed out"),
    ("Tue Aug 12 16:40:43 2025 kern.crit kernel: [1317557.006117] eth0: NETDEV WATCHDOG: CPU: 1: transmit queue 3",
     "logread", "kernel", "kern", "eth0: NETDEV WATCHDOG: CPU: 1: transmit queue 3"),
    ("109.200.197.196: kern:   alert: [2024-05-13T15:13:11.99476118Z]: XFS (sdb6): log I/O error -5",
     "talos", "", "kern", "XFS (sdb6): log I/O error -5"),
    ("2025 Jun 18 07:17:40.046393 sonic_testbed ERR kernel: [ 1326.758055] Aborting journal on device loop1-8.",
     "sonic", "kernel", "", "Aborting journal on device loop1-8."),
    ("[    1.343565] archlinux kernel: ata_piix 0000:00:01.1: version 2.13", "dmesg", "kernel", "",
     "ata_piix 0000:00:01.1: version 2.13"),  # journalctl -o short-monotonic
    ("<13>Nov 27 10:00:00 gpu01 kernel: text", "rfc3164", "kernel", "user", "text"),  # logger -t kernel, facility user
    ("14,1235,5843291473,-;systemd-journald[373]: text", "kmsg", "", "user", "systemd-journald[373]: text"),
    ("kern  :warn  : 2025-01-21T02:21:33,502278+00:00 NVRM: Xid (PCI:0000:38:00): 43, pid=2815167, "
     "name=pt_main_thread, Ch 00000008", "dmesg", "", "kern",  # dmesg --decode --time-format iso
     "NVRM: Xid (PCI:0000:38:00): 43, pid=2815167, name=pt_main_thread, Ch 00000008"),
    ("2025-01-17T17:39:30+0000 exp03-ft-896z-1-lan.exp03-ft-896z-job-svc kernel: nvidia-peermem "
     "nv_get_p2p_free_callback:127 ERROR detected invalid context, skipping further processing",  # -o short-iso
     "rfc3339", "kernel", "", "nvidia-peermem nv_get_p2p_free_callback:127 ERROR detected invalid context, "
     "skipping further processing"),
])
def test_each_envelope_has_its_parser(line, fmt, ident, facility, message):
    parsed = logformats.parse(line, booted=time.time() - 86400)
    assert (parsed.format, parsed.ident, parsed.facility, parsed.message) == (fmt, ident, facility, message)
    assert parsed.ts is not None or fmt == "dmesg" and line.startswith("[  +")  # dmesg -H has no absolute time


@pytest.mark.parametrize("line,reason", [
    ("Jan 10 10:54:17 pytest-11.local [57253.352107] bond1: link status definitely down", "envelope not recognised"),
    ("xyz 27 10:15:32 gpu01 kernel: " + XID_79, "envelope not recognised"),  # not a month in any locale
    ("lis 27 10:15:32 gpu01 mallory[4242]: " + XID_79, "program mallory"),
    ("<13>Nov 27 10:00:00 gpu01 kernel: " + XID_79, "facility user"),
    ("Tue Apr  8 16:00:53 2025 user.info kernel: [   17.500800] " + XID_79, "facility user"),
    ("user: warning: [2026-01-12T20:27:31.913975631Z]: " + XID_79, "facility user"),
    ("14,1235,5843291473,-;" + XID_79, "facility user"),
    ("user  :notice: [ 5843.291473] " + XID_79, "facility user"),  # dmesg --decode: written into /dev/kmsg
    ("2023-10-29T17:22:27.664127+00:00 wizylap user.warning kernel: " + XID_79, "facility user"),  # rsyslog fac.pri
    ("[32116.493054] systemd-journald[373]: " + XID_79, "program systemd-journald"),
    (json.dumps({"MESSAGE": XID_79, "SYSLOG_IDENTIFIER": "kernel"}), "journal entry without _TRANSPORT"),
    (json.dumps({"MESSAGE": XID_79, "_TRANSPORT": "syslog", "SYSLOG_IDENTIFIER": "kernel"}),
     "journal _TRANSPORT=syslog"),
    (XID_79, "envelope not recognised"),
])
def test_a_line_whose_writer_is_not_established_is_not_the_kernels(line, reason):
    assert logformats.unattributed(logformats.parse(line), ["kernel"]) == reason


def test_the_same_messages_from_the_kernel_are(tmp_path):
    for line in ("lis 27 10:15:32 gpu01 kernel: " + XID_79, "[ 5843.291473] " + XID_79, "3,12,5843291473,-;" + XID_79,
                 json.dumps({"MESSAGE": XID_79, "_TRANSPORT": "kernel"}),
                 "10.0.0.5: kern: err: [2026-11-23T19:49:20.123456Z]: " + XID_79,
                 "kern  :warn  : [ 5843.291473] " + XID_79,
                 "2023-10-29T17:22:27.664127+00:00 wizylap kern.warning kernel: " + XID_79):
        assert logformats.unattributed(logformats.parse(line), ["kernel"]) == "", line


def kernel_section(log, tmp_path):
    from dataclasses import replace

    (tmp_path / "proc").mkdir(exist_ok=True)
    (tmp_path / "proc" / "stat").write_text(f"btime {int(time.time() - 86400)}\n")
    params = replace(SECTIONS["kernel"], files=[str(log)], source="files", start_at="start")
    from sigma.telemetry.base import Context
    from sigma.telemetry.collectors.logtail import LogTailCollector

    return LogTailCollector("kernel", params, Context(node="node1", node_dir=str(tmp_path), host_root=str(tmp_path)))


def test_a_users_logger_line_with_a_localized_month_is_shown_not_acted_on(tmp_path):
    """The trust hole: `logger` text carrying an Xid 79, written with a Polish month name. With the envelope read in
    every locale, the program is known and is not the kernel; the kernel's own line beside it is acted on."""
    log = tmp_path / "kern.log"
    log.write_text("lis 27 10:15:32 gpu01 mallory[4242]: " + XID_79 + "\n"
                   "lis 27 10:15:33 gpu01 kernel: NVRM: Xid (PCI:0000:3b:00): 48, pid=1, name=python, DBE\n"
                   "11月 27 10:15:34 gpu01 " + XID_79 + "\n")
    out = Output()
    kernel_section(log, tmp_path).collect(out)
    xids = [json.loads(e[5])["xid"] for e in out.events if e[1] == "log" and e[2] == "xid"]
    assert xids == [48]
    shown = [(json.loads(e[5])["reason"], e[4]) for e in out.events if e[2] == "log_unattributed"]
    assert shown == [("program mallory", "lis 27 10:15:32 gpu01 mallory[4242]: " + XID_79)]
    counted = samples(out)
    assert counted[("log.unattributed_lines", (("reason", "program mallory"), ("source", str(log))))] == 1
    # no tag: "NVRM" reads as the program; the line is counted, and no pattern sees an Xid in what is left
    assert counted[("log.unattributed_lines", (("reason", "program NVRM"), ("source", str(log))))] == 1


def test_a_localized_month_gives_the_line_its_own_time(tmp_path):
    now = time.time()
    local = time.localtime(now - 3600)
    polish = ("sty", "lut", "mar", "kwi", "maj", "cze", "lip", "sie", "wrz", "paź", "lis", "gru")[local.tm_mon - 1]
    line = f"{polish} {local.tm_mday:02d} {time.strftime('%H:%M:%S', local)} gpu01 kernel: {XID_79}"
    assert abs(logformats.parse(line, now=now).ts - (now - 3600)) < 1.5


def test_a_record_on_several_lines_is_one_line(tmp_path):
    """dmesg and journalctl indent the continuation lines of a multi-line record: the driver's notice of a GPU gone
    from the bus is one event, acted on like Xid 79."""
    log = tmp_path / "kern.log"
    log.write_text("[ 1843.308145] NVRM: The NVIDIA GPU 0000:b3:00.0\n"
                   "               NVRM: (PCI ID: 10de:26b5) installed in this system has\n"
                   "               NVRM: fallen off the bus and is not responding to commands.\n"
                   "[ 1843.439662] NVRM: loading NVIDIA UNIX Open Kernel Module for x86_64  570.158.01\n")
    out = Output()
    kernel_section(log, tmp_path).collect(out)
    assert [(e[2], e[4]) for e in out.events if e[1] == "log"] == [
        ("gpu_fallen_off_bus", "NVRM: The NVIDIA GPU 0000:b3:00.0 NVRM: (PCI ID: 10de:26b5) installed in this system "
                               "has NVRM: fallen off the bus and is not responding to commands.")]


def test_unattributed_lines_reported_one_by_one_up_to_a_budget(tmp_path):
    from sigma.telemetry.collectors.logtail import UNATTRIBUTED_EVENTS_PER_RUN

    log = tmp_path / "kern.log"
    log.write_text("".join(f"{XID_79} {i}\n" for i in range(UNATTRIBUTED_EVENTS_PER_RUN + 5)))
    out = Output()
    kernel_section(log, tmp_path).collect(out)
    shown = [json.loads(e[5]) for e in out.events if e[2] == "log_unattributed"]
    assert len(shown) == UNATTRIBUTED_EVENTS_PER_RUN + 1 and shown[-1]["suppressed"] == 5
    assert not [e for e in out.events if e[1] == "log"]


def test_job_output_needs_no_envelope(tmp_path):
    """Job output has no writer to establish (its file names the job): a rank's line is matched as printed, and the
    culprit it names is kept."""
    from dataclasses import replace

    from sigma.telemetry.base import Context
    from sigma.telemetry.collectors.logtail import LogTailCollector

    out_file = tmp_path / "job-77" / "rank.node1.log"
    out_file.parent.mkdir()
    out_file.write_text("h100-15:139:1092 [7] socket.c:485 NCCL WARN socketStartConnect: Connect to "
                        "10.0.0.82<38455> failed : Software caused connection abort\n")
    params = replace(SECTIONS["job_output"], files=[str(tmp_path / "job-*" / "*.node1.log")], start_at="start")
    out = Output()
    LogTailCollector("job_output", params, Context(node="node1", node_dir=str(tmp_path))).collect(out)
    [event] = [e for e in out.events if e[1] == "log"]
    fields = json.loads(event[5])
    assert (event[2], fields["host"], fields["device"], fields["peer"], json.loads(event[6])) == (
        "nccl_error", "h100-15", 7, "10.0.0.82", [77])
