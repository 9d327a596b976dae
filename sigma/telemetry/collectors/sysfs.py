"""Counters and states from sysfs/procfs files, e.g. InfiniBand port counters and port state.

Each entry globs files under `host_root`; `path_regex` named groups become labels and may be used in the metric
name template ({counter}); the file's first number is the value ("4: ACTIVE" -> 4, "1234" -> 1234).
"""

from __future__ import annotations

import glob
import re
from dataclasses import dataclass, field

from sigma.telemetry.base import Collector, CollectorParams, Output, register

NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


@dataclass
class SysfsFile:
    glob: str  # absolute glob, read under host_root
    metric: str  # metric name; {group} placeholders come from path_regex
    path_regex: str = ""  # regex on the path (without host_root); named groups become labels

    def __post_init__(self):
        try:
            self.compiled = re.compile(self.path_regex) if self.path_regex else None
        except re.error as exc:
            raise ValueError(f"bad path_regex {self.path_regex!r}: {exc}") from None
        names = set(self.compiled.groupindex) if self.compiled else set()
        missing = set(re.findall(r"\{(\w+)\}", self.metric)) - names
        if missing:
            raise ValueError(f"metric {self.metric!r} uses {sorted(missing)} that path_regex does not capture")


DEFAULT_FILES = [
    SysfsFile("/sys/class/infiniband/*/ports/*/counters/*", "ib.port.{counter}",
              r"/sys/class/infiniband/(?P<device>[^/]+)/ports/(?P<port>\d+)/counters/(?P<counter>[^/]+)$"),
    SysfsFile("/sys/class/infiniband/*/ports/*/state", "ib.port.state",
              r"/sys/class/infiniband/(?P<device>[^/]+)/ports/(?P<port>\d+)/state$"),
    SysfsFile("/sys/class/infiniband/*/ports/*/phys_state", "ib.port.phys_state",
              r"/sys/class/infiniband/(?P<device>[^/]+)/ports/(?P<port>\d+)/phys_state$"),
]


@register("sysfs")
class SysfsCollector(Collector):
    @dataclass
    class Params(CollectorParams):
        files: list[SysfsFile] = field(default_factory=lambda: list(DEFAULT_FILES))  # what to read

    def collect(self, out: Output) -> None:
        root = self.ctx.host_root.rstrip("/")
        for entry in self.params.files:
            for full in sorted(glob.glob(root + entry.glob)):
                rel = full[len(root):] if root else full
                labels = {}
                if entry.compiled:
                    m = entry.compiled.search(rel)
                    if m is None:
                        continue
                    labels = m.groupdict()
                try:
                    with open(full) as f:
                        text = f.read(256)
                except OSError:
                    continue  # some counters are unreadable on some firmware: skip, keep the rest
                m = NUMBER.search(text)
                if m is None:
                    continue
                value = float(m.group()) if "." in m.group() else int(m.group())
                metric = entry.metric.format(**labels)
                out.sample(metric, value, {k: v for k, v in labels.items() if "{" + k + "}" not in entry.metric})
