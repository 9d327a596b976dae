"""Controller tick time while one node floods the controller with matching events.

One node emits `--rate` matching kernel-log events per second (Xid 63 lines, a record-only rule, each with its
own pid so no two lines are the same) for `--minutes` minutes: the controller database (real SQLite, the
controller's own tables, rows as ingest writes them) holds the whole window before the first timed tick. Then
`--ticks` real `Controller.tick()` calls run on a simulated clock, one second apart, each after another second of
the flood has been inserted; every tenth tick another node logs an Xid 79, which must be drained in that tick. Before them, the ticks right
after the controller starts (it reads the rule windows' older events a slice per tick) are timed too.

Side by side, on databases of the same shape:
- unloaded: the same controller and ticks without the flood;
- re-read (the previous controller's way): every tick loads the whole rule window of events and matches every
  row against every rule (`evaluate` over the window, today's matcher), only the event rules, timed for
  `--baseline-ticks` ticks.

Wall and process CPU time are both printed: on a shared machine the wall time includes waiting for a core.

SLURM's answers come from the in-memory SLURM of the unit tests (tests/unit/controller/fakes.py): the figures are
the controller's own work per tick; on a real cluster sinfo/squeue add a constant on top.

usage: python bench/tick.py [--rate 1000] [--minutes 10] [--ticks 60] [--baseline-ticks 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from sigma.controller.config import BreakerConfig, ControllerConfig, Playbook, RemediationConfig  # noqa: E402
from sigma.controller.config import ValidationConfig  # noqa: E402
from sigma.controller.db import open_db  # noqa: E402
from sigma.controller.act.decisionlog import DecisionLog  # noqa: E402
from sigma.controller.loop import Controller  # noqa: E402
from sigma.paths import configs_dir  # noqa: E402
from sigma.rules.loader import load_rules  # noqa: E402
from sigma.rules.matcher import evaluate  # noqa: E402
from tests.unit.controller.fakes import FakeSlurm  # noqa: E402

NODES = [f"node{i}" for i in range(1, 17)]
NOISY = "node1"
T0 = 1_800_000_000.0


def flood(conn, start: float, seconds: int, rate: int, first_pid: int) -> int:
    """`rate` events per second from the noisy node over [start, start + seconds)."""
    pid = first_pid
    for sec in range(seconds):
        rows = []
        for i in range(rate):
            rows.append((NOISY, start + sec + i / rate, "log", "xid", "warning",
                         f"NVRM: Xid (PCI:0000:3b:00): 63, pid={pid}, Row remapping event", json.dumps({"xid": 63})))
            pid += 1
        with conn:
            conn.executemany("INSERT INTO events (node, ts, source, kind, severity, message, fields)"
                             " VALUES (?,?,?,?,?,?,?)", rows)
    return pid


def xid79(conn, node: str, ts: float) -> None:
    with conn:
        conn.execute("INSERT INTO events (node, ts, source, kind, severity, message, fields) VALUES (?,?,?,?,?,?,?)",
                     (node, ts, "log", "xid", "error", "NVRM: Xid (PCI:0000:3b:00): 79, pid=1, GPU has fallen off"
                      " the bus.", json.dumps({"xid": 79})))


class Clock:
    def __init__(self, t: float):
        self.t = t

    def __call__(self) -> float:
        return self.t


def controller(workdir: Path, clock: Clock) -> tuple[Controller, FakeSlurm]:
    workdir.mkdir(parents=True, exist_ok=True)
    cfg = ControllerConfig(db=str(workdir / "controller.db"), log_dir=str(workdir / "log"),
                           breaker=BreakerConfig(max_nodes=16, max_fraction=1.0, wave_max_nodes=16,
                                                         wave_max_fraction=1.0))  # every fault drains
    script = workdir / "validate.sbatch"
    script.write_text("#!/bin/sh\nexit 0\n")
    rcfg = RemediationConfig(ack_kernel_log=False, validation=ValidationConfig(script=str(script)),
                             playbooks=[Playbook(name="manual", kind="manual")])
    slurm = FakeSlurm(nodes=NODES)
    ctl = Controller(cfg, conn=open_db(cfg.db), slurm=slurm, rules=load_rules(configs_dir() / "rules"),
                     remediation=rcfg, log=DecisionLog(cfg.log_dir), clock=clock, root=workdir)
    return ctl, slurm


def run_ticks(ctl: Controller, slurm: FakeSlurm, clock: Clock, ticks: int, rate: int, pid: int,
              until_read: bool = False) -> dict:
    """Time `ticks` ticks (until_read: at least, and until the rule windows are read); before each, one more second
    of the flood (rate 0: none); every tenth tick an Xid 79 on a quiet node, which must be drained by that tick."""
    times, cpu, caught, faults = [], [], 0, 0
    victims = iter(NODES[1:] if not until_read else ["node16", "node15", "node14", "node13", "node12"] * 100)
    i = 0
    while i < ticks or (until_read and not ctl.windows_read):
        if rate:
            pid = flood(ctl.conn, clock.t, 1, rate, pid)
        clock.t += 1.0
        victim = next(victims) if i % 10 == 9 or (until_read and i == 0) else None
        if victim:
            xid79(ctl.conn, victim, clock.t - 0.5)
            faults += 1
        t0, c0 = time.perf_counter(), time.process_time()
        ctl.tick()
        times.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
        if victim and slurm.node(victim).drained:
            caught += 1
        i += 1
    return {"times": times, "cpu": cpu, "caught": caught, "faults": faults, "pid": pid}


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(round(q * (len(values) - 1))))]


def summary(name: str, times: list[float], cpu: list[float]) -> str:
    ms, cms = [t * 1000 for t in times], [t * 1000 for t in cpu]
    return (f"{name:<46} n={len(ms):<3} wall p50 {statistics.median(ms):7.1f}  p99 {pct(ms, 0.99):7.1f}  "
            f"max {max(ms):7.1f} ms | CPU p50 {statistics.median(cms):7.1f}  p99 {pct(cms, 0.99):7.1f} ms")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rate", type=int, default=1000, help="matching events per second from the noisy node")
    ap.add_argument("--minutes", type=float, default=10.0, help="how long the flood has lasted before timing")
    ap.add_argument("--ticks", type=int, default=60, help="timed ticks (one simulated second apart)")
    ap.add_argument("--baseline-ticks", type=int, default=3, help="ticks timed for the re-read baseline")
    args = ap.parse_args()
    seconds = int(args.minutes * 60)

    with tempfile.TemporaryDirectory(prefix="sigma-bench-tick-") as tmp:
        clock = Clock(T0)
        ctl, slurm = controller(Path(tmp) / "loaded", clock)
        t = time.perf_counter()
        pid = flood(ctl.conn, T0 - seconds, seconds, args.rate, 0)
        fill_s = time.perf_counter() - t
        rows = ctl.conn.execute("SELECT COUNT(*) FROM events").fetchone()[0]
        print(f"flood: {NOISY} at {args.rate} matching events/s for {seconds} s = {rows} rows in the controller "
              f"database ({fill_s:.1f} s to insert); {len(NODES)} nodes, {len(ctl.rules)} rules")

        start = run_ticks(ctl, slurm, clock, 1, args.rate, pid, until_read=True)  # at start: windows read
        pid = start["pid"]
        loaded = run_ticks(ctl, slurm, clock, args.ticks, args.rate, pid)
        (noisy,) = [f for f in ctl.detect(clock.t, {n.name: n for n in slurm.nodes()}, []) if f.node == NOISY]

        clock2 = Clock(T0)
        quiet, quiet_slurm = controller(Path(tmp) / "unloaded", clock2)
        quiet.tick()
        unloaded = run_ticks(quiet, quiet_slurm, clock2, args.ticks, 0, 0)

        rules = ctl.active_rules
        window = max(r.window_s for r in rules if r.log or r.health)
        reread, reread_cpu = [], []
        for _ in range(args.baseline_ticks):
            t, c = time.perf_counter(), time.process_time()
            events = ctl.conn.execute("SELECT * FROM events WHERE ts >= ?", (clock.t - window,)).fetchall()
            evaluate(rules, now=clock.t, events=events)
            reread.append(time.perf_counter() - t)
            reread_cpu.append(time.process_time() - c)

    print()
    print(summary("tick, unloaded", unloaded["times"], unloaded["cpu"]))
    print(summary(f"tick, {NOISY} flooding ({args.rate}/s, window full)", loaded["times"], loaded["cpu"]))
    print(summary("event rules only, re-reading the window", reread, reread_cpu))
    print(summary(f"ticks at start, reading the windows ({len(start['times'])})", start["times"], start["cpu"]))
    print()
    p99_loaded, p99_quiet = pct(loaded["times"], 0.99), pct(unloaded["times"], 0.99)
    print(f"wall p99 flooding / unloaded: {p99_loaded / p99_quiet:.1f}x; re-reading the window (the previous "
          f"controller's way, same matcher) / flooding tick, median CPU: "
          f"{statistics.median(reread_cpu) / statistics.median(loaded['cpu']):.0f}x")
    print(f"Xid 79 on a quiet node drained in the same tick: {loaded['caught']}/{loaded['faults']} while flooding, "
          f"{unloaded['caught']}/{unloaded['faults']} unloaded, {start['caught']}/{start['faults']} while the "
          f"windows were still being read at start")
    print(f"{NOISY}: one finding, count {noisy.evidence['count']}, {len(noisy.evidence['events'])} evidence rows"
          f" (capped: {bool(noisy.evidence.get('evidence_capped'))})")
    print(f"goal: p99 tick < 1 s while flooding -> {'met' if p99_loaded < 1.0 else 'NOT met'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
