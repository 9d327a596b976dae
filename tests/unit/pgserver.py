"""A throwaway PostgreSQL server for tests: Debian's binaries, a private data directory and a Unix socket under
/tmp, no TCP port. As root the server runs as the `postgres` user (PostgreSQL refuses root)."""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest


def pg_bin(name: str) -> str | None:
    """Debian keeps the server binaries in /usr/lib/postgresql/<version>/bin, off PATH."""
    found = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"), key=lambda p: int(p.split("/")[4]))
    return found[-1] if found else shutil.which(name)


class PgServer:
    def __init__(self):
        self.dir = Path(tempfile.mkdtemp(prefix="sigma-pg-"))
        self.data = self.dir / "data"
        self.socket = self.dir / "sock"
        self.as_postgres = os.geteuid() == 0
        self.user = "postgres" if self.as_postgres else os.environ.get("USER", "postgres")

    def _run(self, *argv: str) -> None:
        prefix = ["runuser", "-u", "postgres", "--"] if self.as_postgres else []
        subprocess.run(prefix + list(argv), check=True, capture_output=True, timeout=120)

    def start(self) -> "PgServer":
        self.socket.mkdir(parents=True)
        if self.as_postgres:
            shutil.chown(self.dir, "postgres")
            shutil.chown(self.socket, "postgres")
        self._run(pg_bin("initdb"), "-D", str(self.data), "-U", self.user, "--auth=trust", "-E", "UTF8")
        self._run(pg_bin("pg_ctl"), "-D", str(self.data), "-w", "-l", str(self.dir / "server.log"), "-o",
                  f"-c listen_addresses='' -k {self.socket} -c fsync=off", "start")
        return self

    def url(self, db: str = "postgres") -> str:
        return f"postgresql://{self.user}@/{db}?host={self.socket}"

    def create_db(self, name: str) -> str:
        import psycopg

        with psycopg.connect(self.url(), autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)

    def stop(self) -> None:
        try:
            self._run(pg_bin("pg_ctl"), "-D", str(self.data), "-m", "immediate", "stop")
        finally:
            shutil.rmtree(self.dir, ignore_errors=True)


def require_postgres():
    """Skips the calling test module unless psycopg and the server binaries are installed; returns psycopg."""
    psycopg = pytest.importorskip("psycopg", reason="psycopg is not installed (pip install -e '.[postgres]')")
    if pg_bin("initdb") is None or pg_bin("pg_ctl") is None:
        pytest.skip("PostgreSQL server binaries (initdb, pg_ctl) not found: apt-get install postgresql",
                    allow_module_level=True)
    return psycopg


@pytest.fixture(scope="module")
def pg():
    """One server for the test module."""
    server = PgServer().start()
    yield server
    server.stop()
