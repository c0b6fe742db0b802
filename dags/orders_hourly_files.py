"""Orders, hour by hour, from Kafka into a directory of Parquet files, exactly once.

The same pipeline as orders_hourly (same topic, same transform: lineage, dead
letters), with a FileTarget: each committed window is one partition directory
``eos_window_start=.../`` under the root, written by Spark's own Parquet writer
into a staging directory readers ignore and published by one atomic rename after
the ledger (schema ``eos`` in ``postgres_default``) decided the commit. Dead
letters go to the ledger's ``eos.dead_letters``.

The root is ``$EOS_ORDERS_FILES_ROOT``, by default ``<temp dir>/airflow-eos/
orders_hourly_files``; it must be a local directory that the workers and the
Spark executors see at the same path, or an ``hdfs://namenode:port/...`` URL
(``create_root`` makes it).
"""

from __future__ import annotations

import os
import tempfile
from datetime import datetime, timedelta, timezone

from airflow.sdk import DAG, task
from airflow.timetables.interval import CronDataIntervalTimetable
from airflow_eos import FileTarget, KafkaSource, exactly_once_window

ROOT = os.environ.get("EOS_ORDERS_FILES_ROOT") or os.path.join(tempfile.gettempdir(), "airflow-eos",
                                                               "orders_hourly_files")

with DAG(
    dag_id="orders_hourly_files",
    schedule=CronDataIntervalTimetable("0 * * * *", timezone="UTC"),
    start_date=datetime(2026, 1, 1, tzinfo=timezone.utc),
    catchup=False,
    max_active_runs=4,
    default_args={"retries": 1, "retry_delay": timedelta(seconds=5)},
    tags=["airflow-eos", "example"],
) as dag:

    @task
    def create_root() -> str:
        from airflow_eos.targets.files.storage import files_for  # a local directory, or one on HDFS

        files_for(ROOT).makedirs(ROOT)
        return ROOT

    window = exactly_once_window(
        pipeline="orders_hourly_files",
        source=KafkaSource(topics=["orders"], kafka_conn_id="kafka_default"),
        transform="airflow_eos.examples.transforms:orders",
        target=FileTarget(path=ROOT, postgres_conn_id="postgres_default"),
        spark_conn_id="spark_default",
        max_bad_records=1_000,
    )
    create_root() >> window
