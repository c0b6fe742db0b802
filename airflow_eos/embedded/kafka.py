"""Apache Kafka, one node in KRaft mode, from the jars scripts/bootstrap.sh
fetched (kafka_home)."""

from __future__ import annotations

import base64
import contextlib
import logging
import os
import shutil
import subprocess
import tempfile
import time
import uuid
from collections.abc import Mapping
from pathlib import Path

from airflow_eos.core.jars import JarCache
from airflow_eos.embedded.processes import JvmService, free_port, wait_for_port

log = logging.getLogger("airflow_eos.embedded")

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


# The JVM's collector and compiler settings, as Kafka's own start scripts take them (kafka-run-class.sh):
# a deployment on a small machine (or a test run) may give, e.g., the serial collector and C1 only.
PERFORMANCE_OPTS_ENV = "KAFKA_JVM_PERFORMANCE_OPTS"
DEFAULT_PERFORMANCE_OPTS = "-XX:+UseG1GC"

KAFKA_JARS = JarCache(f"kafka-{KAFKA_VERSION}", f"Apache Kafka {KAFKA_VERSION}'s jars", "EOS_KAFKA_HOME",
                      "kafka_2.13-*.jar", "scripts/kafka/pom.xml")


def kafka_home() -> Path:
    """Where scripts/bootstrap.sh put Apache Kafka's jars (``lib/``)."""
    return KAFKA_JARS.home()


class KafkaBroker(JvmService):
    """Apache Kafka, one node in KRaft mode (broker and controller in one JVM), on
    127.0.0.1 and free ports. Its log directory lives until the broker is
    destroyed, so a restart keeps every record (as a real broker's does).

    The core never relies on broker metadata for correctness (see core.cut_search);
    the tests run on this broker so that what they prove holds on Kafka itself.
    """

    stop_grace = 20.0  # a clean shutdown (SIGTERM) may take its time before SIGKILL
    stop_group = False

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
        performance = (os.environ.get(PERFORMANCE_OPTS_ENV) or DEFAULT_PERFORMANCE_OPTS).split()
        return ["java", f"-Xms{self.heap}", f"-Xmx{self.heap}", *performance, "-Djava.awt.headless=true",
                f"-Dlog4j2.configurationFile={self.dir / 'log4j2.yaml'}", "-cp", KAFKA_JARS.classpath(), *args]

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
            wait_for_port(self.port, timeout, self.proc)
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

