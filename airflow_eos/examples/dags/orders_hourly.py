"""Orders, hour by hour, from Kafka into PostgreSQL, exactly once.

Record level with lineage: every row of analytics.orders names the Kafka record
it came from (eos_topic, eos_partition, eos_offset); malformed events become
dead letters (eos.dead_letters) instead of failing the window. Backfills and
the UI's Clear rerun a window without duplicates: the plan is frozen, a newer
attempt fences the old one, the commit publishes once.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from airflow.providers.common.sql.operators.sql import SQLExecuteQueryOperator
from airflow.sdk import DAG
from airflow.timetables.interval import CronDataIntervalTimetable
from airflow_eos import KafkaSource, PostgresTarget, exactly_once_window
from airflow_eos.examples.tables import ORDERS_TABLE_DDL

with DAG(
    dag_id="orders_hourly",
    schedule=CronDataIntervalTimetable("0 * * * *", timezone="UTC"),
    start_date=datetime(2026, 1, 1, tzinfo=timezone.utc),
    catchup=False,
    max_active_runs=4,
    default_args={"retries": 1, "retry_delay": timedelta(seconds=5)},
    tags=["airflow-eos", "example"],
) as dag:
    create_table = SQLExecuteQueryOperator(task_id="create_table", conn_id="postgres_default", sql=ORDERS_TABLE_DDL)
    window = exactly_once_window(
        pipeline="orders_hourly",
        source=KafkaSource(topics=["orders"], kafka_conn_id="kafka_default"),
        transform="airflow_eos.examples.transforms:orders",
        target=PostgresTarget(table="analytics.orders", postgres_conn_id="postgres_default"),
        spark_conn_id="spark_default",
        max_bad_records=1_000,
    )
    create_table >> window
