"""The process watchdog's verdict (pure): what is a hang of a job without KPIs, and what is not."""

from __future__ import annotations

from sigma.controller.detect.prochang import judge_processes

NOW, TIMEOUT = 1000.0, 120.0


def rows(node: str, cpu: float, stopped: int = 0, traced: int = 0, start: float = NOW - TIMEOUT, count: int = 2):
    out = []
    t = start
    while t <= NOW:
        for metric, value in (("job.procs.cpu", cpu), ("job.procs.stopped", stopped), ("job.procs.traced", traced),
                              ("job.procs.count", count)):
            out.append({"node": node, "ts": t, "metric": metric, "value": value})
        t += 5.0
    return out


def judge(*parts, busy_before=True):
    return judge_processes(7, ["node1", "node2"], [r for p in parts for r in p], NOW, TIMEOUT, busy_before)


def test_one_node_stopped_is_a_hang_whatever_the_other_does():
    for other in (0.0, 0.99):  # blocked waiting for it, or spinning in a collective
        f = judge(rows("node1", other), rows("node2", 0.0, stopped=2))
        assert f.rule_id == "watchdog-proc-hang" and f.action == "requeue" and f.scope == "job" and f.node is None
        assert "node2" in f.summary and "SIGSTOP" in f.summary and f.evidence["nodes"]["node2"]["stopped"]


def test_every_node_idle_after_being_busy_is_a_hang_and_only_then():
    assert "no CPU progress" in judge(rows("node1", 0.0), rows("node2", 0.01)).summary
    assert judge(rows("node1", 0.0), rows("node2", 0.01), busy_before=False) is None  # `sleep`, an idle shell


def test_what_is_no_hang():
    assert judge(rows("node1", 0.5), rows("node2", 0.0)) is None  # one node computes
    assert judge(rows("node1", 0.0, traced=1), rows("node2", 0.0, stopped=2)) is None  # a debugger holds it
    # stopped in some samples only (a duty cycle, a stop shorter than the timeout), or stopped but using CPU
    flicker = [dict(r, value=r["ts"] % 10 == 0) if r["metric"] == "job.procs.stopped" else r
               for r in rows("node2", 0.0, stopped=1)]
    assert judge(rows("node1", 0.5), flicker) is None
    assert judge(rows("node1", 0.5), rows("node2", 0.3, stopped=1)) is None
    # a node whose sidecar fell silent, or came late: its samples do not cover the window
    assert judge(rows("node1", 0.0), rows("node2", 0.0, stopped=2, start=NOW - 60)) is None
    assert judge(rows("node1", 0.0), []) is None
