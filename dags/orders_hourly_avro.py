"""Orders in Avro, hour by hour, from Kafka into PostgreSQL, exactly once.

The topic ``orders_avro`` carries Avro in Confluent's wire format, its writer
schemas in a schema registry (the ``eos_schema_registry`` connection
``schema_registry_default``). Each window decodes under the reader schema its
plan froze (the subject ``orders_avro-value``'s latest when the window was
planned), so a rerun decodes as the first run did even after the registry moved
on; records of older compatible writer schemas resolve to it by Avro's rules.
A record that is not in the wire format, names a schema id the registry does not
know, or was written with a schema the reader schema cannot resolve is a dead
letter (eos.dead_letters) with the reason; a registry that does not answer fails
the stage, which is retried, and nothing is published.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from airflow.providers.common.sql.operators.sql import SQLExecuteQueryOperator
from airflow.sdk import DAG
from airflow.timetables.interval import CronDataIntervalTimetable
from airflow_eos import KafkaSource, PostgresTarget, exactly_once_window
from airflow_eos.examples.tables import ORDERS_AVRO_TABLE_DDL

with DAG(
    dag_id="orders_hourly_avro",
    schedule=CronDataIntervalTimetable("0 * * * *", timezone="UTC"),
    start_date=datetime(2026, 1, 1, tzinfo=timezone.utc),
    catchup=False,
    max_active_runs=4,
    default_args={"retries": 1, "retry_delay": timedelta(seconds=5)},
    tags=["airflow-eos", "example"],
) as dag:
    create_table = SQLExecuteQueryOperator(
        task_id="create_table", conn_id="postgres_default", sql=ORDERS_AVRO_TABLE_DDL)
    window = exactly_once_window(
        pipeline="orders_hourly_avro",
        source=KafkaSource(topics=["orders_avro"], kafka_conn_id="kafka_default", value_format="avro",
                           schema_registry_conn_id="schema_registry_default"),
        transform="airflow_eos.examples.transforms:orders_avro",
        target=PostgresTarget(table="analytics.orders_avro", postgres_conn_id="postgres_default"),
        spark_conn_id="spark_default",
        max_bad_records=1_000,
    )
    create_table >> window
