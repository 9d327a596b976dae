"""Shared helpers for the health unit tests: fixture trees copied to tmp, the test config, a context."""

from __future__ import annotations

import shutil
from pathlib import Path

from tests.conftest import FIXTURES

HEALTH = FIXTURES / "health"
TEST_CONFIG = HEALTH / "health-test.yaml"


def tree(tmp_path: Path, name: str) -> Path:
    """A private copy of a fixture root (checks write probe files and marks)."""
    dst = tmp_path / name
    shutil.copytree(HEALTH / name, dst)
    return dst


def context(root: Path, node: str, node_dir: Path, job_id=None, config=None):
    from sigma.health.config import load_health_config
    from sigma.health.context import Context

    return Context.create(config or load_health_config(TEST_CONFIG), node, root, node_dir, job_id)
