"""Transforms of the example DAGs. A transform is DataFrame -> DataFrame, run in
Spark on the records of one window, in the schema of Spark's own Kafka source
(key, value, topic, partition, offset, timestamp, timestampType, headers).

Record-level transforms keep lineage (eos_topic, eos_partition, eos_offset), so
``airflow-eos verify`` can prove every record was published exactly once. A row
whose ``eos_error`` is not null is a dead letter: it is kept, with its offset and
its raw key and value, in eos.dead_letters instead of the target.
"""

from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import DoubleType, StringType, StructField, StructType

ORDER = StructType([
    StructField("order_id", StringType()),
    StructField("customer", StringType()),
    StructField("amount", DoubleType()),
])


def orders(df: DataFrame) -> DataFrame:
    """One row per order event; malformed JSON or a missing field is a dead letter."""
    order = F.from_json(F.col("value").cast("string"), ORDER)
    rows = df.select(order.alias("o"), "topic", "partition", "offset", "key", "value")
    return rows.select(
        F.col("o.order_id").alias("order_id"),
        F.col("o.customer").alias("customer"),
        F.col("o.amount").try_cast("decimal(12,2)").alias("amount"),
        F.col("topic").alias("eos_topic"),
        F.col("partition").alias("eos_partition"),
        F.col("offset").alias("eos_offset"),
        F.when(F.col("o").isNull() | F.col("o.order_id").isNull(), F.lit("malformed order: not JSON or no order_id"))
        .when(F.col("o.amount").isNull(), F.lit("malformed order: no amount"))
        .when(F.col("o.amount").try_cast("decimal(12,2)").isNull(), F.lit("malformed order: amount out of range"))
        .alias("eos_error"),
        "key",
        "value",
    )


def events_per_minute(df: DataFrame) -> DataFrame:
    """Records per minute of record time (an aggregate: no lineage; verify
    checks the window's record counts instead)."""
    return (df.groupBy(F.date_trunc("minute", F.col("timestamp")).alias("minute"))
            .agg(F.count(F.lit(1)).alias("events")))


# The target tables of the examples. The sink never creates or alters a target.
_ORDERS_COLUMNS = """
    order_id          text           NOT NULL,
    customer          text,
    amount            numeric(12, 2) NOT NULL,
    eos_topic         text           NOT NULL,
    eos_partition     integer        NOT NULL,
    eos_offset        bigint         NOT NULL,
    eos_pipeline      text           NOT NULL,
    eos_window_start  timestamptz    NOT NULL,"""

ORDERS_TABLE_DDL = f"""
CREATE SCHEMA IF NOT EXISTS analytics;
CREATE TABLE IF NOT EXISTS analytics.orders ({_ORDERS_COLUMNS}
    -- lineage is unique: the database itself refuses a duplicate
    UNIQUE (eos_topic, eos_partition, eos_offset)
);
"""

# The same orders, one partition per window (mode partition_per_window): the
# commit attaches the window's staging as a partition instead of copying rows.
# A partitioned table's unique indexes must include its partition key.
PARTITIONED_ORDERS_TABLE_DDL = f"""
CREATE SCHEMA IF NOT EXISTS analytics;
CREATE TABLE IF NOT EXISTS analytics.orders_partitioned ({_ORDERS_COLUMNS}
    UNIQUE (eos_topic, eos_partition, eos_offset, eos_window_start)
) PARTITION BY RANGE (eos_window_start);
"""

EVENTS_PER_MINUTE_TABLE_DDL = """
CREATE SCHEMA IF NOT EXISTS analytics;
CREATE TABLE IF NOT EXISTS analytics.events_per_minute (
    minute            timestamptz NOT NULL,
    events            bigint      NOT NULL,
    eos_pipeline      text        NOT NULL,
    eos_window_start  timestamptz NOT NULL
);
"""
