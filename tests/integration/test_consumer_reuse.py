"""Reads reuse the process's idle consumers (core/consumer_pool.py), and a
reused consumer reads what a new one would: a range read after another
topic's, whose records it had fetched ahead, has exactly its own records
(topic, partition, offset and value of each), never one of the earlier
read's. The tasks of a range split for Spark share a consumer. A read that
failed leaves no consumer behind for the next. Apache Kafka; no Spark (the
data source's read runs here as in a Python worker)."""

from __future__ import annotations

import pytest

from airflow_eos.core import consumer_pool
from airflow_eos.core.errors import LogTruncated
from airflow_eos.core.source import KafkaLog
from airflow_eos.core.windows import PartitionRange, TopicPartition
from airflow_eos.spark.kafka_ranges import KafkaRangePartition, read_range, split_range

BASE_MS = 1_700_000_000_000


@pytest.fixture
def made(monkeypatch):
    """The consumers the pool makes in the test (the pool is emptied first)."""
    consumer_pool.CONSUMERS.close()
    made = []
    real = consumer_pool.reader

    def counting(config, purpose):
        made.append(purpose)
        return real(config, purpose)

    monkeypatch.setattr(consumer_pool, "reader", counting)
    yield made
    consumer_pool.CONSUMERS.close()


@pytest.fixture
def two_topics(topics):
    """Topic a (1 partition, 3,000 records) and b (2 partitions, 40 each): the
    same offsets in both, told apart by their values."""
    a, b = topics.create(1, "reuse-a"), topics.create(2, "reuse-b")
    topics.produce(a, [(0, BASE_MS + i, f"a-0-{i}".encode()) for i in range(3000)])
    topics.produce(b, [(p, BASE_MS + i, f"b-{p}-{i}".encode()) for p in (0, 1) for i in range(40)])
    return a, b


def rows(batches) -> list[tuple[str, int, int, bytes]]:
    return [(r["topic"], r["partition"], r["offset"], r["value"])
            for batch in batches for r in batch.to_pylist()]


def test_a_reused_consumer_reads_exactly_its_range_never_the_last_reads_prefetch(kafka_config, two_topics, made):
    a, b = two_topics
    # The first read stops at offset 10 of 3,000: the consumer had fetched further ahead in a.
    first = rows(read_range(kafka_config, KafkaRangePartition(a, 0, 0, 10)))
    assert first == [(a, 0, i, f"a-0-{i}".encode()) for i in range(10)]
    second = rows(read_range(kafka_config, KafkaRangePartition(b, 1, 5, 25)))
    assert second == [(b, 1, i, f"b-1-{i}".encode()) for i in range(5, 25)]
    third = rows(read_range(kafka_config, KafkaRangePartition(a, 0, 3, 8)))  # behind where it had read
    assert third == [(a, 0, i, f"a-0-{i}".encode()) for i in range(3, 8)]
    assert len(made) == 1, made  # one consumer for the three reads


def test_the_tasks_of_a_split_range_share_a_consumer(kafka_config, two_topics, made):
    a, _ = two_topics
    pieces = split_range(PartitionRange(a, 0, 1, 3000), 1500)
    assert [(p.start_offset, p.end_offset) for p in pieces] == [(1, 1500), (1500, 3000)]  # 1,499 and 1,500 wide
    read = [row for piece in pieces for row in rows(read_range(kafka_config, piece))]
    assert read == [(a, 0, i, f"a-0-{i}".encode()) for i in range(1, 3000)]
    assert len(made) == 1, made


def test_a_kafka_log_reads_on_the_consumers_of_earlier_logs(kafka_config, two_topics, made):
    a, b = two_topics
    with KafkaLog(kafka_config) as log_:
        assert log_.bounds(TopicPartition(a, 0)).end == 3000
        assert [r.offset for r in log_.records(TopicPartition(a, 0), 100, 105)] == list(range(100, 105))
    with KafkaLog(kafka_config) as log_:
        tp = TopicPartition(b, 0)
        assert (log_.bounds(tp).log_start, log_.bounds(tp).end) == (0, 40)
        assert [(r.offset, r.timestamp_ms) for r in log_.records(tp, 30, 40)] == \
            [(i, BASE_MS + i) for i in range(30, 40)]
        assert log_.first_at_or_after(tp, 39, 40).offset == 39
        assert log_.first_at_or_after(tp, 40, 41) is None  # the end of b's partition, not of a's
    assert len(made) == 1, made


def test_a_read_that_failed_leaves_no_consumer_for_the_next(kafka_config, two_topics, made):
    a, b = two_topics
    with pytest.raises(LogTruncated, match="ends at offset 40"):
        rows(read_range(kafka_config, KafkaRangePartition(b, 0, 30, 50), end_grace_s=0.2))
    assert rows(read_range(kafka_config, KafkaRangePartition(b, 0, 30, 40))) == \
        [(b, 0, i, f"b-0-{i}".encode()) for i in range(30, 40)]
    reads = [purpose for purpose in made if purpose.startswith("a Kafka consumer for")]  # not the diagnosis's
    assert len(reads) == 2, made  # the failed read's consumer was closed, not reused
