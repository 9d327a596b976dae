"""What a check sees: the host root, the node and its profile, state/result directories and cached facts."""

from __future__ import annotations

import os
import socket
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from sigma.health.config import HealthConfig, NodeProfile, expand_template


def node_name() -> str:
    return os.environ.get("SLURMD_NODENAME") or socket.gethostname().split(".")[0]


def cluster_dir_from_env() -> Path | None:
    """$SIGMA_CLUSTER_DIR, else the local cluster that owns $SLURM_CONF (slurmd gives scripts only SLURM_CONF)."""
    env = os.environ.get("SIGMA_CLUSTER_DIR")
    if env:
        return Path(env)
    conf = os.environ.get("SLURM_CONF")
    if conf:
        state = Path(conf).resolve().parent.parent
        if (state / "cluster.json").exists():
            return state
    return None


def resolve_node_dir(node: str, configured: str = "") -> Path:
    """Contract: $SIGMA_NODE_DIR, else $SIGMA_CLUSTER_DIR/nodes/<node> on the local cluster, else /var/lib/sigma."""
    if configured:
        return Path(expand_template(configured, node=node))
    if os.environ.get("SIGMA_NODE_DIR"):
        return Path(os.environ["SIGMA_NODE_DIR"])
    cluster = cluster_dir_from_env()
    if cluster is not None:
        return cluster / "nodes" / node
    return Path("/var/lib/sigma")


@dataclass
class Context:
    config: HealthConfig
    node: str
    profile: NodeProfile
    root: Path
    node_dir: Path
    job_id: int | None = None
    suite: str = ""
    _facts: dict[str, Any] = field(default_factory=dict, repr=False)
    _locks: dict[str, threading.Lock] = field(default_factory=dict, repr=False)
    _guard: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @classmethod
    def create(cls, config: HealthConfig, node: str | None = None, root: str | Path | None = None,
               node_dir: str | Path | None = None, job_id: int | None = None, suite: str = "") -> "Context":
        node = node or node_name()
        root = Path(root or os.environ.get("SIGMA_HEALTH_ROOT") or config.root)
        ndir = Path(node_dir) if node_dir else resolve_node_dir(node, config.node_dir)
        return cls(config, node, config.profile(node), root, ndir, job_id, suite)

    def host(self, path: str | Path) -> Path:
        """A host path (/proc/meminfo, /sys/class/net, a log file) under the configured root."""
        path = Path(path)
        if self.root == Path("/"):
            return path
        return self.root / str(path).lstrip("/")

    def template(self, text: str) -> str:
        return expand_template(text, node=self.node, node_dir=str(self.node_dir))

    @property
    def state_dir(self) -> Path:
        """Where checks remember things between runs (e.g. the kernel-log mark)."""
        return self.node_dir / "health"

    def fact(self, name: str, gather: Callable[[], Any]) -> Any:
        """Gather a fact once per run; concurrent askers wait for the first gather."""
        with self._guard:
            if name in self._facts:
                return self._facts[name]
            lock = self._locks.setdefault(name, threading.Lock())
        with lock:
            if name not in self._facts:
                self._facts[name] = gather()
            return self._facts[name]

    def forget(self, name: str) -> None:
        """Drop a cached fact that is no longer true (the process table after a kill, re-read baselines)."""
        with self._guard:
            self._facts.pop(name, None)
