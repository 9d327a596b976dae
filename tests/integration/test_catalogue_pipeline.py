"""Catalogue lines in different log formats through the real sidecars into the controller (shadow mode: the decision
is recorded, nothing is drained), an NCCL timeout in a job's output, a service's failure (notify only), a forged line
that must not count, and rewritten logs that must not replay."""

import json
import time

import pytest

from sigma.chaos.inject import Chaos
from sigma.telemetry.logformats import render
from tests.integration.pipeline import Pipeline, wait_for

pytestmark = pytest.mark.integration


@pytest.fixture
def kernel_logs_restored(cluster):
    """The session's cluster is shared: the kernel and service logs get back what they held (the sidecars are gone
    by then)."""
    logs = [log(n) for n in cluster.node_names() for log in (cluster.kernel_log, cluster.service_log)]
    saved = {path: path.read_text() if path.exists() else "" for path in logs}
    for path in logs:
        path.touch()  # there before the sidecars look for it (a log found later is looked for every recheck_s)
    yield
    for path, text in saved.items():
        path.write_text(text)


def test_catalogue_lines_act_once_and_forged_or_rewritten_lines_never(slurm, cluster, tmp_path, kernel_logs_restored):
    with Pipeline(cluster, tmp_path, controller={"shadow": True}) as p:
        wait_for(lambda: p.pushed_nodes() >= set(cluster.node_names()), timeout=60, what="every sidecar pushing")
        # a plain batch job on node4, the node that only gets a forged line: its real prolog/epilog kernel-log check
        # must not reject the node for it (the other nodes get real faults, which those checks do act on)
        job_id = slurm.submit(None, "-N1", "-w", "node4", wrap="sleep 300")
        wait_for(lambda: (j := slurm.job(job_id)) and j.state == "RUNNING", timeout=60, what="job running")
        now = time.time()
        # the misses, each in another envelope: lost carrier (syslog), an older-driver Xid needing a GPU
        # reset (journal JSON), an EDAC uncorrectable error (dmesg -T)
        lost = Chaos(cluster).inject("log", "node2", signature="lost-carrier")
        p.inject_line("node3", render("NVRM: Xid (0000:3b:00): 119, Timeout after 6s of waiting for RPC response "
                                      "from GPU1 GSP!", "journal-json", ts=now, host="node3"))
        p.inject_line("node1", render("EDAC MC0: 1 UE memory read error on CPU_SrcID#0_Ha#0_Chan#1_DIMM#0 "
                                      "(channel:1 slot:0 page:0x5e2a6 offset:0x0 grain:32 syndrome:0x0)",
                                      "dmesg-T", ts=now, host="node1"))
        # a user's `logger` text in a syslog file: not the kernel's, with an English or a Polish month
        p.inject_line("node4", f"{time.strftime('%b %d %H:%M:%S')} node4 mallory[4242]: NVRM: Xid "
                               "(PCI:0000:3b:00): 79, pid=1, name=x, GPU has fallen off the bus.")
        p.inject_line("node4", f"lis {time.strftime('%d %H:%M:%S')} node4 mallory[4242]: NVRM: Xid "
                               "(PCI:0000:3b:00): 79, pid=1, name=x, GPU has fallen off the bus.")

        def decided():
            rows = p.query("SELECT rule_id, node, action, status FROM incidents WHERE node IS NOT NULL ORDER BY node")
            return rows if len(rows) >= 3 else None

        rows = wait_for(decided, timeout=60, what="three incidents")
        rows = [r for r in rows if r["node"] is not None]
        assert [(r["rule_id"], r["node"], r["action"], r["status"]) for r in rows] == [
            ("memory-uncorrectable", "node1", "drain+ticket", "shadow"),
            ("nic-lost-carrier", "node2", "drain+ticket", "shadow"),
            ("gpu-xid-reset", "node3", "drain+reboot", "shadow")]
        # an NCCL watchdog timeout in the job's output restarts that job, not a node (the controller has seen the
        # job running for as long as the incidents above took)
        assert slurm.job(job_id).state == "RUNNING"
        Chaos(cluster).inject("log", "node4", signature="nccl-watchdog-timeout", job_id=job_id)
        job_inc = wait_for(lambda: p.query("SELECT rule_id, job_id, action, status FROM incidents WHERE job_id = ?",
                                           (job_id,)), timeout=60, what="the job's incident")
        assert [tuple(r.values()) for r in job_inc] == [("nccl-watchdog-timeout", job_id, "requeue", "shadow")]
        # Fabric Manager failing, in node4's syslog: the services section reads it, the controller only notifies
        Chaos(cluster).inject("log", "node4", signature="service-unit-failed")
        service = wait_for(lambda: p.query("SELECT rule_id, node, action FROM incidents WHERE node = 'node4'"),
                           timeout=30, what="the service's incident")
        assert [tuple(r.values()) for r in service] == [("service-unit-failed", "node4", "notify")]

        events = p.query("SELECT node, ts, message FROM events WHERE source = 'log' AND kind != 'nccl_timeout' "
                         "ORDER BY node")
        assert [e["node"] for e in events] == ["node1", "node2", "node3"]  # nothing from node4
        shown = wait_for(lambda: p.query("SELECT message, fields FROM events WHERE node = 'node4' AND "
                                         "kind = 'log_unattributed'") or None, timeout=30, what="forged lines shown")
        assert {json.loads(e["fields"])["reason"] for e in shown} == {"program mallory"} and len(shown) == 2
        node3 = next(e for e in events if e["node"] == "node3")
        assert abs(node3["ts"] - now) < 1e-3  # the journal entry's own time

        # rewrites: `sigma chaos undo` removes its line (same inode, shorter), an editor saves node3's log in place
        Chaos(cluster).undo(lost.id)
        log3 = cluster.kernel_log("node3")
        log3.write_text("# edited by hand\n" + log3.read_text())
        for node in ("node2", "node3"):  # a new line after the rewrite: once it arrives, the rewrite was read
            p.inject_line(node, f"{time.strftime('%b %d %H:%M:%S')} {node} kernel: eth9: NIC Link is Down")
        wait_for(lambda: len(p.query("SELECT id FROM events WHERE message LIKE '%eth9%'")) == 2, timeout=30,
                 what="the lines written after the rewrites")
        time.sleep(2)
        counts = {(e["node"], e["message"][:20]): 0 for e in events}
        for e in p.query("SELECT node, message FROM events WHERE source = 'log' AND message NOT LIKE '%eth9%' "
                         "AND kind != 'nccl_timeout'"):
            counts[(e["node"], e["message"][:20])] += 1
        assert set(counts.values()) == {1}, counts  # no old line came back
        assert sorted(json.loads(r["fields"]).get("untrusted", False)
                      for r in p.query("SELECT fields FROM events WHERE source = 'log' AND kind != 'nccl_timeout'")) \
            == [False] * 5
        (nccl,) = p.query("SELECT job_ids FROM events WHERE kind = 'nccl_timeout'")
        assert json.loads(nccl["job_ids"]) == [job_id]  # the job named by its output's path
