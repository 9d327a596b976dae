"""Try a fault line the way a node would produce it: through the sidecar's own log patterns into the rules.

The fault catalogue is two halves that must agree: the sidecar's log sections (configs/telemetry.yaml) turn a line
into an event of some kind, and the rules (configs/rules) act on events. `try_line` runs one line, wrapped in
one of the log formats, through a real log-tail collector built from the telemetry config and then through the
rule matcher, and says which rules fired and what they decided. Tests check every example of every rule with it;
bench/catalogue.py prints the table.
"""

from __future__ import annotations

import json
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from sigma.findings import Finding
from sigma.rules.matcher import evaluate
from sigma.rules.schema import DRAIN_ACTIONS, Rule
from sigma.telemetry import logformats

# Where a fault's line is written, by the event kind its rule matches (the rest is the kernel's log), and the
# telemetry section that reads it there.
TARGET_BY_KIND = {"dcgm_health": "dcgm", "nccl_timeout": "job", "nccl_error": "job", "cuda_error": "job",
                  "cuda_driver_unusable": "job", "slurm_prolog_failed": "job", "rdma_device_unusable": "job",
                  "coordination_lost": "job", "burn_in_failed": "job", "slurm_batch_script_lost": "job", "shm_exhausted": "job",
                  "slurm_node_failure": "job",
                  "unit_failed": "service",
                  "service_error": "service", "disk_health_warning": "service", "slurm_error": "service"}
SECTION_BY_TARGET = {"kernel": "kernel", "dcgm": "dcgm", "job": "job_output", "service": "services"}
# Envelopes a target's lines can have: job output and DCGM output are written by programs, not by syslog; a kernel
# line without an envelope has no known writer and is not acted on (logformats.unattributed).
FORMATS_BY_TARGET = {"kernel": tuple(f for f in logformats.FORMATS if f != "plain"), "dcgm": ("plain",),
                     "job": ("plain",), "service": logformats.SERVICE_FORMATS}
LINE_SOURCES = ("log", "service")  # events.source of a line's event (the kernel's and job output; a service's)
JOB_ID = 4242


def target_of(rule: Rule) -> str:
    kinds = rule.log.kinds if rule.log is not None else []
    return next((TARGET_BY_KIND[k] for k in kinds if k in TARGET_BY_KIND), "kernel")


@dataclass
class Outcome:
    rule_id: str  # the rule the line should trigger
    format: str
    line: str  # what was written
    events: list[dict] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)
    expected_action: str = ""

    @property
    def fired(self) -> bool:
        return any(f.rule_id == self.rule_id and f.action == self.expected_action for f in self.findings)

    @property
    def wrong_drain(self) -> list[str]:
        """Other rules that would take the node out although the expected rule does not."""
        if self.expected_action in DRAIN_ACTIONS:
            return []
        return [f.rule_id for f in self.findings if f.rule_id != self.rule_id and f.action in DRAIN_ACTIONS]

    @property
    def correct(self) -> bool:
        return self.fired and not self.wrong_drain


def sidecar_sections(config: str | Path) -> dict[str, object]:
    """The logtail sections of a telemetry config, section -> params (placeholders for a node named node1)."""
    from sigma.telemetry.config import load

    loaded = load(config, node="node1", node_dir="/nonexistent")
    return {name: params for name, (kind, params) in loaded.collectors.items() if kind == "logtail"}


def try_line(rules: list[Rule], rule: Rule, example: str, fmt: str, sections: dict[str, object],
             *, now: float | None = None) -> Outcome:
    """Write `example` (count times, for rules that need several) in format `fmt` where its target's section reads
    it, collect, and evaluate every rule over the events."""
    import time
    from dataclasses import replace

    from sigma.telemetry.base import Context, Output
    from sigma.telemetry.collectors.logtail import LogTailCollector

    now = time.time() if now is None else now
    target = target_of(rule)
    section = SECTION_BY_TARGET[target]
    parsed = logformats.parse(example)  # a service's example names its program in its envelope
    message, ident = parsed.message, (parsed.ident if target == "service" else "kernel")
    count = rule.log.count if rule.log is not None else 1
    # written when the rule would see it: a node up for a while, or in its first minutes for a rule on boot
    uptime = rule.log.max_uptime_s / 2 if rule.log is not None and rule.log.max_uptime_s else 5843.0
    booted = now - uptime
    lines = [logformats.render(message, fmt, ts=now - count + i, host="node1", uptime=uptime - count + i, seq=10 + i,
                               ident=ident) for i in range(count)]
    if section not in sections:  # a telemetry config without that log section: the line never becomes an event
        return Outcome(rule.id, fmt, lines[-1], [], [], rule.action)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        (root / "proc").mkdir()
        (root / "proc" / "stat").write_text(f"cpu 0 0 0 0\nbtime {booted}\n")
        path = root / f"job-{JOB_ID}" / "output.node1.log" if target == "job" else root / "kern.log"
        path.parent.mkdir(exist_ok=True)
        path.write_text("")
        base = sections[section]
        if fmt == "kmsg":
            params = replace(base, files=[], source="kmsg", kmsg_path=str(path), start_at="start")
        else:
            params = replace(base, files=[str(path)], source="files", start_at="start")
        collector = LogTailCollector(section, params, Context(node="node1", node_dir=tmp, host_root=tmp))
        path.write_text("".join(line + "\n" for line in lines))
        out = Output(ts=now)
        try:
            collector.collect(out)
        finally:
            collector.close()
    events = [{"id": i, "node": "node1", "ts": e[0], "source": e[1], "kind": e[2], "severity": e[3], "message": e[4],
               "fields": json.loads(e[5]), "job_ids": json.loads(e[6]) if e[6] else [JOB_ID]}
              for i, e in enumerate(out.events) if e[1] in LINE_SOURCES]
    findings = evaluate(rules, now=now + 1, events=events)
    return Outcome(rule.id, fmt, lines[-1], events, findings, rule.action)


def cases(rules: list[Rule]) -> list[tuple[Rule, str, str]]:
    """(rule, example line, format) for every example of every log rule in every format its target writes."""
    out = []
    for rule in rules:
        if rule.log is None or not rule.enabled:
            continue
        for example in rule.examples:
            for fmt in FORMATS_BY_TARGET[target_of(rule)]:
                out.append((rule, example, fmt))
    return out


def act_on_file(rules: list[Rule], sections: dict[str, object], path: str | Path, *, section: str = "kernel",
                now: float | None = None) -> tuple[list[dict], list[Finding]]:
    """Every line of a whole log file (a real node's, or a public sample) through one sidecar section and the rules.

    Lines are judged as if read now, with their own time stamps ignored (a sample from years ago must still be
    classified), so what a rule would decide about each line shows."""
    import time
    from dataclasses import replace

    from sigma.telemetry.base import Context, Output
    from sigma.telemetry.collectors.logtail import LogTailCollector

    now = time.time() if now is None else now
    params = replace(sections[section], files=[str(path)], source="files", start_at="start",
                     max_events_per_run=1_000_000)
    with tempfile.TemporaryDirectory() as tmp:
        collector = LogTailCollector(section, params, Context(node="node1", node_dir=tmp, host_root=tmp))
        out = Output(ts=now)
        try:
            collector.collect(out)
        finally:
            collector.close()
    events = [{"id": i, "node": "node1", "ts": now, "source": e[1], "kind": e[2], "severity": e[3],
               "message": e[4], "fields": json.loads(e[5]), "job_ids": [JOB_ID]}
              for i, e in enumerate(out.events) if e[1] in LINE_SOURCES]
    return events, evaluate(rules, now=now + 1, events=events)
