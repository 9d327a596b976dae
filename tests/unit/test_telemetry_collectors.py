"""Collectors on fixture roots: host (/proc), sysfs (InfiniBand), logtail (files, kmsg), command, health, NVML."""

from __future__ import annotations

import json
import os
import sys
import time

import pytest

from sigma.telemetry.base import CollectorUnavailable
from tests.conftest import FIXTURES
from tests.unit.telemetry_helpers import make, run, samples, saved_positions

ROOT = FIXTURES / "telemetry" / "root"


def test_host_collector_reads_fixture_proc():
    c = make("host", host_root=str(ROOT))
    first = samples(run(c))
    assert first[("host.load1", ())] == 0.5
    assert first[("host.procs.total", ())] == 512
    assert first[("host.mem.total_bytes", ())] == 16384000 * 1024
    assert first[("host.mem.cached_bytes", ())] > 0  # page cache
    assert first[("host.vmstat.pgmajfault", ())] == 4321
    assert first[("host.pressure.memory.some.avg10", ())] == 2.0
    assert first[("host.pressure.io.full.total_us", ())] == 555
    assert first[("host.cpu.seconds", (("mode", "user"),))] == 10.0  # 1000 ticks at 100 Hz
    assert first[("host.net.bytes_recv", (("iface", "eth0"),))] == 123456789
    assert ("host.net.bytes_recv", (("iface", "lo"),)) not in first  # excluded by net_exclude
    disks = {labels for (m, labels) in first if m == "host.disk.read_bytes"}
    assert disks == {(("device", "sda"),), (("device", "nvme0n1"),)}  # partitions and loop devices skipped
    assert first[("host.cpu.seconds", (("cpu", "1"), ("mode", "system")))] == 2.5
    assert first[("host.net.tcp.RetransSegs", ())] == 321 and first[("host.net.udp.RcvbufErrors", ())] == 3
    assert first[("host.net.tcpext.ListenDrops", ())] == 5
    assert ("host.net.tcpext.SyncookiesSent", ()) not in first  # not in tcp_ext_keys
    assert first[("host.fd.allocated", ())] == 3072
    mounts = {dict(labels)["mount"] for (m, labels) in first if m == "host.fs.size_bytes"}
    assert mounts == {"/"}  # proc skipped by type, /again is the same device
    assert ("host.cpu.util_pct", ()) not in first  # needs two runs
    second = samples(run(c))
    assert second[("host.cpu.util_pct", ())] is None  # fixture does not move: no elapsed ticks


def test_host_collector_without_psi(tmp_path):
    import shutil
    root = tmp_path / "root"
    shutil.copytree(ROOT, root)
    shutil.rmtree(root / "proc" / "pressure")
    got = samples(run(make("host", host_root=str(root))))
    assert not any(m.startswith("host.pressure") for m, _ in got)
    assert got[("host.load5", ())] == 0.25


def test_sysfs_infiniband_counters_and_state():
    got = samples(run(make("sysfs", host_root=str(ROOT))))
    assert got[("ib.port.state", (("device", "mlx5_0"), ("port", "1")))] == 4
    assert got[("ib.port.state", (("device", "mlx5_1"), ("port", "1")))] == 1
    assert got[("ib.port.phys_state", (("device", "mlx5_0"), ("port", "1")))] == 5
    assert got[("ib.port.symbol_error", (("device", "mlx5_0"), ("port", "1")))] == 7
    assert got[("ib.port.port_rcv_data", (("device", "mlx5_0"), ("port", "1")))] == 123456789


XID = {"name": "xid", "regex": r"NVRM: Xid \(PCI:(?P<pci>[0-9a-f:.]+)\): (?P<xid>\d+)", "severity": "error"}
OOM = {"name": "oom_kill", "regex": r"Out of memory: Killed process (?P<pid>\d+)"}


def test_logtail_file_patterns_rotation_and_restart(tmp_path):
    log = tmp_path / "kern.log"
    log.write_text("old line before start\nNVRM: Xid (PCI:0000:01:00): 13, old\n")
    c = make("logtail", {"files": [str(log)], "patterns": [XID, OOM]})
    out = run(c)
    assert out.events == []  # start_at: end skips history
    with log.open("a") as f:
        f.write("NVRM: Xid (PCI:0000:3b:00): 79, pid=1\nnoise\nOut of memory: Killed process 42 (x)\npartial")
    out = run(c)
    kinds = [(e[2], json.loads(e[5])) for e in out.events]
    assert kinds[0] == ("xid", {"file": str(log), "pci": "0000:3b:00", "xid": 79})
    assert kinds[1][0] == "oom_kill" and kinds[1][1]["pid"] == 42
    assert len(kinds) == 2  # the partial last line waits
    # rotation by rename: the rest of the old file is read, then the new file from its start
    with log.open("a") as f:
        f.write(" Xid done\n")
    os.rename(log, tmp_path / "kern.log.1")
    log.write_text("NVRM: Xid (PCI:0000:3b:00): 48, new file\n")
    out = run(c)
    assert [json.loads(e[5])["xid"] for e in out.events if e[2] == "xid"] == [48]
    assert [e[4] for e in out.events] == ["NVRM: Xid (PCI:0000:3b:00): 48, new file"]
    # a restart resumes from the persisted position: nothing repeated, nothing lost
    positions = saved_positions(out)
    with log.open("a") as f:
        f.write("NVRM: Xid (PCI:0000:3b:00): 31, after restart\n")
    c2 = make("logtail", {"files": [str(log)], "patterns": [XID]}, positions=positions)
    out = run(c2)
    assert [json.loads(e[5])["xid"] for e in out.events] == [31]


def test_logtail_partial_line_before_rotation_is_kept(tmp_path):
    log = tmp_path / "app.log"
    log.write_text("")
    c = make("logtail", {"files": [str(log)], "patterns": [XID], "start_at": "start"})
    run(c)
    with log.open("a") as f:
        f.write("NVRM: Xid (PCI:0000:3b:00): 79")  # no newline yet
    assert run(c).events == []
    os.rename(log, tmp_path / "app.log.1")  # rotated with an unterminated last line
    log.write_text("")
    out = run(c)
    assert [json.loads(e[5])["xid"] for e in out.events] == [79]


def test_logtail_copytruncate(tmp_path):
    log = tmp_path / "app.log"
    log.write_text("")
    c = make("logtail", {"files": [str(log)], "patterns": [OOM]})
    run(c)
    log.write_text("Out of memory: Killed process 1 (a)\n" * 3)
    assert len(run(c).events) == 3
    log.write_text("Out of memory: Killed process 2 (b)\n")  # truncated in place, shorter than before
    out = run(c)
    assert [json.loads(e[5])["pid"] for e in out.events] == [2]


def test_logtail_kmsg_records_and_sequence(tmp_path):
    kmsg = tmp_path / "kmsg"
    kmsg.write_text((FIXTURES / "telemetry" / "kmsg").read_text())
    c = make("logtail", {"source": "kmsg", "kmsg_path": str(kmsg), "start_at": "start", "patterns": [XID, OOM]})
    out = run(c)
    assert [e[2] for e in out.events if e[1] == "log"] == ["xid", "oom_kill"]
    assert json.loads(out.events[0][5])["stream"] == "kmsg"
    assert run(c).events == []  # sequence numbers already seen
    with kmsg.open("a") as f:
        f.write("3,103,5300000,-;NVRM: Xid (PCI:0000:3b:00): 94, later\n")
    c2 = make("logtail", {"source": "kmsg", "kmsg_path": str(kmsg), "patterns": [XID]}, positions=saved_positions(out))
    assert [json.loads(e[5])["xid"] for e in run(c2).events if e[2] == "xid"] == [94]


def test_logtail_flood_is_counted(tmp_path):
    log = tmp_path / "flood.log"
    log.write_text("")
    c = make("logtail", {"files": [str(log)], "patterns": [OOM], "max_events_per_run": 5})
    run(c)
    log.write_text("Out of memory: Killed process 1 (a)\n" * 12)
    out = run(c)
    assert sum(e[2] == "oom_kill" for e in out.events) == 5
    flood = [e for e in out.events if e[2] == "log_flood"]
    assert json.loads(flood[0][5])["suppressed"] == 7


def test_command_collector_parses_and_times_out():
    c = make("command", {"commands": [
        {"metric": "cmd.answer", "argv": [sys.executable, "-c", "print(42)"]},
        {"metric": "cmd.kv", "argv": [sys.executable, "-c", "print('a 1\\nb 2.5\\nbad x')"], "parse": "keyvalue"},
        {"metric": "cmd.gpu", "argv": [sys.executable, "-c", "print('0, 7\\n1, 9')"], "parse": "regex",
         "regex": r"^(?P<gpu>\d+), (?P<value>\d+)$"},
    ]})
    got = samples(run(c))
    assert got[("cmd.answer", ())] == 42.0
    assert got[("cmd.kv.a", ())] == 1.0 and got[("cmd.kv.b", ())] == 2.5
    assert got[("cmd.gpu", (("gpu", "1"),))] == 9.0
    slow = make("command", {"commands": [
        {"metric": "cmd.slow", "argv": [sys.executable, "-c", "import time; time.sleep(10)"], "timeout_s": 0.3},
        {"metric": "cmd.fast", "argv": [sys.executable, "-c", "print(1)"]}]})
    from sigma.telemetry.base import Output
    out = Output()
    with pytest.raises(RuntimeError, match="timed out after 0.3 s"):
        slow.collect(out)
    got = samples(out)
    assert got[("cmd.slow.timeout", ())] == 1 and got[("cmd.fast", ())] == 1.0  # the others still reported


def _health(dirpath, name, verdict="reject", job_id=77):
    result = {"node": "node1", "ts": 1700000000.5, "suite": "prolog", "job_id": job_id, "verdict": verdict,
              "duration_s": 1.2, "checks": [
                  {"name": "gpu_count", "status": "pass", "message": "", "category": "gpu", "duration_s": 0.1},
                  {"name": "disk_space", "status": "fail", "message": "/tmp 99% full", "category": "disk",
                   "duration_s": 0.01}],
              "issues": [{"check": "disk_space", "status": "fail", "category": "disk", "message": "/tmp 99% full",
                          "blocking": verdict == "reject"}]}
    tmp = dirpath / f".{name}.tmp"
    tmp.write_text(json.dumps(result))
    os.rename(tmp, dirpath / name)


def test_health_results_become_events_once(tmp_path):
    hdir = tmp_path / "health"
    hdir.mkdir()
    _health(hdir, "1600000000000-prolog.json")  # already there at the first start: history, not news
    c = make("health", {"dir": str(hdir)})
    assert run(c).events == []
    _health(hdir, "1700000000500-prolog.json")
    out = run(c)
    rows = [(e[1], e[2], e[3], e[4], e[6]) for e in out.events]
    assert ("health", "disk_space", "fail", "/tmp 99% full", "[77]") in rows
    assert ("health", "gpu_count", "pass", "", "[77]") in rows
    assert ("health", "suite.prolog", "reject", "prolog: reject; disk_space: /tmp 99% full", "[77]") in rows
    assert run(c).events == []
    (hdir / "1700000001000-epilog.json").write_text("{not json")
    _health(hdir, "1700000002000-prolog.json", verdict="accept")
    out = run(c)
    assert [e[2] for e in out.events if e[1] == "sidecar"] == ["health_malformed"]
    assert [e[4] for e in out.events if e[2] == "suite.prolog"] == ["prolog: accept"]  # a warning blocks nothing
    c2 = make("health", {"dir": str(hdir)}, positions=saved_positions(out))  # restart: nothing resent
    assert run(c2).events == []
    c3 = make("health", {"dir": str(hdir), "start_at": "start"})  # a first start that sends what is there
    assert sum(e[2] == "suite.prolog" for e in run(c3).events) == 3


def test_nvml_without_library_is_unavailable():
    import pynvml
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        c = make("nvml")
        with pytest.raises(CollectorUnavailable, match="NVML"):
            run(c)
        return
    pynvml.nvmlShutdown()
    pytest.skip("an NVIDIA driver is present: the unavailable path cannot be exercised here")


@pytest.mark.gpu
def test_nvml_reports_gpus():
    import pynvml
    try:
        pynvml.nvmlInit()
        pynvml.nvmlShutdown()
    except pynvml.NVMLError as exc:
        pytest.skip(f"no NVIDIA GPU/driver on this machine ({exc})")
    c = make("nvml")
    got = samples(run(c))
    count = got[("gpu.count", ())]
    assert count >= 1
    assert ("gpu.mem.total_bytes", (("gpu", "0"),)) in got
    assert ("gpu.temp_c", (("gpu", "0"),)) in got
    c.close()


def test_logtail_real_kernel_ring_buffer():
    """The real /dev/kmsg: what root writes there is read, but it is not the kernel's (the kernel gives it the user
    facility), so it is counted and never acted on; skipped where the ring buffer is closed."""
    import uuid
    if not (os.access("/dev/kmsg", os.R_OK | os.W_OK)):
        pytest.skip("/dev/kmsg is not readable and writable here (needs root)")
    c = make("logtail", {"source": "kmsg", "patterns": [{"name": "sigma_probe", "regex": r"sigma-probe (?P<token>\w+)"}]})
    try:
        run(c)  # start_at end: skip the history
        token = uuid.uuid4().hex
        with open("/dev/kmsg", "w") as f:
            f.write(f"<0>sigma-probe {token}\n")  # asks for the kernel's facility 0: the kernel makes it user (1)
        out = run(c)
        assert [e for e in out.events if e[2] == "sigma_probe"] == []
        assert samples(out)[("log.rejected_lines", (("reason", "facility:1"), ("source", "kmsg")))] >= 1
    finally:
        c.close()


def test_host_keeps_procfs_files_open_and_rereads_them_fresh(tmp_path):
    c = make("host", host_root="/")
    try:
        first = c._read("self", "stat")
        sum(range(3_000_000))  # some CPU time, so this process's utime moves
        deadline = time.monotonic() + 10
        second = c._read("self", "stat")
        while second == first and time.monotonic() < deadline:
            sum(range(1_000_000))
            second = c._read("self", "stat")
        assert ("self", "stat") in c._fds and second != first  # one kept fd, fresh content on each read
    finally:
        c.close()
    assert c._fds == {}
    fixture = tmp_path / "proc"
    fixture.mkdir()
    (fixture / "loadavg").write_text("0.10 0.20 0.30 1/100 42\n")
    d = make("host", host_root=str(tmp_path))
    assert d._read("loadavg").startswith("0.10") and d._fds == {}  # a regular file is opened on every read
    (fixture / "loadavg").write_text("0.50 0.20 0.30 1/100 42\n")
    assert d._read("loadavg").startswith("0.50")
