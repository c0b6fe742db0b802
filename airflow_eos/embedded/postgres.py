"""A throwaway PostgreSQL cluster, from Debian's server binaries."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from airflow_eos.embedded.processes import free_port

PG_BIN_CANDIDATES = ("/usr/lib/postgresql/17/bin", "/usr/lib/postgresql/16/bin", "/usr/lib/postgresql/15/bin")


def pg_bin_dir() -> Path:
    for candidate in PG_BIN_CANDIDATES:
        if Path(candidate, "initdb").exists():
            return Path(candidate)
    raise RuntimeError("PostgreSQL server binaries not found; install Debian's 'postgresql' package")


class PostgresServer:
    """A throwaway PostgreSQL cluster in a temp directory, run as the ``postgres`` user.

    initdb/pg_ctl refuse to run as root, and pytest's tmp dirs are 0700, so the
    cluster lives in a mkdtemp directory owned by ``postgres``.
    """

    def __init__(self, max_connections: int = 200) -> None:
        self.max_connections = max_connections
        self.port = free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="eos-pg-"))
        self.data = self.dir / "data"
        self.bin = pg_bin_dir()
        self._as_postgres = os.geteuid() == 0

    @property
    def url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def _run(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        cmd = [str(self.bin / args[0]), *args[1:]]
        if self._as_postgres:
            cmd = ["runuser", "-u", "postgres", "--", *cmd]
        return subprocess.run(cmd, check=check, capture_output=True, text=True)

    def start(self) -> "PostgresServer":
        if self._as_postgres:
            shutil.chown(self.dir, "postgres", "postgres")
        if not self.data.exists():
            self._run("initdb", "-D", str(self.data), "-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-sync")
        self._pg_ctl_start()
        return self

    def _pg_ctl_start(self) -> None:
        opts = (
            f"-h 127.0.0.1 -p {self.port} -k {self.dir} -c fsync=off -c synchronous_commit=off "
            f"-c full_page_writes=off -c max_connections={self.max_connections}"
        )
        res = self._run("pg_ctl", "-D", str(self.data), "-o", opts, "-l", str(self.dir / "log"), "-w", "-t", "30", "start", check=False)
        if res.returncode != 0:
            logtail = (self.dir / "log").read_text(errors="replace")[-2000:] if (self.dir / "log").exists() else ""
            raise RuntimeError(f"PostgreSQL failed to start: {res.stderr}\n{logtail}")

    def stop(self, mode: str = "fast") -> None:
        """Stop the server; ``mode`` is pg_ctl's: smart, fast or immediate (a crash)."""
        self._run("pg_ctl", "-D", str(self.data), "-m", mode, "-w", "stop", check=False)

    def restart(self, mode: str = "fast") -> None:
        self.stop(mode)
        self._pg_ctl_start()

    def destroy(self) -> None:
        self.stop("immediate")
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> "PostgresServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.destroy()
