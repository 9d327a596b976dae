"""The node's kernel log wherever it is: a real systemd-journald (tests/journald.py) read natively and through
journalctl, resumed by cursor across restarts; /dev/kmsg records; syslog files; `auto` choosing among them, and
saying so loudly when there is none."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from sigma.telemetry.base import Output
from sigma.telemetry.logsources import native_available
from tests.unit.telemetry_helpers import make, samples, saved_positions

XID = {"name": "xid", "regex": r"NVRM: Xid \((?:PCI:)?(?P<pci>[0-9a-fA-F:.]+)\): (?P<xid>\d+)", "severity": "error"}
READERS = ["native", "journalctl"]



def run(c) -> Output:
    out = Output()
    c.collect(out)
    return out


def events(out, kind="xid") -> list[dict]:
    return [{**json.loads(e[5]), "ts": e[0]} for e in out.events if e[2] == kind]


def journal_tail(jd, reader, positions=None, **params):
    if reader == "native" and native_available():
        pytest.skip(native_available())
    return make("logtail", {"source": "journal", "journal_dir": str(jd.directory), "journal_reader": reader,
                            "patterns": [XID], **params}, positions=positions)


def read_until(c, n: int, kind="xid", timeout: float = 5.0) -> list[dict]:
    """journalctl --follow hands entries over a pipe: collect until n events arrived (or the timeout)."""
    import time

    got = []
    deadline = time.monotonic() + timeout
    while len(got) < n and time.monotonic() < deadline:
        got += events(run(c), kind)
        time.sleep(0.05)
    return got


@pytest.mark.parametrize("reader", READERS)
def test_journal_kernel_lines_become_events_and_only_the_kernels(jd, reader):
    c = journal_tail(jd, reader)
    try:
        out = run(c)  # start_at end: what is in the journal already is history
        assert events(out) == []
        assert events(out, "kernel_log_source")[0]["source"] == "journal"
        jd.kernel("NVRM: Xid (PCI:0000:3b:00): 79, pid=1, GPU has fallen off the bus.")
        # what user space may write: root's `echo "<0>..." >/dev/kmsg` (the kernel makes it facility 1), and any
        # program's native journal entry naming itself "kernel"
        jd.kernel("NVRM: Xid (PCI:0000:3b:00): 48, from user space", facility=1)
        jd.logger("NVRM: Xid (PCI:0000:3b:00): 95, from logger", ident="kernel")
        jd.kernel("NVRM: Xid (PCI:0000:3b:00): 94, the kernel again")
        jd.sync()
        got = read_until(c, 2)
        assert [(e["xid"], e["stream"]) for e in got] == [(79, "journal"), (94, "journal")]
        assert got[0]["boot"] == journald_boot()
        assert abs(got[0]["ts"] - __import__("time").time()) < 30  # the entry's own (realtime) stamp
    finally:
        c.close()


def journald_boot() -> str:
    return open("/proc/sys/kernel/random/boot_id").read().strip().replace("-", "")


@pytest.mark.parametrize("reader", READERS)
def test_journal_restart_resumes_after_the_cursor(jd, reader):
    """Lines written while the sidecar was down are read once after the restart; none read before comes back."""
    c = journal_tail(jd, reader)
    run(c)
    jd.kernel("NVRM: Xid (PCI:0000:3b:00): 79, before the restart")
    jd.sync()
    positions = {}
    got = []
    import time

    deadline = time.monotonic() + 5
    while not got and time.monotonic() < deadline:
        out = run(c)
        got += events(out)
        positions.update(saved_positions(out))
    assert [e["xid"] for e in got] == [79]
    c.close()
    jd.kernel("NVRM: Xid (PCI:0000:3b:00): 48, while the sidecar was down")
    jd.kernel("NVRM: Xid (PCI:0000:3b:00): 95, also while it was down")
    jd.sync()
    c2 = journal_tail(jd, reader, positions=positions)
    try:
        assert [e["xid"] for e in read_until(c2, 2)] == [48, 95]
        assert read_until(c2, 1, timeout=0.5) == []
    finally:
        c2.close()


def test_both_readers_read_the_same_entries(jd):
    """Native (libsystemd) and journalctl agree on every field the events take."""
    if native_available():
        pytest.skip(native_available())
    from sigma.telemetry.logsources import JournalctlJournal, NativeJournal

    for i in range(3):
        jd.kernel(f"line {i}: NVRM: Xid (PCI:0000:3b:00): {79 + i}, x")
    jd.sync()
    native = NativeJournal(str(jd.directory), ("kernel",), None, from_end=False).read()
    ctl = JournalctlJournal(str(jd.directory), ("kernel",), None, from_end=False)
    follow = []
    import time

    deadline = time.monotonic() + 5
    while len(follow) < len(native) and time.monotonic() < deadline:
        follow += ctl.read()
        time.sleep(0.05)
    ctl.close()
    assert len(native) == 4 and native == follow


def test_auto_prefers_the_journal_then_kmsg_then_files_and_says_which(jd, tmp_path):
    kmsg = tmp_path / "kmsg"
    kmsg.write_text("")
    kern = tmp_path / "kern.log"
    kern.write_text("")
    base = {"source": "auto", "journal_dir": str(jd.directory), "kmsg_path": str(kmsg), "files": [str(kern)],
            "patterns": [XID]}
    c = make("logtail", base)
    out = run(c)
    assert [e["source"] for e in events(out, "kernel_log_source")] == ["journal"]
    assert samples(out)[("log.kernel_source_ok", (("source", "journal"),))] == 1
    c.close()
    # a journal without this boot's kernel lines (journald does not read /dev/kmsg here): the ring buffer
    empty = tmp_path / "other-journal"
    empty.mkdir()
    c = make("logtail", {**base, "journal_dir": str(empty)})
    src = events(run(c), "kernel_log_source")[0]
    assert src["source"] == "kmsg" and "no journal files" in src["skipped"]["journal"]
    c.close()
    c = make("logtail", {**base, "journal_dir": str(empty), "kmsg_path": str(tmp_path / "none")})
    src = events(run(c), "kernel_log_source")[0]
    assert (src["source"], src["path"]) == ("file", str(kern))
    c.close()


def test_journal_of_another_boot_only_is_passed_over(jd, tmp_path):
    root = tmp_path / "root"
    (root / "proc" / "sys" / "kernel" / "random").mkdir(parents=True)
    (root / "proc" / "sys" / "kernel" / "random" / "boot_id").write_text("0" * 32 + "\n")
    c = make("logtail", {"source": "auto", "auto_order": ["journal"], "journal_dir": str(jd.directory),
                         "patterns": [XID]}, host_root=str(root))
    gone = events(run(c), "kernel_log_unavailable")[0]
    assert "no kernel line of this boot" in gone["reasons"]["journal"]
    c.close()


def test_no_kernel_log_is_loud_and_recovers(tmp_path):
    kern = tmp_path / "kern.log"
    c = make("logtail", {"source": "auto", "journal_dir": str(tmp_path / "no-journal"),
                         "kmsg_path": str(tmp_path / "no-kmsg"), "files": [str(kern)], "recheck_s": 0,
                         "patterns": [XID]})
    out = run(c)
    [gone] = [e for e in out.events if e[2] == "kernel_log_unavailable"]
    assert gone[3] == "error" and "kernel-log fault detection is OFF" in gone[4]
    reasons = json.loads(gone[5])["reasons"]
    assert set(reasons) == {"journal", str(tmp_path / "no-kmsg"), str(kern)}
    assert samples(out)[("log.kernel_source_ok", (("source", "none"),))] == 0
    assert events(run(c), "kernel_log_unavailable") == []  # said once per change, counted every run
    kern.write_text("")  # rsyslog installed: the file appears
    out = run(c)
    assert events(out, "kernel_log_source")[0]["path"] == str(kern)
    with kern.open("a") as f:
        f.write("Nov 23 19:49:20 gpu01 kernel: NVRM: Xid (PCI:0000:3b:00): 79, x\n")
    assert [e["xid"] for e in events(run(c))] == [79]  # a file appearing after the start is read from its start
    kern.unlink()
    assert "stopped working" in str(events(run(c), "kernel_log_unavailable")[0]["reasons"])
    c.close()


def test_sidecar_check_says_what_it_would_read(tmp_path, jd):
    config = tmp_path / "telemetry.yaml"
    config.write_text(f"""
push: {{url: ""}}
collectors:
  kernel: {{type: logtail, source: auto, journal_dir: {jd.directory}, kmsg_path: {tmp_path}/none, files: []}}
""")
    env = {k: v for k, v in os.environ.items() if k != "SIGMA_CLUSTER_DIR"}
    ok = subprocess.run([sys.executable, "-m", "sigma.cli", "sidecar", "--check", "--config", str(config),
                         "--node", "n1"], capture_output=True, text=True, env=env)
    assert ok.returncode == 0 and "kernel log: the systemd journal in" in ok.stdout
    blind = subprocess.run([sys.executable, "-m", "sigma.cli", "sidecar", "--check", "--config", str(config),
                            "--node", "n1", "--set", f"collectors.kernel.journal_dir={tmp_path}/none"],
                           capture_output=True, text=True, env=env)
    assert blind.returncode == 1
    assert "NO KERNEL LOG: kernel-log fault detection would be OFF (journal: no journal files" in blind.stdout


def test_another_transport_a_site_chose_counts_by_the_program_it_names(jd):
    """journal_transports [kernel, journal]: a native entry counts when its program is one of `idents` (a claim
    the site chose to believe), never as the kernel's."""
    c = journal_tail(jd, "native", journal_transports=["kernel", "journal"], idents=["nvidia-persistenced"])
    try:
        run(c)
        jd.logger("NVRM: Xid (PCI:0000:3b:00): 79, via the daemon", ident="nvidia-persistenced")
        jd.logger("NVRM: Xid (PCI:0000:3b:00): 48, from someone else", ident="mallory")
        jd.sync()
        out = run(c)
        assert [e["xid"] for e in events(out)] == [79]
        assert samples(out)[("log.unattributed_lines", (("reason", "program mallory"), ("source", "journal")))] == 1
    finally:
        c.close()


def test_the_system_journal_opens_natively():
    """The node's own journal (no journal_dir): opened through libsystemd whether or not journald runs here."""
    if native_available():
        pytest.skip(native_available())
    from sigma.telemetry.logsources import NativeJournal

    journal = NativeJournal("", ("kernel",), None, from_end=True)
    assert isinstance(journal.read(), list)
    journal.close()


@pytest.mark.parametrize("reader", READERS)
def test_shipped_config_on_a_journald_node_reads_the_system_journal(jd, reader):
    """A journald-only node as it is (no kern.log): the shipped telemetry config, `sigma sidecar --check`, seen from
    a mount namespace where journald's files are the system journal (/run/log/journal) and there is no
    /var/log/kern.log; it takes the journal."""
    env = {k: v for k, v in os.environ.items() if k not in ("SIGMA_CLUSTER_DIR", "SIGMA_NODE_DIR")}
    script = (f'mount -t tmpfs tmpfs /run && mkdir -p /run/log/journal && mount --bind "{jd.directory}" '
              f'/run/log/journal && mount -t tmpfs tmpfs /var/log && '
              f'exec "{sys.executable}" -m sigma.cli sidecar --check --node gpu001 '
              f'--set collectors.kernel.journal_reader={reader}')
    check = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c", script], env=env,
                           capture_output=True, text=True, timeout=60)
    if reader == "native" and native_available():
        pytest.skip(native_available())
    assert check.returncode == 0, check.stdout + check.stderr
    name = {"native": "libsystemd", "journalctl": "journalctl"}[reader]
    assert f"kernel log: the systemd journal (kernel transport, read through {name})" in check.stdout
