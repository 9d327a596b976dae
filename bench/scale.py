"""The controller under load: 256 nodes streaming to one controller on loopback, with faults in the stream.

Pusher processes stand in for the nodes' sidecars (one process pushes for many nodes, each node on a kept-alive
connection of its own, as a sidecar keeps): every node sends, once a second, a signed version-2 batch (the
sidecar's binary wire format, per-node HMAC keys from a real key table) with --metrics samples (8 GPUs x 20
accelerator metrics + host metrics), its KPI row for the job it runs (--jobs concurrent jobs of --job-nodes nodes,
one step a second) and a heartbeat event every 5 s, plus a harmless kernel-log line now and then; a node behind
sends the events and KPIs of its whole backlog first, as the sidecar cuts them. The controller is `sigma controller run`'s own code in its own process: the ingest HTTP server
(threads, HMAC, validation, SQLite) and the detection/remediation loop ticking every poll_s with the shipped rules,
watchdog and isolation, and retention pruning the database as configured.

SLURM's answers (256 nodes, the jobs on them) come from the in-memory SLURM of the unit tests
(tests/unit/controller/fakes.py): no machine here runs 256 slurmd; drains and requeues change its state as
scontrol would. Everything else is the real pipeline.

Faults, injected into the stream every --fault-every seconds, each on a node or job of its own:
- xid79: a kernel-log Xid 79 event (rule gpu-xid-79)
- ecc: one GPU's gpu.ecc.volatile.uncorrected goes 0 -> 4 (metric rule gpu-ecc-uncorrectable)
- hang: a job's ranks stop stepping, one node's heartbeats stop (watchdog hang, T = hang_timeout_s, + isolation)

Printed: ingest lag (batch stored - its samples' time) p50/p99/max, detection latency per fault kind (incident
opened - fault time, from the controller's incidents table), controller CPU (% of one core) and peak RSS, database
growth per hour and the size the configured retention bounds it at, samples lost (sent - stored), machine load.
Goals (the 4-node figures are in docs/controller.md): 0 lost, p99 lag < 2 s, detection within 2x of 4 nodes.
Then the run as a timeline (--timeline S: slices of S seconds) beside what the controller was doing meanwhile: lag,
tick durations, the ingest writer's groups (commits, rows, slowest write and commit), Python's collections and
their pauses, the write-ahead log's and the database's size, retention passes, the machine's load; and the tick's
parts (the Controller's methods timed): the watchdog's two (`_update_kpi_window`, `_watch`) in every slice, to see
whether its cost stays flat as the jobs' KPI windows fill (930 s with the shipped config), then the four largest. --wal-default and --gc-default run the comparison: SQLite's own WAL
checkpoints, Python's default collector thresholds.

    .venv/bin/python bench/scale.py [--nodes 256] [--metrics 200] [--jobs 32] [--job-nodes 8] [--duration 600]
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import json
import multiprocessing as mp
import os
import socket
import statistics
from collections import Counter
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from sigma.telemetry import wire  # noqa: E402

GPUS = 8
GPU_METRICS = ["gpu.util", "gpu.mem.util", "gpu.mem.used_bytes", "gpu.temp_c", "gpu.power_w", "gpu.sm_clock_mhz",
               "gpu.mem_clock_mhz", "gpu.pcie.tx_bytes", "gpu.pcie.rx_bytes", "gpu.pcie.replay_count",
               "gpu.ecc.volatile.corrected", "gpu.ecc.volatile.uncorrected", "gpu.nvlink.tx_bytes",
               "gpu.nvlink.rx_bytes", "gpu.throttle.reasons", "gpu.fan_pct", "gpu.retired_pages.sbe",
               "gpu.retired_pages.dbe", "gpu.xid.count", "gpu.enc.util"]
FAULT_KINDS = ("xid79", "ecc", "hang")
FOUR_NODE = {"xid79": 0.6, "hang": 122.5}  # docs/controller.md, bench/recovery.py: detect (fault -> incident)
RULES = {"xid79": ("gpu-xid-79",), "ecc": ("gpu-ecc-uncorrectable",), "hang": ("watchdog-hang",)}
HEARTBEAT_S = 5.0
MAX_BATCH_SECONDS = 100  # 100 s x 200 samples = the sidecar's largest batch (20,000 records)


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(round(q * (len(values) - 1))))] if values else float("nan")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---------- the workload: who runs what, and when each fault happens ----------
def plan(args) -> dict:
    nodes = [f"n{i:04d}" for i in range(args.nodes)]
    jobs = {1000 + j: nodes[j * args.job_nodes:(j + 1) * args.job_nodes] for j in range(args.jobs)}
    spare_jobs = list(jobs)
    faults, t, k = [], args.first_fault, 0
    used_nodes: set[str] = set()
    while t < args.duration - args.fault_margin:
        kind = FAULT_KINDS[k % len(FAULT_KINDS)]
        if kind == "hang":
            if not spare_jobs:
                break
            job = spare_jobs.pop()
            node = jobs[job][k % args.job_nodes]
        else:  # a node of a job no other fault touches
            job = spare_jobs.pop(0) if spare_jobs else None
            if job is None:
                break
            node = jobs[job][0]
        used_nodes.add(node)
        faults.append({"kind": kind, "at": t, "node": node, "job": job})
        t += args.fault_every if kind == FAULT_KINDS[-1] else args.fault_every / len(FAULT_KINDS)
        k += 1
    return {"nodes": nodes, "jobs": {str(j): n for j, n in jobs.items()}, "faults": faults}


# ---------- controller process ----------
def serve(spec_path: str) -> None:
    """The controller: daemon.run's pieces with SLURM's answers from the in-memory SLURM."""
    from prometheus_client import generate_latest

    from sigma.controller.config import BreakerConfig, ControllerConfig, IngestConfig, Playbook, RemediationConfig
    from sigma.controller.config import ValidationConfig
    from sigma.controller.daemon import detection_reads_s, start_http, tune_gc, wait_next
    from sigma.controller.loop import Controller
    from sigma.controller.report.prometheus import registry
    from sigma.controller.retention import RetentionConfig, RetentionThread
    from tests.unit.controller.fakes import FakeSlurm

    spec = json.loads(Path(spec_path).read_text())
    work = Path(spec["work"])
    cfg = ControllerConfig(db=str(work / "controller.db"), log_dir=str(work / "log"), listen=f"127.0.0.1:{spec['port']}",
                           ingest_keys_file=str(work / "keys.json"), poll_s=1.0, rules=str(REPO / "configs" / "rules"),
                           breaker=BreakerConfig(max_nodes=64, max_fraction=1.0, wave_max_nodes=64,
                                                 wave_max_fraction=1.0),  # every injected fault may drain
                           retention=RetentionConfig(**spec["retention"]),
                           # every node connects in the stream's first second: a site sizes this for its node count
                           ingest=IngestConfig(max_unauthenticated=max(64, len(spec["nodes"]))))
    script = work / "validate.sbatch"
    script.write_text("#!/bin/sh\nexit 0\n")
    rcfg = RemediationConfig(ack_kernel_log=False, validation=ValidationConfig(script=str(script)),
                             playbooks=[Playbook(name="manual", kind="manual")])
    slurm = FakeSlurm(nodes=spec["nodes"])
    start = time.time() - 60  # the jobs started a minute before the stream: past their KPI grace
    for job, nodes in spec["jobs"].items():
        slurm.run_job(int(job), nodes, start=start)
    ctl = Controller(cfg, slurm=slurm, remediation=rcfg, root=work)
    http = start_http(cfg, lambda: generate_latest(registry(cfg.db)))
    if spec.get("wal_default"):  # the comparison: SQLite's own checkpoints after commits
        http.ingest.wal = http.ingest.writer.after_commit = None
        http.ingest.conn.execute("PRAGMA wal_autocheckpoint = 1000")
    ctl.start()
    if not spec.get("gc_default"):
        tune_gc()
    probe = {"ticks": [], "gc": [], "retention": [], "files": []}  # what the controller did, when (the timeline)
    pruner = RetentionThread(cfg.db, cfg.retention, floor_s=detection_reads_s(ctl),
                             on_pass=lambda deleted, took: probe["retention"].append((time.time() - took, took)))
    pruner.start()
    stop = threading.Event()
    gc_start = {}

    def on_gc(phase, info):  # collector pauses stop every thread of the process
        if phase == "start":
            gc_start["t"] = time.perf_counter()
        elif "t" in gc_start:
            probe["gc"].append((time.time(), info["generation"], time.perf_counter() - gc_start.pop("t")))

    gc.callbacks.append(on_gc)

    def files() -> None:  # the database and its write-ahead log, once a second
        db = Path(cfg.db)
        while not stop.wait(1.0):
            wal = Path(f"{db}-wal")
            probe["files"].append((time.time(), db.stat().st_size, wal.stat().st_size if wal.exists() else 0))

    threading.Thread(target=files, daemon=True).start()
    phases = time_phases(ctl)
    import signal
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    while not stop.is_set():
        t0 = time.monotonic()
        start = time.time()
        phases.clear()
        try:
            ctl.tick()
        except Exception as exc:  # as daemon.run: one bad tick must not stop the controller
            print(f"tick failed: {exc!r}", file=sys.stderr, flush=True)
        probe["ticks"].append((start, time.monotonic() - t0))
        probe.setdefault("phases", []).append((start, dict(phases)))
        wait_next(stop, http.ingest.wake, max(0.0, cfg.poll_s - (time.monotonic() - t0)))
    http.stop()
    pruner.stop()
    probe["groups"] = list(http.ingest.writer.timings)
    wal = http.ingest.wal
    probe["wal"] = {**wal.counts, "seconds": wal.seconds} if wal is not None else {}
    (work / "probe.json").write_text(json.dumps(probe))


PHASES = {"ctl": ("_snapshot", "_match_new_events", "_metric_rules", "_rule_kpis", "_update_kpi_window",
                  "_newest_data", "_watch", "_isolate", "_save_state", "_verify", "_housekeeping", "_unfinished"),
          "decider": ("decide",), "journal": ("replay",), "remediator": ("tick",), "windows": ("findings",)}


def time_phases(ctl) -> dict:
    """Wall seconds per part of the tick (the instance's methods wrapped): which part a slow tick spent its
    time in."""
    import sigma.controller.loop as loop

    spent: dict[str, float] = {}

    def timed(name, fn):
        def wrapper(*a, **k):
            t = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                spent[name] = spent.get(name, 0.0) + time.perf_counter() - t
        return wrapper

    for owner, names in PHASES.items():
        obj = ctl if owner == "ctl" else getattr(ctl, owner)
        for name in names:
            setattr(obj, name, timed(name if owner == "ctl" else f"{owner}.{name}", getattr(obj, name)))
    loop.record_losses = timed("record_losses", loop.record_losses)
    return spent


# ---------- pusher processes ----------
class Node:
    """One node's stream: its series, its job, the faults that touch it."""

    def __init__(self, name: str, job: int, rank: int, metrics: int, faults: list[dict], seed: int):
        self.name, self.job, self.rank = name, job, rank
        jobs = json.dumps([job])
        self.series = []
        for m in GPU_METRICS:
            for g in range(GPUS):
                self.series.append((m, json.dumps({"gpu": str(g)}, separators=(",", ":")), jobs))
        for i in range(max(0, metrics - len(self.series))):
            self.series.append((f"host.m{i:03d}", "{}", jobs))
        self.series = self.series[:metrics]
        self.ecc_index = self.series.index(("gpu.ecc.volatile.uncorrected", '{"gpu":"3"}', jobs))
        self.faults = faults
        self.seq = 0
        self.step = 0
        self.base = [float((seed * 31 + i * 7) % 97) for i in range(len(self.series))]
        self.base[self.ecc_index] = 0.0  # a healthy GPU's error counter

    def fault(self, kind: str, t: float, t0: float) -> dict | None:
        for f in self.faults:
            if f["kind"] == kind and t >= t0 + f["at"]:
                return f
        return None

    def samples_at(self, t: float, t0: float, samples: list) -> None:
        """The samples the node collected at second t (appended to the batch being built)."""
        values = list(self.base)
        values[0] = 50.0 + (t % 7)
        if self.fault("ecc", t, t0):
            values[self.ecc_index] = 4.0
        samples += [(t, m, v, labels, jobs) for (m, labels, jobs), v in zip(self.series, values)]

    def extras_at(self, t: float, t0: float, events: list, kpis: list) -> None:
        """The log events and KPIs of second t."""
        job_ids = json.dumps([self.job])
        xid = self.fault("xid79", t, t0)
        if xid and not xid.get("sent"):
            xid["sent"] = True
            events.append([t0 + xid["at"], "log", "xid", "error", "NVRM: Xid (PCI:0000:3b:00): 79, pid=1, GPU has "
                           "fallen off the bus.", json.dumps({"xid": 79}), job_ids])
        hang = self.fault("hang", t, t0)
        if hang is None:
            self.step += 1
            kpis.append([t, self.job, self.rank, self.step, 2.0, 1.0, 8000.0, 0.4, 1.0, "{}"])
        if int(t) % int(HEARTBEAT_S) == self.rank % int(HEARTBEAT_S) and not (hang and hang["node"] == self.name):
            events.append([t, "kpi", "heartbeat", "info", "alive", "{}", job_ids])
        if int(t) % 60 == self.rank % 60:  # a harmless kernel line now and then
            events.append([t, "log", "line", "info", "eth0: renamed from veth", "{}", job_ids])

    def batch(self, sample_seconds: list[float], extra_seconds: list[float], t0: float) -> tuple[bytes, int]:
        """One push: the events and KPIs of extra_seconds (all of the backlog: the sidecar cuts the rare, small
        kinds first) and the samples of sample_seconds (the oldest, up to its batch limit)."""
        samples, events, kpis = [], [], []
        for t in extra_seconds:
            self.extras_at(t, t0, events, kpis)
        for t in sample_seconds:
            self.samples_at(t, t0, samples)
        self.seq += 1
        body = wire.encode_binary_batch(self.name, self.seq, time.time(), samples, events, kpis, self.cache)
        return body, len(samples)

    cache: dict = {}


async def _post(reader, writer, headers: dict, body: bytes) -> tuple[int, bytes]:
    """One HTTP/1.1 request on a kept-alive connection; (status, body)."""
    head = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
    writer.write(f"POST /v1/ingest HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: {len(body)}\r\n{head}\r\n"
                 .encode() + body)
    await writer.drain()
    status = int((await reader.readline()).split()[1])
    length = 0
    while (line := await reader.readline()) not in (b"\r\n", b""):
        name, _, value = line.decode("latin-1").partition(":")
        if name.strip().lower() == "content-length":
            length = int(value)
    return status, await reader.readexactly(length)


def push(worker: int, spec: dict, node_names: list[str], out: str) -> None:
    """Push for node_names from t0 until every second of the run is sent (or the drain deadline passes), each node
    on its own kept-alive connection as a sidecar (asyncio: one thread for them all): each push carries the events
    and KPIs of every second not sent yet and the samples of the oldest, at most MAX_BATCH_SECONDS of them
    (at-least-once: a failed push is retried)."""
    import asyncio

    from sigma.security.keys import KeyTable

    table = KeyTable(spec["keys"]).load()
    keys = {k.node: k for k in table.keys}
    node_job = {n: (int(j), i) for j, ns in spec["jobs"].items() for i, n in enumerate(ns)}
    nodes = [Node(n, node_job[n][0], node_job[n][1], spec["metrics"],
                  [dict(f) for f in spec["faults"] if f["node"] == n or (f["kind"] == "hang" and f["job"] ==
                                                                          node_job[n][0])], i)
             for i, n in enumerate(node_names)]
    t0, duration, port = spec["t0"], spec["duration"], spec["port"]
    deadline = t0 + duration + spec["drain_s"]
    records: list[tuple] = []  # (node, seq, seconds of samples sent, samples, sent at)
    errors = [0]

    async def run(nd: Node) -> None:
        conn = None
        sent_upto = extras_upto = 0  # seconds of the run whose samples / events and KPIs are sent
        while time.time() < deadline and sent_upto < duration:
            collected = min(duration, int(time.time() - t0) + 1)  # seconds collected so far
            if sent_upto >= collected:  # caught up: wait for the next second's collection
                await asyncio.sleep(max(0.0, t0 + collected - time.time()) + 0.01)
                continue
            last = min(collected, sent_upto + MAX_BATCH_SECONDS)
            seconds = [t0 + s for s in range(sent_upto, last)]
            body, n = nd.batch(seconds, [t0 + s for s in range(extras_upto, collected)], t0)
            key = keys[nd.name]
            sent = time.time()
            while time.time() < deadline:  # at-least-once: retry the same batch until it is stored
                headers = wire.auth_headers(key.id, key.secret.encode(), nd.name, body)
                headers["Content-Type"] = "application/octet-stream"
                try:
                    if conn is None:
                        conn = await asyncio.open_connection("127.0.0.1", port)
                    status, reply = await asyncio.wait_for(_post(*conn, headers, body), 60)
                    if status == 200:
                        sent_upto, extras_upto = last, collected
                        records.append((nd.name, nd.seq, seconds, n, sent))
                        break
                    errors[0] += 1
                    print(f"push {nd.name}: {status} {reply[:200]!r}", file=sys.stderr)
                except (OSError, ValueError, IndexError, asyncio.IncompleteReadError, asyncio.TimeoutError):
                    errors[0] += 1
                    if conn is not None:
                        conn[1].close()
                    conn = None
                await asyncio.sleep(0.2)
        if conn is not None:
            conn[1].close()

    async def main() -> None:
        await asyncio.gather(*(run(nd) for nd in nodes))

    asyncio.run(main())
    Path(out).write_text(json.dumps({"records": records, "errors": errors[0]}))


# ---------- measuring ----------
def db_bytes(db: Path) -> int:
    return sum(p.stat().st_size for p in db.parent.glob(db.name + "*") if p.exists())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", type=int, default=256)
    ap.add_argument("--metrics", type=int, default=200, help="samples per node per second")
    ap.add_argument("--jobs", type=int, default=32)
    ap.add_argument("--job-nodes", type=int, default=8)
    ap.add_argument("--duration", type=int, default=600, help="seconds of streaming")
    ap.add_argument("--first-fault", type=float, default=30.0, help="seconds into the stream of the first fault")
    ap.add_argument("--fault-every", type=float, default=180.0, help="seconds between rounds of the three kinds")
    ap.add_argument("--fault-margin", type=float, default=150.0, help="no fault this close to the end (a hang "
                    "needs hang_timeout_s to be detected)")
    ap.add_argument("--drain", type=float, default=300.0, help="seconds after the run the pushers may still send "
                    "their backlog; what is left unsent then counts as lost")
    ap.add_argument("--pushers", type=int, default=2, help="pusher processes")
    ap.add_argument("--raw-hours", type=float, default=6.0, help="retention.samples_raw_s in hours (the bound printed)")
    ap.add_argument("--timeline", type=float, default=30.0, help="print the run in slices of this many seconds "
                    "beside what the controller was doing (0: not)")
    ap.add_argument("--wal-default", action="store_true", help="the comparison: SQLite's own WAL checkpoints "
                    "instead of the ingest writer's (sigma/controller/ingest/wal.py)")
    ap.add_argument("--gc-default", action="store_true", help="the comparison: Python's default collector "
                    "thresholds instead of sigma.controller.daemon.tune_gc")
    ap.add_argument("--serve", help=argparse.SUPPRESS)
    args = ap.parse_args()
    need = GPU_METRICS.index("gpu.ecc.volatile.uncorrected") * GPUS + 4  # GPU 3's series, which the ECC fault sets
    if args.jobs * args.job_nodes != args.nodes:
        ap.error(f"--jobs {args.jobs} x --job-nodes {args.job_nodes} must cover the --nodes {args.nodes} exactly "
                 f"(every node streams its job's KPIs)")
    if args.metrics < need:
        ap.error(f"--metrics {args.metrics}: at least {need}, so that each node has the GPU ECC series its fault "
                 f"writes (GPU metrics first, {GPUS} GPUs each)")
    if args.serve:
        serve(args.serve)
        return 0
    if args.nodes < args.jobs * args.job_nodes:
        ap.error(f"--nodes {args.nodes} cannot hold {args.jobs} jobs of {args.job_nodes} nodes")
    from sigma.controller.retention import RetentionConfig, bound_bytes
    from sigma.security.keys import KeyTable

    work = Path(tempfile.mkdtemp(prefix="sigma-scale-"))
    layout = plan(args)
    table = KeyTable(work / "keys.json")
    for n in layout["nodes"]:
        table.issue(n)
    table.save()
    port = free_port()
    retention = {"samples_raw_s": args.raw_hours * 3600}
    spec = {"work": str(work), "port": port, "nodes": layout["nodes"], "jobs": layout["jobs"],
            "retention": retention, "wal_default": args.wal_default, "gc_default": args.gc_default}
    (work / "spec.json").write_text(json.dumps(spec))
    load0 = os.getloadavg()
    ctl = subprocess.Popen([sys.executable, __file__, "--serve", str(work / "spec.json")], cwd=REPO,
                           stderr=open(work / "controller.err", "w"))
    proc = psutil.Process(ctl.pid)
    deadline = time.time() + 60
    while time.time() < deadline and ctl.poll() is None:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                break
        except OSError:
            time.sleep(0.3)
    else:
        print((work / "controller.err").read_text(), file=sys.stderr)
        raise SystemExit("controller did not start listening within 60 s")
    db = work / "controller.db"
    t0 = float(int(time.time()) + 2)
    push_spec = {"port": port, "keys": str(work / "keys.json"), "jobs": layout["jobs"], "faults": layout["faults"],
                 "metrics": args.metrics, "t0": t0, "duration": args.duration, "drain_s": args.drain}
    outs = [str(work / f"push{i}.json") for i in range(args.pushers)]
    pushers = [mp.get_context("spawn").Process(target=push, args=(i, push_spec, layout["nodes"][i::args.pushers],
                                                                     outs[i]))
               for i in range(args.pushers)]
    for p in pushers:
        p.start()
    time.sleep(max(0.0, t0 - time.time()))
    size0, cpu0, wall0, io0 = db_bytes(db), proc.cpu_times(), time.monotonic(), proc.io_counters()
    rss, loads, load_trace = [], [], []
    print(f"streaming {args.nodes} nodes x {args.metrics} metrics/s ({args.nodes * args.metrics:,} samples/s), "
          f"{args.jobs} jobs x {args.job_nodes} nodes, {len(layout['faults'])} faults, for {args.duration} s "
          f"(work dir {work})", flush=True)
    pusher_procs = [psutil.Process(p.pid) for p in pushers]
    pusher_cpu = {}
    while any(p.is_alive() for p in pushers):
        for pp in pusher_procs:
            try:
                pusher_cpu[pp.pid] = pp.cpu_times().user + pp.cpu_times().system
            except psutil.Error:  # exited
                pass
        rss.append(proc.memory_info().rss)
        loads.append(os.getloadavg()[0])
        load_trace.append((time.time(), loads[-1]))
        time.sleep(1.0)
    wall = time.monotonic() - wall0
    cpu1, io1 = proc.cpu_times(), proc.io_counters()
    size1 = db_bytes(db)
    time.sleep(3.0)  # the last ticks see the last batches
    ctl.terminate()
    ctl.wait(timeout=60)

    records, errors = [], 0
    for o in outs:
        data = json.loads(Path(o).read_text())
        records += data["records"]
        errors += data["errors"]
    import sqlite3
    conn = sqlite3.connect(db)
    received = {(n, s): r for n, s, r in conn.execute("SELECT node, seq, received_at FROM batches")}
    stored = conn.execute("SELECT COUNT(*) FROM samples").fetchone()[0]
    sent = sum(r[3] for r in records)
    generated = args.nodes * args.duration * args.metrics
    lags = [received[(r[0], r[1])] - t for r in records if (r[0], r[1]) in received for t in r[2]]
    waits = [r[4] - t for r in records for t in r[2]]  # the pusher's own delay: sent - sample time
    serve_s = [received[(r[0], r[1])] - r[4] for r in records if (r[0], r[1]) in received]
    per_batch = statistics.mean(len(r[2]) for r in records) if records else 0
    incidents = conn.execute("SELECT rule_id, node, job_id, opened_at, fault_ts FROM incidents").fetchall()
    probe = json.loads((work / "probe.json").read_text()) if (work / "probe.json").exists() else {}
    ticks = [d for _, d in probe.get("ticks", [])]

    cpu = (cpu1.user + cpu1.system - cpu0.user - cpu0.system) / wall * 100
    growth_h = (size1 - size0) / wall * 3600
    print(f"\nmachine: {os.cpu_count()} CPUs, load average {load0[0]:.2f} before, {statistics.mean(loads):.2f} "
          f"mean during the run (other work shares it)")
    print(f"samples: {generated:,} collected, {sent:,} sent, {stored:,} stored, {generated - stored:,} lost; "
          f"{len(records):,} batches ({per_batch:.1f} s of samples each on average), {errors} push retries")
    print(f"ingest lag (stored - sample time), {len(lags):,} node-seconds: p50 {pct(lags, .5):.3f} s  p99 "
          f"{pct(lags, .99):.3f} s  max {max(lags, default=float('nan')):.3f} s  (goal p99 < 2 s)")
    print(f"  of which in the pushers (sent - sample time): p50 {pct(waits, .5):.3f} s  p99 {pct(waits, .99):.3f} s; "
          f"in the controller (stored - sent): p50 {pct(serve_s, .5):.3f} s  p99 {pct(serve_s, .99):.3f} s")
    print(f"controller: CPU {cpu:.0f} % of one core (ingest + detection), RSS peak {max(rss) / 2**20:.0f} MiB; "
          f"tick p50 {pct(ticks, .5) * 1000:.0f} ms  p99 {pct(ticks, .99) * 1000:.0f} ms  ({len(ticks)} ticks); "
          f"wrote {(io1.write_bytes - io0.write_bytes) / wall / 1e6:.1f} MB/s to disk "
          f"({(io1.write_bytes - io0.write_bytes) / max(1, stored):.0f} bytes per stored sample)")
    if probe.get("wal"):
        w = probe["wal"]
        print(f"write-ahead log: {w['passive']:,} passive checkpoints, {w['restart']} restarts, {w['restart_busy']} "
              f"restarts put off (readers), {w['seconds']:.1f} s checkpointing in the ingest writer")
    print(f"pushers: CPU {sum(pusher_cpu.values()) / wall * 100:.0f} % of one core ({args.pushers} processes)")
    print(f"database: {size0 / 2**20:.1f} -> {size1 / 2**20:.1f} MiB in {wall:.0f} s = {growth_h / 2**30:.2f} GiB/h "
          f"; retention (raw {args.raw_hours:g} h, then 1 h rollups for 400 days) bounds it at about "
          f"{bound_bytes(growth_h, RetentionConfig(**retention)) / 2**30:.1f} GiB")
    print("\ndetection latency (incident opened - fault time):")
    for kind in FAULT_KINDS:
        lat, missed = [], 0
        for f in layout["faults"]:
            if f["kind"] != kind:
                continue
            at = t0 + f["at"]
            hits = [o for rule, node, job, o, _ in incidents if rule in RULES[kind] and o >= at and
                    (node == f["node"] or (kind == "hang" and job == f["job"]))]
            if hits:
                lat.append(min(hits) - at)
            else:
                missed += 1
        ref = FOUR_NODE.get(kind)
        print(f"  {kind:<6} {len(lat)}/{len(lat) + missed} detected  "
              + (f"median {statistics.median(lat):.1f} s  max {max(lat):.1f} s" if lat else "")
              + (f"  (4 nodes: {ref} s; goal <= {2 * ref:.1f} s)" if ref else ""))
    explained = {(f["node"], f["job"]) for f in layout["faults"]}
    other = Counter(rule for rule, node, job, _, _ in incidents
                    if not any(node == n or (job is not None and job == j) for n, j in explained))
    print(f"  incidents on no injected fault: {sum(other.values())}"
          + (f" ({', '.join(f'{r} {n}' for r, n in other.most_common())})" if other else ""))
    if args.timeline:
        timeline(args.timeline, t0, records, received, probe, load_trace)
    return 0


def timeline(slice_s: float, t0: float, records: list, received: dict, probe: dict, loads: list) -> None:
    """The run in slices of slice_s seconds (by sample time), beside what the controller was doing then: where
    the lag's tail comes from."""
    def slot(t: float) -> int:
        return int((t - t0) // slice_s)

    lag, ctl_part = {}, {}
    for node, seq, seconds, _, sent in records:
        got = received.get((node, seq))
        if got is None:
            continue
        for t in seconds:
            lag.setdefault(slot(t), []).append(got - t)
        ctl_part.setdefault(slot(sent), []).append(got - sent)
    per = lambda rows: {k: [r[1:] for r in rows if slot(r[0]) == k] for k in {slot(r[0]) for r in rows}}
    ticks, groups = per(probe.get("ticks", [])), per(probe.get("groups", []))
    gcs, files = per(probe.get("gc", [])), per(probe.get("files", []))
    retention = per(probe.get("retention", []))
    load = per(loads)
    print(f"\ntimeline ({slice_s:g} s slices by sample time; lag = stored - sample time; ctl = stored - sent; "
          f"groups: commits, mean rows, slowest write / commit; gc: gen-2 collections and all pauses; WAL at the "
          f"slice's end):")
    print(f"{'t s':>5} {'lag p50':>8} {'p99':>7} {'max':>7} {'ctl p99':>8} {'tick p50':>9} {'max':>7} {'groups':>6} "
          f"{'rows':>7} {'write':>6} {'commit':>7} {'gc2':>4} {'gc ms':>6} {'WAL MiB':>8} {'DB MiB':>7} "
          f"{'retention s':>11} {'load':>5}")
    phases = per(probe.get("phases", []))
    for k in sorted(lag):
        t, g, f = ticks.get(k, []), groups.get(k, []), files.get(k, [])
        print(f"{k * slice_s:>5.0f} {pct(lag[k], .5):>8.2f} {pct(lag[k], .99):>7.2f} {max(lag[k]):>7.2f} "
              f"{pct(ctl_part.get(k, []), .99):>8.2f} {pct([d for d, in t], .5):>9.2f} "
              f"{max([d for d, in t], default=float('nan')):>7.2f} {len(g):>6} "
              f"{statistics.mean([r for _, r, _, _ in g]) if g else 0:>7.0f} "
              f"{max([w for _, _, w, _ in g], default=float('nan')):>6.2f} "
              f"{max([c for _, _, _, c in g], default=float('nan')):>7.2f} "
              f"{sum(1 for gen, _ in gcs.get(k, []) if gen == 2):>4} {sum(d for _, d in gcs.get(k, [])) * 1000:>6.0f} "
              f"{(f[-1][1] / 2**20) if f else float('nan'):>8.1f} {(f[-1][0] / 2**20) if f else float('nan'):>7.0f} "
              f"{sum(d for d, in retention.get(k, [])):>11.1f} "
              f"{statistics.mean([v for v, in load.get(k, [])]) if load.get(k) else float('nan'):>5.1f}")
    print("\nthe tick's parts, seconds summed over each slice: the watchdog's (its rows read, its jobs judged; the "
          "mean and the largest per tick), then the four largest:")
    for k in sorted(phases):
        total: dict[str, float] = {}
        for (spent,) in phases[k]:
            for name, v in spent.items():
                total[name] = total.get(name, 0.0) + v
        watch = [spent.get("_watch", 0.0) for (spent,) in phases[k]]
        top = sorted(total.items(), key=lambda kv: -kv[1])[:4]
        print(f"{k * slice_s:>5.0f}  _update_kpi_window {total.get('_update_kpi_window', 0.0):.2f}  _watch "
              f"{total.get('_watch', 0.0):.2f} ({statistics.mean(watch) * 1000:.0f} / {max(watch) * 1000:.0f} ms)  |  "
              + "  ".join(f"{n} {v:.1f}" for n, v in top))


if __name__ == "__main__":
    raise SystemExit(main())
