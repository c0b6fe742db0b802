"""A Spark Connect server for stage jobs: ``spark-submit airflow_eos/spark/connect_server.py``
(with the ``spark.connect.grpc.*`` conf) runs until SIGTERM.

Spark's own ``SparkConnectServer`` main forces ``spark.sql.artifact.isolation.enabled``
on. Isolation gives every Connect session an artifact UUID that Spark also passes
to its Python processes (``SPARK_JOB_ARTIFACT_UUID``), and Spark keys its Python
worker pools by their environment: every session -- every window's stage -- then
starts five Python daemons of its own (data source lookup, partitions, writer, task
workers, job commit), each paying an interpreter start and the imports again
(~7 s of a 1M-record stage on 2 cores), and Spark never stops them (a leak on a
long-lived server). Here the Connect plugin runs in a classic session with isolation
off: the sessions still have their own conf, data sources and operations, but share
the Python daemons and idle workers. Session artifacts (``addArtifacts``) become
server-wide; the stage job uses none (airflow-eos is installed on the server).
"""

from __future__ import annotations

import signal
import threading

from pyspark.sql import SparkSession


def main() -> None:
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    spark = (SparkSession.builder
             .config("spark.plugins", "org.apache.spark.sql.connect.SparkConnectPlugin")
             .config("spark.sql.artifact.isolation.enabled", "false")
             .getOrCreate())
    try:
        while not stop.wait(1.0):
            pass
    finally:
        spark.stop()


if __name__ == "__main__":
    main()
