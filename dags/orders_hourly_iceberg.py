"""Orders, hour by hour, from Kafka into an Apache Iceberg table, exactly once.

The same pipeline as orders_hourly (same topic, same transform: lineage, dead
letters), with an IcebergTarget: Spark's own Parquet writer writes each
window's files under the table's location, where no snapshot names them; once
the ledger (schema ``eos`` in ``postgres_default``) decided the commit, one
append snapshot names exactly those files, its summary carrying the window
and a commit token. The table lives in the SQL catalog the target keeps in the
ledger's database, or, when ``$EOS_ORDERS_ICEBERG_CATALOG`` names a catalog
connection (a REST catalog: docs/connections.md), in that catalog; dead letters
go to the ledger's ``eos.dead_letters``.

The target never creates or evolves a table: ``create_table`` makes it, once,
with the transform's columns (the schema is the contract, see
docs/iceberg-target.md). Its location is under ``$EOS_ORDERS_ICEBERG_WAREHOUSE``
(by default ``<temp dir>/airflow-eos/iceberg``), a directory the workers and
the Spark executors see at the same path, or an ``s3://bucket/prefix`` the
catalog's ``s3.*`` properties reach.
"""

from __future__ import annotations

import os
import tempfile
from datetime import datetime, timedelta, timezone

from airflow.sdk import DAG, task
from airflow.timetables.interval import CronDataIntervalTimetable
from airflow_eos import IcebergTarget, KafkaSource, exactly_once_window

TABLE = os.environ.get("EOS_ORDERS_ICEBERG_TABLE") or "analytics.orders"
WAREHOUSE = os.environ.get("EOS_ORDERS_ICEBERG_WAREHOUSE") or os.path.join(tempfile.gettempdir(), "airflow-eos",
                                                                          "iceberg")
CATALOG = os.environ.get("EOS_ORDERS_ICEBERG_CATALOG") or None  # a catalog connection's id; None: the ledger's
TARGET = IcebergTarget(table=TABLE, postgres_conn_id="postgres_default", catalog_conn_id=CATALOG)

with DAG(
    dag_id="orders_hourly_iceberg",
    schedule=CronDataIntervalTimetable("0 * * * *", timezone="UTC"),
    start_date=datetime(2026, 1, 1, tzinfo=timezone.utc),
    catchup=False,
    max_active_runs=4,
    default_args={"retries": 1, "retry_delay": timedelta(seconds=5)},
    tags=["airflow-eos", "example"],
) as dag:

    @task
    def create_table() -> str:
        """The table, if it is not there: the transform's columns, nullable."""
        import pyarrow as pa
        from airflow_eos.hooks.eos import EosTargetHook, ledger_for

        ledger_for("postgres_default")  # migrated: the catalog's tables are the ledger's
        catalog = EosTargetHook(TARGET).sink.catalog()
        namespace, _, name = TABLE.rpartition(".")
        catalog.create_namespace_if_not_exists(namespace)
        schema = pa.schema([("order_id", pa.string()), ("customer", pa.string()), ("amount", pa.decimal128(12, 2)),
                            ("eos_topic", pa.string()), ("eos_partition", pa.int32()), ("eos_offset", pa.int64())])
        warehouse = WAREHOUSE if "://" in WAREHOUSE else f"file://{WAREHOUSE}"
        table = catalog.create_table_if_not_exists(TABLE, schema, location=f"{warehouse}/{namespace}/{name}")
        return table.location()

    window = exactly_once_window(
        pipeline="orders_hourly_iceberg",
        source=KafkaSource(topics=["orders"], kafka_conn_id="kafka_default"),
        transform="airflow_eos.examples.transforms:orders",
        target=TARGET,
        spark_conn_id="spark_default",
        max_bad_records=1_000,
    )
    create_table() >> window
