"""Where the project's files live: configs, scripts and the default state directories."""

from __future__ import annotations

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


def default_cluster_dir() -> Path:
    """State directory of the local cluster: $SIGMA_CLUSTER_DIR, else ~/.local/state/sigma/cluster."""
    env = os.environ.get("SIGMA_CLUSTER_DIR")
    if env:
        return Path(env).expanduser().resolve()
    return Path.home() / ".local" / "state" / "sigma" / "cluster"
