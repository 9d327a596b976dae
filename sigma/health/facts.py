"""Fact gathering from the host (through the context's root). Cached per run by Context.fact."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from sigma.health.context import Context


def meminfo(ctx: Context) -> dict[str, int]:
    """/proc/meminfo in kB."""
    def gather():
        out = {}
        for line in ctx.host("/proc/meminfo").read_text().splitlines():
            key, _, rest = line.partition(":")
            parts = rest.split()
            if parts and parts[0].isdigit():
                out[key.strip()] = int(parts[0])
        return out
    return ctx.fact("meminfo", gather)


def mounts(ctx: Context) -> list[dict[str, str]]:
    def gather():
        rows = []
        for line in ctx.host("/proc/mounts").read_text().splitlines():
            parts = line.split()
            if len(parts) >= 3:
                rows.append({"device": parts[0], "mountpoint": parts[1].replace("\\040", " "), "fstype": parts[2]})
        return rows
    return ctx.fact("mounts", gather)


def _read(path: Path, default: str = "") -> str:
    try:
        return path.read_text().strip()
    except OSError:
        return default


def net_interfaces(ctx: Context) -> dict[str, dict[str, str]]:
    """name -> {operstate, carrier, type} from /sys/class/net."""
    def gather():
        base = ctx.host("/sys/class/net")
        out = {}
        if base.is_dir():
            for dev in sorted(base.iterdir()):
                out[dev.name] = {"operstate": _read(dev / "operstate", "unknown"),
                                 "carrier": _read(dev / "carrier", ""), "type": _read(dev / "type", "")}
        return out
    return ctx.fact("net_interfaces", gather)


def ib_ports(ctx: Context) -> list[dict[str, str]] | None:
    """InfiniBand ports from /sys/class/infiniband/<dev>/ports/<n>/{state,phys_state,rate}; None without IB."""
    def gather():
        base = ctx.host("/sys/class/infiniband")
        if not base.is_dir():
            return None
        ports = []
        for dev in sorted(base.iterdir()):
            pdir = dev / "ports"
            if not pdir.is_dir():
                continue
            for port in sorted(pdir.iterdir(), key=lambda p: p.name):
                ports.append({"device": dev.name, "port": port.name, "state": _read(port / "state"),
                              "phys_state": _read(port / "phys_state"), "rate": _read(port / "rate")})
        return ports
    return ctx.fact("ib_ports", gather)


@dataclass(frozen=True)
class Proc:
    pid: int
    ppid: int
    uid: int
    name: str
    cmdline: str
    env: dict[str, str]


SLURM_ENV_KEYS = ("SLURM_JOB_ID", "SLURMD_NODENAME", "SLURM_SCRIPT_CONTEXT", "SLURM_CONF")


def processes(ctx: Context) -> list[Proc]:
    """Processes with the SLURM variables of their environment (readable as root)."""
    def gather():
        out = []
        proc = ctx.host("/proc")
        for entry in proc.iterdir():
            if not entry.name.isdigit():
                continue
            try:
                stat = (entry / "stat").read_text()
                status = (entry / "status").read_text()
                cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
            except OSError:
                continue
            name = stat[stat.find("(") + 1:stat.rfind(")")]
            after = stat[stat.rfind(")") + 2:].split()
            if after and after[0] == "Z":
                continue
            ppid = int(after[1]) if len(after) > 1 else 0
            uid = next((int(line.split()[1]) for line in status.splitlines() if line.startswith("Uid:")), -1)
            env = {}
            try:
                for item in (entry / "environ").read_bytes().split(b"\0"):
                    key, sep, value = item.partition(b"=")
                    if sep and key.decode(errors="replace") in SLURM_ENV_KEYS:
                        env[key.decode()] = value.decode(errors="replace")
            except OSError:
                pass
            out.append(Proc(int(entry.name), ppid, uid, name, cmdline, env))
        return out
    return ctx.fact("processes", gather)


def slurmd_spool_dir(ctx: Context) -> Path | None:
    """SlurmdSpoolDir (with %n = node) from config or $SLURM_CONF, read as a file: no SLURM command runs."""
    if ctx.config.slurmd_spool_dir:
        return Path(ctx.template(ctx.config.slurmd_spool_dir))
    conf = os.environ.get("SLURM_CONF", "/etc/slurm/slurm.conf")
    try:
        text = Path(conf).read_text()
    except OSError:
        return None
    for line in text.splitlines():
        key, _, value = line.split("#", 1)[0].partition("=")
        if key.strip().lower() == "slurmdspooldir":
            return Path(value.strip().replace("%n", ctx.node).replace("%h", ctx.node))
    return Path("/var/spool/slurmd")


def active_jobs(ctx: Context) -> set[int] | None:
    """Job ids with a running step on this node: slurmstepd sockets <spool>/<node>_<job>.<step>."""
    def gather():
        spool = slurmd_spool_dir(ctx)
        if spool is None or not spool.is_dir():
            return None
        jobs = set()
        prefix = f"{ctx.node}_"
        for entry in spool.iterdir():
            if entry.name.startswith(prefix):
                job, _, _ = entry.name[len(prefix):].partition(".")
                if job.isdigit():
                    jobs.add(int(job))
        return jobs
    return ctx.fact("active_jobs", gather)
