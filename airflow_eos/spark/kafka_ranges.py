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
records the plan promised are gone, or not readable yet: a producer transaction
still open holds the last stable offset there (TransactionOpen, once the read
has waited ``poll_timeout_s`` for it to end); either is an error, never a short
result.

The rows are Arrow batches in the schema of Spark's own Kafka source, built by
:mod:`airflow_eos.spark.kafka_batches`.
"""

from __future__ import annotations

import bisect
import itertools
import logging
import math
import operator
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pyspark.sql.datasource import InputPartition

from airflow_eos.core.consumer_pool import CONSUMERS, of_another_partition
from airflow_eos.core.errors import (
    LOG_TRUNCATED_ADVICE,
    ConfigurationError,
    LogTruncated,
    OffsetsExpired,
    SourceUnavailable,
)
from airflow_eos.core.kafka_client import READER_KAFKA_DEFAULTS, ClientErrors
from airflow_eos.core.kafka_errors import kafka_error, open_transaction
from airflow_eos.core.windows import PartitionRange, WindowPlan
from airflow_eos.spark.kafka_batches import (
    GcPause,
    ReadStats,
    RecordColumns,
    arrow_kafka_schema,
    emit_batch,
)

if TYPE_CHECKING:
    import pyarrow as pa

log = logging.getLogger(__name__)


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
    from confluent_kafka import TopicPartition as KafkaTopicPartition

    from airflow_eos.core.kafka_client import consumer_config

    stats = stats if stats is not None else ReadStats()
    start, end = task.start_offset, task.end_offset
    if start >= end:
        return
    began = time.perf_counter()
    config = consumer_config(
        {**READER_KAFKA_DEFAULTS, **kafka_config},
        # Don't prefetch far past a narrow range's end; librdkafka's default is 100k messages.
        # A power of two: ranges of similar widths share settings, so their tasks
        # share the pool's consumers.
        **{"queued.min.messages": max(1_000, min(100_000, 1 << (end - start - 1).bit_length()))},
    )
    gc_pause = GcPause()
    gc_pause.pause()
    try:
        with CONSUMERS.lease(config, f"a Kafka consumer for {task}") as pooled:
            read = _RangeRead(kafka_config, config, task, stats, began, pooled.errors)
            consumer = pooled.consumer
            consumer.assign([KafkaTopicPartition(task.topic, task.partition, start)])
            while read.next_offset < end:
                t0 = time.perf_counter()
                msgs = consumer.consume(num_messages=_CONSUME_BATCH, timeout=_CONSUME_WAIT_S)
                t1 = time.perf_counter()
                stats.fetch_s += t1 - t0
                done = read.take(msgs, t1) if msgs else False
                stats.decode_s += time.perf_counter() - t1
                finished = done or read.next_offset >= end
                if len(read.columns) >= batch_rows or (finished and len(read.columns)):
                    yield from emit_batch(read.columns, stats, gc_pause)
                if finished:
                    break
                read.check_waiting(bool(msgs), time.perf_counter(), end_grace_s=end_grace_s,
                                   poll_timeout_s=poll_timeout_s)
    finally:
        gc_pause.resume()
        stats.total_s = time.perf_counter() - began


class _RangeRead:
    """Where the read of one range stands, and what each answer of the
    consumer means for it: records taken into the columns, the end of the
    partition, errors; and, while no answer completes the range, whether the
    log can still hold the rest of it."""

    def __init__(self, kafka_config: Mapping[str, Any], config: Mapping[str, Any], task: KafkaRangePartition,
                 stats: ReadStats, began: float, errors: ClientErrors):
        self.kafka_config = kafka_config
        self.errors = errors  # the consumer's, for the message that gives up on the cluster
        self.config = config
        self.task = task
        self.stats = stats
        self.began = began
        self.columns = RecordColumns(task.topic, task.partition, arrow_kafka_schema())
        self.next_offset = task.start_offset  # every offset below this one is accounted for
        self.reached = task.start_offset  # the log has been read up to here (records, or end of partition)
        self.answered = False
        self.short_since: float | None = None  # since when the partition has looked shorter than the plan
        self.silence_checked = False
        # The last answer was an end of partition before the end cut (under
        # read_committed: the last stable offset, which an open transaction holds).
        self.ended_short = False
        self.last_answer = self.last_progress_log = time.perf_counter()

    def take(self, msgs: list, at: float) -> bool:
        """Take one non-empty answer of the consumer (``at``: when it came);
        True once the range is complete (a record or end of partition at or
        beyond its end cut)."""
        from confluent_kafka import Message

        if not self.answered:
            self.answered = True
            self.stats.connect_s = at - self.began
        self.last_answer = at
        self.silence_checked = False
        errors = list(map(Message.error, msgs))
        # (KafkaError cannot be compared with None: no errors.count(None).)
        if not any(map(operator.is_not, errors, itertools.repeat(None))):
            records, events = msgs, ()
        else:
            records = [m for m, e in zip(msgs, errors) if e is None]
            events = [(m, e) for m, e in zip(msgs, errors) if e is not None]
        done = self._take_records(records) if records else False
        if done:  # once done, nothing else matters
            return True
        return self._take_events(events, at)

    def _take_records(self, records: list) -> bool:
        """Buffer the records of the range not yielded yet; True if the answer
        reaches beyond the end cut."""
        from confluent_kafka import Message

        topic, partition = self.task.topic, self.task.partition
        if of_another_partition(records[0], topic, partition):  # only ever first: check the rest only then
            records = [m for m in records if not of_another_partition(m, topic, partition)]
            if not records:
                return False
        offsets = list(map(Message.offset, records))
        if not all(map(operator.lt, offsets, itertools.islice(offsets, 1, None))):
            # librdkafka delivers a partition in offset order; if it ever
            # does not, order and de-duplicate rather than yield twice.
            by_offset = dict(sorted(zip(offsets, records)))
            offsets, records = list(by_offset), list(by_offset.values())
        lo = bisect.bisect_left(offsets, self.next_offset)  # below: already yielded
        hi = bisect.bisect_left(offsets, self.task.end_offset)  # from here: beyond the range
        beyond = hi < len(offsets)
        if lo < hi:
            if lo or hi < len(offsets):
                records, offsets = records[lo:hi], offsets[lo:hi]
            self.columns.extend(records, offsets)
            self.next_offset = offsets[-1] + 1
            self.reached = max(self.reached, self.next_offset)
            self.short_since = None  # records after an end of partition: the log grew
            self.ended_short = False
        return beyond

    def _take_events(self, events, at: float) -> bool:
        """Ends of partition and errors; True if the partition ended at or
        beyond the end cut. A fatal error is raised; a transient one is left to
        the poll timeout, which bounds how long it is tolerated."""
        from confluent_kafka import KafkaError

        done = False
        for msg, err in events:
            if of_another_partition(msg, self.task.topic, self.task.partition):
                continue
            if err.code() == KafkaError._PARTITION_EOF:
                if msg.offset() >= self.task.end_offset:
                    done = True  # the rest of the range is offsets without records (markers)
                elif msg.offset() >= self.next_offset:
                    # Offsets between the last record and the end of partition
                    # are markers: the log has been read up to here.
                    self.reached = max(self.reached, msg.offset())
                    self.short_since = self.short_since or at
                    self.ended_short = True
                continue
            error = kafka_error(err, str(self.task), offset=self.next_offset)
            if isinstance(error, OffsetsExpired):
                _diagnose(self.kafka_config, self.task, self.reached)  # raises a more precise error if it can
            if error is not None:
                raise error
        return done

    def check_waiting(self, answered: bool, now: float, *, end_grace_s: float, poll_timeout_s: float) -> None:
        """While the range is not complete: raise if the log cannot hold the rest
        of it (read from its bounds) or Kafka stopped answering; log progress."""
        if self.short_since is not None and now - self.short_since >= end_grace_s:
            # End of partition before the end cut and nothing new since: confirm by
            # reading the log's bounds (raises). If they contradict the end of
            # partition, keep waiting for the records, up to the poll timeout.
            _diagnose(self.kafka_config, self.task, self.reached)
            self.short_since = None
        if not answered and not self.silence_checked and now - self.last_answer >= end_grace_s:
            # Some brokers answer a fetch beyond the end of the log with silence
            # rather than an error: check whether there is anything left to read.
            self.silence_checked = True
            _diagnose(self.kafka_config, self.task, self.reached)
        if not answered and now - self.last_answer >= poll_timeout_s:
            raise self._silence_error(poll_timeout_s)
        if now - self.last_progress_log >= PROGRESS_EVERY_S:
            self.last_progress_log = now
            log.info("%s: %d records so far, at offset %d", self.task,
                     self.stats.records + len(self.columns), self.next_offset)


    def _silence_error(self, waited_s: float) -> SourceUnavailable:
        """The error of a read that got no answer for ``waited_s``: after an end
        of partition short of the end cut, an open transaction holding the
        last stable offset there (the brokers answer), if it is one; else
        Kafka stopped answering."""
        if self.ended_short:
            held = open_transaction(self.kafka_config, str(self.task),
                                    [(self.task.topic, self.task.partition, self.task.end_offset)],
                                    waited=f"for {waited_s:.0f}s")
            if held is not None:
                return held
        servers = self.config["bootstrap.servers"]
        return SourceUnavailable(
            f"{self.task}: no answer from Kafka at {servers} for {waited_s:.0f}s "
            f"while reading at offset {self.next_offset}{self.errors.hint(servers)}"
        )


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


__all__ = ["DEFAULT_BATCH_ROWS", "DEFAULT_END_GRACE_S", "DEFAULT_POLL_TIMEOUT_S", "READER_KAFKA_DEFAULTS",
           "KafkaRangePartition", "ReadStats", "plan_tasks", "read_range", "read_records", "split_range"]
