"""PID 1 of an emulated host (tests/integration/hosts.py), run by the system's python3 with the standard library
only: it boots the host (/etc/rc.boot, as an init system would run its units), reaps orphans, and is the host's
power switch: SIGUSR1 reboots (every other process killed, then /etc/rc.boot again with `reboot`), SIGUSR2 powers
off (every other process killed, nothing started: the node is dead until SIGUSR1), SIGTERM ends the host.
"""

import contextlib
import os
import signal
import subprocess
import time

wanted = []


def others() -> list[int]:
    return [int(p) for p in os.listdir("/proc") if p.isdigit() and int(p) != 1]


def kill_all() -> None:
    for _ in range(100):
        pids = others()
        if not pids:
            return
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        reap()
        time.sleep(0.05)


def reap() -> None:
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def boot(how: str) -> None:
    log = open(f"/var/log/rc.boot.log", "ab")
    log.write(f"--- {time.strftime('%H:%M:%S')} {how}\n".encode())
    log.flush()
    subprocess.Popen(["/bin/sh", "/etc/rc.boot", how], stdout=log, stderr=log, stdin=subprocess.DEVNULL)


def main() -> None:
    for sig in (signal.SIGUSR1, signal.SIGUSR2, signal.SIGTERM):
        signal.signal(sig, lambda s, _f: wanted.append(s))
    boot("boot")
    while True:
        if wanted:
            sig = wanted.pop(0)
            kill_all()
            if sig == signal.SIGTERM:
                return
            if sig == signal.SIGUSR1:
                boot("reboot")
        reap()
        time.sleep(0.1)


if __name__ == "__main__":
    main()
