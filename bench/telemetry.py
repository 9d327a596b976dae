"""Telemetry figures, each against a baseline measured in the same run.

1. Sidecar cost at 1 Hz with the default config (configs/telemetry.yaml), side by side with Debian's
   prometheus-node-exporter scraped at 1 Hz: CPU (% of one core), RSS, and CPU per sample collected.
   Goals: at most half of node_exporter's CPU per sample; RSS <= 60 MB.
2. Controller ingest throughput, samples/s end to end (HTTP + HMAC verify + validate + store) with the server on
   one core, and its ratio to a raw SQLite bulk insert of the same rows into the same schema. Goal >= 400k/s.

    .venv/bin/python bench/telemetry.py [--duration 60] [--ingest-samples 2000000]
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from sigma.controller.db import open_db  # noqa: E402
from sigma.store import connect  # noqa: E402
from sigma.telemetry import wire  # noqa: E402


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_http(url: str, timeout: float = 120.0) -> None:  # a busy machine starts the controller slowly
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=1):
                return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"{url} did not answer")


def wait_store(sidecar: subprocess.Popen, db: Path, log: Path, timeout: float = 120.0) -> None:
    """The sidecar has created its node store and its tables (start-up takes longer than the warm-up on a busy
    machine)."""
    deadline = time.monotonic() + timeout
    while not _has_tables(db):
        if sidecar.poll() is not None or time.monotonic() > deadline:
            tail = log.read_text(errors="replace")[-2000:] if log.exists() else ""
            raise SystemExit(f"the sidecar {'exited' if sidecar.poll() is not None else 'did not create'} "
                             f"{db} within {timeout:.0f} s; its log ({log}):\n{tail}")
        time.sleep(0.2)


def _has_tables(db: Path) -> bool:
    if not db.exists():
        return False
    try:
        store_rows(db)
        return True
    except sqlite3.OperationalError:  # created, its schema not yet
        return False


def start_controller(tmp: Path, secret: Path, cpu: int | None = None) -> tuple[subprocess.Popen, int]:
    port = free_port()
    argv = [sys.executable, "-m", "sigma.controller.ingest.server", "--db", str(tmp / "controller.db"),
            "--secret-file", str(secret), "--port", str(port), "--log-level", "WARNING"]
    proc = subprocess.Popen(argv, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    if cpu is not None:
        os.sched_setaffinity(proc.pid, {cpu})
    wait_http(f"http://127.0.0.1:{port}/healthz")
    return proc, port


def cpu_seconds(p: psutil.Process) -> float:
    t = p.cpu_times()
    return t.user + t.system + t.children_user + t.children_system


def store_rows(db: Path) -> int:
    conn = connect(db, readonly=True)
    try:
        return sum(conn.execute(f"SELECT coalesce(max(id), 0) FROM {t}").fetchone()[0]
                   for t in ("samples", "events", "kpis"))
    finally:
        conn.close()


# ---------- 1. sidecar vs node_exporter ----------
def bench_sidecar(duration: float, tmp: Path, secret: Path, overrides: list[str] = ()) -> dict:
    exporter = shutil.which("prometheus-node-exporter")
    if exporter is None:
        raise SystemExit("prometheus-node-exporter is missing: apt-get install prometheus-node-exporter")
    controller, port = start_controller(tmp, secret)
    node_dir = tmp / "node"
    env = {k: v for k, v in os.environ.items() if not k.startswith("SIGMA_")}  # a real node's defaults
    env["SIGMA_KPI_DIR"] = str(tmp / "kpi")
    sidecar = subprocess.Popen(
        [sys.executable, "-m", "sigma.cli", "sidecar", "--config", str(REPO / "configs" / "telemetry.yaml"),
         "--node", "bench", "--node-dir", str(node_dir), "--controller", f"http://127.0.0.1:{port}/v1/ingest",
         "--secret-file", str(secret), "--log-level", "WARNING", *(f"--set={o}" for o in overrides)],
        cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=open(tmp / "sidecar.log", "wb"))
    ne_port = free_port()
    ne = subprocess.Popen([exporter, f"--web.listen-address=127.0.0.1:{ne_port}"],
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    scraped = []
    stop = threading.Event()

    def scrape():
        next_at = time.monotonic()
        while not stop.is_set():
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{ne_port}/metrics", timeout=5) as r:
                    text = r.read().decode()
                scraped.append(sum(1 for line in text.splitlines() if line and not line.startswith("#")))
            except OSError:
                pass
            next_at += 1.0
            stop.wait(max(0.0, next_at - time.monotonic()))

    try:
        wait_http(f"http://127.0.0.1:{ne_port}/metrics")
        scraper = threading.Thread(target=scrape, daemon=True)
        scraper.start()
        time.sleep(5.0)  # warm-up: imports, first runs, first scrapes
        wait_store(sidecar, node_dir / "telemetry.db", tmp / "sidecar.log")  # a busy machine starts it later
        sp, np_ = psutil.Process(sidecar.pid), psutil.Process(ne.pid)
        s_cpu0, n_cpu0 = cpu_seconds(sp), cpu_seconds(np_)
        rows0, scrapes0 = store_rows(node_dir / "telemetry.db"), len(scraped)
        s_rss, n_rss = 0, 0
        t0 = time.monotonic()
        while time.monotonic() - t0 < duration:
            time.sleep(1.0)
            s_rss, n_rss = max(s_rss, sp.memory_info().rss), max(n_rss, np_.memory_info().rss)
        wall = time.monotonic() - t0
        s_cpu, n_cpu = cpu_seconds(sp) - s_cpu0, cpu_seconds(np_) - n_cpu0
        rows = store_rows(node_dir / "telemetry.db") - rows0
        window = scraped[scrapes0:]
        ne_samples = sum(window)
    finally:
        stop.set()
        for p in (sidecar, ne, controller):
            p.send_signal(signal.SIGTERM)
        for p in (sidecar, ne, controller):
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
    return {"wall_s": wall,
            "sidecar": {"cpu_pct": 100 * s_cpu / wall, "rss_mb": s_rss / 2**20, "samples": rows,
                        "samples_per_s": rows / wall, "cpu_us_per_sample": 1e6 * s_cpu / max(rows, 1)},
            "node_exporter": {"cpu_pct": 100 * n_cpu / wall, "rss_mb": n_rss / 2**20, "samples": ne_samples,
                              "samples_per_s": ne_samples / wall, "scrapes": len(window),
                              "cpu_us_per_sample": 1e6 * n_cpu / max(ne_samples, 1)}}


# ---------- 2. ingest throughput ----------
def make_batches(total: int, per_batch: int, nodes: int, metrics: int = 200):
    """Batches of one node each: `metrics` series x consecutive seconds, like a sidecar catching up."""
    names = [f"gpu.metric_{i // 8}" if i % 2 else f"host.metric_{i}" for i in range(metrics)]
    labels = [json.dumps({"gpu": str(i % 8)}) if i % 2 else "{}" for i in range(metrics)]
    t0 = time.time() - 86400
    batches = []
    n_batches = max(1, total // per_batch)
    for b in range(n_batches):
        node = f"node{b % nodes:04d}"
        seconds = per_batch // metrics
        base = t0 + (b // nodes) * seconds
        rows = [(base + s, names[m], float(s * m % 1000), labels[m], "[4242]")
                for s in range(seconds) for m in range(metrics)]
        batches.append((node, b + 1, rows))
    return batches


def raw_insert(tmp: Path, batches, extra_indexes: tuple = ()) -> tuple[float, float]:
    """The same rows straight into the same schema: executemany, one transaction per batch.
    Returns (wall seconds, CPU seconds)."""
    db = tmp / f"raw{len(extra_indexes)}.db"
    conn = open_db(db)
    conn.execute("PRAGMA cache_size = -65536")
    for index in extra_indexes:
        conn.execute(index)
    prepared = [[(node, *row) for row in rows] for node, _, rows in batches]
    sql = "INSERT INTO samples (node, ts, metric, value, labels, job_ids) VALUES (?, ?, ?, ?, ?, ?)"
    started, cpu_started = time.perf_counter(), time.process_time()
    for rows in prepared:
        with conn:
            conn.executemany(sql, rows)
    elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu_started
    conn.close()
    for path in tmp.glob(f"{db.name}*"):
        path.unlink()
    return elapsed, cpu


def http_ingest(tmp: Path, secret_path: Path, batches, clients: int, server_cpu: int | None,
                encode=wire.encode_binary_batch) -> tuple[float, float]:
    """Returns (wall seconds, server CPU seconds) for sending every batch and getting every ack."""
    secret = wire.read_secret(secret_path)
    bodies = [(node, encode(node, seq, time.time(), rows, [], [])) for node, seq, rows in batches]
    controller, port = start_controller(tmp, secret_path, server_cpu)
    queue = list(range(len(bodies)))
    lock = threading.Lock()
    failures = []

    def client():
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
        while True:
            with lock:
                if not queue:
                    break
                i = queue.pop()
            node, body = bodies[i]
            conn.request("POST", "/v1/ingest", body=body, headers={
                "Content-Length": str(len(body)), **wire.auth_headers(None, secret, node, body)})
            resp = conn.getresponse()
            reply = resp.read()
            if resp.status != 200:
                failures.append(reply)
        conn.close()

    server = psutil.Process(controller.pid)
    try:
        threads = [threading.Thread(target=client) for _ in range(clients)]
        cpu_started = cpu_seconds(server)
        started = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        elapsed = time.perf_counter() - started
        cpu = cpu_seconds(server) - cpu_started
    finally:
        controller.send_signal(signal.SIGTERM)
        controller.wait(timeout=30)
    if failures:
        raise RuntimeError(f"{len(failures)} batches failed: {failures[0][:200]!r}")
    conn = connect(tmp / "controller.db", readonly=True)
    stored = conn.execute("SELECT count(*) FROM samples").fetchone()[0]
    conn.close()
    expected = sum(len(rows) for _, _, rows in batches)
    if stored != expected:
        raise RuntimeError(f"stored {stored} samples, sent {expected}")
    shutil.rmtree(tmp, ignore_errors=True)
    return elapsed, cpu


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--duration", type=float, default=60.0, help="seconds measured for the 1 Hz comparison")
    parser.add_argument("--ingest-samples", type=int, default=2_000_000)
    parser.add_argument("--batch", type=int, default=20_000, help="samples per pushed batch")
    parser.add_argument("--nodes", type=int, default=64)
    parser.add_argument("--clients", type=int, default=2, help="concurrent pushing connections")
    parser.add_argument("--sidecar-set", action="append", default=[], metavar="KEY=VALUE",
                        help="config override for the sidecar run (e.g. push.interval_s=5); default: none")
    parser.add_argument("--skip-sidecar", action="store_true")
    parser.add_argument("--skip-ingest", action="store_true")
    args = parser.parse_args()
    print(f"machine: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f} at start")
    with tempfile.TemporaryDirectory(prefix="sigma-bench-telemetry-") as d:
        tmp = Path(d)
        secret = tmp / "ingest.secret"
        wire.write_secret(secret)
        if not args.skip_sidecar:
            r = bench_sidecar(args.duration, tmp / "sidecar", secret, args.sidecar_set)
            s, n = r["sidecar"], r["node_exporter"]
            print(f"\n== 1 Hz collection, {r['wall_s']:.0f} s, default config "
                  f"{' '.join(args.sidecar_set)} vs prometheus-node-exporter".replace("  ", " "))
            print(f"{'':16}{'CPU % core':>11}{'RSS MB':>9}{'samples/s':>11}{'CPU us/sample':>15}")
            for name, x in (("sigma sidecar", s), ("node_exporter", n)):
                print(f"{name:16}{x['cpu_pct']:>11.2f}{x['rss_mb']:>9.1f}{x['samples_per_s']:>11.0f}"
                      f"{x['cpu_us_per_sample']:>15.1f}")
            ratio = s["cpu_us_per_sample"] / n["cpu_us_per_sample"]
            print(f"sidecar CPU per sample = {ratio:.2f} x node_exporter's (goal <= 0.5); "
                  f"RSS {s['rss_mb']:.1f} MB (goal <= 60)")
        if not args.skip_ingest:
            batches = make_batches(args.ingest_samples, args.batch, args.nodes)
            total = sum(len(rows) for _, _, rows in batches)
            server_cpu = 0 if hasattr(os, "sched_setaffinity") else None
            if server_cpu is not None:
                os.sched_setaffinity(0, set(range(1, os.cpu_count())) or {0})  # clients off the server's core
            raw_s, raw_cpu = raw_insert(tmp, batches)
            e2e_s, e2e_cpu = http_ingest(tmp / "ingest", secret, batches, args.clients, server_cpu)
            json_s, json_cpu = http_ingest(tmp / "ingest-json", secret, batches, args.clients, server_cpu,
                                           wire.encode_batch)
            old_s, old_cpu = raw_insert(tmp, batches, ("CREATE INDEX samples_ts ON samples (ts)",))
            print(f"\n== controller ingest, {total} samples in {len(batches)} batches of {args.batch} "
                  f"from {args.nodes} nodes, server pinned to one core")
            print(f"{'':58}{'wall samples/s':>16}{'per CPU-second':>16}")
            for name, wall, cpu in (("end to end, binary columns (v2, what sidecars send)", e2e_s, e2e_cpu),
                                    ("end to end, JSON columns (v1, still accepted)", json_s, json_cpu),
                                    ("raw SQLite bulk insert, same rows and schema", raw_s, raw_cpu),
                                    ("raw insert with the former samples_ts index too", old_s, old_cpu)):
                print(f"{name:58}{total / wall:>16,.0f}{total / cpu:>16,.0f}")
            print(f"ratio end-to-end (v2) / raw insert: {raw_s / e2e_s:.2f} wall, {raw_cpu / e2e_cpu:.2f} per "
                  f"CPU-second (goal >= 400,000 samples/s end to end on one core)")
    print(f"load average {os.getloadavg()[0]:.2f} at end")
    return 0


if __name__ == "__main__":
    sys.exit(main())
