"""One translation of the errors Kafka reports while a partition is read, into
the errors of :mod:`airflow_eos.core.errors`: the planner (core.source), the
stage job's reader (spark.kafka_ranges) and ``airflow-eos verify`` all read
planned offsets, so the same answer from the broker means the same thing to
each of them.

- the offset is out of range (``OFFSET_OUT_OF_RANGE``; with
  ``auto.offset.reset=error``, librdkafka's ``_AUTO_OFFSET_RESET``): records the
  reader was sent to read are no longer in the log. Retention deleted them or the
  topic was recreated; retrying reads the same offsets and cannot bring them back:
  **OffsetsExpired** (terminal);
- the topic or partition does not exist: **UnknownTopic**;
- any other error that Kafka calls fatal or not retriable: **SourceUnavailable**
  (the broker cannot serve the read now; a retry of the task may succeed);
- a retriable error (a broker being unreachable for a moment, a leader moving):
  ``None``, keep polling; the caller's poll timeout bounds how long, and raises
  SourceUnavailable when it runs out.

``_PARTITION_EOF`` is an event, not an error: readers handle it before asking here.

A reader that waits at an end of partition short of its end cut asks
:func:`open_transaction` before it reports that Kafka stopped answering: under
``read_committed`` that end is the last stable offset, which a producer
transaction still open holds below the high watermark (the planner froze an
idle partition's cut at the high watermark, past the open transaction's
records): **TransactionOpen**, which names the offset and what to do.

No confluent_kafka import at module level: the core is imported by processes
that never read Kafka.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from airflow_eos.core.errors import EosError, OffsetsExpired, SourceUnavailable, TransactionOpen, UnknownTopic

if TYPE_CHECKING:
    from confluent_kafka import KafkaError, KafkaException


def kafka_error(error: "KafkaError | KafkaException", where: str, *, offset: int | None = None) -> EosError | None:
    """The error to raise for ``error``, met reading ``where`` (a partition, or a
    range of one, e.g. ``orders[0]``) at ``offset``; None when it is transient
    (see the module docstring)."""
    from confluent_kafka import KafkaError, KafkaException

    if isinstance(error, KafkaException):
        error = error.args[0] if error.args and isinstance(error.args[0], KafkaError) else error
        if isinstance(error, KafkaException):
            return SourceUnavailable(f"{where}: Kafka failed: {error}")
    code = error.code()
    at = f" at offset {offset}" if offset is not None else ""
    if code in (KafkaError.OFFSET_OUT_OF_RANGE, KafkaError._AUTO_OFFSET_RESET):
        return OffsetsExpired(
            f"{where}: the broker says offset {offset if offset is not None else '?'} is out of range ({error}): "
            "retention deleted records that must be read, or the topic was recreated. They cannot be read "
            "again, and are never skipped silently; raise the topic's retention above the backfill horizon")
    if code in (KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._UNKNOWN_PARTITION, KafkaError._UNKNOWN_TOPIC):
        return UnknownTopic(f"{where}: the topic partition does not exist ({error}); check the topic's name, "
                            "and whether it was deleted")
    if error.fatal() or not error.retriable():
        return SourceUnavailable(f"{where}: reading{at} failed: {error}")
    return None


# How long the look at a partition's offsets may take: it only chooses the message of a read that failed already.
OFFSETS_TIMEOUT_S = 10.0


def open_transaction(kafka_config: Mapping[str, Any], where: str, topic: str, partition: int, end_offset: int, *,
                     waited_s: float) -> TransactionOpen | None:
    """TransactionOpen when a transaction still open holds the last stable
    offset of ``topic[partition]`` below ``end_offset`` while the log holds
    it (the broker's ``ListOffsets``, read_committed and read_uncommitted);
    None when it does not, or the broker does not say. ``where``: what was
    being read (a range of the partition); ``waited_s``: how long the read
    waited at the last stable offset."""
    stable, end = _latest_offsets(kafka_config, topic, partition)
    if stable is None or end is None or not stable < end_offset <= end:
        return None
    servers = kafka_config.get("bootstrap.servers")
    return TransactionOpen(
        f"{where}: the last stable offset of {topic}[{partition}] is held at {stable} by a producer transaction "
        f"still open, below {end_offset}, where the planned range ends (the log ends at {end}): a read_committed reader cannot "
        f"read past an open transaction, and this one waited {waited_s:.0f}s there. The brokers answer; nothing is "
        "lost. The stage fails, and each retry or clear fails the same way, until the producer commits or aborts "
        "that transaction, or the broker aborts it when the producer's transaction.timeout.ms runs out (at most "
        "the broker's transaction.max.timeout.ms, 15 minutes by default); nothing of the window is published "
        "meanwhile, then it is published once: the transaction's records if it committed, none of them if it "
        f"aborted. To end it sooner, find the producer (kafka-transactions.sh --bootstrap-server {servers} "
        f"describe-producers --topic {topic} --partition {partition}) and let it commit, or abort the transaction "
        f"(kafka-transactions.sh --bootstrap-server {servers} abort --topic {topic} --partition {partition} "
        f"--start-offset {stable})")


def _latest_offsets(kafka_config: Mapping[str, Any], topic: str, partition: int) -> tuple[int | None, int | None]:
    """(last stable offset, high watermark) of one partition; None for what
    the broker did not answer."""
    from confluent_kafka import IsolationLevel, KafkaException
    from confluent_kafka import TopicPartition as KafkaTopicPartition
    from confluent_kafka.admin import AdminClient, OffsetSpec

    from airflow_eos.core.kafka_client import CONSUMER_ONLY, client_logging

    admin = AdminClient({**client_logging(), **{k: v for k, v in kafka_config.items() if k not in CONSUMER_ONLY}})
    found: list[int | None] = []
    for isolation in (IsolationLevel.READ_COMMITTED, IsolationLevel.READ_UNCOMMITTED):
        try:
            [future] = admin.list_offsets({KafkaTopicPartition(topic, partition): OffsetSpec.latest()},
                                          isolation_level=isolation, request_timeout=OFFSETS_TIMEOUT_S).values()
            found.append(future.result(OFFSETS_TIMEOUT_S).offset)
        except (KafkaException, TimeoutError):
            found.append(None)
    return found[0], found[1]
