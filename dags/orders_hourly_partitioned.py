"""Orders, hour by hour, into a table partitioned by window: each committed
window is one partition of analytics.orders_partitioned.

The same pipeline shape as orders_hourly (lineage, dead letters, reruns without
duplicates), with the target in mode ``partition_per_window``: the stage fills
the window's future partition and builds its indexes, and the commit attaches
it in the transaction that records the offsets. Publishing moves no rows, so a
1M-record window commits in a fraction of a second.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from airflow.providers.common.sql.operators.sql import SQLExecuteQueryOperator
from airflow.sdk import DAG
from airflow.timetables.interval import CronDataIntervalTimetable
from airflow_eos import KafkaSource, PostgresTarget, exactly_once_window
from airflow_eos.examples.tables import PARTITIONED_ORDERS_TABLE_DDL

with DAG(
    dag_id="orders_hourly_partitioned",
    schedule=CronDataIntervalTimetable("0 * * * *", timezone="UTC"),
    start_date=datetime(2026, 1, 1, tzinfo=timezone.utc),
    catchup=False,
    max_active_runs=4,
    default_args={"retries": 1, "retry_delay": timedelta(seconds=5)},
    tags=["airflow-eos", "example"],
) as dag:
    create_table = SQLExecuteQueryOperator(task_id="create_table", conn_id="postgres_default",
                                           sql=PARTITIONED_ORDERS_TABLE_DDL)
    window = exactly_once_window(
        pipeline="orders_hourly_partitioned",
        source=KafkaSource(topics=["orders"], kafka_conn_id="kafka_default"),
        transform="airflow_eos.examples.transforms:orders",
        target=PostgresTarget(table="analytics.orders_partitioned", mode="partition_per_window",
                              postgres_conn_id="postgres_default"),
        spark_conn_id="spark_default",
        max_bad_records=1_000,
    )
    create_table >> window
