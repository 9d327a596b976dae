"""docs/controller.md covers every controller command and config key; shipped configs load."""

import dataclasses
import re

from sigma.cli import build_parser
from sigma.controller.retention import RetentionConfig
from sigma.controller.config import (BreakerConfig, ControllerConfig, IngestConfig, IsolationConfig, Playbook,
                                     RemediationConfig, ValidationConfig, WatchdogConfig, load_controller_config,
                                     load_remediation_config)
from sigma.paths import configs_dir, project_root

DOC = (project_root() / "docs" / "controller.md").read_text()


def test_every_config_key_is_documented():
    for cls in (ControllerConfig, BreakerConfig, WatchdogConfig, IsolationConfig, IngestConfig, RemediationConfig,
                ValidationConfig, Playbook, RetentionConfig):
        for f in dataclasses.fields(cls):
            assert re.search(rf"`[^`]*\b{f.name}\b[^`]*`", DOC), f"{cls.__name__}.{f.name} not in docs/controller.md"


def test_every_command_is_documented():
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    for name in ("controller", "nodes", "incidents", "explain", "report"):
        assert name in sub.choices
        assert f"sigma {name}" in DOC


def test_shipped_configs_load_and_name_real_files():
    cfg = load_controller_config(configs_dir() / "controller.yaml")
    rem = load_remediation_config(configs_dir() / "remediation.yaml")
    assert (project_root() / cfg.rules).is_dir() and (project_root() / cfg.remediation).is_file()
    assert (project_root() / rem.validation.script).is_file()
    assert cfg.watchdog.hang_timeout_s == 120 and rem.playbook_for("gpu-xid-79", "gpu-reset", "drain+reboot").kind == "reboot"
    assert (project_root() / "daemons" / "sigma-controller.service").read_text().count("sigma controller run") >= 1
