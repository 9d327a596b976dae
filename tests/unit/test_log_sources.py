"""Log sources under real log handling: rotation, copytruncate, rewrites, truncation and restarts never ship a line
twice; untrusted sources are refused or flagged; kmsg positions from an earlier boot are void."""

from __future__ import annotations

import json
import os
import shutil

from sigma.telemetry.base import Output
from tests.unit.telemetry_helpers import make, samples, saved_positions

XID = {"name": "xid", "regex": r"NVRM: Xid \((?:PCI:)?(?P<pci>[0-9a-fA-F:.]+)\): (?P<xid>\d+)", "severity": "error"}


def run(collector) -> Output:
    out = Output()  # now: lines carry real time stamps, judged against the real clock
    collector.collect(out)
    return out


def xids(out) -> list[int]:
    return [json.loads(e[5])["xid"] for e in out.events if e[2] == "xid"]


def line(n: int, xid: int | None = None, age: float = 0.0) -> str:
    """A kern.log line written `age` seconds ago (its uptime stamp makes it unique)."""
    import time

    text = f"NVRM: Xid (PCI:0000:3b:00): {xid}, pid=42, name=python" if xid else f"eth0: link up {n}"
    stamp = time.strftime("%b %d %H:%M:%S", time.localtime(time.time() - age))
    return f"{stamp} node1 kernel: [{1000 + n:12.6f}] {text}\n"


def tail(log, positions=None, **params):
    return make("logtail", {"files": [str(log)], "patterns": [XID], **params}, positions=positions)


def test_rewrite_in_place_that_removes_a_line_ships_nothing_again(tmp_path):
    """What `sigma chaos undo` does: the file is rewritten without the injected line (same inode, shorter)."""
    log = tmp_path / "kern.log"
    log.write_text("".join(line(i, age=3600) for i in range(5)))
    c = tail(log)
    run(c)
    injected = line(5, xid=79)
    with log.open("a") as f:
        f.write(injected + line(6, xid=48))
    assert xids(run(c)) == [79, 48]
    log.write_text(log.read_text().replace(injected, ""))  # undo: same inode, one line fewer
    out = run(c)
    assert xids(out) == []  # the Xid 48 line was shipped already: not again
    # skipped: the Xid 48 line and the five lines older than the last read (their second is never read as new)
    assert samples(out)[("log.replayed_lines_skipped", (("source", str(log)),))] == 6
    with log.open("a") as f:
        f.write(line(7, xid=31))
    assert xids(run(c)) == [31]  # a line written later is new


def test_rewrite_in_place_keeping_the_size_is_noticed(tmp_path):
    """An editor's save in place that removes a line early and adds text later: the bytes before the offset
    changed, the size did not shrink."""
    log = tmp_path / "kern.log"
    log.write_text("".join(line(i) for i in range(3)))
    c = tail(log)
    run(c)
    with log.open("a") as f:
        f.write(line(3, xid=79))
    assert xids(run(c)) == [79]
    text = log.read_text().replace(line(1), "")
    log.write_text(text + line(4) + line(5, xid=74))  # longer than before, line 1 gone
    assert xids(run(c)) == [74]


def test_copytruncate_then_new_lines(tmp_path):
    log = tmp_path / "kern.log"
    log.write_text("")
    c = tail(log)
    run(c)
    log.write_text(line(1, xid=79) + line(2))
    assert xids(run(c)) == [79]
    shutil.copy(log, tmp_path / "kern.log.1")  # logrotate copytruncate: copy, then truncate in place
    with open(log, "r+") as f:
        f.truncate(0)
    assert xids(run(c)) == []
    with log.open("a") as f:
        f.write(line(3, xid=48))
    assert xids(run(c)) == [48]


def test_truncation_then_the_old_content_written_back(tmp_path):
    log = tmp_path / "kern.log"
    log.write_text(line(0))
    c = tail(log)
    run(c)
    with log.open("a") as f:
        f.write(line(1, xid=79))
    assert xids(run(c)) == [79]
    content = log.read_text()
    log.write_text("")
    assert xids(run(c)) == []
    log.write_text(content)  # the same lines back (a restore from a backup)
    assert xids(run(c)) == []


def test_rotation_by_rename_and_an_editors_save_by_rename(tmp_path):
    log = tmp_path / "kern.log"
    log.write_text(line(0))
    c = tail(log)
    run(c)
    with log.open("a") as f:
        f.write(line(1, xid=79))
    assert xids(run(c)) == [79]
    os.rename(log, tmp_path / "kern.log.1")  # logrotate (create): a new, empty file
    log.write_text(line(2, xid=48))
    assert xids(run(c)) == [48]
    # an editor saves by writing a new file and renaming it over the old: new inode, the old lines in it
    new = tmp_path / "kern.log.tmp"
    new.write_text(log.read_text() + line(3, xid=74))
    os.rename(new, log)
    assert xids(run(c)) == [74]


def test_no_replay_across_a_sidecar_restart(tmp_path):
    log = tmp_path / "kern.log"
    log.write_text("")
    c = tail(log)
    run(c)
    injected = line(1, xid=79)
    log.write_text(injected + line(2, xid=95))
    out = run(c)
    assert xids(out) == [79, 95]
    positions = saved_positions(out)
    c.close()
    log.write_text(log.read_text().replace(injected, ""))  # rewritten while the sidecar was down
    c2 = tail(log, positions=positions)
    assert xids(run(c2)) == []
    with log.open("a") as f:
        f.write(line(3, xid=79))  # the same fault again, later: a new line, a new event
    assert xids(run(c2)) == [79]


def test_positions_are_written_only_when_they_change(tmp_path):
    log = tmp_path / "kern.log"
    log.write_text(line(0))
    c = tail(log)
    assert saved_positions(run(c))
    assert run(c).positions == {}
    with log.open("a") as f:
        f.write(line(1))
    assert run(c).positions


def test_event_time_is_the_lines_own_time(tmp_path):
    import time
    from datetime import datetime, timezone

    log = tmp_path / "kern.log"
    log.write_text("")
    c = tail(log)
    run(c)
    hour_ago = time.time() - 3600
    iso = datetime.fromtimestamp(hour_ago, timezone.utc).isoformat()
    future = datetime.fromtimestamp(time.time() + 86400 * 30, timezone.utc).isoformat()
    log.write_text(f"{iso} node1 kernel: NVRM: Xid (PCI:0000:3b:00): 79, an hour ago\n"
                   f"{time.strftime('%b %d %H:%M:%S', time.localtime(hour_ago))} node1 kernel: NVRM: Xid "
                   "(PCI:0000:3b:00): 74, an hour ago, whole seconds\n"
                   f"{future} node1 kernel: NVRM: Xid (PCI:0000:3b:00): 48, a clock a month ahead\n"
                   "NVRM: Xid (0000:3b:00): 31, no time of its own\n")
    o = Output(ts=time.time())
    c.collect(o)
    times = {json.loads(e[5])["xid"]: e[0] for e in o.events}
    assert abs(times[79] - hour_ago) < 1e-3 and times[74] == float(int(hour_ago))
    assert times[48] == o.ts and times[31] == o.ts  # read time


def test_untrusted_file_is_refused_or_flagged(tmp_path):
    log = tmp_path / "kern.log"
    log.write_text("")
    log.chmod(0o666)  # anyone may append "NVRM: Xid ..." here
    c = tail(log, start_at="start")
    log.write_text(line(1, xid=79))
    out = run(c)
    assert xids(out) == []
    events = [json.loads(e[5]) for e in out.events if e[2] == "log_source_untrusted"]
    assert events[0]["source"] == str(log) and "world-writable" in events[0]["reason"]
    assert samples(out)[("log.rejected_lines", (("reason", "untrusted_file"), ("source", str(log))))] == 1
    assert [e for e in run(c).events if e[2] == "log_source_untrusted"] == []  # reported once
    flagged = tail(log, start_at="start", untrusted_source="flag")
    out = run(flagged)
    assert xids(out) == [79] and json.loads(out.events[-1][5])["untrusted"] is True
    log.chmod(0o644)  # trusted again: what was written while anyone could write never counts; later lines do
    assert xids(run(c)) == []
    with log.open("a") as f:
        f.write(line(2, xid=48))
    assert xids(run(c)) == [48]


def test_lines_from_other_programs_are_not_the_kernels(tmp_path):
    log = tmp_path / "syslog"
    log.write_text("")
    c = tail(log, idents=["kernel"])
    run(c)
    log.write_text("Nov 23 19:49:20 node1 mallory[4242]: NVRM: Xid (PCI:0000:3b:00): 79, forged\n"
                   "Nov 23 19:49:21 node1 kernel: NVRM: Xid (PCI:0000:3b:00): 48, real\n")
    out = run(c)
    assert xids(out) == [48]
    assert samples(out)[("log.unattributed_lines", (("reason", "program mallory"), ("source", str(log))))] == 1
    [shown] = [json.loads(e[5]) for e in out.events if e[2] == "log_unattributed"]
    assert (shown["reason"], shown["pattern"]) == ("program mallory", "xid")


def test_kmsg_sequence_from_an_earlier_boot_is_void(tmp_path):
    root = tmp_path / "root"
    (root / "proc" / "sys" / "kernel" / "random").mkdir(parents=True)
    (root / "proc" / "sys" / "kernel" / "random" / "boot_id").write_text("boot-2\n")
    (root / "proc" / "stat").write_text("cpu 0 0 0 0\nbtime 1700000000\n")
    kmsg = tmp_path / "kmsg"
    kmsg.write_text("3,5,2500000,-;NVRM: Xid (PCI:0000:3b:00): 79, after the reboot\n")
    c = make("logtail", {"source": "kmsg", "kmsg_path": str(kmsg), "patterns": [XID]}, host_root=str(root),
             positions={"logtail:logtail:kmsg": {"boot": "boot-1", "seq": 900}})
    from sigma.telemetry.base import Output
    out = Output(ts=1700000100.0)
    c.collect(out)
    assert [(e[0], json.loads(e[5])["xid"]) for e in out.events if e[2] == "xid"] == [(1700000002.5, 79)]  # boot time + uptime
    assert saved_positions(out)["logtail:logtail:kmsg"] == {"boot": "boot2", "seq": 5}


def test_history_skipped_at_the_first_start_stays_skipped_after_a_rewrite(tmp_path):
    """Lines that were in the file before the sidecar's first start were never shipped (start_at: end), so no
    fingerprint knows them: their own time stamps, older than the last read, keep them out after a rewrite."""
    import time

    from sigma.telemetry.base import Output

    log = tmp_path / "kern.log"
    old = time.strftime("%b %d %H:%M:%S", time.localtime(time.time() - 3600))
    log.write_text(f"{old} node1 kernel: NVRM: Xid (PCI:0000:3b:00): 79, pid=1, name=x, an hour ago\n")
    c = tail(log)
    o = Output()
    c.collect(o)
    assert xids(o) == []
    log.write_text("# edited\n" + log.read_text())  # an editor's save: the head changed
    o = Output()
    c.collect(o)
    assert xids(o) == []
    now = time.strftime("%b %d %H:%M:%S", time.localtime(time.time() + 2))
    with log.open("a") as f:
        f.write(f"{now} node1 kernel: NVRM: Xid (PCI:0000:3b:00): 48, pid=1, name=x, new\n")
    o = Output()
    c.collect(o)
    assert xids(o) == [48]
