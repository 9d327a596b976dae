"""The real pipeline on the local cluster: one sidecar per emulated node pushing to `sigma controller run`.

Each Pipeline gets a fresh controller database and fresh sidecar stores, so nothing from an earlier test (or bench
round) reaches it. Used by tests/integration/test_controller*.py and bench/recovery.py.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import yaml
from tests.conftest import wait_for

REPO = Path(__file__).resolve().parents[2]
SIGMA = str(Path(sys.executable).parent / "sigma")
KPI_JOB = Path(__file__).resolve().parent / "kpi_job.py"
XID79 = ("{ts} {node} kernel: [ 4000.000000] NVRM: Xid (PCI:0000:3b:00): 79, pid='<unknown>', name=<unknown>, "
         "GPU has fallen off the bus.\n")
# The comprehensive suite minus its minutes-long performance checks (GEMM, collectives, train step).
QUICK_VALIDATION = ["--check", "kernel_log", "--check", "accelerators", "--check", "disk", "--check", "free_memory",
                    "--check", "mounts"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]




class Pipeline:
    def __init__(self, cluster, workdir: Path, *, controller: dict | None = None, remediation: dict | None = None,
                 rules: str | None = None, sidecar_sets: list[str] | None = None):
        self.cluster = cluster
        self.dir = Path(workdir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.db = self.dir / "controller.db"
        self.secret = self.dir / "ingest.secret"
        self.secret.write_text(secrets.token_hex(24))
        self.secret.chmod(0o600)
        self.env = {**os.environ, **cluster.env, "SIGMA_BIN": SIGMA}
        rem = {"max_failures": 2, "validation": {"script": str(REPO / "sbatch" / "validate-node.sbatch"),
                                                 "args": QUICK_VALIDATION, "timeout_s": 300,
                                                 "output_dir": str(self.dir)},
               "playbooks": [{"name": "reboot", "kind": "reboot", "timeout_s": 180,
                              "categories": ["gpu-reset", "gpu-repair", "kernel", "hang", "isolation"]},
                             {"name": "manual", "kind": "manual"}]}
        rem.update(remediation or {})
        (self.dir / "remediation.yaml").write_text(yaml.safe_dump(rem))
        cfg = {"db": str(self.db), "rules": rules or str(REPO / "configs" / "rules"),
               "remediation": str(self.dir / "remediation.yaml"), "listen": f"127.0.0.1:{self.port}",
               "ingest_secret_file": str(self.secret), "log_dir": str(self.dir / "log"), "poll_s": 1.0,
               "slurm_conf": str(cluster.conf), "snapshot_every_s": 5.0}
        for key, value in (controller or {}).items():
            if isinstance(value, dict):
                cfg.setdefault(key, {}).update(value)
            else:
                cfg[key] = value
        self.config = self.dir / "controller.yaml"
        self.config.write_text(yaml.safe_dump(cfg))
        self.sidecar_sets = sidecar_sets or ["collectors.host.interval_s=5", "collectors.nvml.enabled=false",
                                             "collectors.infiniband.enabled=false", "push.interval_s=0.5"]
        self.procs: dict[str, subprocess.Popen] = {}

    # ---------- processes ----------
    def start(self) -> "Pipeline":
        self._archive_old_health_results()
        self.start_controller()
        for node in self.cluster.node_names():
            self._spawn(f"sidecar-{node}", [SIGMA, "sidecar", "--node", node, "--controller",
                                            f"http://127.0.0.1:{self.port}/v1/ingest", "--secret-file",
                                            str(self.secret), "--set", f"store.path={self.dir}/sidecar-{node}.db",
                                            *sum((["--set", s] for s in self.sidecar_sets), []),
                                            "--log-level", "WARNING"])
        wait_for(lambda: self.pushed_nodes() == set(self.cluster.node_names()), timeout=60,
                 what="every sidecar pushing to the controller")
        return self

    def _archive_old_health_results(self) -> None:
        """Fresh sidecar stores would resend every earlier test's prolog/epilog results as new evidence."""
        for node in self.cluster.node_names():
            health = self.cluster.node_dir(node) / "health"
            if not health.is_dir():
                continue
            old = health / "old"
            old.mkdir(exist_ok=True)
            for f in health.glob("*-*.json"):
                if f.name[0].isdigit():
                    f.replace(old / f.name)

    def start_controller(self) -> None:
        self._spawn("controller", [SIGMA, "controller", "run", "--config", str(self.config)])
        wait_for(lambda: self._healthz(), timeout=30, what="controller listening")

    def kill_controller(self) -> None:
        """kill -9: no chance to finish anything."""
        proc = self.procs.pop("controller")
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)

    def stop(self) -> None:
        for name, proc in reversed(list(self.procs.items())):
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for name, proc in self.procs.items():
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=5)
        self.procs.clear()

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()

    def _spawn(self, name: str, argv: list[str]) -> None:
        log = open(self.dir / f"{name}.out", "ab")
        self.procs[name] = subprocess.Popen(argv, env=self.env, stdout=log, stderr=subprocess.STDOUT,
                                            stdin=subprocess.DEVNULL, start_new_session=True, cwd=str(self.dir))
        log.close()

    def _healthz(self) -> bool:
        import urllib.request

        proc = self.procs.get("controller")
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"controller exited {proc.returncode}: "
                                 f"{(self.dir / 'controller.out').read_text()[-2000:]}")
        try:
            return urllib.request.urlopen(f"http://127.0.0.1:{self.port}/healthz", timeout=2).status == 200
        except OSError:
            return False

    def metrics(self) -> str:
        import urllib.request

        return urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=10).read().decode()

    # ---------- database ----------
    def query(self, sql: str, args=()) -> list[dict]:
        from sigma.controller.db import open_db

        if not self.db.exists():
            return []
        conn = open_db(self.db, readonly=True)
        try:
            return [dict(r) for r in conn.execute(sql, args)]
        finally:
            conn.close()

    def pushed_nodes(self) -> set[str]:
        return {r["node"] for r in self.query("SELECT DISTINCT node FROM batches")}

    def incidents(self, **where) -> list[dict]:
        sql = "SELECT * FROM incidents" + ("" if not where else " WHERE " + " AND ".join(f"{k} = ?" for k in where))
        rows = self.query(sql + " ORDER BY id", tuple(where.values()))
        for r in rows:
            r["evidence"] = json.loads(r["evidence"])
        return rows

    def lifecycle(self, node: str) -> dict | None:
        rows = self.query("SELECT * FROM node_lifecycle WHERE node = ?", (node,))
        return rows[0] if rows else None

    def decisions(self) -> str:
        path = self.dir / "log" / "decisions.log"
        return path.read_text() if path.exists() else ""

    # ---------- faults and jobs ----------
    def inject_xid79(self, node: str) -> float:
        t = time.time()
        with self.cluster.kernel_log(node).open("a") as f:
            f.write(XID79.format(ts=time.strftime("%b %d %H:%M:%S"), node=node))
        return t

    def inject_line(self, node: str, line: str) -> float:
        t = time.time()
        with self.cluster.kernel_log(node).open("a") as f:
            f.write(line.rstrip("\n") + "\n")
        return t

    def submit_kpi_job(self, slurm, nodes: int = 3, step_time: float = 0.5) -> int:
        return slurm.submit(None, f"-N{nodes}", "--ntasks-per-node=1", "--requeue",
                            f"--output={self.dir}/kpi-%j.out",
                            f"--export=ALL,SIGMA_KPI_DIR={self.cluster.env['SIGMA_KPI_DIR']}",
                            wrap=f"srun {sys.executable} {KPI_JOB} {step_time}")

    def rank_pids(self, job_id: int, node: str) -> list[int]:
        """The job's rank processes on one emulated node (found through their SLURM environment)."""
        pids = []
        # other local clusters on this machine reuse job ids and node names: SLURM_CONF tells ours apart
        want = {f"SLURM_JOB_ID={job_id}".encode(), f"SLURMD_NODENAME={node}".encode(),
                f"SLURM_CONF={self.cluster.conf}".encode()}
        for proc in Path("/proc").iterdir():
            if not proc.name.isdigit():
                continue
            try:
                if str(KPI_JOB).encode() not in (proc / "cmdline").read_bytes():
                    continue
                env = set((proc / "environ").read_bytes().split(b"\0"))
            except OSError:
                continue
            if want <= env:
                pids.append(int(proc.name))
        return pids

    def steps_since(self, job_id: int, ts: float) -> int:
        return self.query("SELECT COUNT(*) AS n FROM kpis WHERE job_id = ? AND ts > ? AND step IS NOT NULL",
                          (job_id, ts))[0]["n"]
