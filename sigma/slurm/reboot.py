"""RebootProgram of the local cluster: emulate rebooting one emulated node.

slurmd runs this with no node name in the environment (and Slurm 26.05 with no PATH either), so the node is found
from the ancestor slurmd's `-N NAME`, and the slurmd to start again is the program that process was started as. A real reboot
kills slurmd; here a detached child stops that slurmd and starts `slurmd -b -N NAME` ("rebooted now"), after which
slurmctld logs "node NAME returned to service" and applies nextstate.

Everything it does, and every failure, goes to <state>/log/reboot-NODE.log (reboot.log before the node is known),
beside the daemons' logs: its stdout and stderr go nowhere once it has detached.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import time
import traceback
from pathlib import Path

SBIN_PATH = "/usr/local/sbin:/usr/sbin:/sbin:/usr/local/bin:/usr/bin:/bin"


def find_slurmd(pid: int) -> tuple[int, str] | None:
    """Walk up from pid to the first `slurmd -N NAME` ancestor; return (pid, NAME)."""
    while pid > 1:
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
            ppid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            return None
        if argv and os.path.basename(argv[0]).startswith("slurmd") and "-N" in argv:
            return pid, argv[argv.index("-N") + 1]
        pid = ppid
    return None


def slurmd_program(pid: int) -> str:
    """How the running slurmd was started (its absolute argv[0]), else slurmd on a PATH with the sbin dirs.

    Not /proc/PID/exe: Debian's /usr/sbin/slurmd is an alternatives link to slurmd-wlm, and 24.11's slurmd started
    by that name daemonises and exits at once, silently."""
    try:
        argv0 = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode()
    except OSError:
        argv0 = ""
    if os.path.isabs(argv0) and os.access(argv0, os.X_OK):
        return argv0
    found = shutil.which("slurmd", path=os.environ.get("PATH", "") + ":" + SBIN_PATH)
    if found is None:
        raise FileNotFoundError(f"slurmd (pid {pid}) has no readable /proc/{pid}/exe and no slurmd is on "
                                f"PATH or in {SBIN_PATH}")
    return found


def log_line(log, message: str) -> None:
    print(f"{time.strftime('%FT%T')} {message}", file=log, flush=True)


def reboot(state_dir: Path, slurmd_pid: int, node: str, log) -> None:
    program = slurmd_program(slurmd_pid)
    log_line(log, f"rebooting {node}: stopping slurmd pid {slurmd_pid} ({program})")
    os.kill(slurmd_pid, signal.SIGTERM)
    for _ in range(200):
        if not Path(f"/proc/{slurmd_pid}").exists():
            break
        time.sleep(0.05)
    else:
        os.kill(slurmd_pid, signal.SIGKILL)
    time.sleep(1.0)  # a real reboot takes a while; slurmctld must see the node go quiet
    env = {**os.environ, "PATH": os.environ.get("PATH") or SBIN_PATH,
           "SLURM_CONF": str(state_dir / "etc" / "slurm.conf")}
    proc = subprocess.run([program, "-b", "-N", node], env=env, stdout=log, stderr=log, stdin=subprocess.DEVNULL)
    if proc.returncode != 0 or not slurmd_running(state_dir, node, old_pid=slurmd_pid):
        raise RuntimeError(f"{program} -b -N {node} exited {proc.returncode} and no slurmd runs for {node}: the node "
                           f"stays down until its slurmd is started by hand (see {state_dir}/log/slurmd-{node}.log)")
    log_line(log, f"{node} back: started slurmd -b")


def slurmd_running(state_dir: Path, node: str, old_pid: int, timeout: float = 5.0) -> bool:
    """The daemonised slurmd wrote its pid file and still runs (a daemon can exit after its parent said 0)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            pid = int((state_dir / "run" / f"slurmd-{node}.pid").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            pid = None
        if pid and pid != old_pid and Path(f"/proc/{pid}").exists():
            time.sleep(0.5)
            if Path(f"/proc/{pid}").exists():
                return True
        time.sleep(0.1)
    return False


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--state-dir", type=Path, required=True)
    args, _ = parser.parse_known_args(argv)
    log_dir = args.state_dir / "log"
    found = find_slurmd(os.getppid())
    if found is None:
        with open(log_dir / "reboot.log", "a") as log:
            log_line(log, f"reboot-node (parent pid {os.getppid()}): no ancestor `slurmd -N NAME` found; not an "
                          f"emulated node, nothing done")
        print("reboot-node: no ancestor `slurmd -N NAME` found; not an emulated node", file=sys.stderr)
        return 1
    # Detach: the slurmd that ran us is about to die, and we must outlive it.
    if os.fork() > 0:
        return 0
    os.setsid()
    if os.fork() > 0:
        os._exit(0)
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    with open(log_dir / f"reboot-{found[1]}.log", "a") as log:
        try:
            reboot(args.state_dir, *found, log)
        except BaseException:
            log_line(log, f"reboot of {found[1]} failed:\n{traceback.format_exc()}")
            os._exit(1)
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main())
