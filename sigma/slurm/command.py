"""Run one SLURM command: every call has a timeout and fails loudly with what ran and what it said."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Mapping, Sequence

DEFAULT_TIMEOUT_S = 30.0


class SlurmError(RuntimeError):
    """A SLURM command failed or timed out; carries the command, exit code and stderr."""

    def __init__(self, argv: Sequence[str], returncode: int | None, stderr: str, timed_out: bool = False):
        self.argv = list(argv)
        self.returncode = returncode
        self.stderr = stderr.strip()
        self.timed_out = timed_out
        what = "timed out" if timed_out else f"exited {returncode}"
        super().__init__(f"{' '.join(self.argv)} {what}: {self.stderr or '(no stderr)'}")


def run(
    argv: Sequence[str],
    *,
    timeout: float = DEFAULT_TIMEOUT_S,
    env: Mapping[str, str] | None = None,
    input: str | None = None,
    check: bool = True,
) -> subprocess.CompletedProcess:
    """Run argv with a hard timeout; raise SlurmError on a non-zero exit (when check) or a timeout."""
    full_env = dict(os.environ)
    if env:
        full_env.update(env)
    try:
        proc = subprocess.run(
            list(argv), capture_output=True, text=True, timeout=timeout, env=full_env, input=input,
            stdin=None if input is not None else subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired as exc:
        stderr = exc.stderr.decode() if isinstance(exc.stderr, bytes) else (exc.stderr or "")
        raise SlurmError(argv, None, stderr, timed_out=True) from None
    except FileNotFoundError:
        raise SlurmError(argv, 127, f"{argv[0]}: command not found (is SLURM's client installed?)") from None
    if check and proc.returncode != 0:
        raise SlurmError(argv, proc.returncode, proc.stderr)
    return proc
