"""configs/telemetry.yaml: the shipped file loads; errors name file, line and key; placeholders expand."""

from __future__ import annotations

import pytest

from sigma.config import ConfigError
from sigma.paths import configs_dir
from sigma.telemetry.config import load


def write(tmp_path, text: str):
    path = tmp_path / "telemetry.yaml"
    path.write_text(text)
    return path


def test_shipped_config_loads_with_local_cluster_placeholders(monkeypatch, tmp_path):
    monkeypatch.setenv("SIGMA_CLUSTER_DIR", str(tmp_path))
    monkeypatch.setenv("SIGMA_KPI_DIR", str(tmp_path / "kpi"))
    monkeypatch.delenv("SIGMA_NODE_DIR", raising=False)
    loaded = load(configs_dir() / "telemetry.yaml", node="node3")
    node_dir = tmp_path / "nodes" / "node3"
    assert loaded.config.store.path == f"{node_dir}/telemetry.db"
    kinds = {section: kind for section, (kind, _) in loaded.collectors.items()}
    assert {"host", "nvml", "logtail", "sysfs", "kpi", "health", "command"} <= set(kinds.values())
    kernel = loaded.collectors["kernel"][1]
    assert kernel.files == [f"{node_dir}/kern.log"]
    assert kernel.patterns[0].regex.startswith("NVRM: Xid")  # regexes are not placeholder-expanded
    kpi = loaded.collectors["kpi"][1]
    assert (kpi.dir, kpi.node_name) == (str(tmp_path / "kpi"), "node3")
    assert loaded.collectors["health"][1].dir == f"{node_dir}/health"


def test_an_emulated_nodes_kernel_log_is_its_kern_log_only(monkeypatch, tmp_path):
    monkeypatch.setenv("SIGMA_CLUSTER_DIR", str(tmp_path))
    kernel = load(configs_dir() / "telemetry.yaml", node="node3").collectors["kernel"][1]
    assert (kernel.order, kernel.files) == (["files"], [str(tmp_path / "nodes" / "node3" / "kern.log")])


def test_real_node_defaults(monkeypatch):
    for var in ("SIGMA_CLUSTER_DIR", "SIGMA_KPI_DIR", "SIGMA_NODE_DIR"):
        monkeypatch.delenv(var, raising=False)
    loaded = load(configs_dir() / "telemetry.yaml", node="gpu001")
    assert loaded.config.store.path == "/var/lib/sigma/telemetry.db"
    kernel = loaded.collectors["kernel"][1]
    assert (kernel.source, kernel.order) == ("auto", ["journal", "kmsg", "files"])
    assert kernel.files == ["/var/log/kern.log", "/var/log/messages"]
    assert loaded.collectors["kpi"][1].dir == "/var/spool/sigma/kpi"


@pytest.mark.parametrize("text, where, message", [
    ("collectors:\n  host: {}\n  gpu_magic:\n    interval_s: 1\n", ":3 [collectors.gpu_magic]",
     "unknown collector 'gpu_magic'; known collectors: command, health, host, jobprocs, kpi, logtail, nvml, procs, sysfs"),
    ("collectors:\n  k:\n    type: logtail\n    files: [/x]\n    patterns:\n      - name: bad\n"
     "        regex: 'Xid (('\n", ":6 [collectors.k.patterns.0]", "bad regex 'Xid (('"),
    ("collectors:\n  host:\n    interval_s: fast\n", ":3 [collectors.host.interval_s]", "expected a number"),
    ("collectors:\n  host:\n    percpu: true\n    colour: red\n", ":4 [collectors.host.colour]",
     "unknown key 'colour'"),
    ("store:\n  max_bytes: 1.5\n", ":2 [store.max_bytes]", "expected int"),
    ("jobs:\n  sources: [proc, crystal_ball]\n", ":1 [jobs]", "unknown job source 'crystal_ball'"),
    ("collectors:\n  k:\n    type: logtail\n    interval_s: 1\n", ":2 [collectors.k]", "logtail needs something to read"),
    ("collectors:\n  x:\n    type: command\n    commands:\n      - metric: m\n        argv: [/bin/true]\n"
     "        parse: regex\n        regex: '(?P<v>1)'\n", ":5 [collectors.x.commands.0]", "(?P<value>"),
])
def test_config_errors_name_file_line_and_key(tmp_path, text, where, message):
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as exc:
        load(path, node="n1")
    assert str(exc.value).startswith(f"{path}{where}: ")
    assert message in str(exc.value)


def test_overrides_apply_before_checking(tmp_path):
    path = write(tmp_path, "collectors:\n  host:\n    interval_s: 1\n")
    loaded = load(path, node="n1", overrides=["collectors.host.interval_s=5", "push.url=http://h:1/v1/ingest"])
    assert loaded.collectors["host"][1].interval_s == 5
    assert loaded.config.push.url == "http://h:1/v1/ingest"
    with pytest.raises(ConfigError, match=r"collectors.host.interval_s\]: expected a number"):
        load(path, node="n1", overrides=["collectors.host.interval_s=soon"])
