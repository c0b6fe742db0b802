"""The processes the embedded services run in: a free port to listen on,
waiting until one listens, stopping one (or its whole process group), and
what every service in a JVM of its own shares (JvmService)."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Self

# The JVM flags of the embedded services that serve a demo or a test run (HDFS's mini-cluster, the Iceberg
# REST catalog, the schema registry): a small heap's serial collector, and C1 only, since C2's compilations
# were most of a start's CPU (HDFS's mini-cluster: 14.9 CPU-s to start with C2, 8.8 without; the schema
# registry likewise). A real deployment of these services is not started here.
SMALL_JVM_FLAGS = ("-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-Djava.awt.headless=true")


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for_port(port: int, timeout: float, proc: subprocess.Popen | None = None) -> None:
    """Wait until something listens on 127.0.0.1:``port``; TimeoutError after
    ``timeout`` seconds, RuntimeError as soon as ``proc`` (the process meant to
    listen) has exited."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"process exited with {proc.returncode} before listening on 127.0.0.1:{port}")
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.settimeout(0.2)
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.02)
    raise TimeoutError(f"nothing listening on 127.0.0.1:{port} after {timeout}s")


def stop_process(proc: subprocess.Popen, grace: float = 3.0, *, group: bool = False) -> None:
    """SIGTERM, then SIGKILL after ``grace`` seconds. ``group``: ``proc`` leads a
    session of its own (``start_new_session``): signal its whole process group,
    and kill what is left of the group once the leader has exited."""

    def send(sig: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            if group:
                os.killpg(proc.pid, sig)
            else:
                proc.send_signal(sig)

    if proc.poll() is None:
        send(signal.SIGTERM)
        try:
            proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            send(signal.SIGKILL)
            proc.wait(timeout=10)
    if group:
        send(signal.SIGKILL)  # children that outlived the leader


class JvmService:
    """A service in a JVM child process of its own, its files in a temp dir
    that lives until the service is destroyed: its log's tail, stopping it,
    destroying it, and use as a context manager. A subclass starts it
    (``start`` returns the service) and may say how it is stopped."""

    dir: Path
    logfile: Path
    proc: subprocess.Popen | None
    stop_grace = 10.0  # seconds between SIGTERM and SIGKILL
    stop_group = True  # the JVM leads a session of its own: signal its whole process group

    def start(self) -> Self:
        raise NotImplementedError

    def log_tail(self, chars: int = 3000) -> str:
        try:
            return self.logfile.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def stop(self) -> None:
        """SIGTERM, SIGKILL if it takes over ``stop_grace`` seconds."""
        if self.proc is not None:
            stop_process(self.proc, grace=self.stop_grace, group=self.stop_group)
            self.proc = None

    def destroy(self) -> None:
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.destroy()
