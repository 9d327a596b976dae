"""configs/health.yaml as typed dataclasses: suites, per-check settings, expected hardware per node pattern."""

from __future__ import annotations

import os
from dataclasses import dataclass, field, fields
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal

from sigma.config import ConfigError, load_config
from sigma.paths import config_file, project_root


@dataclass
class CheckConfig:
    timeout_s: float = 5.0  # the check is abandoned (status timeout) after this long
    on_fail: Literal["reject", "warn"] = "reject"  # warn: report a failure without rejecting the node
    args: dict[str, Any] = field(default_factory=dict)  # check-specific arguments (see docs/health.md)


@dataclass
class DiskPath:
    path: str  # directory that must exist, be writable and have free space (read under the host root)
    min_free_gb: float = 1.0  # minimum free space in GiB
    writable: bool = True  # create, write, fsync and remove a probe file


@dataclass
class NodeProfile:
    """Expected hardware and host paths of the nodes a pattern names; unset (null) fields come from defaults."""

    pattern: str = ""  # SLURM hostlist, e.g. gpu[001-512]; empty only in `defaults`
    type: str | None = None  # node type: baselines are kept per type
    gpus: int | None = None  # accelerators NVML must show; 0 or null = none expected (checks skip without NVML)
    ib_ports: int | None = None  # InfiniBand ports that must be ACTIVE/LinkUp; null = check the ones present
    kernel_log: str | None = None  # "kmsg", "/dev/kmsg", or a file path; {node}, {node_dir} are substituted
    mounts: list[str] | None = None  # mount points that must be mounted
    interfaces: list[str] | None = None  # network interfaces that must be up; empty = every non-loopback present
    disk_paths: list[DiskPath] | None = None  # directories checked by the disk check
    max_gpu_temp_c: float | None = None  # GPU temperature limit


DEFAULT_PROFILE = NodeProfile(type="default", gpus=None, ib_ports=None, kernel_log="kmsg", mounts=[],
                              interfaces=[], disk_paths=[DiskPath("/tmp")], max_gpu_temp_c=85.0)


@dataclass
class HookConfig:
    suite: str = "prolog"  # suite to run
    budget_s: float = 10.0  # hard total budget for the whole run, process start included
    drop_caches: bool = True  # sync; echo <drop_caches_mode> > /proc/sys/vm/drop_caches
    drop_caches_mode: int = 3  # 1 page cache, 2 dentries/inodes, 3 both
    kill_job_processes: bool = False  # epilog: kill processes the finished job left behind
    tool_failure: Literal["ignore", "reject"] = "ignore"  # sigma's own error/timeout: keep node (ignore) or drain
    mode: Literal["act", "observe"] = "act"  # observe: run and record every check, exit 0 whatever they find
    # (SLURM drains nothing), leave the job's leftover processes alone (docs/rollout.md)


@dataclass
class HealthConfig:
    root: str = "/"  # host root for every /proc, /sys and log read (fixture trees in tests)
    node_dir: str = ""  # where results go; empty = $SIGMA_NODE_DIR, $SIGMA_CLUSTER_DIR/nodes/<node>, /var/lib/sigma
    baseline_file: str = "{project}/configs/health-baselines.json"  # performance baselines per node type
    slurmd_spool_dir: str = ""  # where slurmd keeps step sockets; empty = SlurmdSpoolDir from $SLURM_CONF
    torch_threads: int = 2  # CPU threads for torch/numpy measurements
    prolog: HookConfig = field(default_factory=HookConfig)  # `sigma health prolog`
    epilog: HookConfig = field(default_factory=lambda: HookConfig(suite="epilog", budget_s=30.0,
                                                                  kill_job_processes=True))
    comprehensive: HookConfig = field(default_factory=lambda: HookConfig(suite="comprehensive", budget_s=900.0,
                                                                         drop_caches=False))
    suites: dict[str, list[str]] = field(default_factory=dict)  # suite name -> check names, in order
    checks: dict[str, CheckConfig] = field(default_factory=dict)  # per-check timeout, on_fail, args
    defaults: NodeProfile = field(default_factory=lambda: DEFAULT_PROFILE)  # for nodes no pattern names
    nodes: list[NodeProfile] = field(default_factory=list)  # first matching pattern wins

    def __post_init__(self):
        from sigma.health.checks import CHECK_NAMES

        for suite, names in self.suites.items():
            for name in names:
                if name not in CHECK_NAMES:
                    raise ValueError(f"suite {suite!r} names unknown check {name!r}; "
                                     f"checks: {', '.join(CHECK_NAMES)}")
        for name in self.checks:
            if name not in CHECK_NAMES:
                raise ValueError(f"checks: unknown check {name!r}; checks: {', '.join(CHECK_NAMES)}")
        for i, prof in enumerate(self.nodes):
            if not prof.pattern:
                raise ValueError(f"nodes[{i}] needs a pattern")
        for hook in (self.prolog, self.epilog, self.comprehensive):
            if hook.suite not in self.suites:
                raise ValueError(f"hook suite {hook.suite!r} is not defined in suites ({', '.join(self.suites)})")

    def check(self, name: str) -> CheckConfig:
        return self.checks.get(name) or CheckConfig()

    def hook(self, name: str) -> HookConfig:
        return {"prolog": self.prolog, "epilog": self.epilog, "comprehensive": self.comprehensive}[name]

    def profile(self, node: str) -> NodeProfile:
        """The node's profile: first pattern naming it, unset fields filled from defaults."""
        base = _complete(self.defaults, DEFAULT_PROFILE)
        for prof in self.nodes:
            if node in _expand(prof.pattern):
                return _complete(prof, base)
        return base


def _complete(profile: NodeProfile, base: NodeProfile) -> NodeProfile:
    values = {f.name: getattr(profile, f.name) for f in fields(NodeProfile)}
    for k, v in values.items():
        if v is None and k != "pattern":
            values[k] = getattr(base, k)
    return NodeProfile(**values)


@lru_cache(maxsize=64)
def _expand(pattern: str) -> frozenset[str]:
    from sigma.slurm.types import expand_hostlist

    return frozenset(expand_hostlist(pattern))


def default_config_path() -> Path:
    env = os.environ.get("SIGMA_HEALTH_CONFIG")
    if env:
        return Path(env)
    cluster = os.environ.get("SIGMA_CLUSTER_DIR")  # the local platform's own (sigma stack up in observe mode)
    if cluster and (Path(cluster) / "etc" / "health.yaml").exists():
        return Path(cluster) / "etc" / "health.yaml"
    return config_file("health.yaml")


def load_health_config(path: str | Path | None = None) -> HealthConfig:
    return load_config(HealthConfig, path or default_config_path())


def expand_template(text: str, **values: str) -> str:
    values.setdefault("project", str(project_root()))
    try:
        return text.format(**values)
    except KeyError as exc:
        raise ConfigError(text, f"unknown placeholder {exc}; valid: {', '.join('{' + k + '}' for k in values)}") from None
