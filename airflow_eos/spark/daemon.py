"""PySpark's worker daemon with the stage job's imports done once, before it forks
(``spark.python.daemon.module=airflow_eos.spark.daemon``).

pyspark.daemon forks one Python worker per task slot and each fresh worker imports
pyspark.worker, pyarrow (and the pandas pyarrow loads on its first ``pa.array``),
confluent-kafka, psycopg and this package: 2-3 s of CPU per worker, paid again
whenever Spark's idle-worker timeout (1 minute) has closed the workers, so by every
hourly window. Imported here, before the fork, a worker starts with them in place.

pyspark.daemon imports the worker module only after the fork because a thread must
not be running when a process forks; none is: numpy's OpenBLAS pool and pyarrow's
jemalloc background thread are kept from starting (the settings below, which the
workers inherit; Spark runs one task per core anyway).

Only Spark's task workers use this module; its planner processes (data source
lookup, partitions, writer, job commit) always start ``pyspark.daemon``.
"""

from __future__ import annotations

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("JE_ARROW_MALLOC_CONF", "background_thread:false")

import confluent_kafka  # noqa: E402, F401
import psycopg  # noqa: E402, F401
import pyarrow as pa  # noqa: E402
import pyspark.worker  # noqa: E402, F401
from pyspark.daemon import manager  # noqa: E402

import airflow_eos.spark.kafka_source  # noqa: E402, F401
import airflow_eos.spark.stage  # noqa: E402, F401

pa.array([b""], pa.binary())  # pyarrow imports pandas on its first conversion from Python objects

if __name__ == "__main__":
    manager()
