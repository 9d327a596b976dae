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
