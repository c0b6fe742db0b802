"""Whole windows over sources only a real Kafka has (issue 34, item 3): a topic
written by transactional producers (aborted transactions, one open at the
window's end), a compacted topic, and retention deleting a planned range before
its stage. Each window runs through the production steps (airflow_eos.steps:
plan, stage, prepare, commit) as the fault suite drives them (harness.chaos: the
stage job's own reader, its Python transform), on the session's PostgreSQL and
Apache Kafka, and ends in ``check``: verify against Kafka clean, every window
committed, nothing live or left behind. Besides verify, each test checks the
lineage itself (:func:`assert_lineage`): the published rows and dead letters
are the records a read_committed reader finds in the committed windows' ranges,
each once, and nothing else.

tests/integration/test_plan.py proves the planner's side of each (cuts, waits,
refusals); this module proves that what it plans is staged, published and
verified exactly once.
"""

from __future__ import annotations

import dataclasses
import io
import json
import logging
import time
import uuid
from collections import Counter
from datetime import timedelta

import psycopg
import pytest
from confluent_kafka import Consumer, Producer
from confluent_kafka import TopicPartition as KafkaTopicPartition
from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource, NewTopic

from airflow_eos.cli.verify import print_report
from airflow_eos.core.errors import OffsetsExpired, TransactionOpen
from airflow_eos.core.kafka_client import client_logging
from airflow_eos.core.windows import to_millis
from airflow_eos.verify import verify
from harness import chaos
from harness.chaos import HOUR, T0, Harness, check, kafka_records, published_lineage, record_value

MINUTE = timedelta(minutes=1)
# The suite's windows ended long ago: a grace longer than that keeps a window
# waiting for a partition that has not passed its end, as a window just ended.
WAITING_GRACE = timedelta(days=36_500)


# --------------------------------------------------------------------------- helpers


def ms(minutes: float) -> int:
    """T0 + ``minutes``, in epoch milliseconds."""
    return to_millis(T0 + minutes * MINUTE)


def on_topic(p: chaos.Pipeline, topic: str, **changes) -> chaos.Pipeline:
    return dataclasses.replace(p, topics=(topic,), **changes)


def create_topic(kafka, topic: str, partitions: int, **settings: str) -> None:
    """A topic with topic-level settings (``segment_ms="100"`` for segment.ms)."""
    admin = AdminClient({**client_logging(), "bootstrap.servers": kafka.address})  # kept until the answer
    config = {k.replace("_", "."): v for k, v in settings.items()}
    for f in admin.create_topics([NewTopic(topic, partitions, 1, config=config)]).values():
        f.result(15)


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


# --------------------------------------------------------------------------- a transactional source


def transactional_producer(kafka) -> Producer:
    # transaction.timeout.ms: longer than a test keeps a transaction open on a busy machine (librdkafka's
    # default, 60 s, is not): the broker aborts a transaction that times out.
    producer = Producer({**client_logging(), "bootstrap.servers": kafka.address,
                         "transactional.id": f"eos-src-{uuid.uuid4().hex[:8]}", "linger.ms": 5,
                         "transaction.timeout.ms": 600_000})
    producer.init_transactions(15)
    return producer


def transaction(producer: Producer, topic: str, orders: list[tuple[float, int]], *, commit: bool | None) -> None:
    """One transaction of orders (minute after T0, order number) on partition 0:
    committed, aborted (False) or left open (None)."""
    producer.begin_transaction()
    for minute, n in orders:
        producer.produce(topic, value=record_value(n), partition=0, timestamp=ms(minute))
    producer.flush(15)
    if commit is True:
        producer.commit_transaction(15)
    elif commit is False:
        producer.abort_transaction(15)


def settled(kafka, topic: str, partition: int = 0) -> int:
    """Wait until the last stable offset of the partition reaches its end (the
    transaction coordinator writes a commit's markers after
    ``commit_transaction`` returns: a transaction begun before they land has
    records before them); returns the end."""
    from confluent_kafka import IsolationLevel
    from confluent_kafka.admin import OffsetSpec

    admin = AdminClient({**client_logging(), "bootstrap.servers": kafka.address})
    tp = KafkaTopicPartition(topic, partition)
    deadline = time.monotonic() + 30
    while True:
        stable, end = (admin.list_offsets({tp: OffsetSpec.latest()}, isolation_level=isolation)[tp].result(15).offset
                       for isolation in (IsolationLevel.READ_COMMITTED, IsolationLevel.READ_UNCOMMITTED))
        if stable == end:
            return end
        assert time.monotonic() < deadline, f"{topic}[{partition}] not settled within 30 s: {stable} < {end}"
        time.sleep(0.1)


def test_a_transactional_source_waits_for_its_open_transaction_then_publishes_each_committed_record_once(
        make_pipeline, kafka, tmp_path, caplog, tally):
    """Partition 0 is written by transactional producers: committed and aborted
    transactions, and one left open with a record in window 0 and one past its
    end; partition 1 by a plain producer, past the end. The window waits (the
    plan step says which partition holds it: the open transaction's first
    record is where a read_committed reader stops) and freezes nothing; the
    transaction commits; windows 0 and 1 are staged and committed. Aborted
    records are never published (their offsets are gaps in the ranges); each
    committed record is published (or a dead letter) once, in its window;
    verify clean."""
    topic = f"txn-source-{uuid.uuid4().hex[:8]}"
    chaos.create_topic(kafka.address, topic, 2)
    p = on_topic(make_pipeline("txn_source"), topic, idle_partition_grace=WAITING_GRACE)
    h = Harness(p, tmp_path)
    chaos.produce(kafka.address, topic, [(1, ms(m), record_value(2000 + m)) for m in range(0, 130, 5)])
    aborted = [*range(1000, 1010), *range(1010, 1016)]
    writer, other = transactional_producer(kafka), transactional_producer(kafka)
    try:
        transaction(writer, topic, [(m, m) for m in range(0, 20)], commit=True)
        transaction(writer, topic, [(20 + i, n) for i, n in enumerate(aborted[:10])], commit=False)
        transaction(writer, topic, [(m, m) for m in range(30, 50)], commit=True)
        transaction(other, topic, [(55, 55), (70, 70)], commit=None)  # open at window 0's end
        with caplog.at_level(logging.INFO, logger="airflow_eos.steps"):
            waiting = h.run(0)
        assert waiting.tries == [("plan", "raised NotReady")], waiting.tries
        assert f"is not closed yet: 1 partition(s) have no record at or after {p.window(0).end.isoformat()}" \
               in caplog.text and f"{topic}[0]" in caplog.text and f"{topic}[1]" not in caplog.text, caplog.text
        assert chaos.attempt_states(p, 0) == []
        with psycopg.connect(p.url) as conn:  # nothing frozen while it waits
            assert conn.execute("SELECT count(*) FROM eos.windows WHERE pipeline = %s", (p.name,)).fetchone() == (0,)
        other.commit_transaction(15)
        transaction(writer, topic, [(100 + i, n) for i, n in enumerate(aborted[10:])], commit=False)
        transaction(writer, topic, [(m, m) for m in range(80, 125, 3)], commit=True)  # 122: closes window 1
    finally:
        del writer, other  # freed now: no client of this test outlives its broker
    assert h.run_until_committed([0, 1]) == 1
    tally.add(check(h, (0, 1)))

    truth = assert_lineage(p)
    committed = {*range(0, 20), *range(30, 50), 55, 70, *range(80, 121, 3)} | {2000 + m for m in range(0, 120, 5)}
    assert sorted(n for n in map(order_id, truth.values()) if n is not None) == sorted(
        n for n in committed if record_value(n).startswith(b"{\"")), "the windows' records are the committed ones"
    ids = published_ids(p)
    assert not set(ids) & set(aborted), "an aborted record was published"
    assert set(ids) <= committed and len(ids) == len(set(ids))
    window0 = {k[3]: order_id(v) for k, v in truth.items() if k[0] == p.window(0).start and k[2] == 0}
    assert max(window0) - min(window0) + 1 > len(window0)  # aborted records and markers: gaps in the range
    assert {n for n in window0.values() if n is not None} == {n for n in (*range(0, 20), *range(30, 50), 55)
                                                              if record_value(n).startswith(b"{\"")}


@pytest.mark.parametrize("ending", ["commit", "abort"])
def test_a_transaction_open_past_the_grace_holds_its_window_until_it_ends_then_the_window_commits_once(
        make_pipeline, kafka, tmp_path, tally, ending):
    """Partition 0 is written by transactional producers; a transaction (orders
    30, 50, 70 at offsets 21-23; order 70 stamped in window 1) is still open
    when window 0 is planned, long past ``idle_partition_grace``: the cut is
    frozen at the end of the log (24), past its records, where a read_committed
    reader cannot read yet. The stage fails with TransactionOpen naming the
    partition, the last stable offset (21), the broker's timeout and the
    command that ends it, not with "no answer from Kafka": its attempt is
    aborted and nothing is published; a rerun fails the same way. The
    transaction then commits (or aborts): the next run commits window 0 once,
    with the transaction's records, also the one stamped in window 1 (the
    window of their offsets), or without them (their offsets gaps in its
    range); verify clean."""
    topic = f"txn-open-{uuid.uuid4().hex[:8]}"
    chaos.create_topic(kafka.address, topic, 2)
    p = on_topic(make_pipeline(f"txn_open_{ending}"), topic)  # the default grace: window 0 ended long ago
    h = Harness(p, tmp_path)
    chaos.produce(kafka.address, topic, [(1, ms(m), record_value(2000 + m)) for m in range(0, 130, 5)])
    writer, other = transactional_producer(kafka), transactional_producer(kafka)
    try:
        transaction(writer, topic, [(m, m) for m in range(0, 20)], commit=True)  # offsets 0-19, its marker 20
        assert settled(kafka, topic) == 21
        transaction(other, topic, [(30, 30), (50, 50), (70, 70)], commit=None)  # offsets 21-23, open
        plan = chaos.plan_step(p, p.window(0))
        held_range = plan["ranges"][0]
        assert (held_range["partition"], held_range["start_offset"], held_range["end_offset"]) == (0, 0, 24), plan

        with pytest.raises(TransactionOpen) as held:
            chaos.stage_step(p, plan)
        message = str(held.value)
        assert f"the last stable offset of {topic}[0] is held at 21 by a producer transaction still open" in message
        assert "below 24, where the planned range ends (the log ends at 24)" in message, message
        assert "transaction.timeout.ms" in message and "The brokers answer" in message, message
        assert f"abort --topic {topic} --partition 0 --start-offset 21" in message, message
        assert "no answer from Kafka" not in message, message
        assert chaos.attempt_states(p, 0) == [(1, "aborted")]
        rerun = h.run(0)
        assert rerun.tries == [("plan", "ok"), ("stage", "raised TransactionOpen"), ("abort", "ok")], rerun.tries
        assert chaos.attempt_states(p, 0) == [(1, "aborted"), (2, "aborted")]
        assert published_ids(p) == [], "published while the transaction was open"

        if ending == "commit":
            other.commit_transaction(15)
        else:
            other.abort_transaction(15)
        transaction(writer, topic, [(125, 125)], commit=True)  # closes window 1
    finally:
        del writer, other  # freed now: no client of this test outlives its broker
    assert h.run_until_committed([0, 1]) == 1
    tally.add(check(h, (0, 1)))

    truth = assert_lineage(p)
    window0 = sorted(k[3] for k in truth if k[0] == p.window(0).start and k[2] == 0)
    transaction_offsets = [21, 22, 23] if ending == "commit" else []  # orders 30, 50 and 70 (malformed: a dead letter)
    assert window0 == [*range(0, 20), *transaction_offsets], window0  # 20: the first transaction's marker
    assert ({30, 50} <= set(published_ids(p))) == (ending == "commit")


# --------------------------------------------------------------------------- a compacted source


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


def test_a_compacted_source_windows_tile_the_log_and_publish_each_surviving_record_once(
        make_pipeline, kafka, tmp_path, tally):
    """Three hours of orders on 2 partitions, every other one under one of 4
    keys per partition (superseded by the next of its key), the rest under
    keys of their own; the log cleaner removes the superseded records (holes
    in the offsets) before the windows are planned. Windows 0-2 tile each
    partition's log; each surviving record is published (or a dead letter)
    once, in the window of its timestamp; no removed record is; verify clean."""
    topic = f"compacted-{uuid.uuid4().hex[:8]}"
    create_topic(kafka, topic, 2, cleanup_policy="compact", segment_ms="100", min_cleanable_dirty_ratio="0.01",
                 min_compaction_lag_ms="0", delete_retention_ms="100")
    p = on_topic(make_pipeline("compacted_source"), topic)
    h = Harness(p, tmp_path)
    orders = [(i % 2, (f"k{i // 2 % 8}" if i // 2 % 2 else f"u{i}").encode(), i * 1.5, i) for i in range(120)]
    closers = [(partition, f"close{partition}".encode(), 185 + partition, 500 + partition) for partition in (0, 1)]
    produce_keyed(kafka, topic, [orders[i:i + 10] for i in range(0, 120, 10)] + [closers])
    # What compaction leaves: per partition, the last record of each shared key and every record of a key of its own.
    offset = {i: i // 2 for i in range(120)}
    last = {(o[0], o[1]): i for i, o in enumerate(orders)}
    survivors = {(o[0], offset[i]) for i, o in enumerate(orders) if last[o[0], o[1]] == i}
    survivors |= {(partition, 60) for partition in (0, 1)}
    deadline = time.monotonic() + 90
    while read_offsets(kafka, topic, 2) != survivors:
        assert time.monotonic() < deadline, "the log cleaner did not compact the topic within 90 s"
        time.sleep(1)

    assert h.run_until_committed([0, 1, 2]) == 1
    tally.add(check(h, (0, 1, 2)))

    truth = assert_lineage(p)
    assert {(k[2], k[3]) for k in truth} == survivors - {(0, 60), (1, 60)}  # each survivor in a window; closers next
    for (ws, _, _, _), value in truth.items():
        n = order_id(value)
        assert n is None or ws == T0 + int(n * 1.5 // 60) * HOUR, (ws, n)  # in the window of its timestamp
    with psycopg.connect(p.url) as conn:
        ranges = conn.execute("SELECT partition, start_offset, end_offset FROM eos.window_ranges WHERE pipeline = %s"
                              " ORDER BY partition, window_start", (p.name,)).fetchall()
    for partition in (0, 1):
        cuts = [(s, e) for q, s, e in ranges if q == partition]
        assert cuts[0][0] == 0 and cuts[-1][1] == 60 and all(a[1] == b[0] for a, b in zip(cuts, cuts[1:])), cuts
    removed = {i for i, o in enumerate(orders) if (o[0], offset[i]) not in survivors}
    assert removed and not set(published_ids(p)) & removed, "a record compaction removed was published"


# --------------------------------------------------------------------------- retention


def test_retention_deleting_a_planned_range_before_its_stage_is_terminal_and_publishes_nothing(
        make_pipeline, kafka, tmp_path, tally):
    """Window 0 is planned; then Kafka's size retention (``retention.bytes``:
    every segment but the active one) deletes its records before its stage.
    The stage fails with OffsetsExpired naming the partition and the offsets
    it cannot read: its attempt is aborted (nothing staged, checkpointed or
    published), the window stays planned, and the task fails without retries
    (a terminal error); a clear fails at the plan with the same error. The next
    window, whose records retention kept, is published as usual, and verify is
    clean: it audits committed windows only, so the expired window is not
    reported as missing records; the pipeline's offsets stay at the expired
    window's start (the committed prefix ends there)."""
    from airflow.exceptions import AirflowFailException

    from airflow_eos.hooks.eos import failing_terminally

    topic = f"retention-{uuid.uuid4().hex[:8]}"
    create_topic(kafka, topic, 1, segment_ms="100")
    p = on_topic(make_pipeline("retention"), topic)
    h = Harness(p, tmp_path)
    # Window 0's 12 records in one segment, window 1's and a record closing it in the next (the active one).
    chaos.produce(kafka.address, topic, [(0, ms(5 * i), record_value(i)) for i in range(12)])
    chaos.produce(kafka.address, topic, [(0, ms(60 + 5 * i), record_value(12 + i)) for i in range(13)])
    plan = chaos.plan_step(p, p.window(0))
    assert [(r["start_offset"], r["end_offset"]) for r in plan["ranges"]] == [(0, 12)], plan

    alter_topic(kafka, topic, retention_bytes="1")
    deadline = time.monotonic() + 60
    while log_start(kafka, topic) < 12:
        assert time.monotonic() < deadline, "retention deleted nothing within 60 s"
        time.sleep(0.5)
    alter_topic(kafka, topic, retention_bytes="-1")
    assert log_start(kafka, topic) == 12, "retention was to delete window 0's segment only"

    with pytest.raises(AirflowFailException) as failed, failing_terminally():  # as the stage task runs it
        chaos.stage_step(p, plan)
    expired = failed.value.__cause__
    assert isinstance(expired, OffsetsExpired) and expired.terminal, repr(expired)
    assert f"{topic}[0]" in str(expired) and "retention deleted planned records [0, 12)" in str(expired), expired
    assert chaos.attempt_states(p, 0) == [(1, "aborted")]
    cleared = h.run(0)
    assert cleared.tries == [("plan", "raised OffsetsExpired")], cleared.tries
    assert h.run(1).state == "success"

    tally.add(check(h, (1,)))
    assert_lineage(p)
    report = verify(p.ledger, dict(p.kafka_config), p.target, p.name)
    assert [(w.state, w.published_rows, w.dead_letters, w.kafka_records) for w in report.windows] == [
        ("planned", 0, 0, None), ("committed", 11, 1, 12)]  # order 18 is malformed: a dead letter
    assert report.offsets == report.expected_offsets and list(report.offsets.values()) in ([], [0])
    with psycopg.connect(p.url) as conn:
        assert conn.execute(f"SELECT count(*) FROM {p.table} WHERE eos_window_start = %s",
                            (p.window(0).start,)).fetchone() == (0,)
        assert conn.execute("SELECT state FROM eos.windows WHERE pipeline = %s AND window_start = %s",
                            (p.name, p.window(0).start)).fetchone() == ("planned",)


def test_a_source_compacted_after_its_windows_committed_still_verifies_clean(make_pipeline, kafka, tmp_path, tally):
    """The cleaner removes records of windows already committed (the topic
    becomes compacted after the commits, as any compacted topic's cleaner does
    to records published before it ran): verify stays clean, since a row whose
    record compaction removed from its own window's range was a record when
    the window was read. It still finds a row published twice."""
    topic = f"compacted-late-{uuid.uuid4().hex[:8]}"
    create_topic(kafka, topic, 1, segment_ms="100", min_cleanable_dirty_ratio="0.01", min_compaction_lag_ms="0",
                 delete_retention_ms="100")
    p = on_topic(make_pipeline("compacted_late"), topic)
    h = Harness(p, tmp_path)
    orders = [(0, f"k{i % 3}".encode(), i * 3, i) for i in range(40)]  # 2 hours, 3 keys
    produce_keyed(kafka, topic, [orders[i:i + 5] for i in range(0, 40, 5)] + [[(0, b"close", 125, 900)]])
    assert h.run_until_committed([0, 1]) == 1
    tally.add(check(h, (0, 1)))

    alter_topic(kafka, topic, cleanup_policy="compact")
    deadline = time.monotonic() + 90
    while read_offsets(kafka, topic, 1) != {(0, 37), (0, 38), (0, 39), (0, 40)}:  # each key's last, the closer
        assert time.monotonic() < deadline, "the log cleaner did not compact the topic within 90 s"
        time.sleep(1)
    report = verify(p.ledger, dict(p.kafka_config), p.target, p.name)
    assert report.clean, str(report)
    assert report.committed_windows == 2 and report.totals.kafka_records == 3
    assert (report.totals.published_rows, report.totals.dead_letters) == (37, 3)  # orders 5, 18 and 31 malformed

    with psycopg.connect(p.url, autocommit=True) as conn:  # a row published twice, its record compacted away
        conn.execute(f"INSERT INTO {p.table} SELECT * FROM {p.table} WHERE eos_offset = 7")
    twice = verify(p.ledger, dict(p.kafka_config), p.target, p.name)
    assert [v.kind for v in twice.violations if v.offset == 7] == ["duplicate"], str(twice)
    assert twice.totals.duplicates == 1, str(twice)


def test_verify_after_retention_deleted_a_committed_windows_records_is_clean_and_names_it(
        make_pipeline, kafka, tmp_path, tally):
    """Windows 0 and 1 commit; then Kafka's size retention deletes window 0's
    segment (as the default 7-day retention does to every window in time).
    verify is clean (a pipeline on such a topic verifies clean again) and names
    window 0 as no longer checkable against the source, with the deleted
    offsets; its rows are still checked: published twice there, a row is a
    duplicate. A row published twice in window 1, still in the log, is one too."""
    topic = f"retained-{uuid.uuid4().hex[:8]}"
    create_topic(kafka, topic, 1, segment_ms="100")
    p = on_topic(make_pipeline("retained"), topic)
    h = Harness(p, tmp_path)
    # Window 0's 12 records in one segment, window 1's and a record closing it in the next (the active one).
    chaos.produce(kafka.address, topic, [(0, ms(5 * i), record_value(i)) for i in range(12)])
    chaos.produce(kafka.address, topic, [(0, ms(60 + 5 * i), record_value(12 + i)) for i in range(13)])
    assert h.run_until_committed([0, 1]) == 1
    tally.add(check(h, (0, 1)))

    alter_topic(kafka, topic, retention_bytes="1")
    deadline = time.monotonic() + 60
    while log_start(kafka, topic) < 12:
        assert time.monotonic() < deadline, "retention deleted nothing within 60 s"
        time.sleep(0.5)
    alter_topic(kafka, topic, retention_bytes="-1")
    assert log_start(kafka, topic) == 12, "retention was to delete window 0's segment only"

    report = verify(p.ledger, dict(p.kafka_config), p.target, p.name)
    assert report.clean, str(report)
    assert [(x.window_start, str(x.tp), x.start_offset, x.end_offset) for x in report.not_checkable] == [
        (p.window(0).start, f"{topic}[0]", 0, 12)]
    assert f"no longer checkable against the source: retention deleted offsets [0, 12) of {topic}[0]" in str(report)
    assert [(w.state, w.published_rows, w.dead_letters, w.kafka_records) for w in report.windows] == [
        ("committed", 11, 1, None), ("committed", 11, 1, 12)]  # orders 5 and 18 are malformed: dead letters
    as_json = report.to_dict()
    assert [w["result"] for w in as_json["windows"]] == ["source_expired", "ok"] and as_json["clean"]
    assert as_json["not_checkable"][0]["start_offset"] == 0 and as_json["not_checkable"][0]["end_offset"] == 12
    printed = io.StringIO()
    print_report(report, printed)  # what `airflow-eos verify` prints (exit code 0: clean)
    assert "NO LONGER CHECKABLE AGAINST THE SOURCE: 1 committed window(s)" in printed.getvalue(), printed.getvalue()
    assert "ok, source expired" in printed.getvalue() and "CLEAN:" in printed.getvalue(), printed.getvalue()

    with psycopg.connect(p.url, autocommit=True) as conn:  # one row twice in each window: in the log and not
        conn.execute(f"INSERT INTO {p.table} SELECT * FROM {p.table} WHERE eos_offset IN (3, 15)")
    twice = verify(p.ledger, dict(p.kafka_config), p.target, p.name)
    assert sorted((v.kind, v.offset) for v in twice.violations if v.kind == "duplicate") == [
        ("duplicate", 3), ("duplicate", 15)], str(twice)
    assert twice.totals.duplicates == 2 and not twice.clean, str(twice)
