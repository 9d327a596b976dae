"""Four sidecars (one per local-cluster node, real processes) push to a controller server process that is
killed with SIGKILL and restarted mid-stream; afterwards the controller holds every row exactly once."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections import Counter
from pathlib import Path

import pytest

from sigma.chaos.inject import kernel_log_line
from sigma.paths import configs_dir
from sigma.store import connect
from sigma.telemetry import wire

pytestmark = pytest.mark.integration

TABLES = {
    "samples": "ts, metric, value, labels, job_ids",
    "events": "ts, source, kind, severity, message, fields, job_ids",
    "kpis": "ts, job_id, rank, step, loss, step_time_s, tokens_per_s, mfu, grad_norm, payload",
}
FAST = ["collectors.host.interval_s=0.5", "collectors.kernel.interval_s=0.3", "collectors.kpi.interval_s=0.3",
        "collectors.health.interval_s=0.5", "push.interval_s=0.3", "push.max_backoff_s=0.5", "jobs.refresh_s=0.5",
        "push.drain_on_exit_s=20"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(predicate, timeout=30.0, what="condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def start_controller(db: Path, secret: Path, port: int, log: Path) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-m", "sigma.controller.ingest.server", "--db", str(db), "--secret-file",
                             str(secret), "--port", str(port)], stdout=log.open("a"), stderr=subprocess.STDOUT)

    def healthy():
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=1) as r:
                return r.status == 200
        except OSError:
            return False
    wait_for(healthy, what="controller /healthz")
    return proc


def rows(db: Path, table: str, node: str | None = None) -> Counter:
    conn = connect(db, readonly=True)
    try:
        where, args = ("WHERE node = ?", (node,)) if node else ("", ())
        return Counter(tuple(r) for r in conn.execute(f"SELECT {TABLES[table]} FROM {table} {where}", args))
    finally:
        conn.close()


def controller_nodes(db: Path) -> set:
    if not db.exists():
        return set()
    conn = connect(db, readonly=True)
    try:
        return {r[0] for r in conn.execute("SELECT DISTINCT node FROM batches")}
    except Exception:
        return set()
    finally:
        conn.close()


def test_four_sidecars_survive_a_killed_controller(cluster, slurm, tmp_path):
    nodes = cluster.node_names()
    secret = tmp_path / "ingest.secret"
    wire.write_secret(secret)
    db, port = tmp_path / "controller.db", free_port()
    env = {**os.environ, **cluster.env}
    kpi_dir = Path(cluster.env["SIGMA_KPI_DIR"])
    for node in nodes:  # the node dirs outlive test runs: start each node store from scratch
        for f in cluster.node_dir(node).glob("telemetry.db*"):
            f.unlink()
        for f in (cluster.node_dir(node) / "health").glob("*.json"):
            f.unlink()
    job_id = slurm.submit(None, "-w", "node2", "-o", str(tmp_path / "job.out"), wrap="sleep 120")
    wait_for(lambda: (slurm.job(job_id) or None) and slurm.job(job_id).state == "RUNNING", what="job running")

    controller_log = tmp_path / "controller.log"
    controller = start_controller(db, secret, port, controller_log)
    sidecars = {}
    for node in nodes:
        argv = [sys.executable, "-m", "sigma.cli", "sidecar", "--config", str(configs_dir() / "telemetry.yaml"),
                "--node", node, "--controller", f"http://127.0.0.1:{port}/v1/ingest", "--secret-file", str(secret)]
        for item in FAST:
            argv += ["--set", item]
        log = (tmp_path / f"sidecar-{node}.log").open("w")
        sidecars[node] = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env)
    try:
        wait_for(lambda: controller_nodes(db) == set(nodes), what="batches from all four nodes")
        with cluster.kernel_log("node3").open("a") as f:
            f.write(kernel_log_line("node3", "NVRM: Xid (PCI:0000:3b:00): 79, pid=4242, GPU has fallen off the bus."))
        time.sleep(1.0)

        controller.send_signal(signal.SIGKILL)  # mid-stream: batches in flight are lost with it
        controller.wait()
        with cluster.kernel_log("node1").open("a") as f:
            f.write(kernel_log_line("node1", "NVRM: Xid (PCI:0000:07:00): 48, pid=77, DBE (double bit error)"))
        job_dir = kpi_dir / f"job-{job_id}"
        job_dir.mkdir(parents=True, exist_ok=True)
        with (job_dir / "rank-0.node2.jsonl").open("a") as f:
            for step in range(1, 6):
                f.write(json.dumps({"ts": time.time(), "job_id": job_id, "rank": 0, "step": step,
                                    "loss": 3.0 - step * 0.1, "step_time_s": 0.5}) + "\n")
            f.write(json.dumps({"ts": time.time(), "job_id": job_id, "rank": 0, "event": "checkpoint",
                                "message": "saved step 5"}) + "\n")
        health = cluster.node_dir("node4") / "health"
        health.mkdir(exist_ok=True)
        (health / f"{int(time.time() * 1000)}-prolog.json").write_text(json.dumps({
            "node": "node4", "ts": time.time(), "suite": "prolog", "job_id": None, "verdict": "reject",
            "duration_s": 0.3, "checks": [{"name": "gpu_count", "status": "fail", "message": "0 of 8 GPUs",
                                           "category": "gpu", "duration_s": 0.1}]}))
        time.sleep(3.0)  # the sidecars buffer meanwhile

        controller = start_controller(db, secret, port, controller_log)
        time.sleep(3.0)
    finally:
        for proc in sidecars.values():
            proc.send_signal(signal.SIGTERM)
        codes = {node: proc.wait(timeout=60) for node, proc in sidecars.items()}
        controller.send_signal(signal.SIGTERM)
        controller.wait(timeout=20)
    logs = {n: (tmp_path / f"sidecar-{n}.log").read_text() for n in nodes}
    assert codes == {n: 0 for n in nodes}, logs

    # every row of every node store is in the controller exactly once, and nothing else is
    total = 0
    for node in nodes:
        store = cluster.node_dir(node) / "telemetry.db"
        for table in TABLES:
            local, remote = rows(store, table), rows(db, table, node)
            assert remote == local, f"{node} {table}: {sum(local.values())} local vs {sum(remote.values())} remote"
            total += sum(local.values())
        pushed = connect(store, readonly=True).execute("SELECT count(*) FROM outbox").fetchone()[0]
        assert pushed == 0, f"{node} still has unacknowledged batches"
    assert total > 400

    conn = connect(db, readonly=True)
    xids = {(r[0], json.loads(r[1])["xid"]) for r in conn.execute(
        "SELECT node, fields FROM events WHERE source = 'log' AND kind = 'xid'")}
    assert xids == {("node3", 79), ("node1", 48)}
    steps = [r[0] for r in conn.execute("SELECT step FROM kpis WHERE node = 'node2' AND job_id = ? ORDER BY step",
                                        (job_id,))]
    assert steps == [1, 2, 3, 4, 5]
    assert conn.execute("SELECT count(*) FROM events WHERE node = 'node4' AND source = 'health' "
                        "AND kind = 'gpu_count' AND severity = 'fail'").fetchone()[0] == 1
    # job tagging: node2's rows carry the running job, the other nodes' rows never do
    tagged = dict(conn.execute("SELECT node, count(*) FROM samples WHERE EXISTS (SELECT 1 FROM "
                               "json_each(samples.job_ids) WHERE value = ?) GROUP BY node", (job_id,)).fetchall())
    assert set(tagged) == {"node2"} and tagged["node2"] > 20
    # the kill was noticed and the retries were harmless: ingest dropped duplicates by (node, seq)
    assert any("cannot push" in logs[n] for n in nodes)
