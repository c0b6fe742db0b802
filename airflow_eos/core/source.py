"""Reading a Kafka log by offset, trusting only records that were actually read.

Kafka-compatible brokers differ in what their metadata answers say (one tried
before, Tansu, reported a high watermark far below the real end and answered 0 to
every ``offsets_for_times``).  So the planner uses those answers only as hints: the end
of a partition is where a fetch reports end-of-partition, and a record's position
and timestamp are what the fetch returned.
"""

from __future__ import annotations

import logging
import re
import threading
import time
import uuid
from contextlib import contextmanager
from dataclasses import dataclass, field
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Protocol

from airflow_eos.core.client_settings import masked, refuse_inline_secrets, without_secrets
from airflow_eos.core.errors import ConfigurationError, OffsetsExpired, SourceUnavailable, UnknownTopic
from airflow_eos.core.kafka_errors import kafka_error
from airflow_eos.core.target import DEFAULT_CONN_IDS, KAFKA
from airflow_eos.core.windows import TopicPartition

log = logging.getLogger(__name__)

# Settings that make single-record probes fast and reads exact. Users' settings
# (security, client ids, ...) are merged over the defaults but never over the
# safety ones, which the protocol depends on.
_DEFAULTS = {
    "fetch.wait.max.ms": 10,
    # librdkafka's default (1 s) idles a reader after it drains its prefetch
    # queue: measured ~200k -> ~850k records/s for one consumer with 10 ms.
    "fetch.queue.backoff.ms": 10,
    "socket.timeout.ms": 10_000,
}
_FORCED = {
    "enable.auto.commit": False,
    "enable.partition.eof": True,
    "auto.offset.reset": "error",  # a seek outside the log must fail loudly, not jump
    "allow.auto.create.topics": False,
    "isolation.level": "read_committed",
}


# librdkafka's own log, through Python logging: an unreachable broker makes it
# log every reconnect (~20 lines a second), so each kind of line per broker is
# let through once per interval, with a count of what was held back.
LIBRDKAFKA_LOG = logging.getLogger("airflow_eos.librdkafka")
LOG_INTERVAL_S = 60.0


class _OncePerInterval(logging.Filter):
    """Passes the first record of each (facility, broker) per interval."""

    def __init__(self, interval_s: float):
        super().__init__()
        self.interval_s = interval_s
        self._seen: dict[tuple, tuple[float, int]] = {}  # key -> (last passed, held back since)
        self._lock = threading.Lock()

    def filter(self, record: logging.LogRecord) -> bool:
        key = (record.levelno, *_librdkafka_key(record))
        now = time.monotonic()
        with self._lock:
            last, held = self._seen.get(key, (None, 0))
            if last is not None and now - last < self.interval_s:
                self._seen[key] = (last, held + 1)
                return False
            self._seen[key] = (now, 0)
        if held:
            record.msg = f"{record.msg} ({held} more like it in the last {self.interval_s:.0f}s not shown)"
        return True


def _librdkafka_key(record: logging.LogRecord) -> tuple[str, str]:
    """(facility, broker) of a librdkafka log line ("%s [%s] %s": facility,
    client name, message) or of an error_cb record (its message)."""
    args = record.args if isinstance(record.args, tuple) else ()
    text = str(args[-1]) if args else record.getMessage()
    broker = re.search(r"([\w.\-]+:\d+)(?:/[\w.\-]+)?", text)
    return (str(args[0]) if len(args) == 3 else record.msg, broker.group(1) if broker else "")


LIBRDKAFKA_LOG.addFilter(_OncePerInterval(LOG_INTERVAL_S))


class ClientErrors:
    """A client's ``error_cb``: logs through LIBRDKAFKA_LOG (throttled) and
    remembers the last error, for the message that gives up on the cluster."""

    def __init__(self) -> None:
        self.last: str | None = None

    def __call__(self, err) -> None:
        text = err.str() if hasattr(err, "str") else str(err)
        # "1/1 brokers are down" follows the reason they are (refused, SASL
        # handshake failed, ...): it must not replace that reason in the message.
        if not (self.last and _all_brokers_down(err)):
            self.last = text
        LIBRDKAFKA_LOG.warning("Kafka client error: %s", text)

    def hint(self, bootstrap: str) -> str:
        """What to check, after a message that says Kafka did not answer."""
        last = f"; last client error: {self.last}" if self.last else ""
        return (f"{last}; check that bootstrap.servers ({bootstrap}) is right, that the brokers are up and "
                "reachable from this host, and the security settings")


def _all_brokers_down(err) -> bool:
    from confluent_kafka import KafkaError

    return hasattr(err, "code") and err.code() == KafkaError._ALL_BROKERS_DOWN


def client_logging() -> dict:
    """Settings every librdkafka client of the package gets: its log through
    LIBRDKAFKA_LOG (throttled) instead of raw lines on stderr, errors to a
    ClientErrors, and no line for each idle connection the broker closes."""
    return {"logger": LIBRDKAFKA_LOG, "error_cb": ClientErrors(), "log.connection.close": False}


def client_errors(config: dict) -> ClientErrors:
    """The ClientErrors of a config made by client_logging (a fresh one if the
    user set their own error_cb)."""
    errors = config.get("error_cb")
    return errors if isinstance(errors, ClientErrors) else ClientErrors()


def consumer_config(kafka_config: dict, **overrides) -> dict:
    """Client settings for reading planned ranges; no consumer group is joined."""
    if not kafka_config.get("bootstrap.servers"):
        raise ConfigurationError("Kafka configuration has no 'bootstrap.servers'")
    config = {**_DEFAULTS, **client_logging(), **kafka_config, **_FORCED, **overrides}
    # assign() never joins a group, but librdkafka insists on a group.id.
    config.setdefault("group.id", f"airflow-eos-reader-{uuid.uuid4().hex[:8]}")
    return config


def reader(config: dict, purpose: str = "a Kafka consumer"):
    """A confluent-kafka Consumer for ``config`` (see consumer_config). A
    configuration librdkafka refuses (an unknown property, a bad value: the
    Kafka connection's extra) is a ConfigurationError naming the property and
    what to change; any other client that cannot be created is
    SourceUnavailable, saying for what. Neither shows a secret of ``config``."""
    from confluent_kafka import Consumer, KafkaError, KafkaException

    try:
        return Consumer(config)
    except KafkaException as exc:
        text = without_secrets(str(exc.args[0].str() if exc.args and isinstance(exc.args[0], KafkaError)
                                    else exc), config)
        where = f"{purpose} for bootstrap.servers {config.get('bootstrap.servers')!r}"
        if exc.args and isinstance(exc.args[0], KafkaError) and exc.args[0].code() == KafkaError._INVALID_ARG:
            text += "".join(f"; {name} names {path}, {problem}" for name, path, problem in missing_files(config))
            raise ConfigurationError(
                f"cannot create {where}: {text}. The client's settings are the Kafka connection's extra "
                "(librdkafka properties, see librdkafka's CONFIGURATION.md): correct or remove that property "
                "there") from None
        raise SourceUnavailable(f"cannot create {where}: {text}") from None


def missing_files(config: dict) -> list[tuple[str, str, str]]:
    """(setting, path, problem) for each file a client setting names
    (``ssl.ca.location``, ``ssl.key.location``, ``sasl.kerberos.keytab``, ...)
    that this process cannot read: librdkafka's own error names OpenSSL's
    reason, not the file."""
    import os

    found = []
    for name, value in config.items():
        if not (name.endswith(".location") or name.endswith(".keytab")) or not isinstance(value, str):
            continue
        if not os.path.exists(value):
            found.append((name, value, "which does not exist"))
        elif not os.access(value, os.R_OK):
            found.append((name, value, "which this process cannot read"))
    return found


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
    override the connection's (e.g. larger fetch sizes for the stage job)."""

    topics: tuple[str, ...]
    kafka_conn_id: str = DEFAULT_CONN_IDS[KAFKA]
    reader_config: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "topics", normalise_topics(self.topics))
        object.__setattr__(self, "reader_config", dict(self.reader_config or {}))
        refuse_inline_secrets(self.reader_config, "KafkaSource(reader_config=...)")

    def __repr__(self) -> str:
        return (f"KafkaSource(topics={list(self.topics)!r}, kafka_conn_id={self.kafka_conn_id!r}, "
                f"reader_config={masked(self.reader_config)!r})")


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
        self.timeout = timeout
        # Planning reads single records at scattered offsets: fetch little and
        # prefetch nothing, or every probe pulls megabytes it then throws away.
        # Both fetch limits: a broker may fill a response up to fetch.max.bytes
        # (50 MB by default) whatever the partition's limit says; Tansu
        # did, and a probe into a 1M-record log took 21 ms (11 ms of it
        # this client's CPU) instead of 1.4 ms. A record bigger than the limits
        # still arrives whole: Kafka returns a partition's first batch regardless.
        config = {"max.partition.fetch.bytes": PROBE_FETCH_BYTES, "message.max.bytes": PROBE_FETCH_BYTES,
                  "queued.min.messages": 1, **kafka_config}
        # librdkafka requires fetch.max.bytes >= message.max.bytes (which a user may have raised).
        config.setdefault("fetch.max.bytes", max(PROBE_FETCH_BYTES, int(config["message.max.bytes"])))
        self._config = consumer_config(config)
        self._errors = client_errors(self._config)
        # A pool of consumers, one per thread reading at a time (see
        # parallel_reads): each read assigns its partition to a consumer of its
        # own. The first is made now, so a configuration librdkafka refuses
        # fails here rather than in the middle of a plan.
        self._lock = threading.Lock()
        self._consumers = [reader(self._config, "Kafka consumer")]
        self._idle = list(self._consumers)
        self._first: dict[TopicPartition, tuple[int, Record | None]] = {}  # bounds(): log start, first record

    def close(self) -> None:
        with self._lock:
            consumers, self._consumers, self._idle = self._consumers, [], []
        for consumer in consumers:
            consumer.close()

    @contextmanager
    def _lease(self):
        """A consumer of the pool for one read, made when every one is busy."""
        with self._lock:
            consumer = self._idle.pop() if self._idle else None
        if consumer is None:
            consumer = reader(self._config, "Kafka consumer")
            with self._lock:
                self._consumers.append(consumer)
        try:
            yield consumer
        finally:
            with self._lock:
                self._idle.append(consumer)

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
            try:
                with self._lease() as consumer:
                    metadata = consumer.list_topics(topic, timeout=self.timeout)
            except KafkaException as exc:
                with self._lease() as consumer:
                    consumer.poll(0)  # serves the error_cb, which has the client's reason (refused, ...)
                raise SourceUnavailable(
                    f"Kafka at {self._config['bootstrap.servers']} did not answer for topic {topic!r} within "
                    f"{self.timeout}s: {exc}{self._errors.hint(self._config['bootstrap.servers'])}"
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
            with self._lease() as consumer:
                [answer] = consumer.offsets_for_times(
                    [KafkaTopicPartition(tp.topic, tp.partition, timestamp_ms)], timeout=self.timeout
                )
        except KafkaException:
            return None
        if answer.error is not None or answer.offset < 0:
            return None
        return answer.offset

    # ---------------------------------------------------------------- reading

    def _poll_from(self, consumer, tp: TopicPartition, offset: int):
        """Assign at ``offset`` on ``consumer`` and yield messages until end of partition."""
        from confluent_kafka import OFFSET_BEGINNING, KafkaError
        from confluent_kafka import TopicPartition as KafkaTopicPartition
        consumer.assign([KafkaTopicPartition(tp.topic, tp.partition, offset)])
        try:
            idle_polls = restarts = 0
            while True:
                msg = consumer.poll(self.timeout / 10)
                if msg is None:
                    idle_polls += 1
                    if idle_polls >= 10:
                        where = "from the beginning of the log" if offset == OFFSET_BEGINNING else f"at offset {offset}"
                        raise SourceUnavailable(
                            f"no answer from Kafka at {self._config['bootstrap.servers']} reading {tp} {where} "
                            f"within {self.timeout}s{self._errors.hint(self._config['bootstrap.servers'])}")
                    continue
                idle_polls = 0
                err = msg.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        yield None, msg.offset()
                        return
                    error = kafka_error(err, str(tp), offset=offset if offset >= 0 else None)
                    if isinstance(error, OffsetsExpired) and offset == OFFSET_BEGINNING and restarts < 10:
                        # Retention moved the log start between Kafka's answer to "where does the log
                        # begin" and the fetch there: the beginning moved, nothing planned was lost.
                        restarts += 1
                        consumer.assign([KafkaTopicPartition(tp.topic, tp.partition, offset)])
                        continue
                    if error is not None:
                        raise error
                    continue  # transient: the idle polls above bound how long
                if msg.topic() != tp.topic or msg.partition() != tp.partition or msg.offset() < offset:
                    continue  # a stale fetch from an earlier assignment
                yield msg, msg.offset()
        finally:
            consumer.unassign()

    def bounds(self, tp: TopicPartition) -> Bounds:
        """Read from the beginning once: the fetch response carries the true log
        start and high watermark, which librdkafka then caches."""
        from confluent_kafka import OFFSET_BEGINNING
        from confluent_kafka import TopicPartition as KafkaTopicPartition
        first: int | None = None
        record: Record | None = None
        with self._lease() as consumer:
            for msg, offset in self._poll_from(consumer, tp, OFFSET_BEGINNING):
                first = offset
                record = Record(offset, msg.timestamp()[1]) if msg is not None else None
                break
            low, high = consumer.get_watermark_offsets(KafkaTopicPartition(tp.topic, tp.partition), cached=True)
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
        with self._lease() as consumer:
            for msg, at in self._poll_from(consumer, tp, offset):
                if msg is None or at >= end:
                    return None
                return Record(at, msg.timestamp()[1])
        return None

    def records(self, tp: TopicPartition, start: int, end: int) -> list[Record]:
        """Every record in ``[start, end)`` (only position and timestamp)."""
        out: list[Record] = []
        if start >= end:
            return out
        with self._lease() as consumer:
            for msg, at in self._poll_from(consumer, tp, start):
                if msg is None or at >= end:
                    break
                out.append(Record(at, msg.timestamp()[1]))
                if at == end - 1:
                    break
        return out


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
