"""Emulated hosts on one Linux machine that share nothing but what a cluster shares.

Each host has its own network namespace (a veth on the cluster's bridge, its own address and name resolution),
its own host name (UTS namespace), its own processes (PID namespace, with tests/integration/hostinit.py as PID 1:
boot, reboot, power off) and its own file system (mount namespace): the machine's root as the read-only image
every host boots from, with the host's own writable layer over it (overlayfs, upper layer on a tmpfs: what a host
writes under /etc, /var, /opt stays on that host), fresh /run and /tmp, /home as the cluster's shared file system,
and /opt/sigma bound from one directory (read-only): the node image's installed software. The kernel is the only
other thing they share, as the machine's own kernel log is: kernel lines meant for one host are written into that
host's /mnt/kmsg FIFO, which its journald reads as /dev/kmsg (see `Host.kernel`).

Needs root, iproute2 (ip netns), util-linux (unshare, nsenter) and overlayfs.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import signal
import subprocess
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

# Runs as PID 1 of the host's new namespaces until it execs the host's init: build the host's root and pivot to it.
ROOT_SH = r"""set -e
hostname "$NAME"
mount -t tmpfs -o mode=0755 tmpfs "$DISK"
mkdir -p "$DISK/upper" "$DISK/work" "$DISK/root"
cp -a "$PRELOAD/." "$DISK/upper/"
mount -t overlay overlay -o "lowerdir=/,upperdir=$DISK/upper,workdir=$DISK/work" "$DISK/root"
R="$DISK/root"
mount --rbind /dev "$R/dev"
mount -t tmpfs -o mode=1777 tmpfs "$R/dev/shm"
mount -t proc proc "$R/proc"
mount -t sysfs sysfs "$R/sys"  # this network namespace's devices
mount --rbind /sys/fs/cgroup "$R/sys/fs/cgroup"
mount -t tmpfs -o mode=0755 tmpfs "$R/run"
mount -t tmpfs -o mode=1777 tmpfs "$R/tmp"
mount --bind "$SHARED" "$R/home"
mount --bind "$HARDWARE" "$R/mnt"
mkdir -p "$R/opt/sigma"
if [ -n "$IMAGE" ]; then mount --bind "$IMAGE" "$R/opt/sigma"; fi
if [ -n "$IMAGE" ] && [ -z "$IMAGE_WRITABLE" ]; then mount -o remount,bind,ro "$R/opt/sigma"; fi
cd "$R"
mkdir -p .oldroot
pivot_root . .oldroot
umount -l /.oldroot
rmdir /.oldroot
cd /
exec "$@"
"""


def sh(argv: list[str], **kw) -> subprocess.CompletedProcess:
    return subprocess.run(argv, check=True, capture_output=True, text=True, timeout=kw.pop("timeout", 60), **kw)


class Host:
    def __init__(self, name: str, address: str, workdir: Path, *, netns: str | None, shared: Path,
                 image: Path | None, image_writable: bool = False):
        self.name, self.address, self.netns = name, address, netns
        self.dir = workdir / name
        self.preload = self.dir / "preload"  # files the host starts with, as its own (over the image)
        self.hardware = self.dir / "hardware"  # the emulated machine's side: its kernel ring buffer FIFO
        self.shared, self.image, self.image_writable = shared, image, image_writable
        self.proc: subprocess.Popen | None = None
        self.pid = 0  # the host's PID 1, as this machine sees it

    def write(self, path: str, text: str, mode: int = 0o644) -> None:
        """A file the host boots with (call before start)."""
        target = self.preload / path.lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
        target.chmod(mode)

    def start(self, init: list[str] | None = None, timeout: float = 30.0) -> "Host":
        for d in (self.dir / "disk", self.preload, self.hardware):
            d.mkdir(parents=True, exist_ok=True)
        if not (self.hardware / "kmsg").exists():
            os.mkfifo(self.hardware / "kmsg")
        self.write("/usr/local/lib/hostinit.py", (HERE / "hostinit.py").read_text())
        self.write("/usr/local/lib/unitrun.py", (HERE / "unitrun.py").read_text())
        env = {"PATH": PATH, "HOME": "/root", "LANG": "C.UTF-8", "NAME": self.name, "DISK": str(self.dir / "disk"),
               "PRELOAD": str(self.preload), "SHARED": str(self.shared), "HARDWARE": str(self.hardware),
               "IMAGE": str(self.image or ""), "IMAGE_WRITABLE": "1" if self.image_writable else ""}
        argv = ["unshare", "--mount", "--uts", "--pid", "--fork", "--propagation", "private", "--kill-child",
                "sh", "-c", ROOT_SH, "root.sh", *(init or ["python3", "/usr/local/lib/hostinit.py"])]
        if self.netns:  # joined without `ip netns exec`, which would hide the machine's cgroup tree
            argv = ["nsenter", f"--net=/run/netns/{self.netns}", *argv]
        log = open(self.dir / "console.log", "ab")
        self.proc = subprocess.Popen(argv, env=env, stdout=log, stderr=log, stdin=subprocess.DEVNULL,
                                     start_new_session=True)
        deadline = time.monotonic() + timeout
        while not self.pid:
            children = Path(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children")
            kids = children.read_text().split() if children.exists() else []
            if kids and self._booted(int(kids[0])):
                self.pid = int(kids[0])
            elif self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"host {self.name} did not start: {(self.dir / 'console.log').read_text()[-2000:]}")
            else:
                time.sleep(0.05)
        return self

    def _booted(self, pid: int) -> bool:
        try:  # its root is the host's own once it pivoted: the hardware's FIFO is at /mnt
            return Path(f"/proc/{pid}/root/mnt/kmsg").exists()
        except OSError:
            return False

    def run(self, command: str, *, check: bool = True, timeout: float = 120.0, input: str | None = None
            ) -> subprocess.CompletedProcess:
        """A shell command on the host, as root logged in there (a clean environment, the host's PATH)."""
        argv = ["nsenter", "-t", str(self.pid), "-m", "-u", "-p", *(["-n"] if self.netns else []), "--",
                "env", "-i", f"PATH={PATH}", "HOME=/root", "LANG=C.UTF-8", "sh", "-c", command]
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, input=input)
        if check and proc.returncode != 0:
            raise AssertionError(f"{self.name}$ {command}\nexit {proc.returncode}\n{proc.stdout}\n{proc.stderr}")
        return proc

    def copy_in(self, data: bytes, path: str) -> None:
        """Put a file onto the host (what scp does between two machines)."""
        argv = ["nsenter", "-t", str(self.pid), "-m", "--", "sh", "-c",
                f"mkdir -p {shlex.quote(str(Path(path).parent))} && cat > {shlex.quote(path)}"]
        subprocess.run(argv, input=data, check=True, timeout=60)

    def fetch(self, path: str) -> bytes:
        """A file's bytes from the host (scp the other way)."""
        argv = ["nsenter", "-t", str(self.pid), "-m", "--", "cat", path]
        return subprocess.run(argv, capture_output=True, check=True, timeout=60).stdout

    def read(self, path: str) -> str:
        return self.run(f"cat {shlex.quote(path)} 2>/dev/null || true").stdout

    def kernel(self, message: str, level: int = 3) -> None:
        """A kernel log line on this host: a record in its kernel ring buffer, which its journald reads."""
        record = f"{level},{int(time.monotonic() * 1e6) % 10**12},{int(time.monotonic() * 1e6)},-;{message}\n"
        deadline = time.monotonic() + 30
        while True:
            try:
                fd = os.open(self.hardware / "kmsg", os.O_WRONLY | os.O_NONBLOCK)
                break
            except OSError:  # ENXIO: no reader (journald not started yet, or rebooting)
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        try:
            os.write(fd, record.encode())
        finally:
            os.close(fd)

    def signal(self, sig: int) -> None:
        os.kill(self.pid, sig)

    def reboot(self) -> None:
        self.signal(signal.SIGUSR1)

    def power_off(self) -> None:
        self.signal(signal.SIGUSR2)

    def stop(self) -> None:
        if self.proc is None:
            return
        if self.pid:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)
        self.proc = None


class Network:
    """The cluster's network: a bridge in the first host's namespace, a veth from every other host onto it."""

    def __init__(self, prefix: str, addresses: dict[str, str]):
        self.prefix = prefix  # netns names: <prefix>-<host>
        self.addresses = addresses

    def netns(self, host: str) -> str:
        return f"{self.prefix}-{host}"

    def up(self) -> None:
        names = list(self.addresses)
        hub = self.netns(names[0])
        for name in names:
            sh(["ip", "netns", "add", self.netns(name)])
            sh(["ip", "-n", self.netns(name), "link", "set", "lo", "up"])
        sh(["ip", "-n", hub, "link", "add", "br0", "type", "bridge"])
        sh(["ip", "-n", hub, "addr", "add", f"{self.addresses[names[0]]}/24", "dev", "br0"])
        sh(["ip", "-n", hub, "link", "set", "br0", "up"])
        for i, name in enumerate(names[1:], 1):
            port = f"veth{i}"
            sh(["ip", "link", "add", port, "netns", hub, "type", "veth", "peer", "name", "eth0", "netns",
                self.netns(name)])
            sh(["ip", "-n", hub, "link", "set", port, "master", "br0", "up"])
            sh(["ip", "-n", self.netns(name), "addr", "add", f"{self.addresses[name]}/24", "dev", "eth0"])
            sh(["ip", "-n", self.netns(name), "link", "set", "eth0", "up"])

    def down(self) -> None:
        for name in self.addresses:
            subprocess.run(["ip", "netns", "del", self.netns(name)], capture_output=True, timeout=30)


def available() -> str:
    """'' when hosts can be emulated here, else why not."""
    if os.geteuid() != 0:
        return "emulated hosts need root (namespaces, mounts)"
    for tool in ("ip", "unshare", "nsenter"):
        if shutil.which(tool) is None:
            return f"{tool} is missing"
    if "overlay" not in Path("/proc/filesystems").read_text():
        return "the kernel has no overlayfs"
    return ""
