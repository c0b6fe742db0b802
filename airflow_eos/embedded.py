"""Embedded, throwaway real services: what ``airflow-eos demo`` runs on (PostgreSQL
and Apache Kafka), and what the tests and ``make bench`` start too
(with a Spark Connect server). In the package because the demo needs it at run
time; the test-only harness lives in tests/harness.

Each service listens on 127.0.0.1 on a free port and is stopped by whoever
started it (use them as context managers).  When ``EOS_POSTGRES_URL`` or
``EOS_KAFKA_BOOTSTRAP`` is set, :func:`postgres_service` / :func:`kafka_service`
hand out that external service instead of starting one.

No Airflow imports here: the demo and the benchmarks use this too.
"""

from __future__ import annotations

import base64
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
import uuid
from collections.abc import Iterator, Mapping
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


KAFKA_VERSION = "4.1.1"  # scripts/kafka/pom.xml and docker-compose.yml name the same (tests/unit/test_deployment.py)

# Kafka's server settings for a single-node broker on one machine. The internal topics get one
# replica (there is one broker) and few partitions (50 each by default: their creation is most of the
# first consumer group's and the first transaction's wait). Records are kept for good: time-based
# retention goes by the records' timestamps, and the demo's and tests' records are stamped in the
# past (they would be deleted within the 5-minute retention check). Records stamped far in the
# future are accepted: Kafka 4 refuses those more than an hour ahead by default (KIP-937), and the
# planner's skewed-timestamp handling is tested with such records.
KAFKA_SETTINGS = {
    "process.roles": "broker,controller",
    "node.id": "1",
    "controller.listener.names": "CONTROLLER",
    "listener.security.protocol.map": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
    "offsets.topic.replication.factor": "1",
    "offsets.topic.num.partitions": "4",
    "transaction.state.log.replication.factor": "1",
    "transaction.state.log.min.isr": "1",
    "transaction.state.log.num.partitions": "4",
    "group.initial.rebalance.delay.ms": "0",
    "num.partitions": "1",
    "log.message.timestamp.after.max.ms": str(2**63 - 1),
    "log.retention.ms": "-1",
    # a topic given a short retention (a test of it) loses its records within seconds, not 5 minutes
    "log.retention.check.interval.ms": "1000",
    "log.cleaner.backoff.ms": "1000",  # and a compacted one is compacted within seconds
}

KAFKA_LOG4J = """Configuration:
  Appenders:
    Console:
      name: STDOUT
      PatternLayout:
        pattern: "[%d] %p %m (%c)%n"
  Loggers:
    Root:
      level: WARN
      AppenderRef:
        - ref: STDOUT
"""


def cluster_id(draw=lambda: uuid.uuid4().bytes) -> str:
    """A new KRaft cluster id: a random UUID in URL-safe base64, drawn again
    while it starts with "-" (as Kafka's own ``Uuid.randomUuid`` does: the
    StorageTool would read such an id as an option, one format in 64)."""
    while True:
        text = base64.urlsafe_b64encode(draw()).decode().rstrip("=")
        if not text.startswith("-"):
            return text


def kafka_home() -> Path:
    """Where scripts/bootstrap.sh put Apache Kafka's jars (``lib/``)."""
    default = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "airflow-eos" / f"kafka-{KAFKA_VERSION}"
    return Path(os.environ.get("EOS_KAFKA_HOME") or default)


def kafka_classpath() -> str:
    lib = kafka_home() / "lib"
    if not (kafka_home() / ".complete").exists() or not any(lib.glob("kafka_2.13-*.jar")):
        raise RuntimeError(f"Apache Kafka {KAFKA_VERSION}'s jars are not in {lib}: run `make setup` (it fetches them "
                           "with Maven from scripts/kafka/pom.xml), or point EOS_KAFKA_HOME at a directory whose lib/ "
                           "holds them")
    return f"{lib}/*"


class KafkaBroker:
    """Apache Kafka, one node in KRaft mode (broker and controller in one JVM), on
    127.0.0.1 and free ports. Its log directory lives until the broker is
    destroyed, so a restart keeps every record (as a real broker's does).

    The core never relies on broker metadata for correctness (see core.cut_search);
    the tests run on this broker so that what they prove holds on Kafka itself.
    """

    def __init__(self, heap: str = "768m", settings: Mapping[str, str] | None = None) -> None:
        """``settings``: server properties over :data:`KAFKA_SETTINGS` (a test's
        broker with, e.g., a short ``offsets.retention.minutes``)."""
        self.settings = dict(settings or {})
        self.port = free_port()
        self.controller_port = free_port()
        while self.controller_port == self.port:
            self.controller_port = free_port()
        self.heap = heap
        self.dir = Path(tempfile.mkdtemp(prefix="eos-kafka-"))
        self.logfile = self.dir / "broker.log"
        self.proc: subprocess.Popen | None = None
        self.started_seconds = 0.0

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def _write_config(self) -> Path:
        settings = {
            **KAFKA_SETTINGS,
            **self.settings,
            "listeners": f"PLAINTEXT://127.0.0.1:{self.port},CONTROLLER://127.0.0.1:{self.controller_port}",
            "advertised.listeners": f"PLAINTEXT://127.0.0.1:{self.port},CONTROLLER://127.0.0.1:{self.controller_port}",
            "controller.quorum.bootstrap.servers": f"127.0.0.1:{self.controller_port}",
            "log.dirs": str(self.dir / "data"),
        }
        config = self.dir / "server.properties"
        config.write_text("".join(f"{k}={v}\n" for k, v in settings.items()))
        (self.dir / "log4j2.yaml").write_text(KAFKA_LOG4J)
        return config

    def _java(self, *args: str) -> list[str]:
        return ["java", f"-Xms{self.heap}", f"-Xmx{self.heap}", "-XX:+UseG1GC", "-Djava.awt.headless=true",
                f"-Dlog4j2.configurationFile={self.dir / 'log4j2.yaml'}", "-cp", kafka_classpath(), *args]

    def start(self, timeout: float = 60.0) -> "KafkaBroker":
        started = time.monotonic()
        config = self.dir / "server.properties"
        if not (self.dir / "data" / "meta.properties").exists():
            config = self._write_config()
            res = subprocess.run(self._java("kafka.tools.StorageTool", "format", "--standalone", "-t", cluster_id(),
                                            "-c", str(config)), capture_output=True, text=True)
            if res.returncode != 0:
                raise RuntimeError(f"Kafka's StorageTool could not format {self.dir / 'data'}: "
                                   f"{(res.stderr or res.stdout)[-2000:]}")
        with open(self.logfile, "ab") as out:
            self.proc = subprocess.Popen(self._java("kafka.Kafka", str(config)), stdout=out,
                                         stderr=subprocess.STDOUT, start_new_session=True)
        try:
            _wait_for_port(self.port, timeout, self.proc)
            self._wait_ready(started + timeout)
        except (RuntimeError, TimeoutError) as exc:
            self.stop()
            raise RuntimeError(f"Apache Kafka did not start: {exc}\n{self.log_tail()}") from exc
        self.started_seconds = time.monotonic() - started
        log.info("Apache Kafka %s on %s started in %.1fs (log %s)", KAFKA_VERSION, self.bootstrap,
                 self.started_seconds, self.logfile)
        return self

    def _wait_ready(self, deadline: float) -> None:
        """Listening is not serving: wait until the broker answers metadata with itself in it."""
        from confluent_kafka.admin import AdminClient  # noqa: PLC0415 - the demo's and tests' dependency

        admin = AdminClient({"bootstrap.servers": self.bootstrap, "client.id": "eos-broker-ready",
                             "log_level": 0})
        while True:
            with contextlib.suppress(Exception):
                if admin.list_topics(timeout=2).brokers:
                    return
            if time.monotonic() > deadline or self.proc.poll() is not None:
                raise TimeoutError(f"broker on {self.bootstrap} did not answer metadata")
            time.sleep(0.1)

    def log_tail(self, chars: int = 3000) -> str:
        try:
            return self.logfile.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def stop(self) -> None:
        """A clean shutdown (SIGTERM), SIGKILL if it takes over 20 s."""
        if self.proc is not None:
            _stop_process(self.proc, grace=20.0)
            self.proc = None

    def kill(self) -> None:
        """A crash: SIGKILL, no shutdown."""
        if self.proc is not None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.kill()
            self.proc.wait(timeout=10)
            self.proc = None

    def restart(self, *, lose_data: bool = False) -> None:
        """Stop and start again on the same ports. The log directory stays, and with it
        every record; ``lose_data`` wipes it first: the broker comes back as a new,
        empty cluster (a disk lost, a cluster rebuilt)."""
        self.stop()
        if lose_data:
            shutil.rmtree(self.dir / "data", ignore_errors=True)
        self.start()

    def destroy(self) -> None:
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> "KafkaBroker":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.destroy()


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
    with KafkaBroker() as broker:
        yield ServiceHandle(broker.bootstrap, broker)
