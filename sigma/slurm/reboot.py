"""RebootProgram of the local cluster: emulate rebooting one emulated node.

slurmd runs this with no node name in the environment, so the node is found from the ancestor slurmd's
`-N NAME`. A real reboot kills slurmd; here a detached child stops that slurmd and starts `slurmd -b -N NAME`
("rebooted now"), after which slurmctld logs "node NAME returned to service" and applies nextstate.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from pathlib import Path


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


def reboot(state_dir: Path, slurmd_pid: int, node: str) -> None:
    log = open(state_dir / "log" / f"reboot-{node}.log", "a")
    print(f"{time.strftime('%FT%T')} rebooting {node}: stopping slurmd pid {slurmd_pid}", file=log, flush=True)
    os.kill(slurmd_pid, signal.SIGTERM)
    for _ in range(200):
        if not Path(f"/proc/{slurmd_pid}").exists():
            break
        time.sleep(0.05)
    else:
        os.kill(slurmd_pid, signal.SIGKILL)
    time.sleep(1.0)  # a real reboot takes a while; slurmctld must see the node go quiet
    env = {**os.environ, "SLURM_CONF": str(state_dir / "etc" / "slurm.conf")}
    subprocess.run(["slurmd", "-b", "-N", node], env=env, stdout=log, stderr=log, stdin=subprocess.DEVNULL)
    print(f"{time.strftime('%FT%T')} {node} back: started slurmd -b", file=log, flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--state-dir", type=Path, required=True)
    args, _ = parser.parse_known_args(argv)
    found = find_slurmd(os.getppid())
    if found is None:
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
    reboot(args.state_dir, *found)
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main())
