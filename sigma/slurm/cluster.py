"""A real SLURM cluster on one machine: munge, MariaDB + slurmdbd, slurmctld and N `slurmd -N nodeK`.

Everything lives under one state directory (configs, pid files, logs, spool, database, per-node kernel logs).
`down` stops only what `up` started, found through pid files, and leaves the directory for inspection.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from sigma.paths import PACKAGE_DIR, configs_dir, default_cluster_dir, default_port_base, project_root
from sigma.slurm.command import SlurmError, run
from sigma.slurm.formats import parse_release, release_text

DEBIAN_PACKAGES = "slurm-wlm slurm-client munge libslurm-dev slurmdbd mariadb-server"
REQUIRED_PROGRAMS = {
    "munged": "munge", "munge": "munge", "unmunge": "munge",
    "mariadbd": "mariadb-server", "mariadb-install-db": "mariadb-server", "mariadb": "mariadb-server",
    "slurmdbd": "slurmdbd", "slurmctld": "slurmctld", "slurmd": "slurmd",
    "sinfo": "slurm-client", "sacctmgr": "slurm-client", "scontrol": "slurm-client",
}
HOSTS_MARK = "# sigma local cluster"
SBIN_PATH = "/usr/local/sbin:/usr/sbin:/sbin"


class ClusterError(RuntimeError):
    """The local cluster cannot be brought up, with a message that says what to do."""


@dataclass
class ClusterSpec:
    """What `up` was asked for; saved as cluster.json so later commands reuse the same ports and secrets."""

    nodes: int = 4  # emulated compute nodes node1..nodeN
    # slurmctld=base, slurmdbd=base+1, mariadb=base+2, controller=base+5, slurmd k=base+10+k; derived from the
    # checkout's path so two checkouts on one machine do not collide
    port_base: int = field(default_factory=default_port_base)
    name: str = "sigma"  # ClusterName in slurm.conf and accounting
    cpus: int = 2  # CPUs each emulated node advertises
    memory_mb: int = 4096  # RealMemory each emulated node advertises
    partition: str = "debug"
    prolog: str = ""  # absolute path of the Prolog script, empty for none
    epilog: str = ""  # absolute path of the Epilog script, empty for none
    mysql_password: str = field(default_factory=lambda: secrets.token_hex(12))
    started_munged: bool = False  # only stop munged in `down` if `up` started it


class LocalCluster:
    def __init__(self, state_dir: Path | str | None = None):
        self.state_dir = Path(state_dir or default_cluster_dir()).expanduser().resolve()
        self.spec_file = self.state_dir / "cluster.json"

    # ---------- layout ----------
    @property
    def conf(self) -> Path:
        return self.state_dir / "etc" / "slurm.conf"

    @property
    def env(self) -> dict[str, str]:
        # Emulated nodes share one filesystem: KPI files carry the node name (see the KPI protocol).
        return {"SLURM_CONF": str(self.conf), "SIGMA_CLUSTER_DIR": str(self.state_dir),
                "SIGMA_KPI_DIR": str(self.state_dir / "kpi")}

    def load_spec(self) -> ClusterSpec | None:
        if not self.spec_file.exists():
            return None
        return ClusterSpec(**json.loads(self.spec_file.read_text()))

    def _save_spec(self, spec: ClusterSpec) -> None:
        self.spec_file.write_text(json.dumps(asdict(spec), indent=2) + "\n")
        self.spec_file.chmod(0o600)

    def node_names(self, spec: ClusterSpec | None = None) -> list[str]:
        spec = spec or self.load_spec() or ClusterSpec()
        return [f"node{k}" for k in range(1, spec.nodes + 1)]

    def node_dir(self, node: str) -> Path:
        """Per-node files the emulation keeps apart: kernel log, sidecar database, health results."""
        return self.state_dir / "nodes" / node

    def kernel_log(self, node: str) -> Path:
        return self.node_dir(node) / "kern.log"

    def service_log(self, node: str) -> Path:
        """The emulated node's services' syslog (telemetry's {service_log}); the kernel's lines are in kern.log."""
        return self.node_dir(node) / "syslog"

    def _pid_file(self, daemon: str) -> Path:
        return self.state_dir / "run" / f"{daemon}.pid"

    def _daemons(self, spec: ClusterSpec) -> list[str]:
        return ["mariadb", "slurmdbd", "slurmctld"] + [f"slurmd-{n}" for n in self.node_names(spec)]

    # ---------- public API ----------
    def up(self, spec: ClusterSpec | None = None, timeout: float = 90.0) -> tuple[ClusterSpec, bool]:
        """Start what is not running and wait for idle nodes; return (spec, whether it was already up)."""
        check_packages()
        saved = self.load_spec()
        spec = _merge_spec(saved, spec)
        if saved and self.running(spec) and self._all_nodes_responding(spec):
            return spec, True
        for sub in ("etc", "run", "log", "spool/ctld", "mysql", "bin"):
            (self.state_dir / sub).mkdir(parents=True, exist_ok=True)
        for node in self.node_names(spec):
            (self.state_dir / "spool" / node).mkdir(parents=True, exist_ok=True)
            self.node_dir(node).mkdir(parents=True, exist_ok=True)
            self.kernel_log(node).touch(exist_ok=True)
            self.service_log(node).touch(exist_ok=True)
        self._check_ports_free(spec)
        spec.started_munged = self._ensure_munge() or spec.started_munged
        self._save_spec(spec)
        self._write_configs(spec)
        ensure_hosts_entries(self.node_names(spec))
        self._start_mariadb(spec)
        self._start_slurmdbd(spec)
        self._register_accounting(spec)
        self._start_daemon("slurmctld", ["slurmctld"], spec.port_base)
        started = time.time()
        restarted = False
        for node in self.node_names(spec):
            if not self._alive(f"slurmd-{node}"):
                self._start_daemon(f"slurmd-{node}", ["slurmd", "-N", node], None)
                restarted = True
        self.wait_idle(spec, timeout=timeout, registered_since=int(started) if restarted else 0)
        return spec, False

    def down(self, keep_munge: bool = False) -> list[str]:
        """Stop what `up` started (by pid file, newest first); return the names stopped.

        munged is shared by every SLURM client on the machine: it is stopped only if `up` started it, no other
        SLURM daemon still runs here, and not with keep_munge.
        """
        spec = self.load_spec()
        if spec is None:
            return []
        stopped = []
        self._stop_job_steps()
        for daemon in reversed(self._daemons(spec)):
            if self._stop(daemon):
                stopped.append(daemon)
        keep_munge = keep_munge or _other_slurm_daemons()
        if spec.started_munged and not keep_munge and _stop_pid(_read_pid(Path("/run/munge/munged.pid")), "munged"):
            stopped.append("munged")
            spec.started_munged = False
            self._save_spec(spec)
        return stopped

    def running(self, spec: ClusterSpec | None = None) -> bool:
        spec = spec or self.load_spec()
        return spec is not None and all(self._alive(d) for d in self._daemons(spec))

    def status(self) -> dict:
        spec = self.load_spec()
        if spec is None:
            return {"state_dir": str(self.state_dir), "configured": False, "daemons": {}}
        daemons = {d: self._alive(d) for d in self._daemons(spec)}
        daemons["munged"] = munge_works()
        return {"state_dir": str(self.state_dir), "configured": True, "name": spec.name,
                "conf": str(self.conf), "daemons": daemons, "metrics": self.metrics_url(spec)}

    def metrics_url(self, spec: ClusterSpec | None = None) -> str | None:
        """Where slurmctld serves OpenMetrics (Slurm 25.11 on, see release_lines), else None."""
        spec = spec or self.load_spec()
        metrics = self.conf.exists() and "MetricsType=metrics/openmetrics" in self.conf.read_text()
        return f"http://127.0.0.1:{spec.port_base}/metrics/" if spec and metrics else None

    def wait_idle(self, spec: ClusterSpec | None = None, timeout: float = 90.0, registered_since: float = 0) -> None:
        """Wait until every node's slurmd has registered (after registered_since) and the node is settled."""
        from sigma.slurm.client import Slurm

        spec = spec or self.load_spec()
        slurm = Slurm(self.conf, timeout=10)
        deadline = time.monotonic() + timeout
        last = "no answer from slurmctld"
        while time.monotonic() < deadline:
            self._check_alive(["slurmctld"] + [f"slurmd-{n}" for n in self.node_names(spec)],
                              missing_pid_file_too=time.monotonic() > deadline - timeout + 5)
            try:
                nodes = slurm.nodes()
            except SlurmError as exc:
                last = str(exc)
            else:
                last = ", ".join(f"{n.name}={n.state}{'+' + '+'.join(n.flags) if n.flags else ''}" for n in nodes)
                if len(nodes) == spec.nodes and all(_settled(n, registered_since) for n in nodes):
                    return
            time.sleep(0.3)
        raise ClusterError(f"nodes not ready after {timeout:.0f}s ({last}); see {self.state_dir}/log/")

    # ---------- internals ----------
    def _check_alive(self, daemons: list[str], missing_pid_file_too: bool) -> None:
        """A daemon that exited during start-up fails `up` at once, with the end of its log."""
        for daemon in daemons:
            if (self._pid_file(daemon).exists() or missing_pid_file_too) and not self._alive(daemon):
                log = self.state_dir / "log" / f"{daemon}.log"
                tail = "".join(log.read_text(errors="replace").splitlines(keepends=True)[-5:]) if log.exists() else ""
                raise ClusterError(f"{daemon} exited while starting; the end of {log}:\n{tail}")

    def _all_nodes_responding(self, spec: ClusterSpec) -> bool:
        from sigma.slurm.client import Slurm

        try:
            nodes = Slurm(self.conf, timeout=10).nodes()
        except SlurmError:
            return False
        return len(nodes) == spec.nodes and all(_settled(n) for n in nodes)

    def _check_ports_free(self, spec: ClusterSpec) -> None:
        """Fail fast, with the fix, when another cluster (or anything else) holds a port a stopped daemon needs."""
        wanted = {"mariadb": spec.port_base + 2, "slurmdbd": spec.port_base + 1, "slurmctld": spec.port_base}
        wanted.update({f"slurmd-{n}": spec.port_base + 10 + k for k, n in enumerate(self.node_names(spec), 1)})
        busy = [(port, daemon) for daemon, port in wanted.items() if not self._alive(daemon) and not _port_free(port)]
        if busy:
            owners = sorted({owner for port, _ in busy if (owner := port_owner(port))} - {str(self.state_dir)})
            whose = (f"they belong to the local cluster under {', '.join(owners)} (its `sigma cluster down "
                     f"--state-dir {owners[0]}` frees them)" if owners else "another program holds them")
            raise ClusterError(f"ports in use: {', '.join(f'{p} ({d})' for p, d in busy)}; {whose}; "
                               f"or pick other ports with `sigma cluster up --port-base N`")

    def _write_configs(self, spec: ClusterSpec) -> None:
        names = self.node_names(spec)
        values = dict(
            cluster_name=spec.name, hostname=socket.gethostname(), state_dir=self.state_dir,
            ctld_port=spec.port_base, dbd_port=spec.port_base + 1, mysql_port=spec.port_base + 2,
            mysql_password=spec.mysql_password, cpus=spec.cpus, memory_mb=spec.memory_mb,
            partition=spec.partition, node_range=f"node[1-{spec.nodes}]" if spec.nodes > 1 else names[0],
            slurmd_ports=(f"[{spec.port_base + 11}-{spec.port_base + 10 + spec.nodes}]"
                          if spec.nodes > 1 else spec.port_base + 11),
            reboot_program=self._write_reboot_program(),
            prolog_lines="\n".join(
                line for line in (spec.prolog and f"Prolog={spec.prolog}",
                                  spec.epilog and f"Epilog={spec.epilog}") if line),
        )
        release = slurm_release()
        values.update(release_lines(release))
        template_dir = configs_dir() / "slurm"
        self.conf.write_text((template_dir / "slurm.conf.in").read_text().format(**values))
        cgroup = cgroup_conf(release, os.path.ismount("/sys/fs/cgroup"))
        if cgroup:
            (self.conf.parent / "cgroup.conf").write_text(cgroup)
        else:
            (self.conf.parent / "cgroup.conf").unlink(missing_ok=True)
        dbd = self.conf.parent / "slurmdbd.conf"
        dbd.write_text((template_dir / "slurmdbd.conf.in").read_text().format(**values))
        dbd.chmod(0o600)

    def _write_reboot_program(self) -> Path:
        script = self.state_dir / "bin" / "reboot-node"
        # slurmd may run it with no PATH (Slurm 26.05): every path is absolute, and sigma importable as it is here
        script.write_text(f"#!/bin/sh\n# RebootProgram of the local cluster: restarts this node's slurmd with -b.\n"
                          f"PATH=${{PATH:-{SBIN_PATH}:/usr/local/bin:/usr/bin:/bin}}; export PATH\n"
                          f"PYTHONPATH={PACKAGE_DIR.parent}; export PYTHONPATH\n"
                          f"exec {sys.executable} -m sigma.slurm.reboot --state-dir {self.state_dir} \"$@\"\n")
        script.chmod(0o755)
        return script

    def _ensure_munge(self) -> bool:
        """Start munged unless a working one exists; return True when we started it."""
        if munge_works():
            return False
        key = Path("/etc/munge/munge.key")
        if not key.exists():
            subprocess.run(["mungekey", "--create", f"--keyfile={key}"], check=True)
            shutil.chown(key, "munge", "munge")
        for d in ("/run/munge", "/var/lib/munge", "/var/log/munge"):
            Path(d).mkdir(parents=True, exist_ok=True)
            shutil.chown(d, "munge", "munge")
        subprocess.run(["runuser", "-u", "munge", "--", _which("munged")], check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=15)
        for _ in range(50):
            if munge_works():
                return True
            time.sleep(0.1)
        raise ClusterError("munged started but `munge -n | unmunge` does not succeed; see /var/log/munge/munged.log")

    def _start_mariadb(self, spec: ClusterSpec) -> None:
        datadir = self.state_dir / "mysql"
        sock = self.state_dir / "run" / "mariadb.sock"
        # its own temporary directory: temporary table names in a shared /tmp collided between two clusters
        # initialising at once (processes of other PID namespaces can have the same PID)
        tmpdir = self.state_dir / "mysql-tmp"
        tmpdir.mkdir(exist_ok=True)
        if not (datadir / "mysql").is_dir():
            _checked(["mariadb-install-db", "--no-defaults", "--user=root", f"--datadir={datadir}",
                      "--auth-root-authentication-method=socket", "--skip-test-db", f"--tmpdir={tmpdir}"],
                     self.state_dir / "log" / "mariadb-install.log", "initialising the MariaDB data directory")
        if not self._alive("mariadb"):
            log = open(self.state_dir / "log" / "mariadb.log", "ab")
            subprocess.Popen(
                [_which("mariadbd"), "--no-defaults", "--user=root", f"--datadir={datadir}", f"--socket={sock}",
                 f"--tmpdir={tmpdir}", f"--port={spec.port_base + 2}", "--bind-address=127.0.0.1",
                 f"--pid-file={self._pid_file('mariadb')}",
                 "--innodb-buffer-pool-size=64M", "--skip-name-resolve", "--innodb-flush-log-at-trx-commit=2",
                 # Slurm 26.05 refuses snapshot isolation (MariaDB 11.6+ default); `loose-`: older servers lack it
                 "--loose-innodb-snapshot-isolation=OFF", "--innodb-lock-wait-timeout=900"],
                stdout=log, stderr=log, stdin=subprocess.DEVNULL, start_new_session=True)
            log.close()
        sql = "".join(
            f"CREATE USER IF NOT EXISTS 'slurm'@'{host}' IDENTIFIED BY '{spec.mysql_password}';"
            f"ALTER USER 'slurm'@'{host}' IDENTIFIED BY '{spec.mysql_password}';"
            f"GRANT ALL ON slurm_acct_db.* TO 'slurm'@'{host}';" for host in ("localhost", "127.0.0.1"))
        sql = "CREATE DATABASE IF NOT EXISTS slurm_acct_db;" + sql
        self._retry(lambda: run(["mariadb", f"--socket={sock}", "-uroot", "-e", sql], timeout=10),
                    30, "MariaDB to accept connections", "mariadb.log")

    def _start_slurmdbd(self, spec: ClusterSpec) -> None:
        self._start_daemon("slurmdbd", ["slurmdbd"], spec.port_base + 1)

    def _register_accounting(self, spec: ClusterSpec) -> None:
        def register():
            out = run(["sacctmgr", "-n", "-P", "show", "cluster", "format=cluster"], env=self.env, timeout=10).stdout
            if spec.name not in out.split():
                run(["sacctmgr", "-i", "add", "cluster", spec.name], env=self.env, timeout=10)
        self._retry(register, 30, "slurmdbd to register the cluster", "slurmdbd.log")

    def _start_daemon(self, name: str, argv: list[str], port: int | None) -> None:
        if not self._alive(name):
            _checked([_which(argv[0]), *argv[1:]], self.state_dir / "log" / f"{name}.start.log",
                     f"starting {name}", env=self.env)
        if port is not None:
            self._retry(lambda: socket.create_connection(("127.0.0.1", port), timeout=1).close(),
                        30, f"{name} to listen on port {port}", f"{name}.log")

    def _retry(self, attempt, timeout: float, what: str, log_name: str):
        deadline = time.monotonic() + timeout
        while True:
            try:
                return attempt()
            except (OSError, SlurmError) as exc:
                if time.monotonic() > deadline:
                    raise ClusterError(f"timed out after {timeout:.0f}s waiting for {what}: {exc}; "
                                       f"see {self.state_dir / 'log' / log_name}") from None
                time.sleep(0.2)

    def _alive(self, daemon: str) -> bool:
        return _pid_alive(_read_pid(self._pid_file(daemon)), _program(daemon))

    def _stop(self, daemon: str) -> bool:
        return _stop_pid(_read_pid(self._pid_file(daemon)), _program(daemon))

    def _stop_job_steps(self) -> None:
        """slurmstepd and job processes outlive slurmd; stop the ones of this cluster (by their SLURM_CONF): the
        step daemons first (they end their jobs), then any job process left over (e.g. an orphaned batch script)."""
        mine = f"SLURM_CONF={self.conf}".encode()
        steps, jobs = [], []
        for proc in Path("/proc").iterdir():
            if not proc.name.isdigit() or int(proc.name) == os.getpid():
                continue
            try:
                env = (proc / "environ").read_bytes().split(b"\0")
                if mine not in env:
                    continue
                if b"slurmstepd" in (proc / "cmdline").read_bytes():
                    steps.append(int(proc.name))
                elif any(v.startswith(b"SLURM_JOB_ID=") for v in env):
                    jobs.append(int(proc.name))
            except OSError:
                continue
        for pid in steps:
            _stop_pid(pid, "slurmstepd")
        for pid in jobs:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


# ---------- helpers without cluster state ----------

def check_packages() -> None:
    if os.geteuid() != 0:
        raise ClusterError("the local cluster needs root: slurmd, munged and the emulated reboots run as root "
                           "(run `sudo sigma cluster up`)")
    missing = sorted({pkg for prog, pkg in REQUIRED_PROGRAMS.items() if _which(prog, required=False) is None})
    if missing:
        raise ClusterError(f"missing system packages: {' '.join(missing)}. Install them with:\n"
                           f"  apt-get install -y {DEBIAN_PACKAGES}\n(`make install` does this for you)")


def slurm_release() -> tuple[int, int, int]:
    """The release of the slurmd here (`slurmd -V` needs no configuration, unlike the clients from 24.11 on)."""
    out = run([_which("slurmd"), "-V"], timeout=10).stdout
    try:
        return parse_release(out)
    except ValueError as exc:
        raise ClusterError(f"cannot tell which Slurm this is: {exc}") from None


def release_lines(release: tuple[int, int, int]) -> dict[str, str]:
    """slurm.conf settings that exist from Slurm 25.11 on (empty before).

    requeue_delay: a job SLURM requeues itself (node failure, failed prolog) may start again after 2 s instead of
    the ~121 s BeginTime every earlier release sets (2 s keeps a relaunch out of the second its old credential was
    revoked in; sigma's start_now still clears the BeginTime of the requeues it makes). MetricsType: slurmctld
    serves OpenMetrics (jobs, nodes, partitions, scheduler) on SlurmctldPort under /metrics/.
    """
    if release[:2] < (25, 11):
        return {"scheduler_since_25_11": "", "metrics_since_25_11": ""}
    return {"scheduler_since_25_11": ",requeue_delay=2",
            "metrics_since_25_11": "# OpenMetrics on http://SlurmctldHost:SlurmctldPort/metrics/ (Slurm 25.11+)\n"
                                   "MetricsType=metrics/openmetrics\n"}


def cgroup_conf(release: tuple[int, int, int], cgroup_fs: bool) -> str:
    """cgroup.conf for the local cluster ("" for none).

    slurmd of 24.11 and 26.05 (and, untested, 23.02 to 25.11) initialises a cgroup plugin whatever ProctrackType
    and TaskPlugin say, and exits ("No filesystem mounted on /sys/fs/cgroup") where there is none: there,
    CgroupPlugin=disabled. Where one is mounted,
    the plugin sites use (autodetect: cgroup/v1 or cgroup/v2), with IgnoreSystemd since `sigma cluster up` starts
    slurmd itself, not as a systemd unit with its own scope. 22.05 starts without any.
    """
    if release[:2] <= (22, 5):
        return ""
    head = f"# cgroup.conf of the local cluster, written by `sigma cluster up` for Slurm {release_text(release)}\n"
    if not cgroup_fs:
        return head + "# no cgroup file system is mounted on /sys/fs/cgroup here\nCgroupPlugin=disabled\n"
    return head + "CgroupPlugin=autodetect\nIgnoreSystemd=yes\n"


def munge_works() -> bool:
    try:
        cred = subprocess.run(["munge", "-n"], capture_output=True, timeout=5)
        if cred.returncode != 0:
            return False
        return subprocess.run(["unmunge"], input=cred.stdout, capture_output=True, timeout=5).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def ensure_hosts_entries(names: list[str], hosts: Path = Path("/etc/hosts")) -> None:
    """Node names must resolve; add one marked line to /etc/hosts for those that do not."""
    unresolved = []
    for name in names:
        try:
            socket.gethostbyname(name)
        except OSError:
            unresolved.append(name)
    if not unresolved:
        return
    try:
        with hosts.open("a") as f:
            f.write(f"127.0.0.1 {' '.join(unresolved)} {HOSTS_MARK}\n")
    except OSError as exc:
        raise ClusterError(f"node names {unresolved} do not resolve and {hosts} is not writable ({exc}); "
                           f"add '127.0.0.1 {' '.join(unresolved)}' to it") from None


def _settled(node, registered_since: float = 0) -> bool:
    """A node's slurmd has registered (since the given time) and it is usable or deliberately drained."""
    return (node.slurmd_start_time >= registered_since and node.state not in ("down", "unknown", "future")
            and not {"NOT_RESPONDING", "REBOOT_ISSUED", "POWERING_UP"} & set(node.flags))


def _merge_spec(saved: ClusterSpec | None, asked: ClusterSpec | None) -> ClusterSpec:
    if saved is None:
        spec = asked or ClusterSpec()
    elif asked is None:
        spec = saved
    else:  # keep the secret and bookkeeping of the running cluster; take the new shape
        spec = ClusterSpec(**{**asdict(asked), "mysql_password": saved.mysql_password,
                              "started_munged": saved.started_munged})
    root = project_root()
    for attr, script in (("prolog", root / "prolog" / "sigma-prolog"), ("epilog", root / "epilog" / "sigma-epilog")):
        if getattr(spec, attr) == "" and script.exists():
            setattr(spec, attr, str(script))
    return spec


def _which(program: str, required: bool = True) -> str | None:
    path = shutil.which(program, path=os.environ.get("PATH", "") + ":" + SBIN_PATH)
    if path is None and required:
        check_packages()
        raise ClusterError(f"{program} not found on PATH")
    return path


def _checked(argv: list[str], log_path: Path, what: str, env: dict | None = None, timeout_s: float = 300) -> None:
    """Run a set-up step into its log. The timeout is generous: MariaDB's first initialisation took over a minute
    on a machine at load 200."""
    with open(log_path, "ab") as log:
        try:
            proc = subprocess.run(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                  env={**os.environ, **(env or {})}, timeout=timeout_s)
        except subprocess.TimeoutExpired:
            raise ClusterError(f"{what} did not finish within {timeout_s} s ({argv[0]}; the machine may be too "
                               f"busy); see {log_path}") from None
    if proc.returncode != 0:
        tail = log_path.read_text(errors="replace")[-2000:]
        raise ClusterError(f"{what} failed ({' '.join(argv)} exited {proc.returncode}); {log_path}:\n{tail}")


def _other_slurm_daemons() -> bool:
    """Any slurmctld/slurmd/slurmdbd still running on this machine (another cluster needs munged)."""
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                argv0 = (proc / "cmdline").read_bytes().split(b"\0")[0]
            except OSError:
                continue
            if os.path.basename(argv0.decode(errors="replace")) in ("slurmctld", "slurmd", "slurmdbd") \
                    and _pid_alive(int(proc.name), "slurm"):
                return True
    return False


def port_owner(port: int) -> str | None:
    """The state directory of the local cluster (or stack) whose process listens on port, if one does."""
    import psutil

    try:
        pids = {c.pid for c in psutil.net_connections("tcp")
                if c.laddr and c.laddr.port == port and c.status == psutil.CONN_LISTEN and c.pid}
    except (psutil.Error, OSError):
        return None
    for pid in pids:
        try:
            proc = psutil.Process(pid)
            conf = proc.environ().get("SLURM_CONF", "")
            argv = proc.cmdline()
        except (psutil.Error, OSError):
            continue
        for arg in [conf, *argv]:  # <state>/etc/slurm.conf, --datadir=<state>/mysql, <state>/etc/controller.yaml
            path = Path(arg.partition("=")[2] if arg.startswith("--") else arg)
            for parent in (path.parent, path.parent.parent):
                if (parent / "cluster.json").exists():
                    return str(parent)
    return None


def _port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _program(daemon: str) -> str:
    return "mariadbd" if daemon == "mariadb" else daemon.split("-")[0]


def _read_pid(path: Path) -> int | None:
    try:
        return int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def _pid_alive(pid: int | None, program: str) -> bool:
    """True if pid runs `program` (guards against a recycled pid)."""
    if pid is None:
        return False
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return program.encode() in cmdline and ") Z" not in stat


def _stop_pid(pid: int | None, program: str, grace: float = 10.0) -> bool:
    if not _pid_alive(pid, program):
        return False
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        if not _pid_alive(pid, program):
            return True
        time.sleep(0.1)
    os.kill(pid, signal.SIGKILL)
    return True
