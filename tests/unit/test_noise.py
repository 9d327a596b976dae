"""Throughput noise: the trainer's per-step counters measured for real, stability figures, attribution over a real
controller database (rank counters and node telemetry), the watchdog's jitter finding, `sigma noise`, and the
sidecar's procs collector."""

from __future__ import annotations

import gc
import json
import mmap
import os
import subprocess
import sys
import time

import pytest

from sigma.controller.config import WatchdogConfig
from sigma.controller.db import open_db
from sigma.controller.detect.noise import NoiseConfig, attribute
from sigma.controller.detect.watchdog import JobInfo, check_job
from sigma.controller.report.noise import NoJobData, job_noise, stability_table
from sigma.train.kpi import throughput_stability
from sigma.train.noise import GcPressure, StepNoise

HOG = "import os, sys\nos.sched_setaffinity(0, {int(sys.argv[1])})\nwhile True: pass\n"


@pytest.fixture
def hog_on_my_cpu():
    """A busy process pinned to the CPU this test is pinned to (restored afterwards)."""
    before = os.sched_getaffinity(0)
    cpu = min(before)
    os.sched_setaffinity(0, {cpu})
    proc = subprocess.Popen([sys.executable, "-c", HOG, str(cpu)])
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait()
        os.sched_setaffinity(0, before)


def evicted_mapping(path, size=16 << 20):
    """A file on disk whose pages are not in the page cache, mapped for random access (as code is read; no
    readahead): touching each page takes a major fault."""
    if not path.exists():
        with open(path, "wb") as f:
            f.write(os.urandom(size))
            f.flush()
            os.fsync(f.fileno())
    fd = os.open(path, os.O_RDONLY)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    m = mmap.mmap(fd, 0, prot=mmap.PROT_READ)
    os.close(fd)
    m.madvise(mmap.MADV_RANDOM)
    return m


def touch(m) -> int:
    return sum(m[i] for i in range(0, len(m), 4096))


# ---------------------------------------------------------------- the trainer's counters, measured


def test_step_noise_measures_gc_time_of_a_real_collection(tmp_path):
    noise = StepNoise()
    pressure = GcPressure(tmp_path / "inject-gc")
    try:
        noise.begin()
        assert pressure.step() is False and noise.sample()["gc_s"] < 0.05
        (tmp_path / "inject-gc").write_text("40000\n")
        for _ in range(3):
            assert pressure.step()
        gc.collect()
        sample = noise.sample()
        assert sample["gc_s"] > 0.001 and {"majflt", "cpu_wait_s"} <= set(sample)
        (tmp_path / "inject-gc").unlink()
        assert pressure.step() is False and pressure.live == []
    finally:
        noise.close()


def test_step_noise_counts_major_faults_of_an_evicted_mapping(tmp_path):
    noise = StepNoise()
    try:
        m = evicted_mapping(tmp_path / "data.bin")
        noise.begin()
        touch(m)
        assert noise.sample()["majflt"] >= 8
        noise.begin()
        touch(m)  # now cached: minor faults at most
        assert noise.sample()["majflt"] < 8
        m.close()
    finally:
        noise.close()


def test_step_noise_measures_cpu_wait_behind_another_process(hog_on_my_cpu):
    noise = StepNoise()
    try:
        time.sleep(0.2)  # the hog is running
        noise.begin()
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < 0.5:
            pass
        assert noise.sample()["cpu_wait_s"] > 0.1  # sharing one CPU with a busy process: about half the time
    finally:
        noise.close()


# ---------------------------------------------------------------- stability


def test_throughput_stability_is_table_11():
    s = throughput_stability([100.0, 80.0, 100.0, 60.0, None, 0.0])
    assert s["steps"] == 4 and s["peak"] == 100.0 and s["min_over_peak"] == 0.6
    assert s["mean_over_peak"] == pytest.approx(0.85) and s["std"] == pytest.approx(19.1485, rel=1e-4)
    assert s["cv"] == pytest.approx(s["std"] / 85.0)
    assert throughput_stability([5.0]) is None


# ---------------------------------------------------------------- attribution over a controller database


def run_rank(steps, slow_at, inject, *, place=None) -> list[dict]:
    """KPI rows of one rank: each step computes for 3 ms of CPU time (its steady work) and runs `inject` on the
    steps in slow_at (`place(slow)` first, on every step); the noise counters come from the real StepNoise."""
    noise = StepNoise()
    rows = []
    try:
        for step in range(1, steps + 1):
            if place:
                place(step in slow_at)
            t0 = time.perf_counter()
            noise.begin()
            cpu0 = time.thread_time()
            while time.thread_time() - cpu0 < 0.003:  # the step's steady work: 3 ms of CPU
                pass
            if step in slow_at:
                inject()
            dt = time.perf_counter() - t0
            rows.append({"ts": time.time(), "step": step, "step_time_s": dt, "tokens_per_s": 1024 / dt,
                         "payload": json.dumps(noise.sample())})
    finally:
        noise.close()
    return rows


def store(conn, job_id, rank, node, rows):
    with conn:
        conn.executemany("INSERT INTO kpis (node, ts, job_id, rank, step, step_time_s, tokens_per_s, payload) "
                         "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                         [(node, r["ts"], job_id, rank, r["step"], r["step_time_s"], r["tokens_per_s"],
                           r.get("payload", "{}")) for r in rows])


def test_each_rank_is_named_for_the_cause_its_own_counters_show(tmp_path):
    """Three ranks, each slowed on a few steps by a real cause: a full collection of many live objects, a mapped
    file evicted from the page cache, a busy process on its CPU. Stored in a controller database, attributed."""
    conn = open_db(tmp_path / "controller.db")
    slow = {6, 10, 14, 18, 22}
    live = [{"i": i} for i in range(300_000)]  # long-lived objects every full collection walks

    def gc_pause():
        gc.collect()

    store(conn, 7, 0, "node1", run_rank(26, slow, gc_pause))
    path = tmp_path / "shard.bin"
    mapped = evicted_mapping(path, 32 << 20)

    def reclaimed():
        evicted_mapping(path, 32 << 20).close()  # the kernel took the pages back
        touch(mapped)

    store(conn, 7, 1, "node1", run_rank(26, slow, reclaimed))
    before = os.sched_getaffinity(0)
    hog_cpu, *others = sorted(before)
    hogs = [subprocess.Popen([sys.executable, "-c", HOG, str(hog_cpu)]) for _ in range(3)]

    def place(slow_step):  # the slow steps run beside busy processes on their CPU, the others away from them
        os.sched_setaffinity(0, {hog_cpu} if slow_step or not others else set(others))

    try:
        store(conn, 7, 2, "node2", run_rank(26, slow, lambda: None, place=place))
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
        os.sched_setaffinity(0, before)
    corpus = tmp_path / "corpus.bin"
    evicted_mapping(corpus, 96 << 20).close()

    buf = mmap.mmap(-1, 1 << 20)  # page-aligned, as O_DIRECT wants

    def read_from_disk():  # a data loader reading a shard straight from the disk: blocked, no page faults
        fd = os.open(corpus, os.O_RDONLY | os.O_DIRECT)
        offset = 0
        while (n := os.preadv(fd, [buf], offset)) > 0:
            offset += n
        os.close(fd)

    store(conn, 7, 3, "node2", run_rank(26, slow, read_from_disk))
    noise = job_noise(conn, 7)
    causes = {r.rank: r.cause for r in noise.ranks}
    assert causes == {0: "gc", 1: "page-cache", 2: "cpu-contention", 3: "io-stall"}, \
        [(r.rank, r.explained, r.excess_s) for r in noise.ranks]
    assert all(r.slow_steps >= 3 for r in noise.ranks), [(r.rank, r.slow_steps) for r in noise.ranks]
    assert noise.causes() == {"gc": [0], "page-cache": [1], "cpu-contention": [2], "io-stall": [3]}
    assert noise.stability["min_over_peak"] < 0.5  # the job's pace: the slowest rank at each step
    mapped.close()
    assert live


def steady_rows(n=30, dt=0.1, t0=1_000_000.0, slow=(), slow_dt=0.4):
    rows, t = [], t0
    for step in range(1, n + 1):
        d = slow_dt if step in slow else dt
        t += d
        rows.append({"ts": t, "step": step, "step_time_s": d, "tokens_per_s": 1000 / d, "payload": "{}"})
    return rows


def add_counter(conn, node, metric, t0, t1, rate_at, labels="{}", every=0.05):
    """A cumulative counter sampled every `every` s whose rate at time t is rate_at(t)."""
    rows, value, t = [], 0.0, t0
    while t <= t1:
        rows.append((node, t, metric, value, labels))
        value += rate_at(t) * every
        t += every
    with conn:
        conn.executemany("INSERT INTO samples (node, ts, metric, value, labels) VALUES (?, ?, ?, ?, ?)", rows)


def test_node_telemetry_names_the_cause_for_a_trainer_without_counters(tmp_path):
    """A trainer that reports only step times: the node's PSI and throttle signals over the rank's slow steps
    against its fast ones decide; a signal as high on fast steps as on slow ones decides nothing."""
    conn = open_db(tmp_path / "controller.db")
    slow = {10, 17, 24}
    rows = steady_rows(slow=slow)
    spans = [(r["ts"] - r["step_time_s"], r["ts"]) for r in rows if r["step"] in slow]
    during = lambda t: any(a <= t <= b for a, b in spans)
    t0, t1 = rows[0]["ts"] - 1, rows[-1]["ts"] + 1
    for rank, node in enumerate(("node1", "node2", "node3", "node4")):
        store(conn, 9, rank, node, rows)
    # node1: I/O stalls during its slow steps; CPU pressure high all the time (a busy shared host) decides nothing
    add_counter(conn, "node1", "host.pressure.io.some.total_us", t0, t1, lambda t: 600_000 if during(t) else 5_000)
    add_counter(conn, "node1", "host.pressure.cpu.some.total_us", t0, t1, lambda t: 900_000)
    # node2: memory stalls with major faults: page-cache reclaim
    add_counter(conn, "node2", "host.pressure.memory.some.total_us", t0, t1, lambda t: 300_000 if during(t) else 0)
    add_counter(conn, "node2", "host.vmstat.pgmajfault", t0, t1, lambda t: 5_000 if during(t) else 10)
    # node3: GPU clocks throttled for heat during the slow steps, plus a CPU-hungry process the evidence names
    with conn:
        conn.executemany("INSERT INTO samples (node, ts, metric, value, labels) VALUES (?, ?, ?, ?, ?)",
                         [("node3", r["ts"], "gpu.throttle_reasons", 0x40 if r["step"] in slow else 0x1,
                           '{"gpu":"0"}') for r in rows]
                         + [("node3", t0 + 5, "host.proc.cpu_pct", 97.0, '{"pid":"4242","comm":"miner"}')])
    # node4: nothing rose
    # node5 and node6: a fault storm on the slow steps (the rank's counters); node5's disk is busy all along
    faulting = [{**r, "payload": json.dumps({"majflt": 900 if r["step"] in slow else 0})} for r in rows]
    store(conn, 9, 4, "node5", faulting)
    store(conn, 9, 5, "node6", faulting)
    add_counter(conn, "node5", "host.pressure.io.some.total_us", t0, t1, lambda t: 700_000)
    add_counter(conn, "node6", "host.pressure.io.some.total_us", t0, t1, lambda t: 600_000 if during(t) else 10_000)
    noise = job_noise(conn, 9)
    causes = {r.node: r.cause for r in noise.ranks}
    assert causes == {"node1": "io-stall", "node2": "page-cache", "node3": "throttling", "node4": "unexplained",
                      "node5": "io-stall", "node6": "page-cache"}
    node3 = next(r for r in noise.ranks if r.node == "node3")
    assert any("miner[4242] 97% CPU" in e for e in node3.evidence)


def test_steady_ranks_and_bad_input(tmp_path):
    conn = open_db(tmp_path / "controller.db")
    store(conn, 3, 0, "node1", steady_rows())
    noise = job_noise(conn, 3)
    assert [r.cause for r in noise.ranks] == ["steady"] and noise.stability["cv"] == 0.0
    with pytest.raises(NoJobData, match="no step KPIs of job 4 in the controller database"):
        job_noise(conn, 4)
    with pytest.raises(NoJobData, match="in that window"):
        job_noise(conn, 3, since=2_000_000.0)
    # a torn payload is not a crash: the rank is judged without counters
    rows = steady_rows(slow={5, 9, 13})
    for r in rows:
        r["payload"] = "{not json"
    assert attribute(5, [{**r, "node": "n", "rank": 0} for r in rows]).ranks[0].cause == "unexplained"
    assert attribute(5, [], cfg=NoiseConfig()).ranks == []


def test_report_and_cli_show_stability_and_causes(tmp_path, capsys):
    from sigma.cli import main

    conn = open_db(tmp_path / "controller.db")
    rows = steady_rows(slow={5, 11, 17})
    for r in rows:
        r["payload"] = json.dumps({"gc_s": 0.3 if r["step"] in {5, 11, 17} else 0.0, "majflt": 0, "cpu_wait_s": 0.0})
    store(conn, 11, 0, "node1", rows)
    table = stability_table(conn, 0, 2_000_000)
    assert [(t["job_id"], t["steps"], t["min_over_peak"]) for t in table] == [(11, 30, 0.25)]
    assert main(["noise", "--db", str(tmp_path / "controller.db"), "--config", "configs/controller.yaml",
                 "--job", "11"]) == 0
    out = capsys.readouterr().out
    assert "rank 0 on node1: gc" in out and "min/peak 0.250" in out and "gc_manual: true" in out
    assert main(["noise", "--db", str(tmp_path / "controller.db"), "--config", "configs/controller.yaml",
                 "--job", "11", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["causes"] == {"gc": [0]}
    assert main(["noise", "--db", str(tmp_path / "controller.db"), "--config", "configs/controller.yaml",
                 "--job", "12"]) == 2
    assert "no step KPIs of job 12" in capsys.readouterr().err
    with conn:  # the watchdog's jitter incident for the job: `sigma explain` carries the attribution
        conn.execute("INSERT INTO incidents (key, opened_at, updated_at, rule_id, source, scope, job_id, severity, "
                     "action, category, summary, fault_ts, status) VALUES ('k', ?, ?, 'watchdog-throughput-jitter', "
                     "'watchdog', 'job', 11, 'warning', 'notify', 'noise', 'step throughput jitters', ?, 'notified')",
                     (rows[-1]["ts"], rows[-1]["ts"], rows[0]["ts"]))
    assert main(["explain", "1", "--db", str(tmp_path / "controller.db"), "--config", "configs/controller.yaml"]) == 0
    out = capsys.readouterr().out
    assert "noise attribution:" in out and "rank 0 on node1: gc" in out
    db = ["--db", str(tmp_path / "controller.db"), "--config", "configs/controller.yaml", "--since", "1.0"]
    assert main(["report", *db]) == 0
    assert "throughput stability per job" in capsys.readouterr().out
    assert main(["report", *db, "--json"]) == 0
    assert [j["job_id"] for j in json.loads(capsys.readouterr().out)["stability"]] == [11]
    assert main(["report", *db, "--html", str(tmp_path / "r.html")]) == 0
    assert "Throughput stability per job" in (tmp_path / "r.html").read_text()


# ---------------------------------------------------------------- the watchdog


def test_watchdog_flags_jitter_without_a_drop():
    job = JobInfo(1, ("node1",), 999_000.0)
    rows = [{**r, "node": "node1", "job_id": 1, "rank": 0} for r in steady_rows(slow=set(range(3, 31, 3)))]
    found = check_job(job, rows, rows[-1]["ts"], WatchdogConfig(recent_window_s=1.0), ever_reported=True)
    assert [f.rule_id for f in found] == ["watchdog-throughput-jitter"] and found[0].category == "noise"
    assert found[0].evidence["stability"]["cv"] > 0.25
    steady = [{**r, "node": "node1", "job_id": 1, "rank": 0} for r in steady_rows()]
    assert check_job(job, steady, steady[-1]["ts"], WatchdogConfig(), ever_reported=True) == []
    assert check_job(job, rows, rows[-1]["ts"], WatchdogConfig(jitter_cv=0), ever_reported=True) == []


# ---------------------------------------------------------------- the sidecar's procs collector


def test_procs_collector_lists_busy_processes_outside_jobs(tmp_path):
    from sigma.telemetry.base import Context, Output
    from sigma.telemetry.collectors.procs import ProcsCollector

    busy = "import time\nt = time.time()\nwhile time.time() - t < 30: pass\n"
    outside = subprocess.Popen([sys.executable, "-c", busy])
    inside = subprocess.Popen([sys.executable, "-c", busy], env={**os.environ, "SLURM_JOB_ID": "77"})
    try:
        ctx = Context(node="node1", node_dir=str(tmp_path), host_root="/")
        c = ProcsCollector("procs", ProcsCollector.Params(top=50, min_cpu_pct=1.0), ctx)
        c.collect(Output())
        time.sleep(1.0)
        out = Output()
        c.collect(out)
        pids = {json.loads(s[3])["pid"]: s[2] for s in out.samples if s[1] == "host.proc.cpu_pct"}
        assert str(outside.pid) in pids and str(inside.pid) not in pids and str(os.getpid()) not in pids
    finally:
        for p in (outside, inside):
            p.kill()
            p.wait()
