"""Typed YAML configs: clear errors with file, line and key."""

from dataclasses import dataclass, field

import pytest

from sigma.config import ConfigError, load_config


@dataclass
class Check:
    name: str
    timeout_s: float = 5.0  # per-check budget


@dataclass
class Suite:
    interval_s: float = 1.0  # how often
    enabled: bool = True  # on or off
    checks: list[Check] = field(default_factory=list)  # what runs
    labels: dict[str, str] = field(default_factory=dict)  # extra labels
    level: int | None = None  # optional


def write(tmp_path, text):
    p = tmp_path / "c.yaml"
    p.write_text(text)
    return p


def test_loads_nested_and_defaults(tmp_path):
    p = write(tmp_path, "interval_s: 2\nchecks:\n  - name: gpu\n  - name: disk\n    timeout_s: 1.5\n")
    s = load_config(Suite, p)
    assert s.interval_s == 2.0 and s.enabled and [c.name for c in s.checks] == ["gpu", "disk"]
    assert s.checks[1].timeout_s == 1.5 and s.level is None


def test_unknown_key_names_line_and_valid_keys(tmp_path):
    p = write(tmp_path, "interval_s: 2\nchecks:\n  - name: gpu\n    timeout: 3\n")
    with pytest.raises(ConfigError) as err:
        load_config(Suite, p)
    msg = str(err.value)
    assert f"{p}:4 [checks.0.timeout]" in msg and "valid keys: name, timeout_s" in msg


def test_wrong_type_names_key(tmp_path):
    p = write(tmp_path, "enabled: yes\ninterval_s: fast\n")
    with pytest.raises(ConfigError, match=r"c.yaml:2 \[interval_s\]: expected a number, got str 'fast'"):
        load_config(Suite, p)


def test_missing_required_and_bad_yaml(tmp_path):
    with pytest.raises(ConfigError, match=r"\[checks.0\]: missing required key 'name'"):
        load_config(Suite, write(tmp_path, "checks:\n  - timeout_s: 1\n"))
    with pytest.raises(ConfigError, match=r"c.yaml:2: invalid YAML"):
        load_config(Suite, write(tmp_path, "a: [1\nb: 2\n"))


def test_section(tmp_path):
    p = write(tmp_path, "suite:\n  interval_s: 3\nother: 1\n")
    assert load_config(Suite, p, "suite").interval_s == 3.0
    assert load_config(Suite, p, "absent").interval_s == 1.0
