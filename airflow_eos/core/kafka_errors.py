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

from collections.abc import Mapping, Sequence
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


def open_transaction(kafka_config: Mapping[str, Any], where: str, ends: Sequence[tuple[str, int, int]], *,
                     waited: str) -> TransactionOpen | None:
    """TransactionOpen when, for some (topic, partition, end offset) of
    ``ends``, a transaction still open holds the partition's last stable
    offset below the end offset while the log holds it (the broker's
    ``ListOffsets``, read_committed and read_uncommitted); None when none is
    held, or the broker does not say. ``where``: what was being read;
    ``waited``: how the read waited there (e.g. "for 60s")."""
    offsets = _latest_offsets(kafka_config, [(topic, partition) for topic, partition, _ in ends])
    held = [(topic, partition, end_offset, stable, end) for topic, partition, end_offset in ends
            for stable, end in [offsets.get((topic, partition), (end_offset, end_offset))]
            if stable < end_offset <= end]
    if not held:
        return None
    servers = kafka_config.get("bootstrap.servers")
    tools = f"kafka-transactions.sh --bootstrap-server {servers}"
    return TransactionOpen(
        f"{where}: " + "; ".join(
            f"the last stable offset of {topic}[{partition}] is held at {stable} by a producer transaction still "
            f"open, below {end_offset}, where the planned range ends (the log ends at {end})"
            for topic, partition, end_offset, stable, end in held)
        + f": a read_committed reader cannot read past an open transaction, and this read waited {waited} there. "
        "The brokers answer; nothing is lost. The stage fails, and each retry or clear fails the same way, until "
        "the producer commits or aborts that transaction, or the broker aborts it when the producer's "
        "transaction.timeout.ms runs out (at most the broker's transaction.max.timeout.ms, 15 minutes by "
        "default); nothing of the window is published meanwhile, then it is published once: the transaction's "
        "records if it committed, none of them if it aborted. To end it sooner, find the producer ("
        + "; ".join(f"{tools} describe-producers --topic {t} --partition {p}" for t, p, *_ in held[:3])
        + ") and let it commit, or abort the transaction ("
        + "; ".join(f"{tools} abort --topic {t} --partition {p} --start-offset {stable}"
                    for t, p, _, stable, _ in held[:3])
        + ")" + (f"; {len(held) - 3} more partition(s) are held" if len(held) > 3 else ""))


def _latest_offsets(kafka_config: Mapping[str, Any],
                    tps: Sequence[tuple[str, int]]) -> dict[tuple[str, int], tuple[int, int]]:
    """(last stable offset, high watermark) of each partition the broker
    answered for: one ListOffsets request per isolation level."""
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient

    from airflow_eos.core.kafka_client import CONSUMER_ONLY, client_logging, list_offsets

    admin = AdminClient({**client_logging(), **{k: v for k, v in kafka_config.items() if k not in CONSUMER_ONLY}})
    found: list[dict[tuple[str, int], int]] = []
    for committed in (True, False):
        answers: dict[tuple[str, int], int] = {}
        try:
            for tp, offset in list_offsets(admin, tps, committed=committed, timeout=OFFSETS_TIMEOUT_S):
                answers[tp] = offset
        except (KafkaException, TimeoutError):
            pass  # what answered is kept
        found.append(answers)
    stable, end = found
    return {tp: (stable[tp], end[tp]) for tp in stable if tp in end}
