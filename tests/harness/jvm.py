"""The JVM settings of every Spark driver the tests start: spark-submit's jobs,
PySpark's local sessions, the Spark Connect server (``SPARK_SUBMIT_OPTS``,
which the Spark launcher adds to the driver JVM's options).

A test's Spark driver is short and small, so its JVM's start is most of its
cost: one spark-submit of a small job took 26.5 CPU-s with the JVM's defaults,
13.5 with only the C1 compiler and the serial collector, and 8.3 when its
classes also came from a class-data archive (Intel Xeon, 2 cores, 2026-11-28).
The archive (AppCDS, ``-XX:ArchiveClassesAtExit``) is made once per run by a
small Spark job that loads the classes a stage loads, in the background: a
JVM started before it is in place runs without it (the JVM says nothing when
``-XX:SharedArchiveFile`` names no file), one started after maps it, shared
with every other. The archive holds the driver's class path, so it serves
every driver started with the same ``SPARK_CONF_DIR`` (none: Spark's own) and
``HADOOP_CONF_DIR``; a driver with other ones runs without it.

The run's Kafka brokers get the same collector and compiler (C1 only, serial
collector: ``KAFKA_JVM_PERFORMANCE_OPTS``, which embedded/kafka.py takes as
Kafka's own start scripts do): a broker's start plus a small transactional load
took 11.2 CPU-s with G1 and C2, 7.0 with these; idle, 4.3 and 3.0 CPU-s in two
minutes (the same machine). And a class-data archive of their own
(:class:`BrokerClassArchive`, kept beside Kafka's jars between runs; a run that
finds none makes it with a broker started for it in the background while the
run's shared one starts): the tests that stop, restart or wipe a broker
start ~15 of their own, and each broker's start and stop took 3.9-4.7 CPU-s
without it, 2.4-3.0 with it (Xeon, 2026-11-29).

Production is untouched: these are the test run's settings, in its environment.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

FLAGS = ("-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC", "-XX:CICompilerCount=1")

# A small job through the paths a stage takes: JSON parsed by Spark SQL, a Python
# UDF (the Python workers), an aggregation (a shuffle), Parquet written and read.
_WARM_UP_JOB = """
import sys
from pyspark.sql import SparkSession, functions as F, types as T
spark = SparkSession.builder.master("local[2]").appName("eos-jvm-warm-up").getOrCreate()
rows = [(f'{{"order_id": "o-{n}", "amount": {n * 0.37:.2f}}}', n % 4, n) for n in range(2000)]
df = spark.createDataFrame(rows, "value string, partition int, offset long")
schema = T.StructType([T.StructField("order_id", T.StringType()), T.StructField("amount", T.DoubleType())])
parsed = df.withColumn("row", F.from_json("value", schema)).select("row.*", "partition", "offset")
upper = F.udf(lambda s: s.upper(), T.StringType())
parsed = parsed.withColumn("order_id", upper("order_id"))
parsed.groupBy("partition").agg(F.count("*"), F.sum("amount")).collect()
parsed.write.mode("overwrite").partitionBy("partition").parquet(sys.argv[1])
spark.read.parquet(sys.argv[1]).filter("offset > 10").count()
spark.stop()
"""


class ClassArchive:
    """The run's class-data archive, made in the background; :meth:`stop` ends
    the job if it still runs and deletes the archive."""

    def __init__(self) -> None:
        self.directory = Path(tempfile.mkdtemp(prefix="eos-jvm-"))
        self.path = self.directory / "spark-driver.jsa"
        self.proc: subprocess.Popen | None = None
        self._waiter: threading.Thread | None = None

    def submit_opts(self) -> str:
        """SPARK_SUBMIT_OPTS for every driver of the run: the flags and the archive."""
        return " ".join(filter(None, (os.environ.get("SPARK_SUBMIT_OPTS"), *FLAGS,
                                      f"-XX:SharedArchiveFile={self.path}")))

    def start(self) -> None:
        """Run the warm-up job; its JVM writes the archive at its exit, under
        another name, renamed into place only if the job succeeded."""
        job = self.directory / "warm_up.py"
        job.write_text(_WARM_UP_JOB)
        partial = self.directory / "spark-driver.jsa.partial"
        env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "SPARK_LOCAL_IP": "127.0.0.1",
               "SPARK_SUBMIT_OPTS": " ".join((*FLAGS, f"-XX:ArchiveClassesAtExit={partial}"))}
        spark_submit = Path(sys.executable).with_name("spark-submit")
        self.proc = subprocess.Popen([str(spark_submit), str(job), str(self.directory / "parquet")], env=env,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                     cwd=self.directory, start_new_session=True)

        def rename_when_done(proc=self.proc) -> None:
            if proc.wait() == 0 and partial.exists():
                os.replace(partial, self.path)

        self._waiter = threading.Thread(target=rename_when_done, name="eos-jvm-archive", daemon=True)
        self._waiter.start()

    def stop(self) -> None:
        from airflow_eos.embedded.processes import stop_process

        if self.proc is not None and self.proc.poll() is None:
            stop_process(self.proc, group=True)
        if self._waiter is not None:
            self._waiter.join(10)
        shutil.rmtree(self.directory, ignore_errors=True)


class BrokerClassArchive:
    """The class-data archive for Apache Kafka's JVMs (the brokers and their
    StorageTool), kept between runs beside Kafka's jars: one made for another
    JDK, other flags or other jars has another name (:func:`_archive_key`), so
    a run only ever maps one made for its own. A run that finds none makes it in
    the background by a broker started, used a little (a transaction, a
    consumer group) and stopped for it: the archive is written at its JVM's
    exit, under another name, renamed into place only if it stopped cleanly. A
    broker started before then runs without it. Making it cost a run ~6.3
    CPU-s and 10 s of a broker's life (``make test-fast``, Xeon, 2026-11-29)."""

    def __init__(self) -> None:
        from airflow_eos.embedded.kafka import KAFKA_JARS

        self.directory = KAFKA_JARS.home() / "class-archives"
        self._temporary = False
        try:
            self.path = self.directory / f"kafka-{_archive_key(KAFKA_JARS.jars())}.jsa"
        except (RuntimeError, OSError):  # no jars or no java: no broker starts, and a test that needs one says why
            self.directory, self._temporary = Path(tempfile.mkdtemp(prefix="eos-kafka-jvm-")), True
            self.path = self.directory / "kafka.jsa"
        self._waiter: threading.Thread | None = None

    def broker_opts(self) -> str:
        """KAFKA_JVM_PERFORMANCE_OPTS for every broker of the run: the flags and the archive."""
        return " ".join((*FLAGS, f"-XX:SharedArchiveFile={self.path}"))

    def start(self) -> None:
        if self.path.exists():
            return
        self._waiter = threading.Thread(target=self._make, name="eos-kafka-archive", daemon=True)
        self._waiter.start()

    def _make(self) -> None:
        from airflow_eos.embedded.kafka import KafkaBroker

        partial = self.directory / f"{self.path.name}.{os.getpid()}.partial"

        class Dumping(KafkaBroker):
            def _java(self, *args: str) -> list[str]:
                command = [a for a in super()._java(*args) if not a.startswith("-XX:SharedArchiveFile=")]
                if args[0] == "kafka.Kafka":  # the broker's classes (the StorageTool's are among them)
                    command.insert(1, f"-XX:ArchiveClassesAtExit={partial}")
                return command

        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            with Dumping(heap="256m") as broker:
                jvm = broker.proc
                _use(broker.bootstrap)
        except Exception:  # noqa: BLE001 - no archive: every broker runs without one, as before
            with contextlib.suppress(OSError):
                partial.unlink(missing_ok=True)
            return
        # A JVM ended by SIGTERM exits with 143 after its shutdown, the archive written; killed, it wrote none whole.
        if jvm.returncode in (0, 143) and partial.exists():
            for stale in self.directory.glob("kafka-*.jsa"):  # made for another JDK, other flags or jars
                stale.unlink(missing_ok=True)
            os.replace(partial, self.path)
        partial.unlink(missing_ok=True)

    def stop(self) -> None:
        if self._waiter is not None:
            self._waiter.join(60)
        if self._temporary:
            shutil.rmtree(self.directory, ignore_errors=True)


def _archive_key(jars: list[str]) -> str:
    """What a class-data archive was made for: the JVM (the java on PATH, its
    file's identity), the flags and the jars (names, sizes, times). The JVM
    refuses an archive made for another class path anyway; the key keeps two
    kinds of run from replacing each other's."""
    java = os.path.realpath(shutil.which("java") or "java")
    files = [(p, os.stat(p)) for p in (java, *jars)]
    parts = [java, *FLAGS, *(f"{p}:{st.st_size}:{st.st_mtime_ns}" for p, st in files)]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]


def _use(bootstrap: str) -> None:
    """What a test's broker does, so that its classes are loaded: a topic
    created, a transaction committed, a consumer group reading it."""
    from confluent_kafka import Consumer, Producer

    from airflow_eos.core.kafka_client import client_logging
    from harness.topics import create_topic

    create_topic(bootstrap, "warm-up", 2, timeout=30)
    quiet = {**client_logging(), "bootstrap.servers": bootstrap}  # librdkafka's retries through logging, not stderr
    producer = Producer({**quiet, "transactional.id": "eos-warm-up"})
    producer.init_transactions(30)
    producer.begin_transaction()
    for n in range(100):
        producer.produce("warm-up", str(n).encode(), partition=n % 2)
    producer.commit_transaction(30)
    consumer = Consumer({**quiet, "group.id": "eos-warm-up", "auto.offset.reset": "earliest",
                         "isolation.level": "read_committed", "enable.partition.eof": True})
    consumer.subscribe(["warm-up"])
    try:
        eof, deadline = 0, time.monotonic() + 30
        while eof < 2 and time.monotonic() < deadline:
            msg = consumer.poll(1)
            if msg is not None and msg.error() is not None:
                eof += 1
    finally:
        consumer.close()
