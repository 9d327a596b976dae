"""Where the project's files live: configs, scripts and the default state directories."""

from __future__ import annotations

import hashlib
import os
import sys
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent


def project_root() -> Path:
    """The checkout (or installed share dir) that holds configs/, prolog/, epilog/ and sbatch/."""
    for candidate in (PACKAGE_DIR.parent, Path(sys.prefix) / "share" / "sigma"):
        if (candidate / "configs").is_dir():
            return candidate
    raise FileNotFoundError(
        f"cannot find the sigma configs/ directory next to {PACKAGE_DIR} or in {sys.prefix}/share/sigma; "
        "install with `make install` (an editable install from the checkout)"
    )


def configs_dir() -> Path:
    return project_root() / "configs"


def checkout_id() -> str:
    """Eight hex digits derived from this checkout's path: several checkouts on one machine never share a local
    cluster (state directory, ports) by default."""
    return hashlib.sha1(str(PACKAGE_DIR.parent).encode()).hexdigest()[:8]


def default_cluster_dir() -> Path:
    """State directory of the local cluster: $SIGMA_CLUSTER_DIR, else ~/.local/state/sigma/cluster-<checkout id>."""
    env = os.environ.get("SIGMA_CLUSTER_DIR")
    if env:
        return Path(env).expanduser().resolve()
    return Path.home() / ".local" / "state" / "sigma" / f"cluster-{checkout_id()}"


def default_port_base() -> int:
    """First TCP port of this checkout's local cluster: 10000-19975 in steps of 25 (tests use 20000-29975)."""
    return 10000 + int(checkout_id(), 16) % 400 * 25
