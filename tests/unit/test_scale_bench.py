"""bench/scale.py's stand-in sidecar: a node behind sends the events and KPIs of its whole backlog first and its
samples at most MAX_BATCH_SECONDS a batch, in a body the controller's own parser accepts (the run itself is a bench,
not a test)."""

from __future__ import annotations

import json

from sigma.controller.ingest.batch import Ingest
from tests.conftest import load_bench


scale = load_bench("scale")


def test_a_node_behind_sends_its_backlogs_events_and_kpis_first(tmp_path):
    t0 = 1_000_000.0
    node = scale.Node("n0001", 1000, 1, 200, [{"kind": "xid79", "at": 130.0, "node": "n0001", "job": 1000}], 1)
    behind = 150  # seconds collected and not sent
    samples = [t0 + s for s in range(scale.MAX_BATCH_SECONDS)]
    body, n = node.batch(samples, [t0 + s for s in range(behind)], t0)
    ingest = Ingest(tmp_path / "c.db", b"s" * 32)
    b = ingest._parse(body, "n0001")
    assert n == len(b["s"]) == 200 * scale.MAX_BATCH_SECONDS and max(b["ts"]) == t0 + scale.MAX_BATCH_SECONDS - 1
    assert [k[3] for k in b["kpis"]] == list(range(1, behind + 1))  # every step of the backlog, one a second
    xid = [e for e in b["events"] if e[2] == "xid"]
    assert len(xid) == 1 and xid[0][0] == t0 + 130.0 and json.loads(xid[0][5]) == {"xid": 79}
    heartbeats = [e[0] for e in b["events"] if e[2] == "heartbeat"]
    assert len(heartbeats) == behind // int(scale.HEARTBEAT_S) and max(heartbeats) >= t0 + behind - scale.HEARTBEAT_S
    ingest.close()


def test_faults_land_on_separate_jobs_and_the_layout_covers_every_node():
    class Args:
        nodes, jobs, job_nodes, duration, first_fault, fault_every, fault_margin = 64, 8, 8, 600, 30.0, 180.0, 150.0

    layout = scale.plan(Args)
    assert sorted(n for ns in layout["jobs"].values() for n in ns) == layout["nodes"]
    assert [f["kind"] for f in layout["faults"]] == ["xid79", "ecc", "hang", "xid79", "ecc"]
    assert len({f["job"] for f in layout["faults"]}) == len(layout["faults"])
    assert all(f["at"] < Args.duration - Args.fault_margin for f in layout["faults"])
