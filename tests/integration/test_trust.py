"""Trust boundaries end to end on the local cluster (`sigma stack up`: a key per node, the real sidecars).

Another user's KPI line cannot requeue a job (the job's own line still can), and a node's key cannot post as
another node. Faults enter at their source: a file written by uid 65534 in the job's KPI directory, an HTTP
request signed with node1's key file.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.request

import pytest

from sigma.security.keys import read_node_key
from sigma.stack import Stack
from sigma.telemetry import http11, wire
from tests.integration.pipeline import KPI_JOB
from tests.conftest import wait_for

pytestmark = pytest.mark.integration

NOBODY = 65534


def query(stack: Stack, sql: str, args=()) -> list[dict]:
    from sigma.controller.db import open_db

    if not stack.db.exists():
        return []
    conn = open_db(stack.db, readonly=True)
    try:
        return [dict(r) for r in conn.execute(sql, args)]
    finally:
        conn.close()


def nan_line(job_id: int) -> str:
    return json.dumps({"ts": time.time(), "job_id": job_id, "rank": 0, "event": "nan_loss",
                       "message": "loss is nan"}) + "\n"


def test_another_users_kpi_line_cannot_requeue_and_a_key_cannot_post_as_another_node(slurm, cluster, tmp_path):
    stack = Stack(cluster)
    stack.down()
    for f in stack.db.parent.glob(stack.db.name + "*"):  # this test's decisions only
        f.unlink()
    stack.up()
    try:
        keys = {n: read_node_key(stack.node_key(n)) for n in cluster.node_names()}
        assert len({k.key_id for k in keys.values()}) == 4 and all(k.key_id for k in keys.values())

        # a node's key posting as another node: refused, counted; posting as itself: stored
        url = stack.controller_url
        host, port = url.split("//")[1].split(":")
        conn = http11.Connection(host, int(port), timeout=10)
        body = wire.encode_binary_batch("node2", 1, time.time(), [], [(time.time(), "log", "xid", "error",
                                        "forged Xid 79", '{"xid":79}', "[]")], [])
        status, _, reply = conn.post("/v1/ingest", wire.auth_headers(keys["node1"].key_id, keys["node1"].secret,
                                                                     "node2", body), body)
        assert status == 403 and b"belongs to node node1, not to node2" in reply
        metrics = urllib.request.urlopen(f"{url}/metrics", timeout=10).read().decode()
        assert 'sigma_ingest_rejected_total{reason="wrong_node"} 1.0' in metrics
        assert "sigma_ingest_shared_key 0.0" in metrics
        assert not query(stack, "SELECT 1 FROM events WHERE message = 'forged Xid 79'")

        # a job of root on node2, writing its own KPIs
        job_id = slurm.submit(None, "-w", "node2", "--requeue", f"--output={tmp_path}/job-%j.out",
                              f"--export=ALL,SIGMA_KPI_DIR={cluster.env['SIGMA_KPI_DIR']}",
                              wrap=f"{sys.executable} {KPI_JOB} 0.5")
        wait_for(lambda: query(stack, "SELECT 1 FROM kpis WHERE job_id = ? AND step >= 3", (job_id,)), timeout=90,
                 what="the job's own KPIs at the controller")

        # another user writes a NaN for it into a file of their own in the (world-writable) job directory
        job_dir = cluster.env["SIGMA_KPI_DIR"] + f"/job-{job_id}"
        subprocess.run(["chmod", "1777", job_dir], check=True)
        forged = f"{job_dir}/rank-7.node2.jsonl"
        subprocess.run(["/bin/sh", "-c", 'printf "%s" "$0" >> "$1"', nan_line(job_id), forged], check=True,
                       user=NOBODY, group=NOBODY)
        refused = wait_for(lambda: query(stack, "SELECT fields FROM events WHERE kind = 'kpi_refused' AND node = "
                                                "'node2'"), timeout=60, what="the forged KPI file refused")
        assert json.loads(refused[0]["fields"])["file_uid"] == NOBODY
        metrics = urllib.request.urlopen(f"{url}/metrics", timeout=10).read().decode()
        assert 'sigma_node_refusals_total{kind="kpi_refused",node="node2"} 1.0' in metrics
        time.sleep(10)  # several controller ticks and sidecar pushes
        assert not query(stack, "SELECT 1 FROM events WHERE kind = 'nan_loss' AND job_ids LIKE ?", (f"%{job_id}%",))
        assert slurm.job(job_id).restarts == 0 and slurm.job(job_id).state == "RUNNING"

        # the job's own user writing the same line: that one counts (the test can fail)
        with open(f"{job_dir}/rank-0.node2.jsonl", "a") as f:
            f.write(nan_line(job_id))
        wait_for(lambda: (j := slurm.job(job_id)) and j.restarts >= 1, timeout=90, what="the job requeued")
    finally:
        stack.down()
