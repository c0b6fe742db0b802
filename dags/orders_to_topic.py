"""Orders, hour by hour, from Kafka into a curated Kafka topic, exactly once.

The same source as orders_hourly (topic ``orders``, malformed records as dead
letters), with a KafkaTarget: each window's records are published into the
topic ``orders_curated`` in one Kafka producer transaction, together with the
window's commit marker, by the commit task; the ledger (schema ``eos`` in
``postgres_default``) records the commit and keeps the dead letters. Each
record's key is the order id, its value the order as compact JSON, and its
headers the customer plus the lineage (``eos-pipeline``, ``eos-window-start``,
``eos-epoch``, ``eos-commit``, ``eos-topic``, ``eos-partition``,
``eos-offset``).

Consumers of ``orders_curated`` must read with ``isolation.level=
read_committed`` to see each order exactly once (see README, "The Kafka
target"). The topic must exist before the first run, with the partitions,
replication and retention its consumers need: the target never creates it::

    kafka-topics.sh --create --topic orders_curated --partitions 3
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from airflow.sdk import DAG
from airflow.timetables.interval import CronDataIntervalTimetable
from airflow_eos import KafkaSource, KafkaTarget, exactly_once_window

with DAG(
    dag_id="orders_to_topic",
    schedule=CronDataIntervalTimetable("0 * * * *", timezone="UTC"),
    start_date=datetime(2026, 1, 1, tzinfo=timezone.utc),
    catchup=False,
    max_active_runs=4,
    default_args={"retries": 1, "retry_delay": timedelta(seconds=5)},
    tags=["airflow-eos", "example"],
) as dag:
    exactly_once_window(
        pipeline="orders_to_topic",
        source=KafkaSource(topics=["orders"], kafka_conn_id="kafka_default"),
        transform="airflow_eos.examples.transforms:orders_to_topic",
        target=KafkaTarget(
            topic="orders_curated",
            key_column="key",
            value_column="value",
            header_columns=("customer",),
            kafka_conn_id="kafka_default",
            postgres_conn_id="postgres_default",
        ),
        spark_conn_id="spark_default",
        max_bad_records=1_000,
    )
