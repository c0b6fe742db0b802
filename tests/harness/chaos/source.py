"""The chaos suite's source data and its transform: the orders in the shared topic, the
target table's DDL, the Python transform and its Spark twin, and a plain reader of
the source's records (what the stage job is checked against).
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from decimal import Decimal
from typing import Any

import psycopg
import pyarrow as pa

from airflow_eos.core.kafka_client import client_logging
from airflow_eos.core.windows import to_millis
from airflow_eos.targets.postgres.target import PARTITION_PER_WINDOW

T0 = datetime(2025, 1, 6, tzinfo=timezone.utc)
HOUR = timedelta(hours=1)


# --------------------------------------------------------------------------- the source data


def record_value(n: int) -> bytes:
    """Order ``n`` of the chaos topic; every 13th is malformed (a dead letter)."""
    if n % 13 == 5:
        return b"{malformed order %d" % n
    return json.dumps({"n": n, "amount": f"{n % 997}.{n % 100:02d}"}).encode()


def source_records(hours: int, per_hour: int, partitions: int, *, start: datetime = T0) -> list[tuple[int, int, bytes]]:
    """(partition, timestamp_ms, value) of ``hours`` hours of orders, then one
    record per partition after the last hour, so that every window closes.
    Deterministic: producing it again into an empty topic gives the same log."""
    out = []
    n = 0
    for h in range(hours):
        for i in range(per_hour):
            for p in range(partitions):
                ts = to_millis(start + h * HOUR) + (i * 3_600_000) // per_hour + p * 7
                out.append((p, ts, record_value(n)))
                n += 1
    for p in range(partitions):
        out.append((p, to_millis(start + hours * HOUR) + 1_000 + p, record_value(n)))
        n += 1
    return out


# How far a record of skewed_source_records may be stamped from its place, either
# way: below the planner's max_timestamp_skew (1 hour), so no cut is a skewed one.
JITTER = timedelta(minutes=20)
LATE = timedelta(hours=2)  # how late every 11th record of skewed_source_records is stamped


def skewed_source_records(hours: int, per_hour: int, partitions: int, *,
                          start: datetime = T0) -> list[tuple[int, int, bytes]]:
    """source_records' orders, stamped out of order as producers with their
    own clocks stamp them: each record up to JITTER off its place either way
    (timestamps decrease within a partition, across window boundaries too:
    a window's cut can be a record of the hour before, followed by older
    ones), every 11th record LATE; none before ``start``; the closing records
    as they are, so every window still closes. Deterministic (a fixed seed)."""
    import random

    rng = random.Random(20261124)
    records = source_records(hours, per_hour, partitions, start=start)
    body, closing = records[:-partitions], records[-partitions:]
    jitter, late, floor = int(JITTER.total_seconds() * 1000), int(LATE.total_seconds() * 1000), to_millis(start)
    out = []
    for k, (partition, ts, value) in enumerate(body):
        stamped = ts - late if k % 11 == 7 else ts + rng.randint(-jitter, jitter)
        out.append((partition, max(floor, stamped), value))
    return out + closing


@dataclass(frozen=True)
class AvroSource:
    """The chaos topic's values in Avro (harness.avro.avro_orders, at source_records'
    places): the schema registry (a plan freezes the value subject's latest, V2,
    as the reader schema; writer schemas are resolved in it by id), and each
    poisoned record's (partition, offset, what its dead letter's reason says)."""

    registry_url: str
    poisoned: tuple[tuple[int, int, str], ...]

    def reader_schema(self, topics: tuple[str, ...]) -> Callable[[], str]:
        """PlanRequest's reader_schema, as the plan hook gives it: the subjects' latest, read at freezing."""
        from airflow_eos.core.avro import latest_reader_schema

        return lambda: latest_reader_schema({"url": self.registry_url}, tuple(f"{t}-value" for t in sorted(topics)))


def avro_source_records(registry_url: str, topic: str, hours: int, per_hour: int,
                        partitions: int) -> tuple[list[tuple[int, int, bytes]], AvroSource]:
    """source_records' places (partitions, timestamps) holding Avro orders of two
    writer schemas and poisoned records of each kind instead of JSON orders."""
    from harness.avro import avro_orders

    stamps = [(partition, ts) for partition, ts, _ in source_records(hours, per_hour, partitions)]
    orders = avro_orders(registry_url, topic, stamps)
    poisoned = tuple(sorted((p, o, reason) for (p, o), reason in orders.poisoned.items()))
    return orders.records, AvroSource(registry_url, poisoned)


def produce(bootstrap: str, topic: str, records: Iterable[tuple[int, int, bytes]]) -> None:
    from confluent_kafka import Producer

    producer = Producer({**client_logging(), "bootstrap.servers": bootstrap, "enable.idempotence": True,
                         "linger.ms": 5})
    refused: list[str] = []

    def delivered(err, msg) -> None:
        if err is not None:
            refused.append(f"{msg.topic()}[{msg.partition()}]: {err}")

    for partition, ts, value in records:
        while True:
            try:
                producer.produce(topic, value=value, partition=partition, timestamp=ts, on_delivery=delivered)
                break
            except BufferError:
                producer.poll(0.05)
    left = producer.flush(30)
    if left or refused:
        raise RuntimeError(f"{left} records not delivered to {topic}, {len(refused)} refused"
                           + (f", e.g. {refused[0]}" if refused else ""))


def create_topic(bootstrap: str, name: str, partitions: int) -> None:
    from harness.topics import create_topic as create_served

    create_served(bootstrap, name, partitions)


def delete_topic(bootstrap: str, name: str) -> None:
    """Drop a topic a schedule made for itself once its check has passed: a
    soak's broker slows as its topics pile up (Tansu's cost per request grows
    with them: the Kafka part of `make chaos N=2000` fell from ~32 to ~10
    schedules a minute with ~800 left behind)."""
    from harness.topics import delete_topic as delete_served

    delete_served(bootstrap, name)


TARGET_DDL = """
CREATE SCHEMA IF NOT EXISTS chaos;
CREATE TABLE {table} (
    id               bigint        NOT NULL,
    amount           numeric(12,2) NOT NULL,
    eos_topic        text          NOT NULL,
    eos_partition    integer       NOT NULL,
    eos_offset       bigint        NOT NULL,
    eos_pipeline     text          NOT NULL,
    eos_window_start timestamptz   NOT NULL
){partitioned}
"""
# No unique index on lineage, on purpose: a duplicate must reach the table,
# where verify finds it, rather than be refused by the database.


def create_target_table(url: str, table: str, mode: str = "replace_window") -> None:
    partitioned = " PARTITION BY RANGE (eos_window_start)" if mode == PARTITION_PER_WINDOW else ""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("SELECT pg_advisory_lock(4242)")  # CREATE SCHEMA IF NOT EXISTS races
        try:
            conn.execute(TARGET_DDL.format(table=table, partitioned=partitioned))
        finally:
            conn.execute("SELECT pg_advisory_unlock(4242)")


# --------------------------------------------------------------------------- the transform


_OUT_SCHEMA = pa.schema([
    ("id", pa.int64()), ("amount", pa.decimal128(12, 2)), ("eos_topic", pa.string()),
    ("eos_partition", pa.int32()), ("eos_offset", pa.int64()),
])


def transform_batch(batch: pa.RecordBatch) -> tuple[pa.RecordBatch, list[dict]]:
    """Records (Kafka schema) -> (rows, dead letters): the Python twin of
    :func:`spark_transform`, deterministic, so a replace rerun reproduces the rows."""
    rows: dict[str, list] = {name: [] for name in _OUT_SCHEMA.names}
    dead = []
    cols = {name: batch.column(name).to_pylist() for name in ("key", "value", "topic", "partition", "offset")}
    for key, value, topic, partition, offset in zip(*cols.values()):
        try:
            order = json.loads(value)
            n, amount = int(order["n"]), Decimal(order["amount"])
        except (ValueError, TypeError, KeyError) as exc:
            dead.append({"topic": topic, "partition": partition, "offset": offset,
                         "error": f"malformed order: {type(exc).__name__}", "key": key, "value": value})
            continue
        rows["id"].append(n)
        rows["amount"].append(amount)
        rows["eos_topic"].append(topic)
        rows["eos_partition"].append(partition)
        rows["eos_offset"].append(offset)
    return pa.record_batch([pa.array(rows[f.name], f.type) for f in _OUT_SCHEMA], schema=_OUT_SCHEMA), dead


def avro_transform_batch(batch: pa.RecordBatch) -> tuple[pa.RecordBatch, list[dict]]:
    """transform_batch for the Avro source's rows (Kafka columns, the reader
    schema's fields, eos_decode_error): a record that did not decode is a dead
    letter with the decoder's reason, as the stage job makes it; a decoded one,
    its row (amount to cents)."""
    rows: dict[str, list] = {name: [] for name in _OUT_SCHEMA.names}
    dead = []
    names = ("key", "value", "topic", "partition", "offset", "id", "amount", "eos_decode_error")
    cols = {name: batch.column(name).to_pylist() for name in names}
    for key, value, topic, partition, offset, n, amount, error in zip(*cols.values()):
        if error is not None:
            dead.append({"topic": topic, "partition": partition, "offset": offset, "error": error,
                         "key": key, "value": value})
            continue
        rows["id"].append(n)
        rows["amount"].append(Decimal(f"{amount:.2f}"))
        rows["eos_topic"].append(topic)
        rows["eos_partition"].append(partition)
        rows["eos_offset"].append(offset)
    return pa.record_batch([pa.array(rows[f.name], f.type) for f in _OUT_SCHEMA], schema=_OUT_SCHEMA), dead


def batch_transform(avro: AvroSource | None,
                    reader_schema: str | None) -> Callable[[pa.RecordBatch], tuple[pa.RecordBatch, list[dict]]]:
    """What the stage job's stand-in does to each batch the reader yields: the
    transform, after decoding the values of an Avro source with the plan's
    frozen ``reader_schema`` as the eos_kafka reader does
    (airflow_eos.spark.avro_columns, writer schemas cached)."""
    if avro is None:
        return transform_batch
    from airflow_eos.spark.avro_columns import registry_decoder, source_schema, with_decoded
    from airflow_eos.spark.kafka_source import KAFKA_SCHEMA

    if reader_schema is None:
        raise AssertionError("an Avro source's plan froze no reader schema")
    decoder = registry_decoder(reader_schema, {"url": avro.registry_url})
    schema = source_schema(KAFKA_SCHEMA, reader_schema)
    return lambda batch: avro_transform_batch(with_decoded(batch, decoder, schema))


def spark_transform(df):
    """The same rows in Spark (for run_stage and spark-submit): ``--transform
    harness.chaos:spark_transform``."""
    from pyspark.sql import functions as F

    order = F.from_json(F.col("value").cast("string"), "n bigint, amount string")
    rows = df.select(order.alias("o"), "topic", "partition", "offset", "key", "value")
    amount = F.col("o.amount").try_cast("decimal(12,2)")
    return rows.select(
        F.col("o.n").alias("id"), amount.alias("amount"),
        F.col("topic").alias("eos_topic"), F.col("partition").alias("eos_partition"),
        F.col("offset").alias("eos_offset"),
        F.when(F.col("o").isNull() | F.col("o.n").isNull() | amount.isNull(),
               F.lit("malformed order")).alias("eos_error"),
        "key", "value",
    )



def kafka_records(kafka_config: Mapping[str, Any], topic: str, partition: int, start: int,
                  end: int) -> dict[int, bytes]:
    """offset -> value of the records in ``[start, end)``, read with a plain
    consumer (not the stage job's reader: this is what the job is checked against)."""
    return dict(_kafka_range(tuple(sorted((k, str(v)) for k, v in kafka_config.items())), topic, partition,
                             start, end))


_kafka_cache: dict[tuple, tuple[tuple[int, bytes], ...]] = {}
_kafka_cache_lock = threading.Lock()


def _kafka_range(config: tuple, topic: str, partition: int, start: int, end: int) -> tuple[tuple[int, bytes], ...]:
    # The chaos topic never changes once produced: a range read once is the same range forever.
    key = (config, topic, partition, start, end)
    with _kafka_cache_lock:
        if key in _kafka_cache:
            return _kafka_cache[key]
    from confluent_kafka import Consumer
    from confluent_kafka import TopicPartition as KafkaTopicPartition

    out: list[tuple[int, bytes]] = []
    if end > start:
        consumer = Consumer({**dict(config), "group.id": "eos-chaos-check", "enable.auto.commit": False,
                             "enable.partition.eof": True})
        try:
            consumer.assign([KafkaTopicPartition(topic, partition, start)])
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                msg = consumer.poll(1.0)
                if msg is None:
                    continue
                if msg.error():
                    if msg.error().code() == -191:  # _PARTITION_EOF
                        break
                    raise RuntimeError(f"reading {topic}/{partition}: {msg.error()}")
                if msg.offset() >= end:
                    break
                out.append((msg.offset(), msg.value()))
                if msg.offset() == end - 1:
                    break
            else:
                raise RuntimeError(f"reading {topic}/{partition} [{start}, {end}) took more than 30 s")
        finally:
            consumer.close()
    with _kafka_cache_lock:
        _kafka_cache[key] = tuple(out)
    return tuple(out)



def slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "_", text.lower()).strip("_")


