"""Host metrics read straight from /proc: CPU, memory and page cache, swap, disk and network I/O, load, pressure
stall info, sockets, softnet drops, filesystems.

Counters are reported raw (cumulative, like node_exporter); CPU utilisation is computed from the delta since the
previous run. Values and names follow psutil's conventions (host.mem.used_bytes = total - available,
cached including SReclaimable; CPU seconds = ticks / CLK_TCK; sectors of 512 bytes), but each file is read once
and parsed with str.split, and every series' metric name and label JSON is built once and reused: the collector
runs every second on every node. Pseudo-files (size 0: procfs, sysfs) stay open and are re-read with pread at
offset 0, which makes the kernel generate fresh content without an open/close per file and run. Every read goes
through `host_root`, so tests run on fixture /proc trees (regular files there are opened on every read).
"""

from __future__ import annotations

import os
import re
import select
from dataclasses import dataclass

from sigma.telemetry.base import Collector, CollectorParams, Output, labels_json, register

MEM_FIELDS = ("total", "available", "used", "free", "active", "inactive", "buffers", "cached", "shared", "slab")
CPU_MODES = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal", "guest", "guest_nice")
# /proc/diskstats columns after the name (psutil names; times in ms, sectors of 512 bytes -> bytes)
DISK_COLUMNS = (("read_count", 0, 1), ("read_merged_count", 1, 1), ("read_bytes", 2, 512), ("read_time", 3, 1),
                ("write_count", 4, 1), ("write_merged_count", 5, 1), ("write_bytes", 6, 512),
                ("write_time", 7, 1), ("io_in_progress", 8, 1), ("busy_time", 9, 1), ("weighted_io_time", 10, 1))
# /proc/net/dev columns after "iface:"
NET_COLUMNS = ("bytes_recv", "packets_recv", "errin", "dropin", "fifo_in", "frame_in", "compressed_in",
               "multicast_in", "bytes_sent", "packets_sent", "errout", "dropout", "fifo_out", "colls_out",
               "carrier_out", "compressed_out")
# /proc/stat lines besides cpu*: first number -> metric
STAT_COUNTERS = {"ctxt": "host.stat.context_switches", "intr": "host.stat.interrupts",
                 "processes": "host.stat.forks", "procs_blocked": "host.procs.blocked",
                 "softirq": "host.stat.softirqs"}
SOFTNET_COLUMNS = (("processed", 0), ("dropped", 1), ("time_squeeze", 2))
PSI_RESOURCES = ("cpu", "memory", "io")
MEMINFO_LINE = re.compile(r"^([^:\n]+):[ \t]+(\d+)( kB)?[ \t]*$", re.M)
CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


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
        meminfo: bool = True  # every /proc/meminfo field as host.meminfo.<Field> (dirty, hugepages, ...)
        stat_counters: bool = True  # /proc/stat context switches, interrupts, forks, softirqs, blocked procs
        sockstat: bool = True  # /proc/net/sockstat socket counts (TCP in use, orphans, TIME_WAIT, memory)
        softnet: bool = True  # /proc/net/softnet_stat per CPU: packets processed, dropped, time squeezes

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
        self._last_cpu = None
        self._series: dict = {}  # (kind, key) -> prebuilt [(metric, labels JSON), ...] for a device/iface/cpu
        self._vmstat = set(params.vmstat_keys or ())
        self._fds: dict[tuple, tuple[int, int]] = {}  # parts -> (kept fd, read size) for pseudo-files

    def close(self) -> None:
        fds, self._fds = self._fds, {}
        for fd, _ in fds.values():
            os.close(fd)

    def _read(self, *parts: str) -> str | None:
        kept = self._fds.get(parts)
        if kept is not None:
            fd, size = kept
            try:
                data = os.pread(fd, size, 0)
                while len(data) >= size:  # grew past the buffer: read it whole with a bigger one
                    size *= 2
                    data = os.pread(fd, size, 0)
            except OSError:  # e.g. the device behind it went away: open it afresh next time
                del self._fds[parts]
                os.close(fd)
                return None
            if size != kept[1]:
                self._fds[parts] = (fd, size)
            return data.decode("utf-8", "replace")
        try:
            fd = os.open(os.path.join(self.proc, *parts), os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            return None
        try:
            pseudo = os.fstat(fd).st_size == 0
            with os.fdopen(os.dup(fd), "rb") as f:
                data = f.read()
        except OSError:
            os.close(fd)
            return None
        if pseudo:
            self._fds[parts] = (fd, max(4096, 2 * len(data)))
        else:
            os.close(fd)
        return data.decode("utf-8", "replace")

    def _labelled(self, kind: str, key: str, names, label: str) -> list:
        """Metric names and label JSON for one device/iface/cpu, built on first sight."""
        series = self._series.get((kind, key))
        if series is None:
            lj = labels_json({label: key})
            series = self._series[(kind, key)] = [(f"host.{kind}.{n}", lj) for n in names]
        return series

    def collect(self, out: Output) -> None:
        p = self.params
        add = out.samples.append
        ts = out.ts
        self._stat(add, ts)
        self._memory(add, ts)
        self._loadavg(add, ts)
        if self._vmstat:
            self._vmstat_counters(add, ts)
        if p.disks:
            self._disks(add, ts)
        if p.network:
            self._network(add, ts)
        if p.pressure:
            self._pressure(out)
        if p.protocols or p.tcp_ext_keys:
            self._netstat(out)
        if p.sockstat:
            self._sockstat(add, ts)
        if p.softnet:
            self._softnet(add, ts)
        if p.filesystems:
            self._filesystems(out)
        self._file_nr(out)

    def _stat(self, add, ts: float) -> None:
        text = self._read("stat")
        if text is None:
            raise OSError(f"cannot read {self.proc}/stat")
        cpus = []
        counters = self.params.stat_counters
        for line in text.splitlines():
            name, _, rest = line.partition(" ")
            if name.startswith("cpu"):
                if name != "cpu" and not self.params.percpu:
                    continue
                cpus.append((name[3:], [int(x) / CLK_TCK for x in rest.split()[:len(CPU_MODES)]]))
            elif counters and name in STAT_COUNTERS:
                add((ts, STAT_COUNTERS[name], int(rest.split(None, 1)[0]), "{}"))
        for cpu, times in cpus:
            for lj, value in zip(self._cpu_labels(cpu), times):
                add((ts, "host.cpu.seconds", value, lj))
        last = self._last_cpu
        if last is not None and len(last) == len(cpus):
            for (cpu, a), (_, b) in zip(last, cpus):
                add((ts, "host.cpu.util_pct", _util_pct(a, b), self._cpu_labels(cpu)[-1]))
        self._last_cpu = cpus
        add((ts, "host.cpu.count", len(cpus) - 1 if len(cpus) > 1 else os.cpu_count(), "{}"))

    def _cpu_labels(self, cpu: str) -> list[str]:
        """Label JSON per mode for one CPU ("" = the total), then the label JSON of its util_pct series."""
        labels = self._series.get(("cpu", cpu))
        if labels is None:
            base = {"cpu": cpu} if cpu else {}
            labels = self._series[("cpu", cpu)] = [labels_json({**base, "mode": m}) for m in CPU_MODES] + [
                labels_json(base)]
        return labels

    def _memory(self, add, ts: float) -> None:
        text = self._read("meminfo")
        if text is None:
            raise OSError(f"cannot read {self.proc}/meminfo")
        fields = MEMINFO_LINE.findall(text)  # [(key, number, " kB" or ""), ...]: the line split in C
        info = {key: int(number) << 10 if unit else int(number) for key, number, unit in fields}
        g = info.get
        total, free, buffers = g("MemTotal", 0), g("MemFree", 0), g("Buffers", 0)
        cached = g("Cached", 0) + g("SReclaimable", 0)
        available = g("MemAvailable")
        if available is None:  # kernels before 3.14
            available = free + cached + buffers
        used = total - available  # as psutil >= 6 and free(1) count it
        for name, value in (("total", total), ("available", available), ("used", used), ("free", free),
                            ("active", g("Active")), ("inactive", g("Inactive")), ("buffers", buffers),
                            ("cached", cached), ("shared", g("Shmem", g("MemShared"))), ("slab", g("Slab"))):
            add((ts, f"host.mem.{name}_bytes", value, "{}"))
        swap_total = g("SwapTotal", 0)
        add((ts, "host.swap.used_bytes", swap_total - g("SwapFree", 0), "{}"))
        add((ts, "host.swap.total_bytes", swap_total, "{}"))
        if self.params.meminfo:
            names = self._series.get("meminfo")
            if names is None:
                names = self._series["meminfo"] = {}
            for key, _, unit in fields:
                metric = names.get(key)
                if metric is None:
                    metric = names[key] = ("host.meminfo." + key.replace("(", "_").replace(")", "")
                                           + ("_bytes" if unit else ""))
                add((ts, metric, info[key], "{}"))

    def _loadavg(self, add, ts: float) -> None:
        parts = (self._read("loadavg") or "").split()
        if len(parts) < 4:
            return
        add((ts, "host.load1", float(parts[0]), "{}"))
        add((ts, "host.load5", float(parts[1]), "{}"))
        add((ts, "host.load15", float(parts[2]), "{}"))
        running, _, total = parts[3].partition("/")
        add((ts, "host.procs.running", int(running), "{}"))
        add((ts, "host.procs.total", int(total), "{}"))

    def _vmstat_counters(self, add, ts: float) -> None:
        text = "\n" + (self._read("vmstat") or "")
        for key in self._vmstat:  # a few wanted keys out of ~180 lines: find them, do not split every line
            at = text.find(f"\n{key} ")
            if at >= 0:
                end = text.find("\n", at + 1)
                add((ts, f"host.vmstat.{key}", int(text[at + len(key) + 2:end if end > 0 else None]), "{}"))

    def _disks(self, add, ts: float) -> None:
        exclude = self.params.disk_re.search
        for line in (self._read("diskstats") or "").splitlines():
            parts = line.split()
            if len(parts) < 14 or exclude(parts[2]):
                continue
            values = parts[3:]
            for (metric, lj), (_, i, scale) in zip(self._labelled("disk", parts[2], [c[0] for c in DISK_COLUMNS],
                                                                  "device"), DISK_COLUMNS):
                add((ts, metric, int(values[i]) * scale, lj))

    def _network(self, add, ts: float) -> None:
        exclude = self.params.net_re.search
        for line in (self._read("net", "dev") or "").splitlines()[2:]:
            nic, _, rest = line.partition(":")
            nic = nic.strip()
            if not rest or exclude(nic):
                continue
            for (metric, lj), value in zip(self._labelled("net", nic, NET_COLUMNS, "iface"), rest.split()):
                add((ts, metric, int(value), lj))

    def _sockstat(self, add, ts: float) -> None:
        for line in (self._read("net", "sockstat") or "").splitlines():
            proto, _, rest = line.partition(":")
            pairs = rest.split()
            prefix = f"host.sockstat.{proto.lower()}."
            for key, value in zip(pairs[0::2], pairs[1::2]):
                add((ts, prefix + key, int(value), "{}"))

    def _softnet(self, add, ts: float) -> None:
        for cpu, line in enumerate((self._read("net", "softnet_stat") or "").splitlines()):
            parts = line.split()
            if len(parts) < 3:
                continue
            for (metric, lj), (_, i) in zip(self._labelled("softnet", str(cpu), [c[0] for c in SOFTNET_COLUMNS],
                                                           "cpu"), SOFTNET_COLUMNS):
                add((ts, metric, int(parts[i], 16), lj))

    def _pressure(self, out: Output) -> None:
        for res in PSI_RESOURCES:
            text = self._read("pressure", res)
            if text is None:
                continue  # kernel without PSI (or disabled): nothing to report
            for kind, values in parse_psi(text).items():
                for key, value in values.items():
                    out.sample(f"host.pressure.{res}.{kind}.{key}", value)

    def _netstat(self, out: Output) -> None:
        """/proc/net/snmp (the `protocols` sections in full) and /proc/net/netstat (the `tcp_ext_keys`): the
        column positions are worked out from the header lines once; later runs only pick the value columns."""
        add, ts = out.samples.append, out.ts
        for name in ("snmp", "netstat"):
            text = self._read("net", name)
            if text is None:
                continue
            lines = text.splitlines()
            layout = self._series.get(("netstat", name))
            if layout is None or layout[0] != lines[0::2]:
                layout = self._series[("netstat", name)] = (lines[0::2], self._net_layout(name, lines))
            for row, columns in layout[1]:
                if row >= len(lines):
                    continue
                values = lines[row].split()
                for i, metric in columns:
                    value = values[i] if i < len(values) else ""
                    if value.lstrip("-").isdigit():
                        add((ts, metric, int(value), "{}"))

    def _net_layout(self, name: str, lines: list[str]) -> list:
        """[(value line index, [(column, metric), ...]), ...] for the wanted sections and keys."""
        p = self.params
        layout = []
        for row in range(0, len(lines) - 1, 2):
            proto, _, names = lines[row].partition(":")
            if name == "snmp":
                if proto not in p.protocols:
                    continue
                keys = names.split()
            else:
                if proto != "TcpExt":
                    continue
                keys = [k for k in p.tcp_ext_keys if k in names.split()]
            fields = lines[row].split()
            layout.append((row + 1, [(fields.index(k), f"host.net.{proto.lower()}.{k}") for k in keys]))
        return layout

    def _filesystems(self, out: Output) -> None:
        mounts = self._mounts()
        add, ts = out.samples.append, out.ts
        for path, lj in mounts:
            try:
                st = os.statvfs(path)
            except OSError:
                continue
            add((ts, "host.fs.size_bytes", st.f_blocks * st.f_frsize, lj))
            add((ts, "host.fs.avail_bytes", st.f_bavail * st.f_frsize, lj))
            add((ts, "host.fs.files", st.f_files, lj))
            add((ts, "host.fs.files_free", st.f_ffree, lj))

    def _mounts(self) -> list[tuple[str, str]]:
        """[(path to statvfs, label JSON)] of the reported filesystems. The mount table is re-read only when it
        changed: a kept /proc mounts file signals each change to poll() (POLLPRI), so most runs read nothing."""
        kept = self._fds.get(("mounts",))
        cached = self._series.get("mounts")
        if cached is not None and kept is not None and cached[0] == kept[0]:
            if not cached[1].poll(0):
                return cached[2]
        text = self._read("mounts")
        if text is None:
            return []
        types = set(self.params.fs_types)
        seen = set()
        mounts = []
        for line in text.splitlines():
            parts = line.split()
            if len(parts) < 3:
                continue
            device, mount, fstype = parts[:3]
            if fstype not in types or device in seen:
                continue
            seen.add(device)
            mount = mount.replace("\\040", " ")
            mounts.append((os.path.join(self.ctx.host_root, mount.lstrip("/")),
                           labels_json({"mount": mount, "fstype": fstype})))
        kept = self._fds.get(("mounts",))
        if kept is not None:  # procfs: watch it for changes from now on
            if cached is None or cached[0] != kept[0]:
                watch = select.poll()
                watch.register(kept[0], select.POLLPRI | select.POLLERR)  # changes since the open
            else:
                watch = cached[1]
            self._series["mounts"] = (kept[0], watch, mounts)
        return mounts

    def _file_nr(self, out: Output) -> None:
        try:
            allocated, _, maximum = (self._read("sys", "fs", "file-nr") or "").split()[:3]
        except ValueError:
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


def _util_pct(a: list, b: list) -> float | None:
    """Busy share of the elapsed CPU time between two /proc/stat readings (mode seconds in CPU_MODES order)."""
    # guest time is already counted in user/nice on Linux
    def split(t):
        total = sum(t[:8])
        return total, total - t[3] - t[4]  # minus idle and iowait
    (total_a, busy_a), (total_b, busy_b) = split(a), split(b)
    total = total_b - total_a
    return None if total <= 0 else round(100.0 * (busy_b - busy_a) / total, 3)
