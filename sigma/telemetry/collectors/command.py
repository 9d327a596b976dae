"""Metrics from a command's output, with a timeout (a hung tool never stalls the sidecar).

parse: `number` (the whole output is one number -> metric), `keyvalue` (lines "key value" -> metric.key), or
`regex` (each match of `regex`: group `value` is the value, other named groups become labels).
The exit status is reported as <metric>.exit_code; a timeout is an error of this collector run.
"""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass, field

from sigma.telemetry.base import Collector, CollectorParams, Output, register


@dataclass
class Command:
    metric: str  # metric name (prefix for keyvalue)
    argv: list[str]  # program and arguments (no shell)
    parse: str = "number"  # number, keyvalue or regex
    regex: str = ""  # for parse: regex, with a named group `value`
    timeout_s: float = 5.0  # kill the command after this long

    def __post_init__(self):
        if not self.argv:
            raise ValueError("argv must name a program")
        if self.parse not in ("number", "keyvalue", "regex"):
            raise ValueError(f"parse must be number, keyvalue or regex, not {self.parse!r}")
        self.compiled = None
        if self.parse == "regex":
            try:
                self.compiled = re.compile(self.regex, re.MULTILINE)
            except re.error as exc:
                raise ValueError(f"bad regex {self.regex!r}: {exc}") from None
            if "value" not in self.compiled.groupindex:
                raise ValueError(f"regex {self.regex!r} needs a named group (?P<value>...)")


@register("command")
class CommandCollector(Collector):
    @dataclass
    class Params(CollectorParams):
        commands: list[Command] = field(default_factory=list)  # commands to run each interval

    def collect(self, out: Output) -> None:
        failures = []
        for cmd in self.params.commands:
            try:
                proc = subprocess.run(cmd.argv, capture_output=True, text=True, timeout=cmd.timeout_s)
            except subprocess.TimeoutExpired:
                failures.append(f"{cmd.argv[0]}: timed out after {cmd.timeout_s} s")
                out.sample(f"{cmd.metric}.timeout", 1)
                continue
            except OSError as exc:
                failures.append(f"{cmd.argv[0]}: {exc.strerror}")
                continue
            out.sample(f"{cmd.metric}.exit_code", proc.returncode)
            try:
                parse_output(out, cmd, proc.stdout)
            except ValueError as exc:
                failures.append(f"{cmd.argv[0]}: {exc}")
        if failures:  # the other commands' samples are kept; the run is still reported as failed
            raise RuntimeError("; ".join(failures))


def parse_output(out: Output, cmd: Command, text: str) -> None:
    if cmd.parse == "number":
        out.sample(cmd.metric, float(text.strip()))
    elif cmd.parse == "keyvalue":
        for line in text.splitlines():
            parts = line.split()
            if len(parts) == 2:
                try:
                    out.sample(f"{cmd.metric}.{parts[0]}", float(parts[1]))
                except ValueError:
                    continue
    else:
        for m in cmd.compiled.finditer(text):
            groups = m.groupdict()
            value = float(groups.pop("value"))
            out.sample(cmd.metric, value, {k: v for k, v in groups.items() if v is not None})
