"""Kernel-log signatures by bucket and the mark: old lines never fail twice, fatal lines stick until
acknowledged, truncation/rotation/reboot reset the mark."""

import os

import pytest

from sigma.health import kernlog
from sigma.health.checks import kernel_log
from tests.unit.health_helpers import HEALTH, context, tree

XID79 = "NVRM: Xid (PCI:0000:3b:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.\n"
KERN = "Nov 21 12:00:00 gpu01 kernel: "  # kern.log's envelope: a file's line counts only when it names the kernel


@pytest.mark.parametrize("line, label, category, fatal", [
    (XID79, "xid-79", "gpu", True),
    ("NVRM: Xid (PCI:0000:86:00): 48, pid=1, An uncorrectable double bit error", "xid-48", "gpu-memory", True),
    ("NVRM: Xid (PCI:0000:86:00): 64, pid=1, row remapper failure", "xid-64", "gpu-memory", True),
    ("NVRM: Xid (PCI:0000:86:00): 95, pid=1, Uncontained ECC error", "xid-95", "gpu-memory", True),
    ("NVRM: Xid (PCI:0000:af:00): 74, pid=1, NVLink: fatal error", "xid-74", "nvlink", True),
    ("NVRM: Xid (PCI:0000:3b:00): 13, pid=4242, Graphics Exception", "xid-13", "gpu", False),
    ("EDAC MC0: 1 UE memory read error on DIMM#0", "ecc", "host-memory", True),
    ("INFO: task kworker/u258:1:1234 blocked for more than 120 seconds.", "hung-task", "kernel", True),
    ("mlx5_core 0000:5e:00.0 ib0: Link down", "ib-link-down", "infiniband", True),
    ("IPv6: ADDRCONF(NETDEV_CHANGE): ib1: lost carrier", "ib-link-down", "infiniband", True),
    ("e1000e: eth0 NIC Link is Down", "link-down", "network", True),
])
def test_classify_buckets(line, label, category, fatal):
    f = kernlog.classify(line)
    assert (f.label, f.category, f.fatal) == (label, category, fatal)


def test_benign_lines_are_not_findings():
    assert kernlog.classify("NVRM: loading NVIDIA UNIX x86_64 Kernel Module 535.129.03") is None
    assert kernlog.classify("mlx5_core 0000:5e:00.0: FW trace") is None


def test_fatal_xid_list_is_configurable():
    assert not kernlog.classify(XID79, fatal_xids=(48,)).fatal


def run_check(ctx, args=None):
    return kernel_log.run(ctx, args or {})


def test_faulty_log_fails_with_first_signature_and_all_findings(tmp_path):
    ctx = context(tree(tmp_path, "faulty"), "gpu02", tmp_path / "node")
    r = run_check(ctx)
    assert r.status == "fail" and r.category == "gpu"
    assert r.message.startswith("xid-79 GPU has fallen off the bus (0000:3b:00) (+6 more)")
    assert [s["kind"] for s in r.data["signatures"]] == ["xid", "xid", "xid", "ecc", "hung-task", "ib-link-down",
                                                         "ib-link-down"]


def test_old_clean_lines_are_not_rejudged_and_new_fault_is_caught(tmp_path):
    root = tree(tmp_path, "healthy")
    log = root / "var/log/kern.log"
    ctx = context(root, "gpu01", tmp_path / "node")
    first = run_check(ctx)
    assert first.status == "pass" and first.data["lines"] == 4 and "xid-13" in first.message
    assert run_check(ctx).data["lines"] == 0  # nothing new
    with log.open("a") as f:
        f.write("Nov 21 12:00:00 gpu01 kernel: " + XID79)
    assert run_check(ctx).status == "fail"


def test_fatal_line_sticks_until_acknowledged_then_only_newer_lines_count(tmp_path):
    root = tree(tmp_path, "healthy")
    log = root / "var/log/kern.log"
    ctx = context(root, "gpu01", tmp_path / "node")
    with log.open("a") as f:
        f.write(KERN + XID79)
        f.write(KERN + "later benign line\n")
    assert run_check(ctx).status == "fail"
    assert run_check(ctx).status == "fail"  # the next job is refused too
    acked = kernel_log.acknowledge(ctx, {})
    assert [f.label for f in acked.findings if f.fatal] == ["xid-79"]
    assert run_check(ctx).status == "pass"
    with log.open("a") as f:
        f.write(KERN + "EDAC MC0: 1 UE memory read error\n")
    r = run_check(ctx)
    assert r.status == "fail" and r.category == "host-memory"


def test_truncation_and_rotation_reset_the_mark(tmp_path):
    root = tree(tmp_path, "healthy")
    log = root / "var/log/kern.log"
    ctx = context(root, "gpu01", tmp_path / "node")
    with log.open("a") as f:
        f.write(KERN + XID79)
    assert run_check(ctx).status == "fail"
    log.write_text("")  # truncated: the bad line is gone
    r = run_check(ctx)
    assert r.status == "pass" and r.data["mark_reset"] == "log file truncated"
    log.write_text("fresh line\n")
    run_check(ctx)
    rotated = log.with_suffix(".new")
    rotated.write_text("a\nb\n")
    os.replace(rotated, log)
    r = run_check(ctx)
    assert r.data["mark_reset"] == "log file replaced (rotated)" and r.data["lines"] == 2


def test_partial_last_line_waits_for_its_newline(tmp_path):
    root = tree(tmp_path, "healthy")
    log = root / "var/log/kern.log"
    ctx = context(root, "gpu01", tmp_path / "node")
    run_check(ctx)
    with log.open("a") as f:
        f.write(KERN + "NVRM: Xid (PCI:0000:3b:00): 7")
    assert run_check(ctx).status == "pass"
    with log.open("a") as f:
        f.write("9, GPU has fallen off the bus.\n")
    assert run_check(ctx).status == "fail"


def test_missing_log_is_a_tool_error_not_a_node_fault(tmp_path):
    root = tree(tmp_path, "healthy")
    (root / "var/log/kern.log").unlink()
    r = run_check(context(root, "gpu01", tmp_path / "node"))
    assert r.status == "error" and r.category == "tool" and "does not exist" in r.message


def test_kmsg_records_by_sequence_and_reboot_resets(tmp_path):
    root = tree(tmp_path, "faulty")
    ctx = context(root, "cpu1", tmp_path / "node")  # cpu[1-4] read kmsg
    r = run_check(ctx)
    assert r.status == "fail" and r.message.startswith("xid-79") and r.data["lines"] == 4
    mark = kernlog.load_mark(ctx.state_dir, str(root / "dev/kmsg"))
    assert mark.seq == 101  # in front of the fatal record
    kernel_log.acknowledge(ctx, {})
    assert run_check(ctx).status == "pass"
    with (root / "dev/kmsg").open("a") as f:
        f.write("3,104,4000000,-;" + XID79)
    assert run_check(ctx).status == "fail"
    (root / "proc/sys/kernel/random/boot_id").write_text("99999999-2222-3333-4444-555555555555\n")
    (root / "dev/kmsg").write_text("6,0,1000,-;booted again\n")
    r = run_check(ctx)
    assert r.status == "pass" and r.data["mark_reset"] == "node rebooted"


def test_healthy_kmsg_with_continuation_lines(tmp_path):
    root = tree(tmp_path, "healthy")
    r = run_check(context(root, "cpu2", tmp_path / "node"))
    assert r.status == "pass" and r.data["lines"] == 3


def test_fixture_tree_is_untouched_by_scans():
    assert not (HEALTH / "healthy" / "health").exists()


def test_any_envelope_counts_but_only_the_kernels_lines():
    import json

    assert kernlog.classify("Nov 23 19:49:20 node1 kernel: [ 12.5] NVRM: Xid (0000:3b:00): 79, GPU has fallen off "
                            "the bus.").xid == 79  # the older driver wording, in kern.log
    entry = {"__REALTIME_TIMESTAMP": "1", "_TRANSPORT": "kernel", "MESSAGE": "NVRM: Xid (PCI:0000:3b:00): 48, x"}
    assert kernlog.classify(json.dumps(entry)).xid == 48
    assert kernlog.classify(json.dumps({**entry, "_TRANSPORT": "syslog"})) is None
    assert kernlog.classify("Nov 23 19:49:20 node1 mallory[42]: NVRM: Xid (PCI:0000:3b:00): 79, forged") is None


def test_lost_carrier_in_either_case():
    assert kernlog.classify("ib0: Lost carrier").kind == "ib-link-down"
    assert kernlog.classify("eno1: Lost carrier").kind == "link-down"


def test_the_prolog_check_acts_only_on_lines_whose_writer_is_the_kernel(tmp_path):
    """The same fail-closed reading as the sidecar: a forged line with a localized month, a line without an
    envelope and user-space text in /dev/kmsg do not fail the node."""
    root = tree(tmp_path, "healthy")
    with open(root / "var/log/kern.log", "a") as f:
        f.write("lis 27 10:15:32 gpu01 mallory[4242]: " + XID79 + XID79)
    ctx = context(root, "gpu01", tmp_path / "node")
    assert run_check(ctx).status == "pass"
    with open(root / "var/log/kern.log", "a") as f:
        f.write("lis 27 10:15:33 gpu01 kernel: " + XID79)
    assert run_check(ctx).status == "fail"


def test_an_envelope_naming_another_facility_is_not_the_kernels():
    """The facility a record carries (kmsg's, a syslog <pri>, rsyslog's kern.warning) says who wrote it: root's
    `echo >/dev/kmsg` gets facility user from the kernel, whatever the text claims."""
    assert kernlog.classify("4,102,2000000,-;" + XID79).xid == 79
    assert kernlog.classify("12,102,2000000,-;" + XID79) is None  # facility 1 (user), level 4
    assert kernlog.classify("<12>Nov 23 19:49:20 gpu01 kernel: " + XID79) is None
    assert kernlog.classify("2026-11-23T19:49:20.123456+00:00 gpu01 user.warning kernel: " + XID79) is None


def test_kmsg_records_user_space_wrote_or_without_a_facility_never_fail_the_node(tmp_path):
    root = tree(tmp_path, "healthy")
    with open(root / "dev/kmsg", "a") as f:
        f.write("12,103,4000000,-;" + XID79)  # root's `echo ... >/dev/kmsg`: the kernel makes it facility 1
        f.write("x,104,4000000,-;" + XID79)  # no facility to read: not established, fail closed
    ctx = context(root, "cpu2", tmp_path / "node")
    r = run_check(ctx)
    assert r.status == "pass" and r.data["lines"] == 4
    with open(root / "dev/kmsg", "a") as f:
        f.write("4,105,5000000,-;" + XID79)
    assert run_check(ctx).status == "fail"


def with_kernel_log(ctx, kernel_log):
    import dataclasses

    ctx.profile = dataclasses.replace(ctx.profile, kernel_log=kernel_log)
    return ctx


def test_auto_chooses_as_the_sidecar_does_and_says_why_when_nothing_can_be_read(tmp_path):
    root = tree(tmp_path, "faulty")  # no journal files under it: /dev/kmsg comes next
    ctx = with_kernel_log(context(root, "gpu02", tmp_path / "node"), "auto")
    r = run_check(ctx)
    assert r.status == "fail" and r.data["source"] == str(root / "dev/kmsg") and r.message.startswith("xid-79")
    (root / "dev/kmsg").unlink()  # then the first syslog file there: Debian's kern.log
    r = run_check(ctx)
    assert r.data["source"] == str(root / "var/log/kern.log") and r.message.startswith("xid-79")
    (root / "var/log/kern.log").unlink()
    r = run_check(ctx)
    assert r.status == "error" and r.category == "tool" and r.message.startswith("no kernel log can be read (")
    for why in ("journal: no journal files under", f"{root}/dev/kmsg: not there", f"{root}/var/log/kern.log: not "
                "there", f"{root}/var/log/messages: not there"):
        assert why in r.message



@pytest.mark.parametrize("reader", ["native", "journalctl"])
def test_the_journal_is_read_by_cursor_and_only_its_kernel_lines_fail_the_node(tmp_path, jd, reader):
    """A real journald: the check reads this boot's kernel transport after its mark (a cursor); an entry user space
    wrote (facility 1 through /dev/kmsg, a program naming itself kernel) never fails the node; a fatal line sticks
    until acknowledged; a reboot voids the mark."""
    from sigma.telemetry.logsources import native_available

    if reader == "native" and native_available():
        pytest.skip(native_available())
    root = tree(tmp_path, "healthy")
    (root / "proc/sys/kernel/random/boot_id").write_text(open("/proc/sys/kernel/random/boot_id").read())
    ctx = with_kernel_log(context(root, "gpu01", tmp_path / "node"), "auto")
    args = {"journal_dir": str(jd.directory), "journal_reader": reader}
    r = run_check(ctx, args)
    assert r.status == "pass" and r.data["source"] == f"journal:{jd.directory}" and r.data["lines"] == 1
    jd.kernel(XID79.strip(), facility=1)
    jd.logger(XID79.strip(), ident="kernel")
    jd.kernel("NVRM: Xid (PCI:0000:3b:00): 13, pid=4242, name=python, Graphics Exception")
    jd.sync()
    r = run_check(ctx, args)
    assert r.status == "pass" and r.data["lines"] == 2 and "xid-13" in r.message  # only what is new, the kernel's
    jd.kernel(XID79.strip())
    jd.sync()
    for _ in range(2):  # it sticks
        r = run_check(ctx, args)
        assert r.status == "fail" and r.message.startswith("xid-79") and r.data["lines"] == 1
    kernel_log.acknowledge(ctx, args)
    assert run_check(ctx, args).status == "pass"
    for i in range(3):
        jd.kernel(f"clean line {i}")
    jd.kernel(XID79.strip())
    jd.sync()
    r = run_check(ctx, {**args, "max_journal_entries": 2})  # a flood since the mark: the newest are judged
    assert r.status == "fail" and r.data["lines"] == 2
    kernel_log.acknowledge(ctx, args)
    (root / "proc/sys/kernel/random/boot_id").write_text("99999999-2222-3333-4444-555555555555\n")
    r = run_check(ctx, args)  # this journal holds no line of that boot: kmsg comes next, the fixture's
    assert r.data["source"] == str(root / "dev/kmsg")


@pytest.mark.parametrize("line, uptime, fatal", [
    ("mlx5_core 0000:9d:00.1 enp157s0f1np1: Link down", 73, False),  # a port still training, or never cabled
    ("mlx5_core 0000:9d:00.1 enp157s0f1np1: Link down", 3600, True),
    ("mlx5_core 0000:9d:00.1 enp157s0f1np1: Link down", None, True),  # when it was logged is unknown: as before
    ("[   73.114200] i40e 0000:3b:00.1 eth3: NIC Link is Down", None, False),  # the line's own boot stamp
    ("[ 3673.114200] i40e 0000:3b:00.1 eth3: NIC Link is Down", None, True),
    ("NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus.", 20, True),  # only links have a boot grace
])
def test_a_link_down_just_after_boot_is_noted_not_fatal(line, uptime, fatal):
    f = kernlog.classify(line, uptime=uptime)
    assert f.fatal is fatal and (fatal or "after boot" in f.description)


def test_the_prolog_after_a_reboot_passes_unused_ports_link_down_and_fails_a_later_one(tmp_path):
    """Back from a reboot the ring buffer starts over: an unused port's `Link down` a minute in is noted (the
    infiniband check judges the ports themselves); the same line an hour later fails the node."""
    root = tree(tmp_path, "faulty")
    ctx = context(root, "cpu1", tmp_path / "node")  # cpu[1-4] read kmsg
    (root / "proc/sys/kernel/random/boot_id").write_text("99999999-2222-3333-4444-555555555555\n")
    (root / "dev/kmsg").write_text("6,0,1000,-;Linux version 6.8.0\n"
                                   "6,1,73114200,-;mlx5_core 0000:9d:00.1 enp157s0f1np1: Link down\n")
    r = run_check(ctx)
    assert r.status == "pass" and "ib-link-down" in r.message
    with (root / "dev/kmsg").open("a") as f:
        f.write("6,2,3673114200,-;mlx5_core 0000:9d:00.1 enp157s0f1np1: Link down\n")
    r = run_check(ctx)
    assert r.status == "fail" and r.message.startswith("ib-link-down")


def test_a_kern_log_file_judges_link_downs_by_the_node_boot_time(tmp_path):
    import time

    root = tree(tmp_path, "healthy")
    booted = time.time() - 3600
    (root / "proc").mkdir(exist_ok=True)
    (root / "proc/stat").write_text(f"cpu 0 0 0 0\nbtime {int(booted)}\n")
    stamp = time.strftime("%b %d %H:%M:%S", time.localtime(booted + 60))
    ctx = context(root, "gpu01", tmp_path / "node")
    with open(root / "var/log/kern.log", "a") as f:
        f.write(f"{stamp} gpu01 kernel: mlx5_core 0000:9d:00.1 enp157s0f1np1: Link down\n")
    assert run_check(ctx).status == "pass"
    with open(root / "var/log/kern.log", "a") as f:
        f.write(f"{time.strftime('%b %d %H:%M:%S')} gpu01 kernel: mlx5_core 0000:9d:00.1 enp157s0f1np1: Link down\n")
    assert run_check(ctx).status == "fail"


def test_the_journal_times_a_link_down_by_its_monotonic_stamp(tmp_path, jd):
    """From the journal, the kernel's own uptime stamp (_SOURCE_MONOTONIC_TIMESTAMP) says when after boot the link
    went down: a minute in is noted, an hour in fails the node."""
    root = tree(tmp_path, "healthy")
    (root / "proc/sys/kernel/random/boot_id").write_text(open("/proc/sys/kernel/random/boot_id").read())
    ctx = with_kernel_log(context(root, "gpu01", tmp_path / "node"), "auto")
    args = {"journal_dir": str(jd.directory), "journal_reader": "journalctl"}
    jd.kernel("mlx5_core 0000:9d:00.1 enp157s0f1np1: Link down", uptime_us=73_114_200)
    jd.sync()
    r = run_check(ctx, args)
    assert r.status == "pass" and r.data["source"] == f"journal:{jd.directory}" and "ib-link-down" in r.message
    jd.kernel("mlx5_core 0000:9d:00.1 enp157s0f1np1: Link down", uptime_us=3_673_114_200)
    jd.sync()
    r = run_check(ctx, args)
    assert r.status == "fail" and r.message.startswith("ib-link-down")
