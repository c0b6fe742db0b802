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

# The DDL of the example tables lives in tables.py (DAG files import it at
# parse time, which must not load pyspark); re-exported here for existing users.
from airflow_eos.examples.tables import (  # noqa: F401
    EVENTS_PER_MINUTE_TABLE_DDL,
    ORDERS_AVRO_TABLE_DDL,
    ORDERS_TABLE_DDL,
    PARTITIONED_ORDERS_TABLE_DDL,
)

def orders(df: DataFrame) -> DataFrame:
    """One row per order event; malformed JSON, a missing field or an amount
    that is not a number is a dead letter.

    Fields are read with ``json_tuple``, not ``from_json``: for a flat record it
    is about twice as fast in Spark 4.3 (``from_json`` opens a reader per row,
    a quarter of the stage's JVM time in a profile of the benchmark), and the
    amount goes from its JSON text straight to a decimal, never through a double.
    """
    fields = F.json_tuple(F.col("value").cast("string"), "order_id", "customer", "amount")
    rows = df.select(fields.alias("order_id", "customer", "amount_text"), "topic", "partition", "offset", "key",
                     "value")
    amount = F.col("amount_text").try_cast("decimal(12,2)")
    return rows.select(
        "order_id",
        "customer",
        amount.alias("amount"),
        F.col("topic").alias("eos_topic"),
        F.col("partition").alias("eos_partition"),
        F.col("offset").alias("eos_offset"),
        F.when(F.col("order_id").isNull(), F.lit("malformed order: not JSON or no order_id"))
        .when(F.col("amount_text").isNull(), F.lit("malformed order: no amount"))
        .when(amount.isNull(), F.lit("malformed order: amount not a number or out of range"))
        .alias("eos_error"),
        "key",
        "value",
    )


def orders_avro(df: DataFrame) -> DataFrame:
    """One row per order of an Avro source (``KafkaSource(value_format="avro")``):
    the reader schema's fields are columns already, whatever schema each record
    was written with; a record that did not decode never reaches a transform
    (it is a dead letter with the decoder's reason, keeping the raw ``key`` and
    ``value`` the transform passes on)."""
    return df.select(
        "id",
        "amount",
        "note",
        F.col("topic").alias("eos_topic"),
        F.col("partition").alias("eos_partition"),
        F.col("offset").alias("eos_offset"),
        "key",
        "value",
    )


def events_per_minute(df: DataFrame) -> DataFrame:
    """Records per minute of record time (an aggregate: no lineage; verify
    checks the window's record counts instead)."""
    return (df.groupBy(F.date_trunc("minute", F.col("timestamp")).alias("minute"))
            .agg(F.count(F.lit(1)).alias("events")))


def orders_to_topic(df: DataFrame) -> DataFrame:
    """Orders as records of a curated topic (a KafkaTarget with
    ``key_column="key"``, ``value_column="value"``,
    ``header_columns=("customer",)``): the order id as the key, the order as
    compact JSON as the value, the customer as a header, and the lineage.

    A malformed order is a dead letter (``eos_error``, as in :func:`orders`).
    Its ``key`` and ``value`` are the source record's: the target's key and
    value columns are also the raw record the stage job keeps with a dead
    letter, so a dead letter keeps what was read, not a curated null.
    """
    rows = orders(df)
    good = F.col("eos_error").isNull()
    curated = F.to_json(F.struct("order_id", "customer", F.col("amount").cast("string").alias("amount")))
    return rows.select(
        F.when(good, F.col("order_id").cast("binary")).otherwise(F.col("key")).alias("key"),
        F.when(good, curated.cast("binary")).otherwise(F.col("value")).alias("value"),
        "customer",
        "eos_topic",
        "eos_partition",
        "eos_offset",
        "eos_error",
    )
