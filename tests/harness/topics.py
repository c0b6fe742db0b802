"""Topics for a test: uniquely named, created on a broker, filled with records
of chosen timestamps, deleted afterwards (the ``topics`` fixture of
tests/conftest.py; a test with a broker of its own makes one itself)."""

from __future__ import annotations

import time
import uuid

from confluent_kafka import KafkaError, KafkaException, Producer
from confluent_kafka.admin import AdminClient, NewTopic

from airflow_eos.core.kafka_client import client_logging


def create_topic(bootstrap: str, name: str, partitions: int, config: dict | None = None, *,
                 timeout: float = 15.0, admin: AdminClient | None = None) -> None:
    """Create a topic and wait until the broker's metadata serves it: every
    partition with a leader. Kafka answers CreateTopics once the controller
    has the topic, and a broker's metadata learns it later (KRaft: when the
    broker has replayed the record), so a client asking at once may be told
    the topic is unknown or has no leader yet. ``admin``: a client of the
    broker's to ask with (a new one costs the broker ~4 ms of CPU)."""
    if admin is None:
        admin = AdminClient({**client_logging(), "bootstrap.servers": bootstrap})
    for f in admin.create_topics([NewTopic(name, partitions, 1, config=dict(config or {}))]).values():
        f.result(timeout=timeout)
    deadline = time.monotonic() + timeout
    while True:
        found = admin.list_topics(timeout=timeout).topics.get(name)
        if found is not None and found.error is None and len(found.partitions) == partitions \
                and all(p.leader >= 0 and p.error is None for p in found.partitions.values()):
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"topic {name} not served with {partitions} partitions and their leaders "
                                 f"{timeout:.0f}s after its creation: {found}")
        time.sleep(0.05)


def delete_topic(bootstrap: str, name: str, *, missing_ok: bool = False, timeout: float = 15.0) -> None:
    """Delete a topic and wait until the broker's metadata no longer serves it
    (as :func:`create_topic` waits for it to be served): a topic created again
    at once could otherwise be told apart from the old one by no client."""
    admin = AdminClient({**client_logging(), "bootstrap.servers": bootstrap})
    for f in admin.delete_topics([name]).values():
        try:
            f.result(timeout=timeout)
        except KafkaException as exc:
            if not (missing_ok and exc.args[0].code() == KafkaError.UNKNOWN_TOPIC_OR_PART):
                raise
    deadline = time.monotonic() + timeout
    while name in admin.list_topics(timeout=timeout).topics:
        if time.monotonic() > deadline:
            raise AssertionError(f"topic {name} still served {timeout:.0f}s after its deletion")
        time.sleep(0.05)


def recreate_topic(bootstrap: str, name: str, partitions: int, config: dict | None = None) -> None:
    """The topic ``name``, empty: deleted if it exists, then created and served."""
    delete_topic(bootstrap, name, missing_ok=True)
    create_topic(bootstrap, name, partitions, config)


class TopicFactory:
    """Creates uniquely named topics and produces records with chosen timestamps."""

    def __init__(self, bootstrap: str):
        self.bootstrap = bootstrap
        self._admin: AdminClient | None = None
        self.created: list[str] = []
        self.failed: list[str] = []  # delivery errors since the last flush
        self._producer: Producer | None = None

    def create(self, partitions: int = 1, prefix: str = "t") -> str:
        name = f"{prefix}-{uuid.uuid4().hex[:10]}"
        create_topic(self.bootstrap, name, partitions, admin=self.admin)
        self.created.append(name)
        return name

    @property
    def admin(self) -> AdminClient:
        """One client for every topic the factory creates and deletes, made when the first one is."""
        if self._admin is None:
            self._admin = AdminClient({**client_logging(), "bootstrap.servers": self.bootstrap})
        return self._admin

    @property
    def producer(self) -> Producer:
        if self._producer is None:
            self._producer = Producer({"bootstrap.servers": self.bootstrap, "enable.idempotence": True,
                                       "linger.ms": 5, "message.max.bytes": 10_000_000})
        return self._producer

    def produce(self, topic: str, records, *, flush: bool = True) -> None:
        """records: iterable of (partition, timestamp_ms, value) tuples."""
        deadline = time.monotonic() + 30
        for partition, ts_ms, value in records:
            while True:
                try:
                    self.producer.produce(topic, value=value, partition=partition, timestamp=ts_ms,
                                          on_delivery=self._delivered)
                    break
                except BufferError:
                    self.producer.poll(0.05)
                except KafkaException as e:
                    # partitions added by create_partitions reach the producer's metadata later than
                    # the admin's answer: ask for the topic's metadata again until the partition is known
                    if e.args[0].code() != KafkaError._UNKNOWN_PARTITION or time.monotonic() > deadline:
                        raise
                    self.producer.list_topics(topic, timeout=5)
                    time.sleep(0.05)
        if flush:
            remaining = self.producer.flush(30)
            assert remaining == 0, f"{remaining} records not delivered"
            failed, self.failed = self.failed, []
            assert not failed, f"{len(failed)} records refused by the broker, e.g. {failed[0]}"

    def _delivered(self, err, msg) -> None:
        if err is not None:
            self.failed.append(f"{msg.topic()}[{msg.partition()}]: {err}")

    def close(self) -> None:
        if self._producer is not None:
            self._producer.flush(10)
            self._producer = None
        if self.created:
            futures = self.admin.delete_topics(self.created)
            for f in futures.values():
                try:
                    f.result(timeout=15)
                except Exception:  # noqa: BLE001 - best effort cleanup of a test's topics
                    pass
