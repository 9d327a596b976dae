"""Debian root file systems with another release's Slurm: run the local cluster, its tests and benches there.

`python -m sigma.slurm.rootfs build trixie` makes /var/cache/sigma/rootfs/trixie (`debootstrap --variant=minbase`
from the mirror apt uses here, then Debian's own slurm-wlm, slurmdbd, munge and mariadb-server, and a venv with
sigma's dependencies but torch); `... run trixie -- CMD` runs CMD in it, with this checkout at its own path.
A built file system is reused (its stamp records what went in) until what goes in changes.

Each run gets a private mount namespace (/proc, /dev, /sys and the checkout bind-mounted; a fresh /tmp), so
nothing stays mounted when it ends and two runs never see each other's /tmp. The network and the process table
are the host's: the cluster in it needs ports of its own. `--no-cgroup` mounts /sys without its cgroup file
systems, as on hosts and containers that have none.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement

from sigma.paths import PACKAGE_DIR

SUITES = {"trixie": "Debian 13", "sid": "Debian unstable"}
PACKAGES = ("slurm-wlm", "slurm-client", "slurmdbd", "munge", "mariadb-server", "python3", "python3-venv",
            "ca-certificates")
VENV = "/opt/sigma-venv"
LEAVE_OUT = {"torch"}  # the SLURM-level tests and benches never import it; PyPI's is a multi-GB CUDA build
DEFAULT_DIR = Path(os.environ.get("SIGMA_ROOTFS_DIR", "/var/cache/sigma/rootfs"))
STAMP = ".sigma-rootfs.json"
PASS_ENV = ("CI", "TERM", "SIGMA_TEST_CLUSTER_DIR", "SIGMA_TEST_PORT_OFFSET")
# what pip uses here (a registry mirror may need its CA); else the file system's own bundle
CA_BUNDLE = Path(os.environ.get("PIP_CERT") or "/etc/ssl/certs/ca-certificates.crt")


# The venv is mounted over the checkout's .venv in each run, so the prolog, epilog and job scripts find
# <checkout>/.venv/bin/sigma as on the host (slurmd passes them no PATH or PYTHONPATH of ours).
SIGMA_LAUNCHER = """#!/bin/sh
here=$(dirname "$0")
PYTHONPATH="$(cd "$here/../.." && pwd)${PYTHONPATH:+:$PYTHONPATH}" exec "$here/python" -m sigma.cli "$@"
"""


class RootfsError(RuntimeError):
    """A root file system could not be built or entered; the message says which step and where its log is."""


def python_requirements() -> list[str]:
    """sigma's install requirements as pip recorded them (whatever the build backend), less LEAVE_OUT, and pytest."""
    try:
        reqs = metadata.requires("sigma-slurm") or []
    except metadata.PackageNotFoundError:
        raise RootfsError("sigma-slurm is not installed in this Python (run `make install`)") from None
    kept = [str(r) for r in map(Requirement, reqs) if r.marker is None and r.name not in LEAVE_OUT]
    return sorted(kept) + ["pytest>=8"]


def wanted_stamp(suite: str) -> dict:
    return {"suite": suite, "packages": list(PACKAGES), "pip": python_requirements()}


def build(suite: str, root_dir: Path = DEFAULT_DIR, log=sys.stderr) -> Path:
    """Build (or finish, or reuse) the root file system of suite; return its path."""
    if suite not in SUITES:
        raise RootfsError(f"unknown suite {suite!r}; known: {', '.join(SUITES)}")
    root = root_dir / suite
    root_dir.mkdir(parents=True, exist_ok=True)
    want = wanted_stamp(suite)
    with open(root_dir / f"{suite}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # a second build of the same suite waits for the first, then reuses it
        if _stamp(root) == want:
            return root
        logfile = root_dir / f"{suite}.build.log"
        with open(logfile, "a") as out:
            def step(what: str, argv: list[str]) -> None:
                print(f"rootfs {suite}: {what}", file=log, flush=True)
                out.write(f"\n=== {what}: {shlex.join(argv)}\n")
                out.flush()
                if subprocess.run(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL).returncode:
                    raise RootfsError(f"{suite}: {what} failed; see {logfile}")

            # debootstrap removes its /debootstrap when it has finished: a file system with one was interrupted
            if not (root / "usr" / "bin" / "apt-get").exists() or (root / "debootstrap").exists():
                if not shutil.which("debootstrap"):
                    raise RootfsError("debootstrap is not installed (apt-get install debootstrap)")
                shutil.rmtree(root, ignore_errors=True)
                step("debootstrap", ["debootstrap", "--variant=minbase", suite, str(root), _mirror()])
            # no daemon may start while packages install; the cluster starts its own
            (root / "usr" / "sbin" / "policy-rc.d").write_text("#!/bin/sh\nexit 101\n")
            (root / "usr" / "sbin" / "policy-rc.d").chmod(0o755)
            apt = ["apt-get", "-o", "Acquire::Check-Valid-Until=false", "-q"]  # sid's Release can be past it
            step("apt-get update", _chroot(root, [*apt, "update"]))
            step("apt-get install", _chroot(root, [*apt, "install", "-y", "--no-install-recommends", *PACKAGES]))
            shutil.copy(CA_BUNDLE if CA_BUNDLE.exists() else root / "etc/ssl/certs/ca-certificates.crt",
                        root / "etc" / "host-ca.crt")
            step("venv", _chroot(root, ["python3", "-m", "venv", VENV]))
            pip = [f"{VENV}/bin/pip", "install", "-q", "--cert", "/etc/host-ca.crt"]
            step("pip install", _chroot(root, [*pip, *want["pip"]]))
            (root / VENV.lstrip("/") / "bin" / "sigma").write_text(SIGMA_LAUNCHER)
            (root / VENV.lstrip("/") / "bin" / "sigma").chmod(0o755)
        (root / STAMP).write_text(json.dumps(want, indent=1) + "\n")
    return root


def slurm_version(root: Path) -> str:
    """The Slurm release installed in root, e.g. 24.11.5."""
    out = subprocess.run(["chroot", str(root), "slurmd", "-V"], capture_output=True, text=True).stdout
    return out.split()[-1] if out.strip() else "?"


def run_argv(root: Path, argv: list[str], *, cgroup: bool = True, workdir: Path | None = None) -> list[str]:
    """The command line that runs argv inside root (see the module's docstring); needs root privileges."""
    checkout = PACKAGE_DIR.parent
    workdir = workdir or Path.cwd()
    env = {"PATH": f"{checkout}/.venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME": "/root",
           "LANG": "C.UTF-8", "PYTHONPATH": str(checkout), "PYTHONDONTWRITEBYTECODE": "1",
           **{k: os.environ[k] for k in PASS_ENV if k in os.environ}}
    r, c = shlex.quote(str(root)), shlex.quote(str(checkout))
    script = f"""set -e
mount --rbind /dev {r}/dev
mount -t proc proc {r}/proc
mount {'--rbind' if cgroup else '--bind'} /sys {r}/sys
mkdir -p {r}{c}
mount --bind {c} {r}{c}
tmp=$(mktemp -d /tmp/sigma-rootfs-tmp.XXXXXX)
chmod 1777 "$tmp"
mount --bind "$tmp" {r}/tmp
mkdir -p {c}/.venv
mount --bind {r}{VENV} {r}{c}/.venv
set +e
chroot {r} /usr/bin/env -i {shlex.join(f"{k}={v}" for k, v in env.items())} \\
    sh -c 'cd "$0" && exec "$@"' {shlex.quote(str(workdir))} {shlex.join(argv)}
rc=$?
umount -R {r}/tmp
rm -rf "$tmp"
exit $rc
"""
    return ["unshare", "--mount", "--propagation", "private", "sh", "-c", script]


def run(suite: str, argv: list[str], *, root_dir: Path = DEFAULT_DIR, cgroup: bool = True) -> int:
    root = build(suite, root_dir)
    return subprocess.run(run_argv(root, argv, cgroup=cgroup)).returncode


def _chroot(root: Path, argv: list[str]) -> list[str]:
    """argv in root with /proc, /dev and /sys mounted for the package scripts, in a private mount namespace."""
    r = shlex.quote(str(root))
    env = "env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LANG=C.UTF-8 DEBIAN_FRONTEND=noninteractive"
    return ["unshare", "--mount", "--propagation", "private", "sh", "-ec",
            f"mount -t proc proc {r}/proc; mount --rbind /dev {r}/dev; mount --bind /sys {r}/sys; "
            f"exec chroot {r} {env} {shlex.join(argv)}"]


def _stamp(root: Path) -> dict | None:
    try:
        return json.loads((root / STAMP).read_text())
    except (OSError, ValueError):
        return None


def _mirror() -> str:
    """The Debian mirror apt already uses here (deb822 or one-line sources), else deb.debian.org."""
    for path in sorted(Path("/etc/apt").glob("sources.list*")) + sorted(Path("/etc/apt/sources.list.d").glob("*")):
        try:
            text = path.read_text()
        except OSError:
            continue
        for line in text.splitlines():
            words = line.split()
            for w in words:
                if w.startswith("http") and w.rstrip("/").endswith("/debian"):
                    return w
    return "http://deb.debian.org/debian"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dir", type=Path, default=DEFAULT_DIR, help=f"where root file systems live ({DEFAULT_DIR})")
    sub = parser.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="build or reuse the root file system of SUITE and print its Slurm version")
    b.add_argument("suite", choices=sorted(SUITES))
    r = sub.add_parser("run", help="run a command inside SUITE's root file system")
    r.add_argument("suite", choices=sorted(SUITES))
    r.add_argument("--no-cgroup", action="store_true", help="mount /sys without the cgroup file systems")
    r.add_argument("command", nargs=argparse.REMAINDER, help="-- CMD ARGS...")
    args = parser.parse_args(argv)
    if os.geteuid() != 0:
        parser.error("root file systems need root (debootstrap, chroot, mount)")
    try:
        if args.cmd == "build":
            root = build(args.suite, args.dir)
            print(f"{root}: Slurm {slurm_version(root)}")
            return 0
        command = args.command[1:] if args.command[:1] == ["--"] else args.command
        return run(args.suite, command or ["bash"], root_dir=args.dir, cgroup=not args.no_cgroup)
    except RootfsError as exc:
        print(f"rootfs: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
