"""Reading a Kafka log by offset, trusting only records that were actually read:
where a pipeline reads (KafkaSource), what cut resolution needs of a log
(PartitionLog) and the log over a real cluster (KafkaLog). The librdkafka
clients themselves (settings, logging, errors) are core/kafka_client.py's.

Kafka-compatible brokers differ in what their metadata answers say (Tansu, for
one, can report a high watermark far below the real end and answer 0 to every
``offsets_for_times``).  So the planner uses those answers only as hints: the end
of a partition is where a fetch reports end-of-partition, and a record's position
and timestamp are what the fetch returned.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Protocol

from airflow_eos.core.avro import ValueFormat, as_value_format, record_schema_json
from airflow_eos.core.client_settings import masked, refuse_inline_secrets
from airflow_eos.core.errors import ConfigurationError, OffsetsExpired, SourceUnavailable, UnknownTopic
from airflow_eos.core.consumer_pool import CONSUMERS, PooledConsumer, of_another_partition
from airflow_eos.core.kafka_client import client_logging, consumer_config, request_timeout
# cli/ reads the librdkafka log's logger from here; it lives in core/kafka_client.py
from airflow_eos.core.kafka_errors import kafka_error
from airflow_eos.core.target import DEFAULT_CONN_IDS, KAFKA
from airflow_eos.core.windows import TopicPartition

log = logging.getLogger(__name__)


def normalise_topics(topics, pipeline: str = "") -> tuple[str, ...]:
    """A pipeline's topics as a sorted tuple; refuses what can never be read."""
    owner = f" of pipeline {pipeline!r}" if pipeline else ""
    if isinstance(topics, str):
        raise ConfigurationError(f"topics{owner} must be a list of topic names, not the string {topics!r}")
    topics = tuple(topics)
    if not topics:
        raise ConfigurationError(f"the topic list{owner} is empty")
    if any(not isinstance(t, str) or not t for t in topics):
        raise ConfigurationError(f"topic names{owner} must be non-empty strings, got {list(topics)!r}")
    if len(set(topics)) != len(topics):
        raise ConfigurationError(f"the topic list{owner} has duplicates: {list(topics)!r}")
    return tuple(sorted(topics))


@dataclass(frozen=True)
class KafkaSource:
    """Where a pipeline reads: its topics, on the cluster of an Airflow ``kafka``
    connection (its extra is the librdkafka config), plus reader settings that
    override the connection's (e.g. larger fetch sizes for the stage job).

    ``value_format=ValueFormat.AVRO`` (or ``"avro"``): the values are Avro in
    Confluent's wire format, decoded against a reader schema frozen with each
    window's plan, writer schemas resolved by id through the schema registry of
    ``schema_registry_conn_id`` (an ``eos_schema_registry`` connection).
    ``reader_schema``: an Avro record schema (JSON text or dict); None: the
    latest schema of subject ``<topic>-value`` when the window is planned."""

    topics: tuple[str, ...]
    kafka_conn_id: str = DEFAULT_CONN_IDS[KAFKA]
    reader_config: dict = field(default_factory=dict)
    value_format: ValueFormat = ValueFormat.RAW
    schema_registry_conn_id: str | None = None
    reader_schema: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "topics", normalise_topics(self.topics))
        object.__setattr__(self, "reader_config", dict(self.reader_config or {}))
        refuse_inline_secrets(self.reader_config, "KafkaSource(reader_config=...)")
        object.__setattr__(self, "value_format", as_value_format(self.value_format))
        if self.value_format is ValueFormat.RAW:
            if self.schema_registry_conn_id is not None or self.reader_schema is not None:
                raise ConfigurationError("schema_registry_conn_id and reader_schema are for an Avro source: "
                                         "set value_format='avro' too (raw values are handed over as read)")
            return
        if not self.schema_registry_conn_id:
            raise ConfigurationError("an Avro source (value_format='avro') needs schema_registry_conn_id: the "
                                     "eos_schema_registry connection its writer schemas are resolved through")
        if self.reader_schema is not None:
            object.__setattr__(self, "reader_schema", record_schema_json(self.reader_schema))

    @property
    def is_avro(self) -> bool:
        return self.value_format is ValueFormat.AVRO

    def value_subjects(self) -> tuple[str, ...]:
        """The registry subjects of the topics' values (Confluent's TopicNameStrategy)."""
        return tuple(f"{topic}-value" for topic in self.topics)

    def __repr__(self) -> str:
        avro = (f", value_format='avro', schema_registry_conn_id={self.schema_registry_conn_id!r}, "
                f"reader_schema={'given' if self.reader_schema else 'latest'}") if self.is_avro else ""
        return (f"KafkaSource(topics={list(self.topics)!r}, kafka_conn_id={self.kafka_conn_id!r}, "
                f"reader_config={masked(self.reader_config)!r}{avro})")


@dataclass(frozen=True)
class Record:
    """Where a record is and when it happened; all the planner needs of it."""

    offset: int
    timestamp_ms: int


@dataclass(frozen=True)
class Bounds:
    """First offset still in the log (retention moves it up) and the end (next offset)."""

    log_start: int
    end: int


class PartitionLog(Protocol):
    """What cut resolution needs of a log. KafkaLog reads Kafka; tests of the pure
    logic may supply an in-memory log."""

    def bounds(self, tp: TopicPartition) -> Bounds: ...

    def first_at_or_after(self, tp: TopicPartition, offset: int, end: int) -> Record | None: ...

    def records(self, tp: TopicPartition, start: int, end: int) -> list[Record]: ...

    def time_hint(self, tp: TopicPartition, timestamp_ms: int) -> int | None: ...


def per_partition(log_: PartitionLog, fn: Callable[[TopicPartition], Any],
                  tps: Iterable[TopicPartition]) -> dict[TopicPartition, Any]:
    """``{tp: fn(tp)}`` over the partitions, read side by side by as many threads
    as the log allows (``parallel_reads``; a log that does not say is read by
    one): each partition's reads are round trips that wait on the broker, and
    partitions do not depend on each other. The first error raised is raised."""
    tps = list(tps)
    workers = min(len(tps), getattr(log_, "parallel_reads", 1))
    if workers <= 1:
        return {tp: fn(tp) for tp in tps}
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="eos-read") as pool:
        return dict(zip(tps, pool.map(fn, tps)))


PROBE_FETCH_BYTES = 64 * 1024


class KafkaLog:
    """A PartitionLog over a real Kafka (or Kafka-protocol) cluster. Safe to
    read from ``parallel_reads`` threads at once: every read is a fetch round
    trip that waits on the broker, so a plan of many partitions resolves them
    side by side (per_partition) -- measured here, 256 partitions one after
    another spent 90 % of their time waiting in ``poll`` (7.3 s, 0.8 s of CPU)."""

    parallel_reads = 16

    def __init__(self, kafka_config: dict, *, timeout: float = 10.0):
        self.timeout = request_timeout(kafka_config, timeout)
        # Planning reads single records at scattered offsets: fetch little and
        # prefetch nothing, or every probe pulls megabytes it then throws away.
        # Both fetch limits: a broker may fill a response up to fetch.max.bytes
        # (50 MB by default) whatever the partition's limit says (Tansu does:
        # a probe into a 1M-record log then takes 21 ms, 11 ms of it this
        # client's CPU, instead of 1.4 ms). A record bigger than the limits
        # still arrives whole: Kafka returns a partition's first batch regardless.
        config = {"max.partition.fetch.bytes": PROBE_FETCH_BYTES, "message.max.bytes": PROBE_FETCH_BYTES,
                  "queued.min.messages": 1, **kafka_config}
        # librdkafka requires fetch.max.bytes >= message.max.bytes (which a user may have raised).
        config.setdefault("fetch.max.bytes", max(PROBE_FETCH_BYTES, int(config["message.max.bytes"])))
        self._config = consumer_config(config)
        # Each read leases a consumer of the process's pool (one per thread
        # reading at a time, see parallel_reads) and gives it back. The first
        # is leased now, so a configuration librdkafka refuses fails here
        # rather than in the middle of a plan.
        with self._lease():
            pass
        self._first: dict[TopicPartition, tuple[int, Record | None]] = {}  # bounds(): log start, first record

    def close(self) -> None:
        """Nothing to release: the consumers are the pool's (core/consumer_pool.py)."""

    def _lease(self):
        """A consumer of the pool for one read (a PooledConsumer)."""
        return CONSUMERS.lease(self._config, "Kafka consumer")

    def __enter__(self) -> "KafkaLog":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ---------------------------------------------------------------- metadata

    def partitions(self, topics: list[str]) -> list[TopicPartition]:
        """Every partition of the topics; an unknown topic is an error, never empty."""
        from confluent_kafka import KafkaError, KafkaException
        found: list[TopicPartition] = []
        for topic in topics:
            with self._lease() as pooled:
                try:
                    metadata = pooled.consumer.list_topics(topic, timeout=self.timeout)
                except KafkaException as exc:
                    pooled.consumer.poll(0)  # serves the error_cb, which has the client's reason (refused, ...)
                    raise SourceUnavailable(
                        f"Kafka at {self._config['bootstrap.servers']} did not answer for topic {topic!r} within "
                        f"{self.timeout}s: {exc}{pooled.errors.hint(self._config['bootstrap.servers'])}"
                    ) from exc
            info = metadata.topics.get(topic)
            if info is None or info.error is not None:
                code = info.error.code() if info is not None else None
                if info is None or code in (KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._UNKNOWN_TOPIC):
                    raise UnknownTopic(
                        f"topic {topic!r} does not exist on {self._config['bootstrap.servers']}: check the topic "
                        "names of the pipeline's KafkaSource and that its Kafka connection points at the cluster "
                        "that holds them (airflow-eos never creates a source topic); nothing was planned")
                raise SourceUnavailable(f"metadata for topic {topic!r} failed: {info.error}")
            if not info.partitions:
                raise UnknownTopic(f"topic {topic!r} has no partitions")
            found.extend(TopicPartition(topic, p) for p in sorted(info.partitions))
        return found

    def time_hint(self, tp: TopicPartition, timestamp_ms: int) -> int | None:
        """The broker's opinion of the first offset at/after a time. A hint only."""
        from confluent_kafka import KafkaException
        from confluent_kafka import TopicPartition as KafkaTopicPartition
        try:
            with self._lease() as pooled:
                [answer] = pooled.consumer.offsets_for_times(
                    [KafkaTopicPartition(tp.topic, tp.partition, timestamp_ms)], timeout=self.timeout
                )
        except KafkaException:
            return None
        if answer.error is not None or answer.offset < 0:
            return None
        return answer.offset

    # ---------------------------------------------------------------- reading

    def _poll_from(self, pooled: PooledConsumer, tp: TopicPartition, offset: int):
        """Assign at ``offset`` on a leased consumer and yield messages until end of partition."""
        from confluent_kafka import OFFSET_BEGINNING, KafkaError
        from confluent_kafka import TopicPartition as KafkaTopicPartition
        consumer = pooled.consumer
        self._fetch_metadata(pooled, tp.topic)
        consumer.assign([KafkaTopicPartition(tp.topic, tp.partition, offset)])
        try:
            idle_polls = 0
            restart_until = time.monotonic() + self.timeout
            while True:
                msg = consumer.poll(self.timeout / 10)
                if msg is None:
                    idle_polls += 1
                    if idle_polls >= 10:
                        where = "from the beginning of the log" if offset == OFFSET_BEGINNING else f"at offset {offset}"
                        raise SourceUnavailable(
                            f"no answer from Kafka at {self._config['bootstrap.servers']} reading {tp} {where} "
                            f"within {self.timeout}s{pooled.errors.hint(self._config['bootstrap.servers'])}")
                    continue
                idle_polls = 0
                if _stale(msg, tp, offset):
                    continue
                err = msg.error()
                if err is None:
                    yield msg, msg.offset()
                    continue
                if err.code() == KafkaError._PARTITION_EOF:
                    yield None, msg.offset()
                    return
                error = kafka_error(err, str(tp), offset=offset if offset >= 0 else None)
                if isinstance(error, OffsetsExpired) and offset == OFFSET_BEGINNING \
                        and time.monotonic() < restart_until:
                    # Retention moved the log start between Kafka's answer to "where does the log
                    # begin" and the fetch there: the beginning moved, nothing planned was lost.
                    # Read again from the new beginning, within the read's time bound: retention
                    # deleting faster than a fetch's round trip may move it again each time.
                    consumer.assign([KafkaTopicPartition(tp.topic, tp.partition, offset)])
                    continue
                if error is not None:
                    raise error
                # transient: the idle polls above bound how long
        finally:
            consumer.unassign()

    def _fetch_metadata(self, pooled: PooledConsumer, topic: str) -> None:
        """Ask for the topic's metadata (one round trip) the first time a
        consumer of the pool reads it. A consumer assigned a partition whose
        leader it does not know yet retries the offset lookup of
        OFFSET_BEGINNING after 500 ms: measured here, 0.5-0.6 s to a cold
        consumer's first record from the log start, 10-60 ms with this
        first, which is most of a plan of a few partitions (each read
        thread's first bounds() on a consumer of its own). Best effort: a
        broker that does not answer is reported by the read that follows."""
        from confluent_kafka import KafkaException
        if topic in pooled.topics_known:
            return
        try:
            pooled.consumer.list_topics(topic, timeout=min(self.timeout, 1.0))
        except KafkaException:
            return
        pooled.topics_known.add(topic)

    def bounds(self, tp: TopicPartition) -> Bounds:
        """Read from the beginning once: the fetch response carries the true log
        start and high watermark, which librdkafka then caches."""
        from confluent_kafka import OFFSET_BEGINNING
        from confluent_kafka import TopicPartition as KafkaTopicPartition
        first: int | None = None
        record: Record | None = None
        with self._lease() as pooled:
            for msg, offset in self._poll_from(pooled, tp, OFFSET_BEGINNING):
                first = offset
                record = Record(offset, msg.timestamp()[1]) if msg is not None else None
                break
            low, high = pooled.consumer.get_watermark_offsets(KafkaTopicPartition(tp.topic, tp.partition), cached=True)
        if first is None:
            first = max(low, 0)
        if high < 0:
            high = first
        # A log whose first record sits after a transaction marker: the cached
        # low watermark is the true log start.
        log_start = min(first, low) if low >= 0 else first
        # The first record, kept: a search from the log start (the first window
        # of a pipeline, a backfill) probes it first, and a probe is a round trip.
        self._first[tp] = (log_start, record)
        return Bounds(log_start=log_start, end=max(high, first))

    def first_at_or_after(self, tp: TopicPartition, offset: int, end: int) -> Record | None:
        """The first record at or after ``offset`` and before ``end``, or None."""
        if offset >= end:
            return None
        log_start, first = self._first.get(tp, (None, None))
        if first is not None and log_start <= offset <= first.offset:  # read by bounds(): no record before it
            return first if first.offset < end else None
        with self._lease() as pooled:
            for msg, at in self._poll_from(pooled, tp, offset):
                if msg is None or at >= end:
                    return None
                return Record(at, msg.timestamp()[1])
        return None

    def records(self, tp: TopicPartition, start: int, end: int) -> list[Record]:
        """Every record in ``[start, end)`` (only position and timestamp)."""
        out: list[Record] = []
        if start >= end:
            return out
        with self._lease() as pooled:
            for msg, at in self._poll_from(pooled, tp, start):
                if msg is None or at >= end:
                    break
                out.append(Record(at, msg.timestamp()[1]))
                if at == end - 1:
                    break
        return out


def _stale(msg, tp: TopicPartition, offset: int) -> bool:
    """A message of an earlier assignment of a pooled consumer: another
    partition's, or a record or end of partition before ``offset``."""
    from confluent_kafka import KafkaError

    if of_another_partition(msg, tp.topic, tp.partition):
        return True
    err = msg.error()
    return (err is None or err.code() == KafkaError._PARTITION_EOF) and msg.offset() < offset


def mirror_offsets(kafka_config: dict, group_id: str, offsets) -> None:
    """Commit a pipeline's offsets to a consumer group so lag tools see them
    (the ledger stays the source of truth)."""
    from confluent_kafka import Consumer
    from confluent_kafka import TopicPartition as KafkaTopicPartition
    consumer = Consumer({**client_logging(), **kafka_config, "group.id": group_id, "enable.auto.commit": False})
    try:
        consumer.commit(offsets=[KafkaTopicPartition(tp.topic, tp.partition, off) for tp, off in offsets.items()],
                        asynchronous=False)
    finally:
        consumer.close()
