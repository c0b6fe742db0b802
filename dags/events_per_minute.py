"""Events per minute into a database, exactly once: the classic aggregate.

Each hourly window counts its records per minute of record time and publishes
the counts with the window (mode replace_window); rerunning a window with
on_committed="replace" swaps its counts atomically, so a reader never sees a
window counted twice or half.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from airflow.providers.common.sql.operators.sql import SQLExecuteQueryOperator
from airflow.sdk import DAG
from airflow.timetables.interval import CronDataIntervalTimetable
from airflow_eos import KafkaSource, PostgresTarget, exactly_once_window
from airflow_eos.examples.tables import EVENTS_PER_MINUTE_TABLE_DDL

with DAG(
    dag_id="events_per_minute",
    schedule=CronDataIntervalTimetable("0 * * * *", timezone="UTC"),
    start_date=datetime(2026, 1, 1, tzinfo=timezone.utc),
    catchup=False,
    max_active_runs=4,
    default_args={"retries": 1, "retry_delay": timedelta(seconds=5)},
    tags=["airflow-eos", "example"],
) as dag:
    create_table = SQLExecuteQueryOperator(
        task_id="create_table", conn_id="postgres_default", sql=EVENTS_PER_MINUTE_TABLE_DDL)
    window = exactly_once_window(
        pipeline="events_per_minute",
        source=KafkaSource(topics=["events"]),
        transform="airflow_eos.examples.transforms:events_per_minute",
        target=PostgresTarget(table="analytics.events_per_minute", on_committed="replace"),
    )
    create_table >> window
