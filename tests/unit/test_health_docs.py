"""docs/health.md covers every check, every health subcommand and every config key."""

import dataclasses

from sigma.health import config as cfg
from sigma.health.checks import CHECK_NAMES
from tests.conftest import REPO

DOC = (REPO / "docs" / "health.md").read_text()


def test_every_check_is_documented():
    assert [n for n in CHECK_NAMES if f"`{n}`" not in DOC] == []


def test_every_subcommand_is_documented():
    for cmd in ("health run", "health prolog", "health epilog", "health log-ack", "health baseline record",
                "health baseline show", "health list"):
        assert f"sigma {cmd}" in DOC, cmd


def test_every_config_key_is_documented():
    keys = set()
    for cls in (cfg.HealthConfig, cfg.HookConfig, cfg.CheckConfig, cfg.NodeProfile, cfg.DiskPath):
        keys |= {f.name for f in dataclasses.fields(cls)}
    assert sorted(k for k in keys if f"`{k}`" not in DOC) == []
