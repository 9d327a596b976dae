"""The trainer's liveness and wait signals: heartbeat events from a side thread, per-step collective wait time."""

import json
import time

from sigma.train.kpi import KpiWriter


def test_heartbeats_come_from_a_side_thread_and_stop_on_close(tmp_path):
    kpi = KpiWriter(0, tmp_path, job_id=7, node="node1")
    kpi.start_heartbeat(0.05)
    time.sleep(0.4)  # the main thread is busy elsewhere (here: asleep), the heartbeats go on
    kpi.close()
    beats = [json.loads(line) for line in kpi.path.read_text().splitlines()]
    assert len(beats) >= 3 and {b["event"] for b in beats} == {"heartbeat"}
    assert all(b["job_id"] == 7 and b["rank"] == 0 for b in beats)
    size = kpi.path.stat().st_size
    time.sleep(0.15)
    assert kpi.path.stat().st_size == size  # nothing written after close


def test_heartbeat_off_with_zero(tmp_path):
    kpi = KpiWriter(0, tmp_path, job_id=7, node="node1")
    kpi.start_heartbeat(0)
    time.sleep(0.1)
    kpi.close()
    assert kpi.path.read_text() == ""
