"""Building a SparkSession that can run this package's data source.

Three situations:

- launched by ``spark-submit`` (or the ``pyspark`` shell): master and conf were
  given there and win; this only fills in what is missing and registers the source;
- a plain Python process (tests, benchmarks, the demo): a local session with
  the settings this machine needs — loopback only (otherwise Spark binds a public
  interface), no UI, and Python workers running *this* interpreter (otherwise they
  run the system python, which lacks the venv's packages);
- a client of a running Spark Connect server (``remote="sc://host:port"``): no
  JVM here at all. The server's driver stays warm between windows, so a stage
  pays neither spark-submit nor JVM start; its Python workers need airflow-eos
  installed (the server's ``PYSPARK_PYTHON``).
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from collections.abc import Mapping
from typing import Any

from pyspark.sql import SparkSession

from airflow_eos.spark.connector import connector_jars
from airflow_eos.spark.kafka_source import register
from airflow_eos.spark.submit import WORKER_DAEMON_CONF

log = logging.getLogger(__name__)

DEFAULT_LOCAL_MASTER = "local[2]"
_CONNECT_MODE_ENV = "SPARK_CONNECT_MODE_ENABLED"
_connect_sessions: set[int] = set()  # ids of the Spark Connect sessions spark_session() opened
_connect_mark_is_ours = False  # pyspark set _CONNECT_MODE_ENV for our first open session
_LOCAL_CONF = {
    "spark.ui.enabled": "false",
    # A local session has few cores; Spark's default of 200 shuffle partitions
    # would make every aggregation schedule 200 tiny tasks.
    "spark.sql.shuffle.partitions": "4",
    **WORKER_DAEMON_CONF,
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
    remote: str | None = None,
) -> SparkSession:
    """A SparkSession with the ``eos_kafka`` data source registered.

    With ``remote`` (a Spark Connect URL, ``sc://host:port/;params``): a new
    session of that server (``conf`` is applied to it; ``master`` is the
    server's). Under spark-submit, ``--master`` and ``--conf`` win over
    ``master`` and ``conf`` given here; otherwise a local session (``local[2]``
    unless ``master`` says otherwise) is built with ``conf`` applied over the
    local defaults.
    """
    if remote:
        global _connect_mark_is_ours
        if not _connect_sessions:
            _connect_mark_is_ours = _CONNECT_MODE_ENV not in os.environ  # see stop_session
        # create(), not getOrCreate(): a session of our own, whose stop() ends
        # only it, never another task's session of the same server.
        spark = SparkSession.builder.remote(remote).create()
        _connect_sessions.add(id(spark))
        for key, value in (conf or {}).items():
            spark.conf.set(key, str(value))
        register(spark)
        log.info("Spark %s session %r on Spark Connect server %s", spark.version, app_name,
                 remote.split(";", 1)[0])  # the parameters may hold a token
        return spark
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
        # Spark's Kafka connector (and S3A), from the cache `make setup` filled, beside any jars of ``conf``
        # (spark-submit's --jars does this for a submitted job; a Connect server has them from its start)
        settings = {**_LOCAL_CONF, **(conf or {})}
        settings["spark.jars"] = ",".join([*filter(None, str(settings.get("spark.jars", "")).split(",")),
                                           *connector_jars()])
        for key, value in settings.items():
            builder = builder.config(key, str(value))
    spark = builder.getOrCreate()
    register(spark)
    log.info("Spark %s session %r on %s", spark.version, app_name, spark.sparkContext.master)
    return spark


def is_remote(spark: SparkSession) -> bool:
    """A Spark Connect client session (no JVM in this process)?"""
    return type(spark).__module__.startswith("pyspark.sql.connect")


def stop_session(spark: SparkSession, timeout: float = 15.0) -> None:
    """Stop the session and, if this process launched the JVM, the JVM too
    (with its Python workers), so tests and benchmarks leave no process behind.
    A later spark_session() starts a fresh JVM."""
    from pyspark import SparkContext

    spark.stop()
    if is_remote(spark):
        # A Spark Connect session: the server and its JVM are not ours. pyspark
        # marked the whole process as a Connect client (an environment variable,
        # inherited by every child): without its last session, unmark it, or a
        # spark-submit started from this process later (another task of a
        # dag.test, a test suite) would fail with CONNECT_URL_NOT_SET.
        _connect_sessions.discard(id(spark))
        if not _connect_sessions and _connect_mark_is_ours:
            os.environ.pop(_CONNECT_MODE_ENV, None)
        return
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
