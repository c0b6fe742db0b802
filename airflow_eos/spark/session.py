"""Building a SparkSession that can run this package's data source.

Two situations:

- launched by ``spark-submit`` (or the ``pyspark`` shell): master and conf were
  given there and win; this only fills in what is missing and registers the source;
- a plain Python process (tests, benchmarks, the demo): a local session with
  the settings this machine needs — loopback only (otherwise Spark binds a public
  interface), no UI, and Python workers running *this* interpreter (otherwise they
  run the system python, which lacks the venv's packages).
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from collections.abc import Mapping
from typing import Any

from pyspark.sql import SparkSession

from airflow_eos.spark.kafka_source import register

log = logging.getLogger(__name__)

DEFAULT_LOCAL_MASTER = "local[2]"
_LOCAL_CONF = {
    "spark.ui.enabled": "false",
    # A local session has few cores; Spark's default of 200 shuffle partitions
    # would make every aggregation schedule 200 tiny tasks.
    "spark.sql.shuffle.partitions": "4",
}


def launched_by_spark_submit() -> bool:
    """spark-submit (and the pyspark shell) start the JVM first and tell the
    Python driver where to find it."""
    return "PYSPARK_GATEWAY_PORT" in os.environ


def _submitted_conf() -> set[str]:
    """Keys of the conf spark-submit was given (--conf, --master, defaults file)."""
    from pyspark import SparkConf, SparkContext

    SparkContext._ensure_initialized()  # connects to the JVM spark-submit started
    return {key for key, _ in SparkConf().getAll()}


def spark_session(
    app_name: str = "airflow-eos",
    *,
    master: str | None = None,
    conf: Mapping[str, Any] | None = None,
) -> SparkSession:
    """A SparkSession with the ``eos_kafka`` data source registered.

    Under spark-submit, ``--master`` and ``--conf`` win over ``master`` and
    ``conf`` given here; otherwise a local session (``local[2]`` unless ``master``
    says otherwise) is built with ``conf`` applied over the local defaults.
    """
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    builder = SparkSession.builder
    if launched_by_spark_submit():
        # The JVM exists already; Python workers use PYSPARK_PYTHON as the
        # SparkContext sees it, so only fill it in when nobody chose.
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        submitted = _submitted_conf()
        for key, value in {"spark.app.name": app_name, **(conf or {})}.items():
            if key not in submitted:
                builder = builder.config(key, str(value))
    else:
        os.environ["PYSPARK_PYTHON"] = sys.executable
        builder = builder.appName(app_name).master(master or DEFAULT_LOCAL_MASTER)
        for key, value in {**_LOCAL_CONF, **(conf or {})}.items():
            builder = builder.config(key, str(value))
    spark = builder.getOrCreate()
    register(spark)
    log.info("Spark %s session %r on %s", spark.version, app_name, spark.sparkContext.master)
    return spark


def stop_session(spark: SparkSession, timeout: float = 15.0) -> None:
    """Stop the session and, if this process launched the JVM, the JVM too
    (with its Python workers), so tests and benchmarks leave no process behind.
    A later spark_session() starts a fresh JVM."""
    from pyspark import SparkContext

    spark.stop()
    gateway = SparkContext._gateway
    proc = getattr(gateway, "proc", None)
    if gateway is None or proc is None:
        return  # the JVM belongs to spark-submit, which stops it
    gateway.shutdown()
    # The JVM exits when its stdin closes; terminate it if it does not.
    if proc.stdin is not None:
        proc.stdin.close()
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.terminate()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)
    SparkContext._gateway = None
    SparkContext._jvm = None
