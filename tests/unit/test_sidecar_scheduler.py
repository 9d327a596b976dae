"""The sidecar's scheduler thread: a collector whose run stalls is reported and moved to a thread of its own; the
other collectors go on (and are stored) while it hangs, and its results are stored again once it returns."""

from __future__ import annotations

import threading
from dataclasses import dataclass

import pytest

from sigma.store import connect
from sigma.telemetry import agent
from sigma.telemetry.base import REGISTRY, Collector, CollectorParams, load_collectors, register

from tests.conftest import wait_for

GATE = threading.Event()


class GateCollector(Collector):
    @dataclass
    class Params(CollectorParams):
        block: bool = False  # wait for GATE before returning

    def collect(self, out) -> None:
        if self.params.block:
            GATE.wait(60)
        out.sample("gate.value", 1.0)


@pytest.fixture
def gate_collector():
    """Registered for this test only (the registry is what the docs test checks)."""
    load_collectors()
    register("test_gate")(GateCollector)
    yield
    REGISTRY.pop("test_gate", None)


CONFIG = """
store: {{path: "{db}"}}
push: {{url: ""}}
jobs: {{sources: [kpi]}}
collectors:
  stuck: {{type: test_gate, block: true, interval_s: 0.1}}
  steady: {{type: test_gate, interval_s: 0.1}}
"""


def test_a_stalled_collector_is_isolated_and_the_others_go_on(tmp_path, monkeypatch, gate_collector):
    db = tmp_path / "telemetry.db"
    config = tmp_path / "telemetry.yaml"
    config.write_text(CONFIG.format(db=db))
    monkeypatch.setattr(agent, "STALL_S", 0.3)
    GATE.clear()
    sidecar = agent.Sidecar(str(config), node="n1", node_dir=str(tmp_path))
    sidecar._start_collectors()
    first = sidecar.scheduler

    def runs(section):
        conn = connect(db, readonly=True)
        try:
            return conn.execute("SELECT count(*) FROM samples WHERE metric = 'sidecar.collector.success' "
                                "AND labels = ?", (f'{{"collector":"{section}"}}',)).fetchone()[0]
        finally:
            conn.close()

    try:
        # the stuck run holds the first scheduler; the watchdog hands the others to a new one
        def watchdog_acted():
            sidecar._watchdog()
            return sidecar.isolated
        wait_for(watchdog_acted, what="the watchdog to act")
        assert sidecar.isolated == [first] and sidecar.scheduler is not first
        assert [r.section for r in sidecar.scheduler.runners] == ["steady"]
        wait_for(lambda: runs("steady") >= 5, what="steady runs stored while the other hangs")
        assert runs("stuck") == 0
        conn = connect(db, readonly=True)
        hung = conn.execute("SELECT message FROM events WHERE kind = 'collector_hung'").fetchall()
        conn.close()
        assert len(hung) == 1 and hung[0][0].startswith("stuck:")
        GATE.set()  # the stalled run returns: its thread goes on with that collector alone
        wait_for(lambda: runs("stuck") >= 3, what="stuck runs stored after it returned")
        assert [r.section for r in first.runners] == ["stuck"] and not first.writer
    finally:
        GATE.set()
        sidecar._stop_collectors()
        sidecar.store.close()
    assert not first.thread.is_alive() and not sidecar.isolated
