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
minutes (the same machine).

Production is untouched: these are the test run's settings, in its environment.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import threading
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
