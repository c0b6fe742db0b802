"""The Kafka side of the Kafka target: the names a window's commit uses
(``transactional.id``, marker group, commit token), the producer, the check
that the topic exists, and the marker read. confluent_kafka is imported inside
the functions.

**The marker.** A window's transaction sends, with
``send_offsets_to_transaction``, the offsets of the window's *marker group*
(one consumer group per window that no consumer ever joins): the window's end
cut for each planned source partition, and the *commit token* as the offset of
partition 0 of the target topic. Committed offsets of a transaction are
visible after its commit and absent after its abort (on Apache Kafka and on a
Kafka-compatible broker tried before, which did not hide aborted records and
dropped offset metadata: hence the token as an offset value). The token is
``epoch << 32 | 31 random bits``: it names the attempt whose transaction
committed and tells apart two transactions of one attempt (a commit crashed in
the middle, then retried), whose records both carry it as a header.
"""

from __future__ import annotations

import hashlib
import logging
import re
import secrets
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from airflow_eos.core.attempt import Attempt
from airflow_eos.core.errors import TargetError
from airflow_eos.core.kafka_client import CONSUMER_ONLY, client_errors, client_logging, list_offsets, request_timeout
from airflow_eos.core.windows import TopicPartition, Window, to_utc

log = logging.getLogger(__name__)

# Lineage headers on every published record.
H_PIPELINE = "eos-pipeline"
H_WINDOW_START = "eos-window-start"
H_WINDOW_END = "eos-window-end"
H_EPOCH = "eos-epoch"
H_COMMIT = "eos-commit"
H_TOPIC = "eos-topic"
H_PARTITION = "eos-partition"
H_OFFSET = "eos-offset"

TIMEOUT = 30.0



def _window_digest(target_id: str, window: Window | Attempt) -> str:
    if isinstance(window, Attempt):
        window = window.window
    text = f"{target_id}\0{window.pipeline}\0{to_utc(window.start).isoformat()}"
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _slug(pipeline: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", pipeline)[:60] or "p"


def transactional_id(prefix: str, target_id: str, window: Window | Attempt) -> str:
    """One ``transactional.id`` per (target, pipeline, window): every commit of
    the window (a retry, a rerun's, a zombie's) uses it, so each one's
    ``init_transactions`` fences the others and aborts their open
    transaction; windows of a pipeline commit in parallel without fencing
    each other."""
    w = window.window if isinstance(window, Attempt) else window
    return f"{prefix}.{_slug(w.pipeline)}.{to_utc(w.start):%Y%m%dT%H%M%S}.{_window_digest(target_id, w)}"


def marker_group(prefix: str, target_id: str, window: Window | Attempt) -> str:
    """The window's marker consumer group (never joined by a consumer)."""
    return transactional_id(prefix, target_id, window) + ".marker"


def new_token(epoch: int) -> int:
    return (epoch << 32) | (secrets.randbits(31) + 1)


def token_epoch(token: int) -> int:
    return token >> 32


@dataclass(frozen=True)
class Marker:
    """A committed transaction of a window, as its marker group says."""

    token: int
    offsets: Mapping[TopicPartition, int]

    @property
    def epoch(self) -> int:
        return token_epoch(self.token)


def marker_offsets(topic: str, token: int, source_ends: Mapping[TopicPartition, int]) -> list:
    from confluent_kafka import TopicPartition as KafkaTP
    if any(tp.topic == topic and tp.partition == 0 for tp in source_ends):
        raise TargetError(f"the pipeline reads partition 0 of its own target topic {topic}: the window's commit "
                          "marker cannot take its place; publish into another topic")
    return [KafkaTP(topic, 0, token)] + [KafkaTP(tp.topic, tp.partition, end) for tp, end in sorted(source_ends.items(), key=lambda kv: (kv[0].topic, kv[0].partition))]


def read_marker(kafka_config: Mapping[str, Any], group: str, topic: str,
                sources: Iterable[TopicPartition]) -> Marker | None:
    """The marker of a committed transaction of the window, or None. Read
    after ``init_transactions``: any transaction of the window still in
    flight has then ended (committed or aborted)."""
    from confluent_kafka import Consumer, KafkaError, KafkaException
    from confluent_kafka import TopicPartition as KafkaTP
    coordinator_moving = {KafkaError.NOT_COORDINATOR, KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
                          KafkaError.COORDINATOR_NOT_AVAILABLE}
    consumer = Consumer({**_client(kafka_config), "group.id": group, "enable.auto.commit": False})
    wanted = [KafkaTP(topic, 0)] + [KafkaTP(tp.topic, tp.partition) for tp in sources]
    deadline = time.monotonic() + TIMEOUT
    try:
        while True:
            try:
                found = consumer.committed(wanted, timeout=max(deadline - time.monotonic(), 1.0))
                break
            except KafkaException as exc:
                # A group's coordinator moving or loading its offsets partition (a broker just started, a
                # new group) answers NOT_COORDINATOR / COORDINATOR_LOAD_IN_PROGRESS: ask again until the deadline.
                if exc.args[0].code() not in coordinator_moving or time.monotonic() > deadline:
                    raise TargetError(f"cannot read the commit marker (consumer group {group}) of topic {topic}: "
                                      f"{exc.args[0]}") from exc
                time.sleep(0.2)
    finally:
        consumer.close()
    token = found[0].offset
    if token is None or token < 0:
        return None
    return Marker(token, {TopicPartition(t.topic, t.partition): t.offset for t in found[1:] if t.offset >= 0})


def _client(kafka_config: Mapping[str, Any]) -> dict[str, Any]:
    """The connection settings of a client (without the source's group and a
    transactional id), logging like every librdkafka client of the package:
    through airflow_eos.librdkafka, throttled, never raw lines on stderr (a
    producer's TxnCoordinator reconnects would otherwise reach the task log
    and the test output unfiltered)."""
    settings = {k: v for k, v in dict(kafka_config).items() if k not in ("group.id", "transactional.id")}
    return {**client_logging(), **settings}


def _producer_client(kafka_config: Mapping[str, Any]) -> dict[str, Any]:
    """The connection settings of a producer or an admin client: no consumer-only keys."""
    return {k: v for k, v in _client(kafka_config).items() if k not in CONSUMER_ONLY}


def check_topic(kafka_config: Mapping[str, Any], topic: str) -> int:
    """The target topic's partition count; TargetError if it does not exist
    (it is never created: a producer's metadata request might create it with
    the broker's defaults)."""
    from confluent_kafka import KafkaError, KafkaException
    from confluent_kafka.admin import AdminClient
    config = _producer_client(kafka_config)
    admin = AdminClient(config)
    try:
        # Every topic, not this one: a metadata request naming a missing topic
        # lets a broker with auto.create.topics.enable create it.
        metadata = admin.list_topics(timeout=request_timeout(config, TIMEOUT))
    except KafkaException as exc:
        raise unreachable(config, topic, exc) from exc
    found = metadata.topics.get(topic)
    if found is not None and found.error is not None \
            and found.error.code() != KafkaError.UNKNOWN_TOPIC_OR_PART:
        raise TargetError(f"the target topic {topic!r} is not available now: {found.error.str()} (e.g. just "
                          "created, or its leader is being elected); nothing changed: retry the task")
    if found is None or found.error is not None or not found.partitions:
        raise TargetError(f"the target topic {topic!r} does not exist (or is not visible to this client): create it "
                          "with the partitions, replication and retention its consumers need (e.g. kafka-topics.sh "
                          f"--create --topic {topic}); the Kafka target never creates a topic")
    return len(found.partitions)


def unreachable(config: Mapping[str, Any], topic: str, exc: Exception) -> TargetError:
    """The error of a target cluster that did not answer a metadata request:
    where (its bootstrap servers), the client's reason, what to check; the
    request changed nothing, so the step may simply be retried."""
    bootstrap = config.get("bootstrap.servers")
    hint = client_errors(dict(config)).hint(str(bootstrap))
    return TargetError(f"cannot reach the Kafka cluster at {bootstrap} of target topic {topic}: "
                       f"{exc.args[0] if exc.args else exc}{hint}; this request changed nothing: retry the task once "
                       "the cluster answers")


def cluster_identity(kafka_config: Mapping[str, Any], topic: str) -> str:
    """The physical identity of ``topic`` on the cluster ``kafka_config`` reaches,
    whatever connection names it: ``kafka-cluster:<cluster id>/<topic>`` (the id
    the cluster reports in its metadata; every broker of a real Kafka cluster
    reports the same one). A broker that reports no cluster id (before Kafka
    0.10.1) is named by the brokers its metadata lists (advertised addresses,
    sorted): ``kafka-brokers:<host:port,...>/<topic>``."""
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient
    config = _producer_client(kafka_config)
    admin = AdminClient(config)
    try:
        metadata = admin.list_topics(timeout=request_timeout(config, TIMEOUT))  # every topic: naming one may create it
    except KafkaException as exc:
        raise unreachable(config, topic, exc) from exc
    if metadata.cluster_id:
        return f"kafka-cluster:{metadata.cluster_id}/{topic}"
    brokers = sorted(f"{b.host}:{b.port}" for b in metadata.brokers.values())
    return f"kafka-brokers:{','.join(brokers)}/{topic}"


def producer(kafka_config: Mapping[str, Any], tx_id: str, extra: Mapping[str, Any]):
    from confluent_kafka import Producer
    config = {"linger.ms": 20, "batch.num.messages": 10000, **_producer_client(kafka_config), **dict(extra),
              "transactional.id": tx_id, "enable.idempotence": True, "acks": "all",
              "allow.auto.create.topics": False}
    return Producer(config)


@dataclass(frozen=True)
class PartitionBounds:
    """One partition of a topic as the broker reports it: where its log starts
    (retention or ``delete_records`` moved it past what was deleted), its end
    (the high watermark: what a read_uncommitted reader reaches) and its last
    stable offset (what a read_committed reader reaches: an open transaction
    holds it at that transaction's first record)."""

    log_start: int
    end: int
    stable: int


def partition_bounds(kafka_config: Mapping[str, Any], topic: str, partitions: int) -> dict[int, PartitionBounds]:
    """The bounds of every partition of ``topic``, from ``ListOffsets``. Used
    only where an understated answer is safe: an end read too low makes a
    later scan start earlier (it reads more), never skip a record."""
    from confluent_kafka.admin import AdminClient
    admin = AdminClient(_producer_client(kafka_config))
    starts = _list_offsets(admin, topic, partitions, latest=False, committed=False)
    ends = _list_offsets(admin, topic, partitions, latest=True, committed=False)
    stable = _list_offsets(admin, topic, partitions, latest=True, committed=True)
    return {p: PartitionBounds(starts[p], ends[p], stable[p]) for p in range(partitions)}


def partition_ends(kafka_config: Mapping[str, Any], topic: str, partitions: int) -> dict[int, int]:
    """The end (high watermark) of every partition of ``topic``: one request."""
    from confluent_kafka.admin import AdminClient
    admin = AdminClient(_producer_client(kafka_config))
    return _list_offsets(admin, topic, partitions, latest=True, committed=False)


def _list_offsets(admin, topic: str, partitions: int, *, latest: bool, committed: bool) -> dict[int, int]:
    from confluent_kafka import KafkaException
    try:
        return {p: offset for (_, p), offset in list_offsets(admin, [(topic, p) for p in range(partitions)],
                                                              latest=latest, committed=committed, timeout=TIMEOUT)}
    except (KafkaException, TimeoutError) as exc:
        reason = exc.args[0] if exc.args else f"no answer within {TIMEOUT:.0f} s"
        raise TargetError(f"cannot read the offsets of target topic {topic}: {reason}") from exc


def is_compacted(kafka_config: Mapping[str, Any], topic: str) -> bool:
    """Does the topic's ``cleanup.policy`` include ``compact``? The log cleaner
    may then remove a record without moving the log start."""
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient, ConfigResource, ResourceType
    admin = AdminClient(_producer_client(kafka_config))
    resource = ConfigResource(ResourceType.TOPIC, topic)
    try:
        configs = admin.describe_configs([resource], request_timeout=TIMEOUT)[resource].result()
    except KafkaException as exc:
        raise TargetError(f"cannot read the configuration of target topic {topic}: {exc.args[0]}") from exc
    policy = configs.get("cleanup.policy")
    return policy is not None and "compact" in (policy.value or "")
