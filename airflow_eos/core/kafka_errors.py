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

No confluent_kafka import at module level: the core is imported by processes
that never read Kafka.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from airflow_eos.core.errors import EosError, OffsetsExpired, SourceUnavailable, UnknownTopic

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
