"""`sigma demo`: the whole loop on the local SLURM cluster, using only commands a user could type.

Platform up (SLURM + controller + one sidecar per node) -> MoE training on 2 nodes through `sigma train` ->
an Xid 79 ("GPU fallen off the bus") written into one of the job's nodes' kernel log -> detection, drain,
requeue, resume from the checkpoint on healthy nodes, and the node's reboot -> validation -> return to service,
shown live, then the timeline and `sigma report`.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
from pathlib import Path


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("demo", help="run the main job end to end on a local SLURM cluster",
                       description=__doc__.splitlines()[0])
    p.add_argument("--state-dir", type=Path, default=None, help="cluster state directory")
    p.add_argument("--xid", type=int, default=79, help="the Xid code injected (default 79)")
    p.add_argument("--timeout", type=float, default=240.0, help="give up waiting for recovery after this long")
    p.add_argument("--down", action="store_true", help="stop the platform and the cluster at the end")
    p.set_defaults(func=run_demo)


def _sigma(*args: str, env: dict, check: bool = True) -> str:
    proc = subprocess.run([sys.executable, "-m", "sigma.cli", *args], env=env, capture_output=True, text=True)
    if check and proc.returncode != 0:
        from sigma.cli import CommandError

        raise CommandError(f"`sigma {' '.join(args)}` failed: {proc.stderr.strip() or proc.stdout.strip()}")
    return proc.stdout


def run_demo(args) -> int:
    from rich.live import Live
    from rich.table import Table

    from sigma.chaos.inject import Chaos
    from sigma.chaos.timeline import observe
    from sigma.cli import CommandError
    from sigma.cli import console as wide_console
    from sigma.controller.db import open_db
    from sigma.slurm.client import Slurm
    from sigma.slurm.cluster import LocalCluster
    from sigma.stack import Stack

    console = wide_console()
    start = time.monotonic()

    def say(text: str) -> None:
        console.print(f"[dim][{time.monotonic() - start:6.1f}s][/dim] {text}")

    cluster = LocalCluster(args.state_dir)
    stack = Stack(cluster)
    say("bringing up the platform: SLURM (munge, MariaDB, slurmdbd, slurmctld, 4 slurmd), the controller, "
        "one telemetry sidecar per node")
    stack.up()
    env = {**os.environ, **cluster.env}
    slurm = Slurm(cluster.conf)
    say(f"platform up: controller {stack.controller_url}, decisions in {cluster.state_dir / 'log' / 'decisions.log'}")

    runs = cluster.state_dir / "runs"  # each demo trains a new run: demo, demo-2, ...
    out = _sigma("train", "--config", "configs/train/debug.yaml", "--nodes", "2", "--no-wait", "name=demo",
                 "parallel.ep=2", "steps=100000", "checkpoint.every=20", f"checkpoint.dir={runs}/{{name}}/checkpoints",
                 f"launch.folder={runs}/{{name}}/submitit", "fault.step_delay_s=0.05", "kpi.progress_every=0", env=env)
    match = re.search(r"run (\S+) as slurm job (\d+)", out)
    if not match:
        raise CommandError(f"could not find the job id in `sigma train` output: {out!r}")
    run_name, job_id = match.group(1), int(match.group(2))
    run_dir = runs / run_name
    say(f"sigma train: MoE `debug` preset on 2 nodes x 1 rank, expert parallel 2, checkpoint every 20 steps: "
        f"SLURM job {job_id}")

    db = open_db(stack.db, readonly=True)
    progress = _wait_for_progress(db, slurm, job_id, min_step=30, timeout=args.timeout, say=say,
                                  logs=run_dir / "submitit")
    job = slurm.job(job_id)
    victim = job.nodes[-1]
    say(f"training on {', '.join(job.nodes)}: step {progress[0]}, loss {progress[1]:.3f}")

    injection = Chaos(cluster).inject("log", victim, xid=args.xid)
    say(f"[bold red]fault[/bold red]: `sigma chaos log --xid {args.xid} --node {victim}` wrote to "
        f"{cluster.kernel_log(victim)}:\n    {injection.params['line'].strip()}")

    def render(t) -> Table:
        table = Table(title=f"recovery from Xid {args.xid} on {victim} (job {job_id})", title_justify="left")
        table.add_column("milestone")
        table.add_column("after fault", justify="right")
        table.add_column("detail")
        for name, dt, detail in t.rows():
            table.add_row(name, "…" if dt is None else f"{dt:6.1f} s", detail)
        return table

    deadline = time.monotonic() + args.timeout
    timeline = observe(db, victim, job_id, injection.ts)
    with Live(render(timeline), console=console, refresh_per_second=4) as live:
        while time.monotonic() < deadline:
            timeline = observe(db, victim, job_id, injection.ts)
            live.update(render(timeline))
            if timeline.resumed_ts and timeline.node_back_ts:
                break
            time.sleep(0.5)
    job = slurm.job(job_id)
    complete = bool(timeline.resumed_ts and timeline.node_back_ts)
    say(f"job {job_id} now {job.state if job else 'gone'} on {', '.join(job.nodes) if job else '-'} after "
        f"{job.restarts if job else '?'} requeue(s); {victim} is "
        f"{'back in service' if complete else 'not back yet'}")
    console.print(_sigma("report", "--config", str(stack.controller_config), env=env, check=False))
    slurm.cancel(job_id)
    say(f"cancelled the demo training job {job_id}")
    if args.down:
        stack.down()
        cluster.down()
        say("platform and cluster stopped")
    else:
        hint = f" --state-dir {args.state_dir}" if args.state_dir else ""
        env_hint = (f" (after `export SIGMA_CONTROLLER_CONFIG={stack.controller_config}`)"
                    if args.state_dir else "")
        say(f"the platform keeps running: try `sigma nodes`, `sigma incidents`, `sigma explain "
            f"{timeline.incident_id}`, `sigma report --html report.html`{env_hint}; stop it with "
            f"`sigma stack down --with-cluster{hint}`")
    if not complete:
        raise CommandError(f"recovery did not complete within {args.timeout:.0f}s; see "
                           f"{cluster.state_dir / 'log' / 'decisions.log'}")
    return 0


def _wait_for_progress(db, slurm, job_id: int, min_step: int, timeout: float, say, logs: Path) -> tuple[int, float]:
    from sigma.cli import CommandError

    deadline = time.monotonic() + timeout
    announced = False
    while time.monotonic() < deadline:
        job = slurm.job(job_id)
        if job is None or not job.active:
            raise CommandError(f"training job {job_id} ended ({job.state if job else 'gone'}) before making "
                               f"progress; see {logs}/{job_id}_0_log.err")
        row = db.execute("SELECT step, loss FROM kpis WHERE job_id = ? AND step IS NOT NULL ORDER BY ts DESC LIMIT 1",
                         (job_id,)).fetchone()
        if row and not announced:
            say(f"first KPIs reached the controller through the sidecars: step {row[0]}, loss {row[1]:.3f}")
            announced = True
        if row and row[0] >= min_step:
            return row[0], row[1]
        time.sleep(0.5)
    raise CommandError(f"job {job_id} made no progress to step {min_step} within {timeout:.0f}s")
