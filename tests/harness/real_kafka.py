"""Sources only a real Kafka has, for whole windows over them (tests/chaos/test_transactional_source.py,
test_compacted_source.py, test_retention.py): topics with topic-level settings, keyed
records in segments of their own, waiting for the log cleaner or retention, and the
lineage check those tests share.

Each of their windows runs through the production steps (airflow_eos.steps: plan,
stage, prepare, commit) as the fault suite drives them (harness.chaos: the stage
job's own reader, its Python transform), on the session's PostgreSQL and Apache
Kafka, and ends in ``check``: verify against Kafka clean, every window committed,
nothing live or left behind. Besides verify, each test checks the lineage itself
(:func:`assert_lineage`): the published rows and dead letters are the records a
read_committed reader finds in the committed windows' ranges, each once, and
nothing else. tests/integration/test_plan.py proves the planner's side (cuts,
waits, refusals); these tests prove that what it plans is staged, published and
verified exactly once."""

from __future__ import annotations

import dataclasses
import json
import time
from collections import Counter
from datetime import timedelta

import psycopg
from confluent_kafka import Consumer, Producer
from confluent_kafka import TopicPartition as KafkaTopicPartition
from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource

from airflow_eos.core.kafka_client import client_logging
from airflow_eos.core.windows import to_millis
from harness import chaos
from harness.chaos import T0, kafka_records, published_lineage, record_value
from harness.topics import create_topic as create_served

MINUTE = timedelta(minutes=1)


def ms(minutes: float) -> int:
    """T0 + ``minutes``, in epoch milliseconds."""
    return to_millis(T0 + minutes * MINUTE)


def on_topic(p: chaos.Pipeline, topic: str, **changes) -> chaos.Pipeline:
    return dataclasses.replace(p, topics=(topic,), **changes)


def create_topic(kafka, topic: str, partitions: int, **settings: str) -> None:
    """A topic with topic-level settings (``segment_ms="100"`` for segment.ms)."""
    create_served(kafka.address, topic, partitions, {k.replace("_", "."): v for k, v in settings.items()})


def alter_topic(kafka, topic: str, **settings: str) -> None:
    admin = AdminClient({**client_logging(), "bootstrap.servers": kafka.address})
    resource = ConfigResource(ConfigResource.Type.TOPIC, topic, incremental_configs=[
        ConfigEntry(k.replace("_", "."), v, incremental_operation=AlterConfigOpType.SET)
        for k, v in settings.items()])
    for f in admin.incremental_alter_configs([resource]).values():
        f.result(15)


def log_start(kafka, topic: str, partition: int = 0) -> int:
    watcher = Consumer({**client_logging(), "bootstrap.servers": kafka.address, "group.id": "eos-log-start"})
    try:
        return watcher.get_watermark_offsets(KafkaTopicPartition(topic, partition), timeout=10)[0]
    finally:
        watcher.close()


def window_values(p: chaos.Pipeline) -> dict:
    """(window start, topic, partition, offset) -> value of every record a
    read_committed reader finds in the ranges of the pipeline's committed
    windows: what they must publish (or dead-letter), each once."""
    with psycopg.connect(p.url) as conn:
        ranges = conn.execute(
            "SELECT r.window_start, r.topic, r.partition, r.start_offset, r.end_offset FROM eos.window_ranges r"
            " JOIN eos.windows w USING (pipeline, window_start) WHERE r.pipeline = %s AND w.state = 'committed'",
            (p.name,)).fetchall()
    return {(ws, topic, partition, offset): value
            for ws, topic, partition, start, end in ranges
            for offset, value in kafka_records(p.kafka_config, topic, partition, start, end).items()}


def assert_lineage(p: chaos.Pipeline) -> dict:
    """Every published row traces to a record (topic, partition, offset) of
    its window in Kafka, no row twice, none missing, nothing extra: the rows
    and the committed attempts' dead letters are the windows' records, each
    once. Returns the windows' records (see window_values)."""
    truth = window_values(p)
    rows = published_lineage(p)
    with psycopg.connect(p.url) as conn:
        dead = Counter(conn.execute(
            'SELECT d.window_start, d.topic, d.partition, d."offset" FROM eos.dead_letters d'
            " JOIN eos.windows w ON w.pipeline = d.pipeline AND w.window_start = d.window_start"
            " AND w.committed_epoch = d.epoch WHERE d.pipeline = %s", (p.name,)).fetchall())
    assert [k for k, n in (rows + dead).items() if n > 1] == [], "published or dead-lettered more than once"
    assert set(truth) - set(rows) - set(dead) == set(), "records neither published nor a dead letter"
    assert set(rows) - set(truth) == set() and set(dead) - set(truth) == set(), "rows without a record"
    return truth


def published_ids(p: chaos.Pipeline) -> list[int]:
    with psycopg.connect(p.url) as conn:
        return sorted(n for (n,) in conn.execute(f"SELECT id FROM {p.table} WHERE eos_pipeline = %s", (p.name,)))


def order_id(value: bytes) -> int | None:
    """The order number of a record of the suite's orders (None: malformed, a dead letter)."""
    try:
        return json.loads(value)["n"]
    except ValueError:
        return None


def produce_keyed(kafka, topic: str, batches: list[list[tuple[int, bytes, int, int]]]) -> None:
    """Batches of (partition, key, minute after T0, order number), one flush each:
    each batch lands in a segment of its own (segment.ms is tiny and a segment
    rolls by its records' timestamps), so the cleaner may compact all but the last."""
    producer = Producer({**client_logging(), "bootstrap.servers": kafka.address, "enable.idempotence": True,
                         "linger.ms": 5})
    try:
        for batch in batches:
            for partition, key, minute, n in batch:
                producer.produce(topic, key=key, value=record_value(n), partition=partition, timestamp=ms(minute))
            assert producer.flush(30) == 0
    finally:
        del producer


def read_offsets(kafka, topic: str, partitions: int) -> set[tuple[int, int]]:
    """(partition, offset) of every record the topic holds now (read anew each time)."""
    consumer = Consumer({**client_logging(), "bootstrap.servers": kafka.address, "group.id": "eos-compacted",
                         "enable.partition.eof": True, "enable.auto.commit": False, "fetch.wait.max.ms": 10})
    found, ended = set(), set()
    try:
        consumer.assign([KafkaTopicPartition(topic, partition, 0) for partition in range(partitions)])
        while len(ended) < partitions:
            msg = consumer.poll(10)
            assert msg is not None, "no end of partition within 10 s"
            if msg.error():
                ended.add(msg.partition())
            else:
                found.add((msg.partition(), msg.offset()))
    finally:
        consumer.close()
    return found


def await_compacted(kafka, topic: str, partitions: int, survivors: set[tuple[int, int]]) -> None:
    """Waits (90 s at most) until the log cleaner has left exactly ``survivors``, (partition, offset)."""
    deadline = time.monotonic() + 90
    while read_offsets(kafka, topic, partitions) != survivors:
        assert time.monotonic() < deadline, "the log cleaner did not compact the topic within 90 s"
        time.sleep(1)


def two_windows_in_two_segments(kafka, topic: str) -> None:
    """Partition 0 of a topic with a tiny segment.ms: window 0's 12 records (offsets 0-11) in one
    segment, window 1's and a record closing it in the next (the active one)."""
    chaos.produce(kafka.address, topic, [(0, ms(5 * i), record_value(i)) for i in range(12)])
    chaos.produce(kafka.address, topic, [(0, ms(60 + 5 * i), record_value(12 + i)) for i in range(13)])


def retention_deletes_window_0(kafka, topic: str) -> None:
    """Kafka's size retention (``retention.bytes``: every segment but the active one) deletes
    window 0's segment of :func:`two_windows_in_two_segments`, and nothing else."""
    alter_topic(kafka, topic, retention_bytes="1")
    deadline = time.monotonic() + 60
    while log_start(kafka, topic) < 12:
        assert time.monotonic() < deadline, "retention deleted nothing within 60 s"
        time.sleep(0.5)
    alter_topic(kafka, topic, retention_bytes="-1")
    assert log_start(kafka, topic) == 12, "retention was to delete window 0's segment only"
