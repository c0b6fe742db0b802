"""Records of one Kafka range as Arrow batches in the schema of Spark's own
Kafka source, for the reader of :mod:`airflow_eos.spark.kafka_ranges`: the
schema, the column-wise buffer a batch is built from, what a read task measures,
and the pause of Python's garbage collector while it reads.

The rows have the schema of Spark's Kafka source (with ``includeHeaders``), so a
transform written for ``spark.read.format("kafka")`` works unchanged.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

if TYPE_CHECKING:
    import pyarrow as pa

# Spark's Kafka source schema with includeHeaders=true (KafkaRecordToRowConverter):
# every field nullable, as there.
KAFKA_SCHEMA = StructType([
    StructField("key", BinaryType()),
    StructField("value", BinaryType()),
    StructField("topic", StringType()),
    StructField("partition", IntegerType()),
    StructField("offset", LongType()),
    StructField("timestamp", TimestampType()),
    StructField("timestampType", IntegerType()),
    StructField("headers", ArrayType(StructType([
        StructField("key", StringType()),
        StructField("value", BinaryType()),
    ]))),
])


def arrow_kafka_schema() -> "pa.Schema":
    """KAFKA_SCHEMA as Arrow: Spark checks a yielded batch's schema for equality
    with its own conversion of the declared schema (field names, nullability,
    list element names)."""
    from pyspark.sql.pandas.types import to_arrow_schema

    return to_arrow_schema(KAFKA_SCHEMA, timezone="UTC")


class RecordColumns:
    """Records of one range accumulated column-wise, turned into Arrow batches.

    Columns are filled with ``map`` over confluent-kafka's Message methods, which
    runs the per-record calls in C rather than in a Python loop."""

    def __init__(self, topic: str, partition: int, schema: "pa.Schema"):
        self.topic = topic
        self.partition = partition
        self.schema = schema
        self.clear()

    def clear(self) -> None:
        self.keys: list = []
        self.values: list = []
        self.offsets: list[int] = []
        self.timestamps: list[tuple[int, int]] = []
        self.headers: list = []

    def __len__(self) -> int:
        return len(self.offsets)

    def extend(self, records: list, offsets: list[int]) -> None:
        from confluent_kafka import Message

        self.keys.extend(map(Message.key, records))
        self.values.extend(map(Message.value, records))
        self.offsets.extend(offsets)
        self.timestamps.extend(map(Message.timestamp, records))
        self.headers.extend(map(Message.headers, records))

    def to_batch(self) -> "pa.RecordBatch":
        import numpy as np
        import pyarrow as pa

        n = len(self.offsets)
        types = [f.type for f in self.schema]
        ts_types, ts_millis = zip(*self.timestamps)
        # numpy, not pyarrow.compute: the latter's first call costs ~1.5 s (kernel
        # registry start-up) in every fresh Python worker.
        timestamps = pa.array(np.asarray(ts_millis, dtype=np.int64) * 1000, pa.int64()).view(types[5])
        # confluent-kafka's timestamp types (0 none, 1 create, 2 log append) are
        # Kafka's ids (-1, 0, 1), which Spark's Kafka source exposes, plus one.
        kafka_ts_types = pa.array(np.asarray(ts_types, dtype=np.int32) - 1, types[6])
        if self.headers.count(None) == n:
            headers = pa.nulls(n, types[7])  # Spark's Kafka source: null when a record has none
        else:
            headers = pa.array(self.headers, types[7])
        arrays = [
            pa.array(self.keys, types[0]),
            pa.array(self.values, types[1]),
            pa.repeat(pa.scalar(self.topic, types[2]), n),
            pa.repeat(pa.scalar(self.partition, types[3]), n),
            pa.array(self.offsets, types[4]),
            timestamps,
            kafka_ts_types,
            headers,
        ]
        self.clear()
        return pa.RecordBatch.from_arrays(arrays, schema=self.schema)


@dataclass
class ReadStats:
    """What one task did and where its time went (seconds)."""

    records: int = 0
    batches: int = 0
    warm_up_s: float = 0.0  # a fresh worker's one-time imports
    connect_s: float = 0.0  # consumer creation and assignment, until the first answer
    fetch_s: float = 0.0  # in consume(): waiting, and librdkafka handing over messages
    decode_s: float = 0.0  # taking records apart into columns
    arrow_s: float = 0.0  # building Arrow batches
    downstream_s: float = 0.0  # Spark consuming the batches we yielded
    total_s: float = 0.0

    def summary(self) -> str:
        rate = self.records / self.total_s if self.total_s > 0 else 0.0
        return (f"{self.records} records in {self.batches} batches, {self.total_s:.2f}s ({rate:,.0f} rec/s): "
                f"warm-up {self.warm_up_s:.2f}s, connect {self.connect_s:.2f}s, fetch {self.fetch_s:.2f}s, "
                f"decode {self.decode_s:.2f}s, arrow {self.arrow_s:.2f}s, downstream {self.downstream_s:.2f}s")


class GcPause:
    """Pauses Python's cyclic garbage collector while the reader runs, not while
    Spark runs between our batches. consume() creates ~10k GC-tracked messages a
    call and the collector's passes over them halved read throughput (measured:
    ~450k -> ~900k records/s per task). The reader creates no reference cycles."""

    def __init__(self) -> None:
        self.owned = gc.isenabled()  # if someone else disabled it, leave it alone

    def pause(self) -> None:
        if self.owned:
            gc.disable()

    def resume(self) -> None:
        if self.owned:
            gc.enable()


def emit_batch(columns: RecordColumns, stats: ReadStats, gc_pause: GcPause) -> Iterator["pa.RecordBatch"]:
    """Yield the buffered records as one batch, the collector running (and the
    time counted as downstream) while Spark consumes it."""
    t0 = time.perf_counter()
    rows = len(columns)
    batch = columns.to_batch()
    t1 = time.perf_counter()
    stats.arrow_s += t1 - t0
    stats.records += rows
    stats.batches += 1
    gc_pause.resume()
    yield batch
    gc_pause.pause()
    stats.downstream_s += time.perf_counter() - t1


__all__ = ["KAFKA_SCHEMA", "GcPause", "ReadStats", "RecordColumns", "arrow_kafka_schema", "emit_batch"]
