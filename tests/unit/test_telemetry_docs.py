"""docs/telemetry.md covers every collector, every config key and every `sigma sidecar` option."""

from __future__ import annotations

import dataclasses

from sigma.cli import build_parser
from sigma.telemetry.base import load_collectors
from sigma.telemetry.collectors.command import Command
from sigma.telemetry.collectors.logtail import Pattern
from sigma.telemetry.collectors.sysfs import SysfsFile
from sigma.telemetry.config import JobsConfig, PushConfig, StoreConfig, TelemetryConfig
from tests.conftest import REPO

DOC = (REPO / "docs" / "telemetry.md").read_text()


def test_every_collector_and_config_key_is_documented():
    classes = [TelemetryConfig, StoreConfig, PushConfig, JobsConfig, Pattern, SysfsFile, Command]
    registry = load_collectors()
    missing = [f"collector {name}" for name in registry if f"`{name}`" not in DOC]
    for cls in classes + [c.Params for c in registry.values()]:
        missing += [f"{cls.__qualname__}.{f.name}" for f in dataclasses.fields(cls) if f"`{f.name}`" not in DOC]
    assert not missing, f"undocumented in docs/telemetry.md: {missing}"


def test_every_sidecar_option_is_documented():
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    sidecar = sub.choices["sidecar"]
    options = [o for a in sidecar._actions for o in a.option_strings if o.startswith("--") and o != "--help"]
    missing = [o for o in options if o not in DOC and o != "--log-level"]
    assert not missing, f"undocumented sidecar options: {missing}"
