"""configs/health.yaml loads, node patterns pick profiles, mistakes are reported with file:line."""

import pytest

from sigma.config import ConfigError
from sigma.health.checks import CHECK_NAMES, load
from sigma.health.config import load_health_config
from sigma.paths import configs_dir


def test_repo_config_loads_and_names_every_check():
    config = load_health_config(configs_dir() / "health.yaml")
    assert set(config.suites) == {"prolog", "epilog", "comprehensive"}
    assert set(config.suites["comprehensive"]) == set(CHECK_NAMES)
    assert config.prolog.budget_s == 10 and config.prolog.tool_failure == "ignore"
    gpu = config.profile("gpu137")
    assert (gpu.type, gpu.gpus, gpu.ib_ports, gpu.kernel_log) == ("gpu-8x", 8, 8, "auto")
    local = config.profile("node3")
    assert local.kernel_log == "{node_dir}/kern.log" and local.type == "local"
    other = config.profile("login1")
    assert other.type == "default" and other.kernel_log == "auto" and other.gpus is None


def test_every_check_module_has_category_run_and_doc():
    for name in CHECK_NAMES:
        module = load(name)
        assert module.CATEGORY and callable(module.run) and module.__doc__


def test_unknown_check_in_suite_names_file_and_line(tmp_path):
    path = tmp_path / "h.yaml"
    path.write_text("suites:\n  prolog: [kernel_log, gpu_burn]\n  epilog: []\n  comprehensive: []\n")
    with pytest.raises(ConfigError, match=r"h.yaml:1.*unknown check 'gpu_burn'"):
        load_health_config(path)


def test_unknown_key_lists_valid_keys(tmp_path):
    path = tmp_path / "h.yaml"
    path.write_text("suites: {prolog: [], epilog: [], comprehensive: []}\nnodes:\n  - pattern: gpu[1-2]\n"
                    "    gpu: 8\n")
    with pytest.raises(ConfigError, match=r"h.yaml:4 \[nodes.0.gpu\]: unknown key 'gpu'; valid keys: .*gpus"):
        load_health_config(path)


def test_bad_policy_value(tmp_path):
    path = tmp_path / "h.yaml"
    path.write_text("suites: {prolog: [], epilog: [], comprehensive: []}\nprolog:\n  tool_failure: drain\n")
    with pytest.raises(ConfigError, match=r"h.yaml:3 \[prolog.tool_failure\]: must be one of 'ignore', 'reject'"):
        load_health_config(path)
