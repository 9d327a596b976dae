"""Where sigma's files live: the shipped files (configs, units, hooks, job scripts), the deployed layout on a
cluster's hosts, and the local cluster's default state directories."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent
SHIPPED_DIRS = ("configs", "daemons", "prolog", "epilog", "sbatch")  # setup.py carries these in the wheel

# The deployed layout (docs/deploy.md), one for every host: the units, the prolog/epilog wrappers, cron lines and
# the docs all use these paths.
PREFIX = Path("/opt/sigma")  # the virtual environment the wheel is installed into
BIN = PREFIX / "bin" / "sigma"  # ... and its commands: sigma, sigma-prolog, sigma-epilog
ETC = Path("/etc/sigma")  # site configs and keys: a file here overrides the shipped one of the same name
VAR_LIB = Path("/var/lib/sigma")  # controller database; a node's telemetry store and health results
KPI_DIR = Path("/var/spool/sigma/kpi")  # job KPI files (world-writable, sticky)
LOG_DIR = Path("/var/log/sigma")  # controller logs, rule learning's log


def project_root() -> Path:
    """The directory that holds configs/, daemons/, prolog/, epilog/ and sbatch/: the checkout (an editable
    install) or, in an installed wheel, the package's share/ directory."""
    for candidate in (PACKAGE_DIR.parent, PACKAGE_DIR / "share"):
        if (candidate / "configs").is_dir():
            return candidate
    raise FileNotFoundError(
        f"the sigma package at {PACKAGE_DIR} lacks its shipped files (share/configs): it was not installed from a "
        f"wheel built by setup.py; reinstall it (`pip install sigma_slurm-*.whl`, or `make install` in a checkout)")


def configs_dir() -> Path:
    return project_root() / "configs"


def config_file(name: str) -> Path:
    """A config by name: the site's copy under /etc/sigma when there is one, else the shipped one."""
    site = ETC / name
    return site if site.exists() else configs_dir() / name


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
