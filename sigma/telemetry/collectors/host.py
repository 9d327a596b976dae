"""Host metrics through psutil: CPU, memory and page cache, swap, disk and network I/O, load, pressure stall info.

Counters are reported raw (cumulative, like node_exporter); CPU utilisation is computed from the delta since the
previous run. Every read goes through `host_root` (psutil.PROCFS_PATH), so tests run on fixture /proc trees.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

import psutil

from sigma.telemetry.base import Collector, CollectorParams, Output, register

MEM_FIELDS = ("total", "available", "used", "free", "active", "inactive", "buffers", "cached", "shared", "slab")
DISK_FIELDS = ("read_count", "write_count", "read_bytes", "write_bytes", "read_time", "write_time", "busy_time")
NET_FIELDS = ("bytes_sent", "bytes_recv", "packets_sent", "packets_recv", "errin", "errout", "dropin", "dropout")
PSI_RESOURCES = ("cpu", "memory", "io")


@register("host")
class HostCollector(Collector):
    @dataclass
    class Params(CollectorParams):
        percpu: bool = True  # also one utilisation series per CPU
        disks: bool = True  # per-device disk I/O counters
        disk_exclude: str = r"^(loop|ram|sr|fd)\d+$|^(sd|vd|xvd|hd)[a-z]+\d+$|^(nvme\d+n\d+|mmcblk\d+)p\d+$"  # skip
        network: bool = True  # per-interface network counters
        net_exclude: str = r"^lo$"  # regex of interfaces to skip
        pressure: bool = True  # /proc/pressure/{cpu,memory,io} (PSI)
        vmstat_keys: list[str] = None  # /proc/vmstat counters to report (page cache activity)
        filesystems: bool = True  # size and inode use of local and network filesystems
        fs_types: list[str] = None  # filesystem types reported (default: common disk and parallel filesystems)
        protocols: list[str] = None  # /proc/net/snmp sections reported in full (TCP retransmits, UDP drops)
        tcp_ext_keys: list[str] = None  # /proc/net/netstat TcpExt counters to report

        def __post_init__(self):
            super().__post_init__()
            if self.vmstat_keys is None:
                self.vmstat_keys = ["pgmajfault", "pgfault", "pgpgin", "pgpgout", "nr_dirty", "nr_writeback",
                                    "pswpin", "pswpout", "oom_kill"]
            if self.fs_types is None:
                self.fs_types = ["ext2", "ext3", "ext4", "xfs", "btrfs", "zfs", "overlay", "nfs", "nfs4", "lustre",
                                 "gpfs", "beegfs", "wekafs", "cephfs", "fuse.juicefs"]
            if self.protocols is None:
                self.protocols = ["Ip", "Tcp", "Udp"]
            if self.tcp_ext_keys is None:
                self.tcp_ext_keys = ["ListenOverflows", "ListenDrops", "TCPTimeouts", "TCPLostRetransmit",
                                     "TCPSynRetrans", "TCPAbortOnTimeout", "TCPOFOQueue", "TCPRcvQDrop",
                                     "TCPBacklogDrop", "TCPMemoryPressures"]
            self.disk_re = re.compile(self.disk_exclude)
            self.net_re = re.compile(self.net_exclude)

    def __init__(self, section, params, ctx):
        super().__init__(section, params, ctx)
        self.proc = os.path.join(ctx.host_root, "proc")
        psutil.PROCFS_PATH = self.proc
        self._last_cpu = None

    def collect(self, out: Output) -> None:
        p = self.params
        psutil.PROCFS_PATH = self.proc
        self._cpu(out)
        mem = psutil.virtual_memory()
        for f in MEM_FIELDS:
            out.sample(f"host.mem.{f}_bytes", getattr(mem, f, None))
        swap = psutil.swap_memory()
        out.sample("host.swap.used_bytes", swap.used)
        out.sample("host.swap.total_bytes", swap.total)
        self._loadavg(out)
        if p.vmstat_keys:
            self._vmstat(out)
        if p.disks:
            for dev, c in (psutil.disk_io_counters(perdisk=True, nowrap=False) or {}).items():
                if p.disk_re.search(dev):
                    continue
                labels = {"device": dev}
                for f in DISK_FIELDS:
                    out.sample(f"host.disk.{f}", getattr(c, f, None), labels)
        if p.network:
            for nic, c in (psutil.net_io_counters(pernic=True, nowrap=False) or {}).items():
                if p.net_re.search(nic):
                    continue
                labels = {"iface": nic}
                for f in NET_FIELDS:
                    out.sample(f"host.net.{f}", getattr(c, f), labels)
        if p.pressure:
            self._pressure(out)
        if p.protocols or p.tcp_ext_keys:
            self._netstat(out)
        if p.filesystems:
            self._filesystems(out)
        self._file_nr(out)

    def _cpu(self, out: Output) -> None:
        total = psutil.cpu_times()
        per = psutil.cpu_times(percpu=True) if self.params.percpu else []
        for mode in total._fields:
            out.sample("host.cpu.seconds", getattr(total, mode), {"mode": mode})
        for i, t in enumerate(per):
            cpu = str(i)
            for mode in t._fields:
                out.sample("host.cpu.seconds", getattr(t, mode), {"cpu": cpu, "mode": mode})
        now = [total] + list(per)
        if self._last_cpu is not None and len(self._last_cpu) == len(now):
            for i, (a, b) in enumerate(zip(self._last_cpu, now)):
                util = _util_pct(a, b)
                out.sample("host.cpu.util_pct", util, None if i == 0 else {"cpu": str(i - 1)})
        self._last_cpu = now
        out.sample("host.cpu.count", len(per) or os.cpu_count())

    def _loadavg(self, out: Output) -> None:
        with open(os.path.join(self.proc, "loadavg")) as f:
            parts = f.read().split()
        for name, value in zip(("host.load1", "host.load5", "host.load15"), parts[:3]):
            out.sample(name, float(value))
        running, _, total = parts[3].partition("/")
        out.sample("host.procs.running", int(running))
        out.sample("host.procs.total", int(total))

    def _vmstat(self, out: Output) -> None:
        wanted = set(self.params.vmstat_keys)
        with open(os.path.join(self.proc, "vmstat")) as f:
            for line in f:
                key, _, value = line.partition(" ")
                if key in wanted:
                    out.sample(f"host.vmstat.{key}", int(value))

    def _pressure(self, out: Output) -> None:
        for res in PSI_RESOURCES:
            try:
                with open(os.path.join(self.proc, "pressure", res)) as f:
                    text = f.read()
            except OSError:
                continue  # kernel without PSI (or disabled): nothing to report
            for kind, values in parse_psi(text).items():
                for key, value in values.items():
                    out.sample(f"host.pressure.{res}.{kind}.{key}", value)


    def _netstat(self, out: Output) -> None:
        p = self.params
        for name, wanted in (("snmp", None), ("netstat", {"TcpExt": set(p.tcp_ext_keys)})):
            try:
                with open(os.path.join(self.proc, "net", name)) as f:
                    tables = parse_proc_net_table(f.read(), set(p.protocols) if wanted is None else set(wanted))
            except OSError:
                continue
            for proto, values in tables.items():
                if wanted is None:
                    if proto not in p.protocols:
                        continue
                    keys = values
                else:
                    if proto not in wanted:
                        continue
                    keys = wanted[proto]
                for key in keys:
                    if key in values:
                        out.sample(f"host.net.{proto.lower()}.{key}", values[key])

    def _filesystems(self, out: Output) -> None:
        types = set(self.params.fs_types)
        seen = set()
        try:
            with open(os.path.join(self.proc, "mounts")) as f:
                mounts = [line.split()[:3] for line in f]
        except OSError:
            return
        for device, mount, fstype in mounts:
            if fstype not in types or device in seen:
                continue
            seen.add(device)
            mount = mount.replace("\\040", " ")
            try:
                st = os.statvfs(os.path.join(self.ctx.host_root, mount.lstrip("/")))
            except OSError:
                continue
            labels = {"mount": mount, "fstype": fstype}
            out.sample("host.fs.size_bytes", st.f_blocks * st.f_frsize, labels)
            out.sample("host.fs.avail_bytes", st.f_bavail * st.f_frsize, labels)
            out.sample("host.fs.files", st.f_files, labels)
            out.sample("host.fs.files_free", st.f_ffree, labels)

    def _file_nr(self, out: Output) -> None:
        try:
            with open(os.path.join(self.proc, "sys", "fs", "file-nr")) as f:
                allocated, _, maximum = f.read().split()[:3]
        except (OSError, ValueError):
            return
        out.sample("host.fd.allocated", int(allocated))
        out.sample("host.fd.max", int(maximum))


def parse_proc_net_table(text: str, protocols: set | None = None) -> dict[str, dict[str, int]]:
    """/proc/net/snmp and /proc/net/netstat: pairs of 'Proto: names...' / 'Proto: values...' lines."""
    tables: dict[str, dict[str, int]] = {}
    lines = text.splitlines()
    for header, values in zip(lines[0::2], lines[1::2]):
        proto, _, names = header.partition(":")
        if protocols is not None and proto not in protocols:
            continue
        proto2, _, numbers = values.partition(":")
        if proto != proto2:
            continue
        tables[proto] = {k: int(v) for k, v in zip(names.split(), numbers.split()) if v.lstrip("-").isdigit()}
    return tables


def parse_psi(text: str) -> dict[str, dict[str, float]]:
    """'some avg10=0.00 avg60=0.10 avg300=0.05 total=123' lines -> {'some': {'avg10': 0.0, ..., 'total_us': 123}}."""
    result = {}
    for line in text.splitlines():
        kind, *pairs = line.split()
        values = {}
        for pair in pairs:
            k, _, v = pair.partition("=")
            values["total_us" if k == "total" else k] = float(v)
        result[kind] = values
    return result


def _util_pct(a, b) -> float | None:
    # guest time is already counted in user/nice on Linux
    def split(t):
        total = sum(t) - getattr(t, "guest", 0) - getattr(t, "guest_nice", 0)
        return total, total - t.idle - getattr(t, "iowait", 0)
    (total_a, busy_a), (total_b, busy_b) = split(a), split(b)
    total = total_b - total_a
    return None if total <= 0 else round(100.0 * (busy_b - busy_a) / total, 3)
