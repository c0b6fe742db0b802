"""Topics for a test: uniquely named, created on a broker, filled with records
of chosen timestamps, deleted afterwards (the ``topics`` fixture of
tests/conftest.py; a test with a broker of its own makes one itself)."""

from __future__ import annotations

import time
import uuid

from confluent_kafka import KafkaError, KafkaException, Producer
from confluent_kafka.admin import AdminClient, NewTopic


class TopicFactory:
    """Creates uniquely named topics and produces records with chosen timestamps."""

    def __init__(self, bootstrap: str):
        self.bootstrap = bootstrap
        self.admin = AdminClient({"bootstrap.servers": bootstrap})
        self.created: list[str] = []
        self.failed: list[str] = []  # delivery errors since the last flush
        self._producer: Producer | None = None

    def create(self, partitions: int = 1, prefix: str = "t") -> str:
        name = f"{prefix}-{uuid.uuid4().hex[:10]}"
        futures = self.admin.create_topics([NewTopic(name, partitions, 1)])
        for f in futures.values():
            f.result(timeout=15)
        self.created.append(name)
        return name

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
