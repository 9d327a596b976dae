"""configs/telemetry.yaml: store, push, job tagging and the collectors, each checked with file:line [key] errors.

Placeholders in path-valued keys (names containing path, file, files, dir, glob, root) are expanded:
{node}, {node_dir}, {cluster_dir}, {kpi_dir}, {kernel_log}, {service_log}, {slurmd_spool}; see docs/telemetry.md.
"""

from __future__ import annotations

import dataclasses
import os
import re
import socket
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from sigma.config import ConfigError, _Source, from_dict, load_yaml
from sigma.telemetry.base import CollectorParams, load_collectors

PLACEHOLDER = re.compile(r"\{(node|node_dir|cluster_dir|kpi_dir|kernel_log|service_log|slurmd_spool)\}")
PATH_KEY = re.compile(r"(path|file|files|dir|glob|root|node_name)$")


@dataclass
class StoreConfig:
    path: str = "{node_dir}/telemetry.db"  # node-local SQLite database
    max_age_s: float = 7 * 86400.0  # rows older than this are deleted (reported if never pushed)
    max_bytes: int = 1 << 30  # database size bound; oldest rows go first (reported, never silent)
    prune_every_s: float = 30.0  # how often the bounds are enforced
    write_every_s: float = 1.0  # collected records are committed together at this cadence (fewer transactions)


@dataclass
class PushConfig:
    url: str = "http://sigma-controller:8470/v1/ingest"  # controller ingest endpoint ("" disables pushing)
    secret_file: str = "/etc/sigma/ingest.secret"  # this node's key (`sigma keys issue`) or a shared secret; 0600
    interval_s: float = 1.0  # push cadence when caught up
    max_records: int = 20000  # records per batch
    timeout_s: float = 10.0  # HTTP timeout per batch
    max_backoff_s: float = 10.0  # longest wait between retries while the controller is unreachable
    drain_on_exit_s: float = 5.0  # on SIGTERM, keep pushing the backlog this long before exiting


@dataclass
class JobsConfig:
    sources: list[str] = field(default_factory=lambda: ["proc", "kpi"])  # proc, kpi, squeue (see docs)
    refresh_s: float = 5.0  # how often the running job ids are looked up
    kpi_active_s: float = 120.0  # a job whose KPI file grew this recently counts as running here
    squeue_refresh_s: float = 30.0  # squeue source: poll interval (one call per node; keep it slow)
    slurmd_spool_dir: str = "{slurmd_spool}"  # SlurmdSpoolDir: its step sockets say which jobs run here
    proc_rescan_s: float = 60.0  # proc source without a readable spool dir: how often /proc is scanned

    def __post_init__(self):
        bad = [s for s in self.sources if s not in ("proc", "kpi", "squeue")]
        if bad:
            raise ValueError(f"unknown job source {bad[0]!r}; valid: proc, kpi, squeue")


@dataclass
class TelemetryConfig:
    node: str = ""  # node name; --node overrides; empty means the short hostname
    host_root: str = "/"  # prefix for /proc and /sys reads
    store: StoreConfig = field(default_factory=StoreConfig)  # node-local database
    push: PushConfig = field(default_factory=PushConfig)  # delivery to the controller
    jobs: JobsConfig = field(default_factory=JobsConfig)  # how rows get their SLURM job ids
    collectors: dict = field(default_factory=dict)  # section name -> collector params (checked separately)


@dataclass
class Loaded:
    config: TelemetryConfig
    collectors: dict[str, tuple[str, CollectorParams]]  # section -> (collector type, params)
    variables: dict[str, str]
    path: str


def variables_for(node: str, node_dir: str | None = None) -> dict[str, str]:
    """Placeholder values: the local-cluster layout when SIGMA_CLUSTER_DIR is set, else a real node's."""
    cluster_dir = os.environ.get("SIGMA_CLUSTER_DIR", "")
    if node_dir is None:
        node_dir = os.environ.get("SIGMA_NODE_DIR") or (
            str(Path(cluster_dir) / "nodes" / node) if cluster_dir else "/var/lib/sigma")
    kpi_dir = os.environ.get("SIGMA_KPI_DIR") or "/var/spool/sigma/kpi"
    kernel_log = str(Path(node_dir) / "kern.log") if cluster_dir else "/var/log/kern.log"
    service_log = str(Path(node_dir) / "syslog") if cluster_dir else "/var/log/syslog"
    slurmd_spool = str(Path(cluster_dir) / "spool" / node) if cluster_dir else "/var/spool/slurmd"
    return {"node": node, "node_dir": node_dir, "cluster_dir": cluster_dir, "kpi_dir": kpi_dir,
            "kernel_log": kernel_log, "service_log": service_log, "slurmd_spool": slurmd_spool}


def load(path: str | Path, node: str | None = None, node_dir: str | None = None,
         overrides: list[str] = ()) -> Loaded:
    """Parse and check the whole file; raise ConfigError naming file:line [key] on the first problem."""
    path = str(path)
    data, source = load_yaml(path)
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(source.where(()), "the telemetry config must be a mapping")
    for item in overrides:
        _apply_override(data, item)
    cfg = from_dict(TelemetryConfig, data, source)
    name = node or cfg.node or socket.gethostname().split(".")[0]
    cfg.node = name
    variables = variables_for(name, node_dir)
    _expand(cfg, variables)
    registry = load_collectors()
    collectors = {}
    if not isinstance(cfg.collectors, dict):
        raise ConfigError(source.where(("collectors",)), "collectors must be a mapping of section -> settings")
    for section, raw in cfg.collectors.items():
        key = ("collectors", section)
        raw = raw if raw is not None else {}
        if not isinstance(raw, dict):
            raise ConfigError(source.where(key), f"expected a mapping of settings, got {type(raw).__name__}")
        kind = raw.get("type") or section
        if kind not in registry:
            where = source.where(key + (("type",) if "type" in raw else ()))
            raise ConfigError(where, f"unknown collector {kind!r}; known collectors: {', '.join(sorted(registry))}")
        params = from_dict(registry[kind].Params, raw, source, key)
        _expand(params, variables)
        if kind == "logtail" and params.source == "auto" and variables["cluster_dir"]:
            # an emulated node of the local cluster: its kernel log is its kern.log (its services' log its syslog),
            # never the host's journal, /dev/kmsg or syslog files, which are not that node's
            own = variables["service_log"] if params.log_name == "service" else variables["kernel_log"]
            params.auto_order, params.files = ["files"], [own]
        collectors[section] = (kind, params)
    return Loaded(cfg, collectors, variables, path)


def _apply_override(data: dict, item: str) -> None:
    """--set a.b.c=VALUE (VALUE parsed as YAML) applied before checking, like an edit of the file."""
    key, sep, value = item.partition("=")
    if not sep or not key:
        raise ConfigError("--set", f"expected KEY=VALUE, got {item!r}")
    parts = key.split(".")
    node = data
    for part in parts[:-1]:
        node = node.setdefault(part, {})
        if not isinstance(node, dict):
            raise ConfigError(f"--set [{key}]", f"{part!r} is not a mapping")
    node[parts[-1]] = yaml.safe_load(value)


def _expand(obj, variables: dict[str, str]) -> None:
    """Expand placeholders in path-like string fields (regexes are left alone: {2} is a quantifier there)."""
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        if not PATH_KEY.search(f.name):
            if dataclasses.is_dataclass(value):
                _expand(value, variables)
            elif isinstance(value, list):
                for v in value:
                    if dataclasses.is_dataclass(v):
                        _expand(v, variables)
            continue
        if isinstance(value, str):
            setattr(obj, f.name, _sub(value, variables))
        elif isinstance(value, list):
            setattr(obj, f.name, [_sub(v, variables) if isinstance(v, str) else v for v in value])


def _sub(text: str, variables: dict[str, str]) -> str:
    return PLACEHOLDER.sub(lambda m: variables[m.group(1)], text)


__all__ = ["ConfigError", "Loaded", "TelemetryConfig", "load", "variables_for", "_Source"]
