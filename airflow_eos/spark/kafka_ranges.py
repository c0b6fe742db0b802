"""Reading one planned offset range of a Kafka partition exactly, for the
``eos_kafka`` data source (:mod:`airflow_eos.spark.kafka_source`), which runs it in
Spark's Python workers, and for the stage job's write tasks, which read dead
letters' records back by offset (read_records).

A planned range ``[start_offset, end_offset)`` of a partition becomes one Spark
task, or several when it is wider than ``max_records_per_task`` offsets; the
sub-ranges tile the range exactly (split_range).  A task reads with confluent-kafka
(assign + seek, no consumer group, ``read_committed``) and stops at the end cut
*by offset*: offsets may have gaps (transaction markers, compaction), so neither a
record count nor "the last record is end-1" says a range is complete.  A range is
complete when a record at or beyond the end cut, or the end of the partition at or
beyond it, was seen.  Reaching the end of the partition before the end cut means
records the plan promised are gone; that is an error, never a short result.

The rows have the schema of Spark's own Kafka source (with ``includeHeaders``),
so a transform written for ``spark.read.format("kafka")`` works unchanged.
"""

from __future__ import annotations

import bisect
import gc
import itertools
import logging
import math
import operator
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pyspark.sql.datasource import InputPartition
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

from airflow_eos.core.errors import (
    LOG_TRUNCATED_ADVICE,
    ConfigurationError,
    LogTruncated,
    OffsetsExpired,
    SourceUnavailable,
)
from airflow_eos.core.kafka_errors import kafka_error
from airflow_eos.core.windows import PartitionRange, WindowPlan

if TYPE_CHECKING:
    import pyarrow as pa

log = logging.getLogger(__name__)


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


# bench/bench_read.py (now folded into bench/run.py) measured 5k, 20k and 50k rows per batch alike (within the
# noise of 2 cores); 20k amortises per-batch costs and keeps a batch a few MB.
DEFAULT_BATCH_ROWS = 20_000
# How long a partition may look shorter than the plan (end of partition, or
# silence, before the end cut) before the read fails: a leader change can report
# a high watermark that is briefly behind.
DEFAULT_END_GRACE_S = 2.0
# No record, no end of partition, no error for this long: the broker is gone.
DEFAULT_POLL_TIMEOUT_S = 60.0
PROGRESS_EVERY_S = 10.0

# Throughput settings for bulk reads; a user's kafka.* options override them.
# (The safety settings of consumer_config override both.)
READER_KAFKA_DEFAULTS = {
    # When its prefetch queue is full, librdkafka pauses fetching for
    # fetch.queue.backoff.ms (default 1000): a reader that drains the queue in
    # 0.1 s then idles. Measured on Tansu, a Kafka-protocol broker: ~200k -> ~850k records/s
    # per consumer.
    "fetch.queue.backoff.ms": 10,
    "fetch.wait.max.ms": 10,
    "max.partition.fetch.bytes": 8 * 1024 * 1024,
    "fetch.max.bytes": 64 * 1024 * 1024,
    "receive.message.max.bytes": 65 * 1024 * 1024,
}
# Dead letters' records are read back by offset (read_records): offsets closer
# than this are read in one pass (~175k records/s here), farther ones seek.
READ_BACK_GAP = 10_000
_CONSUME_BATCH = 10_000
# consume() waits this long unless _CONSUME_BATCH records are ready; short, so a
# task's last partial batch does not wait for records it will not use.
_CONSUME_WAIT_S = 0.05


# --------------------------------------------------------------------------- splitting


@dataclass(frozen=True)
class KafkaRangePartition(InputPartition):
    """One Spark task: offsets ``[start_offset, end_offset)`` of one Kafka partition,
    piece ``piece`` of ``pieces`` of its planned range."""

    topic: str
    partition: int
    start_offset: int
    end_offset: int
    piece: int = 1
    pieces: int = 1

    def __str__(self) -> str:
        return (f"{self.topic}[{self.partition}] [{self.start_offset}, {self.end_offset})"
                f" piece {self.piece}/{self.pieces}")


def split_range(rng: PartitionRange, max_records_per_task: int) -> list[KafkaRangePartition]:
    """Sub-ranges of near-equal offset width, at most ``max_records_per_task`` wide,
    tiling ``rng`` exactly. An empty range needs no task."""
    if rng.width <= 0:
        return []
    pieces = math.ceil(rng.width / max_records_per_task)
    bounds = [rng.start_offset + (rng.width * i) // pieces for i in range(pieces + 1)]
    return [KafkaRangePartition(rng.topic, rng.partition, bounds[i], bounds[i + 1], i + 1, pieces)
            for i in range(pieces)]


def plan_tasks(plan: WindowPlan, max_records_per_task: int) -> list[KafkaRangePartition]:
    return [task for rng in plan.ranges for task in split_range(rng, max_records_per_task)]


# --------------------------------------------------------------------------- reading one range


def _arrow_schema() -> "pa.Schema":
    # Spark checks a yielded batch's schema for equality with its own conversion
    # of the declared schema (field names, nullability, list element names).
    from pyspark.sql.pandas.types import to_arrow_schema

    return to_arrow_schema(KAFKA_SCHEMA, timezone="UTC")


class _Columns:
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


class _GcPause:
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


def read_range(
    kafka_config: Mapping[str, Any],
    task: KafkaRangePartition,
    *,
    batch_rows: int = DEFAULT_BATCH_ROWS,
    end_grace_s: float = DEFAULT_END_GRACE_S,
    poll_timeout_s: float = DEFAULT_POLL_TIMEOUT_S,
    stats: ReadStats | None = None,
) -> Iterator["pa.RecordBatch"]:
    """Yield every record of ``task``'s offsets as Arrow batches of KAFKA_SCHEMA.

    Exact: each record with ``start <= offset < end`` once, in offset order, or an
    error (LogTruncated, OffsetsExpired, UnknownTopic, SourceUnavailable) — never
    fewer records because the log ended early.
    """
    from confluent_kafka import KafkaError, Message
    from confluent_kafka import TopicPartition as KafkaTopicPartition

    from airflow_eos.core.source import client_errors, consumer_config, reader

    stats = stats if stats is not None else ReadStats()
    start, end = task.start_offset, task.end_offset
    if start >= end:
        return
    began = time.perf_counter()
    config = consumer_config(
        {**READER_KAFKA_DEFAULTS, **kafka_config},
        # Don't prefetch far past a narrow range's end; librdkafka's default is 100k messages.
        **{"queued.min.messages": max(1_000, min(100_000, end - start))},
    )
    consumer = reader(config, f"a Kafka consumer for {task}")
    columns = _Columns(task.topic, task.partition, _arrow_schema())
    next_offset = start  # every offset below this one is accounted for
    reached = start  # the log has been read up to here (records, or end of partition)
    answered = False
    short_since: float | None = None  # since when the partition has looked shorter than the plan
    silence_checked = False
    last_answer = last_progress_log = time.perf_counter()
    gc_pause = _GcPause()
    gc_pause.pause()
    try:
        consumer.assign([KafkaTopicPartition(task.topic, task.partition, start)])
        while next_offset < end:
            t0 = time.perf_counter()
            msgs = consumer.consume(num_messages=_CONSUME_BATCH, timeout=_CONSUME_WAIT_S)
            t1 = time.perf_counter()
            stats.fetch_s += t1 - t0
            done = False
            if msgs:
                if not answered:
                    answered = True
                    stats.connect_s = t1 - began
                last_answer = t1
                silence_checked = False
                errors = list(map(Message.error, msgs))
                # (KafkaError cannot be compared with None: no errors.count(None).)
                if not any(map(operator.is_not, errors, itertools.repeat(None))):
                    records, events = msgs, ()
                else:
                    records = [m for m, e in zip(msgs, errors) if e is None]
                    events = [(m, e) for m, e in zip(msgs, errors) if e is not None]
                if records:
                    offsets = list(map(Message.offset, records))
                    if not all(map(operator.lt, offsets, itertools.islice(offsets, 1, None))):
                        # librdkafka delivers a partition in offset order; if it ever
                        # does not, order and de-duplicate rather than yield twice.
                        by_offset = dict(sorted(zip(offsets, records)))
                        offsets, records = list(by_offset), list(by_offset.values())
                    lo = bisect.bisect_left(offsets, next_offset)  # below: already yielded
                    hi = bisect.bisect_left(offsets, end)  # from here: beyond the range
                    done = hi < len(offsets)
                    if lo < hi:
                        if lo or hi < len(offsets):
                            records, offsets = records[lo:hi], offsets[lo:hi]
                        columns.extend(records, offsets)
                        next_offset = offsets[-1] + 1
                        reached = max(reached, next_offset)
                        short_since = None  # records after an end of partition: the log grew
                for msg, err in events if not done else ():  # once done, nothing else matters
                    code = err.code()
                    if code == KafkaError._PARTITION_EOF:
                        if msg.offset() >= end:
                            done = True  # the rest of the range is offsets without records (markers)
                        elif msg.offset() >= next_offset:
                            # Offsets between the last record and the end of partition
                            # are markers: the log has been read up to here.
                            reached = max(reached, msg.offset())
                            short_since = short_since or t1
                        continue
                    error = kafka_error(err, str(task), offset=next_offset)
                    if isinstance(error, OffsetsExpired):
                        _diagnose(kafka_config, task, reached)  # raises a more precise error if it can
                    if error is not None:
                        raise error
                    # transient; the poll timeout bounds how long we tolerate it
            now = time.perf_counter()
            stats.decode_s += now - t1
            finished = done or next_offset >= end
            if len(columns) >= batch_rows or (finished and len(columns)):
                yield from _emit(columns, stats, gc_pause)
            if finished:
                break
            now = time.perf_counter()
            if short_since is not None and now - short_since >= end_grace_s:
                # End of partition before the end cut and nothing new since: confirm by
                # reading the log's bounds (raises). If they contradict the end of
                # partition, keep waiting for the records, up to the poll timeout.
                _diagnose(kafka_config, task, reached)
                short_since = None
            if not msgs and not silence_checked and now - last_answer >= end_grace_s:
                # Some brokers answer a fetch beyond the end of the log with silence
                # rather than an error: check whether there is anything left to read.
                silence_checked = True
                _diagnose(kafka_config, task, reached)
            if not msgs and now - last_answer >= poll_timeout_s:
                raise SourceUnavailable(
                    f"{task}: no answer from Kafka at {config['bootstrap.servers']} for {poll_timeout_s:.0f}s "
                    f"while reading at offset {next_offset}{client_errors(config).hint(config['bootstrap.servers'])}"
                )
            if now - last_progress_log >= PROGRESS_EVERY_S:
                last_progress_log = now
                log.info("%s: %d records so far, at offset %d", task, stats.records + len(columns), next_offset)
    finally:
        gc_pause.resume()
        consumer.close()
        stats.total_s = time.perf_counter() - began


def read_records(kafka_config: Mapping[str, Any], topic: str, partition: int,
                 offsets: Iterable[int]) -> dict[int, tuple[bytes | None, bytes | None]]:
    """The key and value of the records at ``offsets`` of one partition (dead
    letters' raw records, read back by their lineage). Offsets at most
    READ_BACK_GAP apart are read in one pass, farther ones in passes of their own."""
    import pyarrow as pa
    import pyarrow.compute as pc

    wanted = sorted(set(offsets))
    runs: list[list[int]] = []
    for offset in wanted:
        if runs and offset - runs[-1][-1] <= READ_BACK_GAP:
            runs[-1].append(offset)
        else:
            runs.append([offset])
    found: dict[int, tuple[bytes | None, bytes | None]] = {}
    for run in runs:
        task = KafkaRangePartition(topic, partition, run[0], run[-1] + 1)
        for batch in read_range(kafka_config, task, batch_rows=min(DEFAULT_BATCH_ROWS, task.end_offset - run[0])):
            hits = batch.filter(pc.is_in(batch.column("offset"), value_set=pa.array(run, pa.int64())))
            for offset, key, value in zip(*(hits.column(c).to_pylist() for c in ("offset", "key", "value"))):
                found[offset] = (key, value)
    missing = [o for o in wanted if o not in found]
    if missing:
        raise ConfigurationError(f"{topic}[{partition}] has no records at offsets {missing[:5]} "
                                 f"({len(missing)} in all), which rows' lineage names: lineage columns must "
                                 "name the source record of each row")
    return found


def _emit(columns: _Columns, stats: ReadStats, gc_pause: _GcPause) -> Iterator["pa.RecordBatch"]:
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


def _diagnose(kafka_config: Mapping[str, Any], task: KafkaRangePartition, reached: int) -> None:
    """Raise OffsetsExpired or LogTruncated if the log, read from its beginning,
    cannot hold what is left of ``task`` (read up to ``reached``); return if it
    can (keep waiting)."""
    from airflow_eos.core.source import KafkaLog
    from airflow_eos.core.windows import TopicPartition

    tp = TopicPartition(task.topic, task.partition)
    with KafkaLog(dict(kafka_config)) as kafka_log:
        bounds = kafka_log.bounds(tp)
    if reached == task.start_offset and task.start_offset < bounds.log_start:
        raise OffsetsExpired(
            f"{task}: the log of {tp} now starts at offset {bounds.log_start}: retention deleted planned "
            f"records [{task.start_offset}, {min(bounds.log_start, task.end_offset)}). They cannot be read "
            "again; never skipped silently"
        )
    if bounds.end <= reached < task.end_offset:
        raise LogTruncated(
            f"{task}: the log of {tp} ends at offset {bounds.end}, before the plan's end cut "
            f"{task.end_offset}: records [{bounds.end}, {task.end_offset}) are missing. The topic lost "
            f"data or was recreated; the frozen plan cannot be read as planned. {LOG_TRUNCATED_ADVICE}"
        )


__all__ = ["DEFAULT_BATCH_ROWS", "DEFAULT_END_GRACE_S", "DEFAULT_POLL_TIMEOUT_S", "KAFKA_SCHEMA", "READER_KAFKA_DEFAULTS",
           "KafkaRangePartition", "ReadStats", "plan_tasks", "read_range", "read_records", "split_range"]
