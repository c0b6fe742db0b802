"""Whole windows over a topic written by transactional producers (issue 34, item 3):
aborted transactions, and one open at the window's end.

Each window runs through the production steps as the fault suite drives them and
ends in ``check`` and a lineage check: see harness/real_kafka.py.
"""

from __future__ import annotations

import dataclasses
import logging
import time
import uuid
from datetime import timedelta

import psycopg
import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient
from harness import chaos
from harness.chaos import Harness, check, record_value
from harness.real_kafka import assert_lineage, ms, on_topic, order_id, published_ids

from airflow_eos.core.errors import TransactionOpen
from airflow_eos.core.kafka_client import client_logging, list_offsets

# The suite's windows ended long ago: a grace longer than that keeps a window
# waiting for a partition that has not passed its end, as a window just ended.
WAITING_GRACE = timedelta(days=36_500)


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
    admin = AdminClient({**client_logging(), "bootstrap.servers": kafka.address})
    deadline = time.monotonic() + 30
    while True:
        stable, end = (offset for committed in (True, False)
                       for _, offset in list_offsets(admin, [(topic, partition)], committed=committed, timeout=15))
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
    # While the transaction holds the window, each stage waits poll_timeout_s with its COPY into the
    # staging open, and an open COPY holds every DROP DATABASE on the server (PostgreSQL waits for all
    # sessions to absorb its barrier): other workers' tests would wait for it. Held, it waits 3 s.
    held = dataclasses.replace(p, poll_timeout_s=3.0)
    chaos.produce(kafka.address, topic, [(1, ms(m), record_value(2000 + m)) for m in range(0, 130, 5)])
    writer, other = transactional_producer(kafka), transactional_producer(kafka)
    try:
        transaction(writer, topic, [(m, m) for m in range(0, 20)], commit=True)  # offsets 0-19, its marker 20
        assert settled(kafka, topic) == 21
        transaction(other, topic, [(30, 30), (50, 50), (70, 70)], commit=None)  # offsets 21-23, open
        plan = chaos.plan_step(p, p.window(0))
        held_range = plan["ranges"][0]
        assert (held_range["partition"], held_range["start_offset"], held_range["end_offset"]) == (0, 0, 24), plan

        with pytest.raises(TransactionOpen) as held_by:
            chaos.stage_step(held, plan)
        message = str(held_by.value)
        assert f"the last stable offset of {topic}[0] is held at 21 by a producer transaction still open" in message
        assert "below 24, where the planned range ends (the log ends at 24)" in message, message
        assert "transaction.timeout.ms" in message and "The brokers answer" in message, message
        assert f"abort --topic {topic} --partition 0 --start-offset 21" in message, message
        assert "no answer from Kafka" not in message, message
        assert chaos.attempt_states(p, 0) == [(1, "aborted")]
        rerun = Harness(held, tmp_path / "held").run(0)
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
