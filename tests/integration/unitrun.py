"""Run a systemd service unit as systemd would, where systemd is not PID 1 (an emulated host): the [Service]
section's Environment, ExecStartPre and ExecStart lines, WorkingDirectory (/ by default), Nice, and Restart=always
with RestartSec. The main process's pid goes to /run/<unit>.pid (what `systemctl reload` signals), its output to
/var/log/<unit>.log. Standard library only: run by the host's python3.

usage: unitrun.py /etc/systemd/system/NAME.service
"""

import os
import shlex
import subprocess
import sys
import time
from pathlib import Path


def service_section(path: Path) -> list[tuple[str, str]]:
    items, section = [], ""
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            section = line
        elif section == "[Service]" and "=" in line:
            key, _, value = line.partition("=")
            items.append((key.strip(), value.strip()))
    return items


def main(unit: str) -> int:
    path = Path(unit)
    name = path.name.removesuffix(".service")
    items = service_section(path)
    env = dict(os.environ)
    for key, value in items:
        if key == "Environment":
            for assignment in shlex.split(value):
                k, _, v = assignment.partition("=")
                env[k] = v
    get = lambda key, default="": next((v for k, v in items if k == key), default)  # noqa: E731
    log = open(f"/var/log/{name}.log", "ab")
    for key, value in items:
        if key == "ExecStartPre":
            subprocess.run(shlex.split(value), env=env, stdout=log, stderr=log, check=True)
    argv = shlex.split(get("ExecStart"))
    nice = int(get("Nice", "0"))
    while True:
        proc = subprocess.Popen(argv, env=env, stdout=log, stderr=log, stdin=subprocess.DEVNULL,
                                cwd=get("WorkingDirectory", "/"), preexec_fn=lambda: os.nice(nice))
        Path(f"/run/{name}.pid").write_text(f"{proc.pid}\n")
        code = proc.wait()
        log.write(f"unitrun: {name} exited {code}\n".encode())
        log.flush()
        if get("Restart") != "always":
            return code
        time.sleep(float(get("RestartSec", "1")))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
