"""A real systemd-journald for tests, private to the test: its kernel log is a FIFO it reads as /dev/kmsg.

journald runs in a mount namespace of its own (`unshare -m`): a tmpfs over /run and /etc/systemd (its sockets and
its journald.conf), a FIFO bound over /dev/kmsg, and its journal files in a test directory (Storage=volatile, bound
over /run/log/journal). A kmsg record written to the FIFO is read by journald's own /dev/kmsg code, so the entry it
stores has the trusted fields journald gives kernel lines (_TRANSPORT=kernel, SYSLOG_FACILITY, _BOOT_ID), exactly
as on a node; `logger --journald` and `systemd-cat` inside the namespace add entries of other transports. Readers
(journalctl -D, sd_journal_open_directory) read the directory from outside. Nothing of the host's own journal,
kernel log or /run is touched.

Needs root (mount namespaces) and systemd's journald binary: `available()` says why not.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import signal
import subprocess
import termios
import time
from pathlib import Path

JOURNALD = next((p for p in ("/lib/systemd/systemd-journald", "/usr/lib/systemd/systemd-journald")
                 if os.path.exists(p)), "")

_START = r"""set -e
mount -t tmpfs tmpfs /run
mkdir -p /run/systemd/journal /run/log/journal
mount --bind "$JDIR" /run/log/journal
mount -t tmpfs tmpfs /etc/systemd
printf '[Journal]\nStorage=volatile\nReadKMsg=yes\nRateLimitBurst=0\nForwardToSyslog=no\nForwardToWall=no\n' \
  > /etc/systemd/journald.conf
mount --bind "$KMSG" /dev/kmsg
SYSTEMD_LOG_TARGET=console exec "$JOURNALD"
"""


def available() -> str:
    """'' when a private journald can run here, else why not."""
    if not JOURNALD:
        return "systemd-journald is not installed (Debian package systemd)"
    if os.geteuid() != 0:
        return "a private journald needs root (mount namespaces)"
    if shutil.which("unshare") is None:
        return "unshare (util-linux) is missing"
    return ""


class Journald:
    def __init__(self, root: Path):
        self.root = Path(root)
        self.directory = self.root / "journal"  # what journalctl -D / sd_journal_open_directory read
        self.kmsg = self.root / "kmsg"
        self.proc: subprocess.Popen | None = None
        self.seq = -1  # the kernel numbers its records from 0
        self._fifo = -1

    def start(self, timeout: float = 10.0) -> "Journald":
        self.directory.mkdir(parents=True, exist_ok=True)
        if not self.kmsg.exists():
            os.mkfifo(self.kmsg)
        env = {**os.environ, "JDIR": str(self.directory), "KMSG": str(self.kmsg), "JOURNALD": JOURNALD}
        with open(self.root / "journald.log", "ab") as log:
            self.proc = subprocess.Popen(["unshare", "-m", "--propagation", "private", "sh", "-c", _START], env=env,
                                         stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         start_new_session=True)
        deadline = time.monotonic() + timeout
        while not any(self.directory.glob("*/system.journal")):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"journald did not start: {(self.root / 'journald.log').read_text()[-2000:]}")
            time.sleep(0.05)
        self._fifo = os.open(self.kmsg, os.O_WRONLY | os.O_NONBLOCK)  # journald holds the reading end
        return self

    def kernel(self, message: str, level: int = 3, facility: int = 0, uptime_us: int | None = None) -> None:
        """One kernel ring buffer record, as the kernel hands it to journald (facility 0 is the kernel's own;
        what user space writes to /dev/kmsg gets another facility from the kernel)."""
        self.seq += 1
        usec = uptime_us if uptime_us is not None else int(time.monotonic() * 1e6)
        os.write(self._fifo, f"{facility * 8 + level},{self.seq},{usec},-;{message}\n".encode())
        self._drained()

    def logger(self, message: str, ident: str = "kernel") -> None:
        """An entry through journald's native socket, as any local program can write one (`logger --journald`),
        naming itself as it likes: its _TRANSPORT is journal, not kernel."""
        text = f"MESSAGE={message}\nSYSLOG_IDENTIFIER={ident}\nPRIORITY=3\n"
        subprocess.run(["nsenter", "-t", str(self.proc.pid), "-m", "logger", "--journald"], input=text.encode(),
                       check=True, timeout=10)

    def sync(self, timeout: float = 10.0) -> None:
        """Wait until journald has written every entry it received (the reader sees them)."""
        subprocess.run(["nsenter", "-t", str(self.proc.pid), "-m", "journalctl", "--sync"], check=True,
                       timeout=timeout, capture_output=True)

    def _drained(self, timeout: float = 10.0) -> None:
        # journald reads one record per read(): write the next only once it took this one
        buf = bytearray(4)
        deadline = time.monotonic() + timeout
        while True:
            fcntl.ioctl(self._fifo, termios.FIONREAD, buf)
            if int.from_bytes(buf, "little") == 0:
                return
            if time.monotonic() > deadline:
                raise RuntimeError("journald does not read its kernel log")
            time.sleep(0.01)

    def stop(self) -> None:
        if self._fifo >= 0:
            os.close(self._fifo)
            self._fifo = -1
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(5)
        self.proc = None

    def __enter__(self) -> "Journald":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
