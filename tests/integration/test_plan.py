"""Planning windows against the real PostgreSQL ledger and the real broker."""

from __future__ import annotations

import re
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta, timezone

import psycopg
import pytest
from confluent_kafka import Consumer, TopicPartition as KTP
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from airflow_eos.core.errors import (
    LedgerUnavailable,
    LogTruncated,
    OffsetsExpired,
    SkewedTimestamp,
    OwnershipConflict,
    SourceUnavailable,
    UnknownTopic,
    WindowConflict,
    WindowNotClosed,
)
from airflow_eos.core.ledger import Ledger
from airflow_eos.core.plan import PlanRequest, plan_window
from airflow_eos.targets.postgres.target import PostgresTarget
from airflow_eos.core.kafka_client import client_logging
from airflow_eos.core.source import PROBE_FETCH_BYTES, KafkaLog
from airflow_eos.core.windows import Window, to_millis
from airflow_eos.embedded import free_port
from harness.topics import create_topic, delete_topic
from memlog import MemoryLog

T0 = datetime(2026, 1, 1, tzinfo=timezone.utc)
HOUR = timedelta(hours=1)
MINUTE = timedelta(minutes=1)
LATER = lambda: T0 + timedelta(days=30)  # noqa: E731 - "now" long after the data: every partition idle


def ms(t: datetime) -> int:
    return to_millis(t)


def plan(ledger, kafka_config, pipeline, start, end, topics, *, grace=timedelta(minutes=5), now=LATER, **fields):
    """``fields``: more PlanRequest fields (max_timestamp_skew, on_skewed_timestamp; the claim's dag_id,
    target_id, target_exclusive)."""
    with KafkaLog(kafka_config) as log:
        return plan_window(ledger, log, PlanRequest(Window(pipeline, start, end), tuple(topics), grace, **fields),
                           now=now)


def read_all(bootstrap, topic, partitions):
    """Every record of the topic, read directly: (partition, offset) -> timestamp_ms."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "verify", "enable.partition.eof": True,
                  "enable.auto.commit": False, "fetch.wait.max.ms": 10})
    out = {}
    try:
        for p in range(partitions):
            c.assign([KTP(topic, p, 0)])
            while True:
                m = c.poll(5)
                assert m is not None, "broker stopped answering"
                if m.error():
                    break  # partition EOF
                out[p, m.offset()] = m.timestamp()[1]
    finally:
        c.close()
    return out


# --------------------------------------------------------------------------- tiling, property-based


@pytest.fixture(scope="module")
def shared_db(pg_server):
    """One database for the property test's examples (each uses its own pipeline)."""
    name = f"eos_tiling_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(pg_server.address, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    url = pg_server.address.rpartition("/")[0] + "/" + name
    ledger = Ledger(url)
    ledger.migrate()
    yield ledger
    with psycopg.connect(pg_server.address, autocommit=True) as admin:
        admin.execute(f'DROP DATABASE "{name}" WITH (FORCE)')


@pytest.fixture(scope="module")
def ten_hour_topic(kafka):
    """3 partitions over 10 hours: p0 dense, p1 sparse with offset gaps from
    transactions, p2 empty. Timestamps grow with offsets."""
    from confluent_kafka import Producer

    name = f"tiling-{uuid.uuid4().hex[:8]}"
    create_topic(kafka.address, name, 3)
    dense = Producer({"bootstrap.servers": kafka.address, "linger.ms": 5})
    for i in range(3000):  # one record every 12 s
        dense.produce(name, value=b"d%d" % i, partition=0, timestamp=ms(T0) + i * 12_000)
    dense.flush(30)
    tx = Producer({"bootstrap.servers": kafka.address, "transactional.id": f"tx-{name}", "linger.ms": 5})
    tx.init_transactions(15)
    for batch in range(40):  # each commit leaves a marker: offsets with gaps
        tx.begin_transaction()
        for i in range(5):
            tx.produce(name, value=b"s", partition=1, timestamp=ms(T0) + (batch * 5 + i) * 180_000)
        tx.commit_transaction(15)
    # Destroyed now, not at the end of the module: a client left alive logs raw
    # librdkafka lines to stderr when the broker closes its idle connections,
    # into whichever test runs then (test_unreachable_broker_is_a_clear_error).
    del dense, tx
    records = read_all(kafka.address, name, 3)
    yield name, records
    delete_topic(kafka.address, name)


boundaries = st.lists(st.integers(0, 11 * 60), min_size=2, max_size=7, unique=True).map(sorted)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(minutes=boundaries, data=st.data())
def test_windows_tile_the_log_whatever_the_planning_order(shared_db, kafka_config, ten_hour_topic, minutes, data):
    topic, records = ten_hour_topic
    pipeline = f"tiling-{uuid.uuid4().hex[:8]}"
    instants = [T0 + m * MINUTE for m in minutes]
    windows = list(zip(instants, instants[1:]))
    order = data.draw(st.permutations(windows))

    with ThreadPoolExecutor(4) as pool:  # neighbours planned concurrently, in random order
        plans = list(pool.map(lambda w: plan(shared_db, kafka_config, pipeline, w[0], w[1], [topic]), order))

    by_start = {p.window.start: p for p in plans}
    for partition in range(3):
        ranges = [next(r for r in by_start[s].ranges if r.partition == partition) for s, _ in windows]
        for a, b in zip(ranges, ranges[1:]):
            assert a.end_offset == b.start_offset, f"gap or overlap in partition {partition}: {a} then {b}"
        # each record lands in the window its timestamp says (timestamps grow with offsets here)
        for (start, end), r in zip(windows, ranges):
            inside = [ts for (p, off), ts in records.items() if p == partition and r.start_offset <= off < r.end_offset]
            assert all(ms(start) <= ts < ms(end) for ts in inside), (start, end, r)
        first = ranges[0].start_offset
        expected_first = min((off for (p, off), ts in records.items() if p == partition and ts >= ms(windows[0][0])),
                             default=None)
        if expected_first is not None:
            assert first == expected_first
    # re-planning any window returns the frozen plan
    again = plan(shared_db, kafka_config, pipeline, windows[0][0], windows[0][1], [topic])
    assert again == by_start[windows[0][0]]


# --------------------------------------------------------------------------- freezing


def leases_at_once(monkeypatch) -> list[int]:
    """[the most consumers of the pool leased at the same time], from now on."""
    from contextlib import contextmanager

    from airflow_eos.core.consumer_pool import CONSUMERS

    leased, most, lock, lease = [0], [0], threading.Lock(), CONSUMERS.lease

    @contextmanager
    def counted(config, purpose):
        with lease(config, purpose) as pooled:
            with lock:
                leased[0] += 1
                most[0] = max(most[0], leased[0])
            try:
                yield pooled
            finally:
                with lock:
                    leased[0] -= 1

    monkeypatch.setattr(CONSUMERS, "lease", counted)
    return most


def test_many_partitions_read_side_by_side_plan_exactly_what_one_reader_plans(ledger, kafka_config, topics, kafka,
                                                                               monkeypatch):
    """The plan reads partitions in parallel (KafkaLog.parallel_reads consumers):
    every cut must be what reading them one at a time finds, and what the records say."""
    n = 40
    topic = topics.create(partitions=n)
    # Partition p: 30 records a minute apart, shifted by p seconds (every cut differs).
    topics.produce(topic, [(p, ms(T0) + i * 60_000 + p * 1_000, b"x") for p in range(n) for i in range(30)])
    records = read_all(kafka.address, topic, n)
    start, end = T0 + 10 * MINUTE + 20 * timedelta(seconds=1), T0 + 20 * MINUTE
    request = lambda pipeline: PlanRequest(Window(pipeline, start, end), (topic,), timedelta(minutes=5))  # noqa: E731

    at_once = leases_at_once(monkeypatch)
    with KafkaLog(kafka_config) as log:
        side_by_side = plan_window(ledger, log, request("wide-parallel"), now=LATER)
    assert 1 < at_once[0] <= KafkaLog.parallel_reads, "the partitions were not read side by side"
    at_once[0] = 0
    with KafkaLog(kafka_config) as log:
        log.parallel_reads = 1
        one_at_a_time = plan_window(ledger, log, request("wide-serial"), now=LATER)
    assert at_once[0] == 1

    def cut(p, t):
        return min(off for (q, off), ts in records.items() if q == p and ts >= ms(t))

    expected = [(p, cut(p, start), cut(p, end)) for p in range(n)]
    assert [(r.partition, r.start_offset, r.end_offset) for r in side_by_side.ranges] == expected
    assert [(r.partition, r.start_offset, r.end_offset) for r in one_at_a_time.ranges] == expected




def test_replanning_returns_the_frozen_plan_and_late_records_go_to_the_next_window(ledger, kafka_config, topics):
    topic = topics.create(partitions=2)
    topics.produce(topic, [(p, ms(T0) + i * 60_000, b"x") for p in range(2) for i in range(130)])
    first = plan(ledger, kafka_config, "late", T0, T0 + HOUR, [topic])
    assert [(r.start_offset, r.end_offset) for r in first.ranges] == [(0, 60), (0, 60)]

    # late records with old timestamps arrive after the cut was frozen
    topics.produce(topic, [(0, ms(T0) + 5_000, b"late")] * 3)
    assert plan(ledger, kafka_config, "late", T0, T0 + HOUR, [topic]) == first
    nxt = plan(ledger, kafka_config, "late", T0 + HOUR, T0 + 2 * HOUR, [topic])
    # the next window starts at the shared cut and, when its end is resolved, ends
    # at the first record >= its end; the late records sit after that
    assert [r.start_offset for r in nxt.ranges] == [60, 60]
    assert [r.end_offset for r in nxt.ranges] == [120, 120]


def test_records_bigger_than_a_probe_fetch_are_planned_exactly(ledger, kafka_config, topics, monkeypatch):
    """Planning fetches at most PROBE_FETCH_BYTES per probe; a bigger record still
    arrives whole, by a probe and by the final scan, also when the connection
    raises message.max.bytes for large records."""
    monkeypatch.setattr("airflow_eos.core.cut_search.SCAN_BELOW", 4)  # probe, don't just scan 20 records
    topic = topics.create(partitions=1)
    big = b"x" * (3 * PROBE_FETCH_BYTES)
    topics.produce(topic, [(0, ms(T0) + i * 10 * 60_000, big) for i in range(20)])  # one every 10 minutes
    for pipeline, config in (("big", kafka_config), ("big-raised", {**kafka_config, "message.max.bytes": 10_000_000})):
        got = plan(ledger, config, pipeline, T0 + HOUR, T0 + 2 * HOUR, [topic])
        assert [(r.start_offset, r.end_offset) for r in got.ranges] == [(6, 12)], pipeline


def test_concurrent_planners_of_one_window_agree(ledger, kafka_config, topics):
    topic = topics.create(partitions=3)
    topics.produce(topic, [(p, ms(T0) + i * 30_000, b"x") for p in range(3) for i in range(300)])
    barrier = threading.Barrier(6)

    def one(_):
        barrier.wait()
        return plan(ledger, kafka_config, "race", T0 + HOUR, T0 + 2 * HOUR, [topic])

    with ThreadPoolExecutor(6) as pool:
        plans = list(pool.map(one, range(6)))
    assert all(p == plans[0] for p in plans)
    assert [(r.start_offset, r.end_offset) for r in plans[0].ranges] == [(120, 240)] * 3
    with psycopg.connect(ledger.url) as conn:
        assert conn.execute("SELECT count(*) FROM eos.windows").fetchone()[0] == 1
        assert conn.execute("SELECT count(*) FROM eos.cuts").fetchone()[0] == 6


# --------------------------------------------------------------------------- closing


def test_window_waits_for_a_partition_that_has_not_passed_its_end(ledger, kafka_config, topics):
    topic = topics.create(partitions=2)
    topics.produce(topic, [(0, ms(T0) + i * 60_000, b"x") for i in range(90)])  # p0 passes T0+1h
    topics.produce(topic, [(1, ms(T0) + i * 60_000, b"x") for i in range(30)])  # p1 stops at T0+30m
    end = T0 + HOUR
    with pytest.raises(WindowNotClosed, match=r"\[1\]") as caught:
        plan(ledger, kafka_config, "idle", T0, end, [topic], grace=timedelta(minutes=10),
             now=lambda: end + timedelta(minutes=9))
    assert caught.value.waiting_for == [(topic, 1)]
    with psycopg.connect(ledger.url) as conn:  # waiting freezes nothing
        assert conn.execute("SELECT count(*) FROM eos.cuts").fetchone()[0] == 0

    # idle past the grace: p1's cut is frozen at the end of its log
    closed = plan(ledger, kafka_config, "idle", T0, end, [topic], grace=timedelta(minutes=10),
                  now=lambda: end + timedelta(minutes=10))
    assert [(r.start_offset, r.end_offset) for r in closed.ranges] == [(0, 60), (0, 30)]
    with psycopg.connect(ledger.url) as conn:
        hows = dict(conn.execute('SELECT partition, how FROM eos.cuts WHERE at = %s', (end,)).fetchall())
    assert hows == {0: "record", 1: "idle"}


def test_empty_partitions_and_empty_windows_plan_cleanly(ledger, kafka_config, topics):
    empty = topics.create(partitions=2)
    p = plan(ledger, kafka_config, "empty", T0, T0 + HOUR, [empty])
    assert [(r.start_offset, r.end_offset) for r in p.ranges] == [(0, 0), (0, 0)]
    assert p.max_records == 0

    sparse = topics.create(partitions=1)
    topics.produce(sparse, [(0, ms(T0) + 10_000, b"a"), (0, ms(T0 + 3 * HOUR), b"b")])
    quiet = plan(ledger, kafka_config, "quiet", T0 + HOUR, T0 + 2 * HOUR, [sparse])
    assert [(r.start_offset, r.end_offset) for r in quiet.ranges] == [(1, 1)]


def test_new_partition_records_are_not_lost(ledger):
    """A window planned before a partition existed does not hold it; the next
    window planned with it starts at its log start. (The log is in memory, the
    ledger real; the test below does the same on Kafka with create_partitions.)"""
    log = MemoryLog()
    log.add_partition("orders", 0, [ms(T0) + i * 60_000 for i in range(240)])
    req = lambda s, e: PlanRequest(Window("grow", s, e), ("orders",), timedelta(0))  # noqa: E731
    w1 = plan_window(ledger, log, req(T0, T0 + HOUR), now=LATER)
    assert [r.partition for r in w1.ranges] == [0]

    log.add_partition("orders", 1, [ms(T0) + i * 60_000 for i in range(240)])  # records from T0 on
    w3 = plan_window(ledger, log, req(T0 + 2 * HOUR, T0 + 3 * HOUR), now=LATER)
    w2 = plan_window(ledger, log, req(T0 + HOUR, T0 + 2 * HOUR), now=LATER)
    p1 = {w.window.start: next(r for r in w.ranges if r.partition == 1) for w in (w2, w3)}
    assert (p1[T0 + HOUR].start_offset, p1[T0 + HOUR].end_offset) == (0, 120)  # includes T0..T0+1h
    assert (p1[T0 + 2 * HOUR].start_offset, p1[T0 + 2 * HOUR].end_offset) == (120, 180)


def test_new_partition_on_real_kafka(ledger, kafka_config, topics):
    from confluent_kafka.admin import NewPartitions

    topic = topics.create(partitions=1)
    topics.produce(topic, [(0, ms(T0) + i * 60_000, b"x") for i in range(240)])
    w1 = plan(ledger, kafka_config, "grow", T0, T0 + HOUR, [topic], grace=timedelta(0))
    for f in topics.admin.create_partitions([NewPartitions(topic, 2)]).values():
        f.result(15)
    topics.produce(topic, [(1, ms(T0) + i * 60_000, b"y") for i in range(240)])
    w2 = plan(ledger, kafka_config, "grow", T0 + HOUR, T0 + 2 * HOUR, [topic], grace=timedelta(0))
    assert [r.partition for r in w1.ranges] == [0]
    assert [(r.partition, r.start_offset, r.end_offset) for r in w2.ranges] == [(0, 60, 120), (1, 0, 120)]


# --------------------------------------------------------------------------- skewed timestamps (issue 16)

Y2030 = ms(datetime(2030, 1, 1, tzinfo=timezone.utc))


def produce_issue_16(topics):
    """Two partitions, a record every 6 minutes for 5 hours; in partition 1 one
    record stamped 2030-01-01 after the 10th (offset 10). The old planner froze
    partition 1's cuts at offset 10 from window 2 on: [10, 10) window after
    window, the records behind it never published."""
    topic = topics.create(partitions=2)
    sane = [ms(T0) + i * 360_000 for i in range(50)]
    topics.produce(topic, [(0, ts, b"x") for ts in sane])
    topics.produce(topic, [(1, ts, b"x") for ts in sane[:10] + [Y2030] + sane[10:]])
    return topic


def test_a_far_future_record_fails_planning_loudly_and_freezes_nothing(ledger, kafka_config, topics):
    topic = produce_issue_16(topics)
    first = plan(ledger, kafka_config, "skew", T0, T0 + HOUR, [topic])
    assert [(r.start_offset, r.end_offset) for r in first.ranges] == [(0, 10), (0, 10)]
    with pytest.raises(SkewedTimestamp) as caught:
        plan(ledger, kafka_config, "skew", T0 + HOUR, T0 + 2 * HOUR, [topic])
    text = str(caught.value)
    assert text.startswith(f"window skew [{(T0 + HOUR).isoformat()}, {(T0 + 2 * HOUR).isoformat()}): ")
    assert f"{topic}[1] offset 10 is stamped 2030-01-01T00:00:00+00:00" in text
    assert "offset 11 after it is stamped 2026-01-01T01:00:00+00:00" in text
    assert "nothing was frozen" in text and 'on_skewed_timestamp="position"' in text
    with psycopg.connect(ledger.url) as conn:
        assert conn.execute("SELECT count(*) FROM eos.windows").fetchone()[0] == 1
        assert conn.execute("SELECT count(*) FROM eos.cuts WHERE at > %s", (T0 + HOUR,)).fetchone()[0] == 0


def test_a_far_future_record_is_published_in_the_window_of_its_position(ledger, kafka_config, topics):
    topic = produce_issue_16(topics)
    windows = [(T0 + i * HOUR, T0 + (i + 1) * HOUR) for i in range(4)]
    plans = {}
    for i in (2, 0, 1, 3):  # out of order: cuts resolved against frozen neighbours on either side
        plans[i] = plan(ledger, kafka_config, "pos", *windows[i], [topic], on_skewed_timestamp="position")
    p1 = [next(r for r in plans[i].ranges if r.partition == 1) for i in range(4)]
    assert [(r.start_offset, r.end_offset) for r in p1] == [(0, 10), (10, 21), (21, 31), (31, 41)]
    assert all(r.width > 0 for r in p1)
    assert all(a.end_offset == b.start_offset for a, b in zip(p1, p1[1:]))  # a tiling of [0, 41)
    assert sum(r.start_offset <= 10 < r.end_offset for r in p1) == 1  # the 2030 record in exactly one window
    p0 = [next(r for r in plans[i].ranges if r.partition == 0) for i in range(4)]
    assert [(r.start_offset, r.end_offset) for r in p0] == [(0, 10), (10, 20), (20, 30), (30, 40)]
    with psycopg.connect(ledger.url) as conn:
        assert conn.execute("SELECT how FROM eos.cuts WHERE partition = 1 AND at = %s",
                            (T0 + 2 * HOUR,)).fetchone() == ("skewed",)


# --------------------------------------------------------------------------- bad input


def test_unknown_topic_is_a_clear_error(ledger, kafka_config):
    with pytest.raises(UnknownTopic, match="no-such-topic"):
        plan(ledger, kafka_config, "p", T0, T0 + HOUR, ["no-such-topic"])


def test_unreachable_broker_is_a_clear_error(ledger, caplog, capfd):
    """One error naming the address and what to check; librdkafka's reconnect
    lines (~20 a second) are not let through, to the log nor to stderr."""
    address = f"127.0.0.1:{free_port()}"
    # librdkafka names the client "<client.id>#consumer-<n>" in each line it logs
    client_id = f"eos-unreachable-{uuid.uuid4().hex[:8]}"
    with pytest.raises(SourceUnavailable, match="did not answer") as caught:
        with KafkaLog({"bootstrap.servers": address, "client.id": client_id}, timeout=2) as log:
            plan_window(ledger, log, PlanRequest(Window("p", T0, T0 + HOUR), ("orders",)), now=LATER)
    assert f"Kafka at {address} did not answer for topic 'orders' within 2s" in str(caught.value)
    assert f"Connect to ipv4#{address} failed" in str(caught.value)  # the client's own reason
    assert f"check that bootstrap.servers ({address}) is right" in str(caught.value)
    librdkafka = [r for r in caplog.records if r.name == "airflow_eos.librdkafka"]
    assert 0 < len(librdkafka) < 10, [r.getMessage() for r in librdkafka]
    # Nothing of this client on stderr (a line of another test's client left
    # alive is that test's leak, not this client's).
    stderr = capfd.readouterr().err
    assert client_id not in stderr and address not in stderr, stderr


def test_unreachable_database_is_a_clear_error_without_the_password():
    ledger = Ledger(f"postgresql://eos:s3cret@127.0.0.1:{free_port()}/db", connect_timeout=2)
    with pytest.raises(LedgerUnavailable, match=r"eos:\*\*\*@127\.0\.0\.1") as caught:
        ledger.migrate()
    assert "s3cret" not in str(caught.value)


def test_expired_offsets_name_topic_partition_and_offsets(ledger):
    """Retention moved the log start past a frozen plan (simulated in memory;
    the test below does it on Kafka with delete_records)."""
    log = MemoryLog()
    log.add_partition("orders", 0, [ms(T0) + i * 60_000 for i in range(180)])
    req = PlanRequest(Window("old", T0 + HOUR, T0 + 2 * HOUR), ("orders",), timedelta(0))
    frozen = plan_window(ledger, log, req, now=LATER)
    assert [(r.start_offset, r.end_offset) for r in frozen.ranges] == [(60, 120)]
    log.log_start[frozen.ranges[0].tp] = 75
    with pytest.raises(OffsetsExpired, match=r"orders\[0\] must be read from offset 60 to 120.*starts at offset 75"):
        plan_window(ledger, log, req, now=LATER)


def test_expired_offsets_on_real_kafka(ledger, kafka_config, topics):
    topic = topics.create(partitions=1)
    topics.produce(topic, [(0, ms(T0) + i * 60_000, b"x") for i in range(180)])
    plan(ledger, kafka_config, "old", T0 + HOUR, T0 + 2 * HOUR, [topic])
    for f in topics.admin.delete_records([KTP(topic, 0, 75)]).values():
        f.result(15)
    with pytest.raises(OffsetsExpired, match=rf"{topic}\[0\] must be read from offset 60"):
        plan(ledger, kafka_config, "old", T0 + HOUR, T0 + 2 * HOUR, [topic])


def recreate(topics, topic):
    """Delete the topic and create it again, empty (one partition)."""
    delete_topic(topics.bootstrap, topic)
    create_topic(topics.bootstrap, topic, 1)


def test_recreated_topic_is_reported_as_truncated(ledger, kafka_config, topics, kafka):
    topic = topics.create(partitions=1)
    topics.produce(topic, [(0, ms(T0) + i * 60_000, b"x") for i in range(180)])
    plan(ledger, kafka_config, "gone", T0 + HOUR, T0 + 2 * HOUR, [topic])
    recreate(topics, topic)
    topics.produce(topic, [(0, ms(T0) + i * 60_000, b"x") for i in range(30)])
    with pytest.raises(LogTruncated, match=r"planned up to offset 120, but the log ends at 30"):
        plan(ledger, kafka_config, "gone", T0 + HOUR, T0 + 2 * HOUR, [topic])


def test_a_window_planned_after_the_topic_lost_its_records_is_truncated_not_empty(ledger, kafka_config, topics):
    """Regression (chaos: the broker restarted empty): the next window, never
    planned, would freeze an empty range at the previous window's cut and
    commit nothing, though the records it should hold are gone. It must fail
    loudly, and freeze nothing."""
    topic = topics.create(partitions=1)
    topics.produce(topic, [(0, ms(T0) + i * 60_000, b"x") for i in range(180)])
    plan(ledger, kafka_config, "emptied", T0 + HOUR, T0 + 2 * HOUR, [topic])
    recreate(topics, topic)
    with pytest.raises(LogTruncated, match=r"planned up to offset 120, but the log ends at 0"):
        plan(ledger, kafka_config, "emptied", T0 + 2 * HOUR, T0 + 3 * HOUR, [topic])
    with ledger.connect() as conn:
        assert ledger.load_plan(conn, Window("emptied", T0 + 2 * HOUR, T0 + 3 * HOUR)) is None


def test_changed_boundaries_or_topics_conflict_with_frozen_windows(ledger, kafka_config, topics):
    a, b = topics.create(), topics.create()
    topics.produce(a, [(0, ms(T0) + i * 60_000, b"x") for i in range(200)])
    topics.produce(b, [(0, ms(T0) + i * 60_000, b"x") for i in range(200)])
    plan(ledger, kafka_config, "sched", T0, T0 + HOUR, [a])
    with pytest.raises(WindowConflict, match="planned before with end"):
        plan(ledger, kafka_config, "sched", T0, T0 + 2 * HOUR, [a])
    with pytest.raises(WindowConflict, match="overlaps"):
        plan(ledger, kafka_config, "sched", T0 + 30 * MINUTE, T0 + 90 * MINUTE, [a])
    # other topics under the pipeline id: refused by its claim (a frozen window
    # still refuses them after a release: test_release_lets_the_next_plan_...)
    with pytest.raises(OwnershipConflict, match="asks for other topics than its claim"):
        plan(ledger, kafka_config, "sched", T0, T0 + HOUR, [a, b])


# --------------------------------------------------------------------------- ownership


def claims(ledger):
    """pipeline -> (dag_id, topics, target, target_exclusive) as recorded."""
    with psycopg.connect(ledger.url) as conn:
        return {p: rest for p, *rest in conn.execute(
            "SELECT pipeline, dag_id, topics, target, target_exclusive FROM eos.pipelines WHERE topics IS NOT NULL")}


def windows_of(ledger, pipeline):
    with psycopg.connect(ledger.url) as conn:
        return conn.execute("SELECT window_start FROM eos.windows WHERE pipeline = %s ORDER BY 1",
                            (pipeline,)).fetchall()


def hourly_topic(topics, hours=3):
    topic = topics.create()
    topics.produce(topic, [(0, ms(T0) + i * 60_000, b"x") for i in range(hours * 60 + 1)])
    return topic


def test_two_dags_sharing_a_pipeline_id_the_second_is_refused_naming_both(ledger, kafka_config, topics):
    """A pipeline id copied into a second DAG (here with other topics): its first
    plan is refused, naming both DAGs, before anything of it is frozen; also when
    it plans a window the first DAG already froze (a Clear in the second DAG)."""
    a, b = hourly_topic(topics), hourly_topic(topics)
    first = plan(ledger, kafka_config, "orders", T0, T0 + HOUR, [a], dag_id="orders_a")
    assert claims(ledger) == {"orders": ["orders_a", [a], None, False]}

    for start, their_topics in ((T0 + HOUR, [b]), (T0, [b]), (T0 + HOUR, [a])):
        with pytest.raises(OwnershipConflict) as refused:
            plan(ledger, kafka_config, "orders", start, start + HOUR, their_topics, dag_id="orders_b")
        message = str(refused.value)
        assert message.startswith("two DAGs share pipeline id 'orders': DAG 'orders_a' (topics " + a), message
        assert f"DAG 'orders_b' (topics {their_topics[0]})" in message
        assert "Give each DAG its own pipeline id" in message and "airflow-eos release --pipeline orders" in message
    assert windows_of(ledger, "orders") == [(T0,)]  # nothing frozen for orders_b
    assert claims(ledger) == {"orders": ["orders_a", [a], None, False]}
    # the owner goes on, and so does the core API (no DAG named: it claims none)
    assert plan(ledger, kafka_config, "orders", T0, T0 + HOUR, [a], dag_id="orders_a") == first
    assert plan(ledger, kafka_config, "orders", T0, T0 + HOUR, [a]) == first
    plan(ledger, kafka_config, "orders", T0 + HOUR, T0 + 2 * HOUR, [a], dag_id="orders_a")


def test_a_pipelines_topics_and_target_are_fixed_by_its_first_plan(ledger, kafka_config, topics):
    a, b = hourly_topic(topics), hourly_topic(topics)
    orders = PostgresTarget(table="analytics.orders")
    plan(ledger, kafka_config, "p", T0, T0 + HOUR, [a], dag_id="d", target_id=orders.target_id)
    both = ", ".join(sorted([a, b]))
    with pytest.raises(OwnershipConflict, match=rf"pipeline 'p' \(DAG 'd'; topics {both}; .*asks for other "
                                                rf"topics than its claim: pipeline 'p' \(DAG 'd'; topics {a};"):
        plan(ledger, kafka_config, "p", T0 + HOUR, T0 + 2 * HOUR, [a, b], dag_id="d", target_id=orders.target_id)
    with pytest.raises(OwnershipConflict, match="publishes into another target than its claim: .*target "
                                                "postgresql:analytics.orders"):
        plan(ledger, kafka_config, "p", T0 + HOUR, T0 + 2 * HOUR, [a], dag_id="d",
             target_id=PostgresTarget(table="analytics.orders_v2").target_id)
    assert windows_of(ledger, "p") == [(T0,)]
    # the same table, spelt otherwise, is the same target
    plan(ledger, kafka_config, "p", T0 + HOUR, T0 + 2 * HOUR, [a], dag_id="d",
         target_id=PostgresTarget(table='"analytics".ORDERS').target_id)


def test_a_second_pipeline_sending_the_same_topic_into_a_target_is_refused_naming_both(
        ledger, kafka_config, topics):
    """Without a lineage index the target would take every record twice, and
    each pipeline's verify, seeing only its own rows, would say CLEAN."""
    a, b = hourly_topic(topics), hourly_topic(topics)
    orders = PostgresTarget(table="analytics.orders")
    plan(ledger, kafka_config, "orders_v1", T0, T0 + HOUR, [a], dag_id="v1", target_id=orders.target_id)
    with pytest.raises(OwnershipConflict) as refused:
        plan(ledger, kafka_config, "orders_v2", T0, T0 + HOUR, [a, b], dag_id="v2",
             target_id=PostgresTarget(table="Analytics.Orders").target_id)
    assert str(refused.value).startswith(
        f"pipelines 'orders_v1' and 'orders_v2' would both publish topic(s) {a} into postgresql:analytics.orders: "
        f"every record of them would be published twice. pipeline 'orders_v1' (DAG 'v1'; topics {a}; target "
        f"postgresql:analytics.orders) claimed it first; refused: pipeline 'orders_v2' (DAG 'v2'; topics "), refused
    assert windows_of(ledger, "orders_v2") == [] and "orders_v2" not in claims(ledger)

    # disjoint topics into one replace_window table: allowed (rows carry eos_pipeline);
    # the same topic into another table: allowed
    plan(ledger, kafka_config, "orders_b", T0, T0 + HOUR, [b], dag_id="b", target_id=orders.target_id)
    plan(ledger, kafka_config, "orders_copy", T0, T0 + HOUR, [a], dag_id="copy",
         target_id=PostgresTarget(table="analytics.orders_copy").target_id)
    assert sorted(claims(ledger)) == ["orders_b", "orders_copy", "orders_v1"]


def test_a_partition_per_window_table_takes_one_pipeline_refused_at_the_first_plan(ledger, kafka_config, topics):
    a, b = hourly_topic(topics), hourly_topic(topics)
    partitioned = PostgresTarget(table="analytics.orders_partitioned", mode="partition_per_window")
    assert partitioned.exclusive and not PostgresTarget(table="analytics.orders_partitioned").exclusive
    plan(ledger, kafka_config, "first", T0, T0 + HOUR, [a], dag_id="first",
         target_id=partitioned.target_id, target_exclusive=True)
    for exclusive in (True, False):  # another pipeline, disjoint topics, either mode
        with pytest.raises(OwnershipConflict, match=r"target postgresql:analytics.orders_partitioned takes the "
                                                    r"windows of one pipeline only .* pipeline 'first' \(DAG "
                                                    r"'first'.* claimed it first; refused: pipeline 'second'"):
            plan(ledger, kafka_config, "second", T0 + HOUR, T0 + 2 * HOUR, [b], dag_id="second",
                 target_id=partitioned.target_id, target_exclusive=exclusive)
    assert windows_of(ledger, "second") == [] and "second" not in claims(ledger)

    # and the other way round: a table shared by two pipelines cannot become one pipeline's
    shared = PostgresTarget(table="analytics.shared")
    plan(ledger, kafka_config, "s1", T0, T0 + HOUR, [a], target_id=shared.target_id)
    plan(ledger, kafka_config, "s2", T0, T0 + HOUR, [b], target_id=shared.target_id)
    with pytest.raises(OwnershipConflict, match="takes the windows of one pipeline only"):
        plan(ledger, kafka_config, "s1", T0 + HOUR, T0 + 2 * HOUR, [a], target_id=shared.target_id,
             target_exclusive=True)


def test_a_plan_without_dag_or_target_claims_what_it_names_and_a_later_plan_fills_in_the_rest(
        ledger, kafka_config, topics):
    a = hourly_topic(topics)
    target = PostgresTarget(table="t").target_id
    plan(ledger, kafka_config, "p", T0, T0 + HOUR, [a])
    assert claims(ledger) == {"p": [None, [a], None, False]}
    plan(ledger, kafka_config, "p", T0, T0 + HOUR, [a], dag_id="d")  # a frozen window: fills in the DAG
    plan(ledger, kafka_config, "p", T0 + HOUR, T0 + 2 * HOUR, [a], target_id=target)
    assert claims(ledger) == {"p": ["d", [a], "postgresql:public.t", False]}
    with pytest.raises(OwnershipConflict, match="two DAGs share pipeline id 'p'"):
        plan(ledger, kafka_config, "p", T0, T0 + HOUR, [a], dag_id="e")


def test_concurrent_claimants_of_one_target_or_one_pipeline_id_exactly_one_wins(ledger, kafka_config, topics):
    a = hourly_topic(topics)
    barrier = threading.Barrier(6)

    def claim(pipeline, dag_id, table):
        barrier.wait()
        try:
            return plan(ledger, kafka_config, pipeline, T0, T0 + HOUR, [a], dag_id=dag_id,
                        target_id=PostgresTarget(table=table).target_id)
        except OwnershipConflict as exc:
            return exc

    for claimants in ([(f"p{i}", f"d{i}", "orders") for i in range(6)],  # six pipelines, one target
                      [("shared", f"dag{i}", "orders_2") for i in range(6)]):  # six DAGs, one pipeline id
        with ThreadPoolExecutor(6) as pool:
            results = list(pool.map(lambda c: claim(*c), claimants))
        refused = [r for r in results if isinstance(r, OwnershipConflict)]
        assert len(refused) == 5, results
    assert len(claims(ledger)) == 2


def test_release_lets_the_next_plan_claim_the_pipeline_again(ledger, kafka_config, topics):
    """A deliberate move: DAG renamed, and the pipeline given other topics."""
    a, b = hourly_topic(topics), hourly_topic(topics)
    plan(ledger, kafka_config, "p", T0, T0 + HOUR, [a], dag_id="old_name")
    with pytest.raises(OwnershipConflict):
        plan(ledger, kafka_config, "p", T0 + HOUR, T0 + 2 * HOUR, [a, b], dag_id="new_name")
    with ledger.connect() as conn, conn.transaction():
        released = ledger.release(conn, "p")
        assert ledger.release(conn, "p") is None  # nothing left to release
    assert (released.dag_id, released.topics) == ("old_name", (a,))
    assert claims(ledger) == {}
    plan(ledger, kafka_config, "p", T0 + HOUR, T0 + 2 * HOUR, [a, b], dag_id="new_name")
    assert claims(ledger) == {"p": ["new_name", sorted([a, b]), None, False]}
    with pytest.raises(OwnershipConflict, match="DAG 'new_name'.* claimed it first, and DAG 'old_name'"):
        plan(ledger, kafka_config, "p", T0 + 2 * HOUR, T0 + 3 * HOUR, [a], dag_id="old_name")
    # windows planned before the move keep their topics
    with pytest.raises(WindowConflict, match="planned for topics"):
        plan(ledger, kafka_config, "p", T0, T0 + HOUR, [a, b], dag_id="new_name")


# --------------------------------------------------------------------------- transactional sources


def _transactional_producer(bootstrap: str):
    from confluent_kafka import Producer

    producer = Producer({**client_logging(), "bootstrap.servers": bootstrap,
                         "transactional.id": f"src-{uuid.uuid4().hex[:8]}", "linger.ms": 1})
    producer.init_transactions(15)
    return producer


def _transaction(producer, topic: str, minutes, *, commit: bool | None) -> None:
    """One transaction of records stamped T0 + each of ``minutes``: committed,
    aborted (False) or left open (None)."""
    producer.begin_transaction()
    for m in minutes:
        producer.produce(topic, value=f"m{m}".encode(), partition=0, timestamp=ms(T0 + m * MINUTE))
    producer.flush(15)
    if commit is True:
        producer.commit_transaction(15)
    elif commit is False:
        producer.abort_transaction(15)


def _committed_values(bootstrap: str, topic: str, start: int, end: int) -> list[bytes]:
    """What a read_committed reader gets of offsets [start, end) of partition 0."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "txn-check", "enable.partition.eof": True,
                  "enable.auto.commit": False, "isolation.level": "read_committed", "fetch.wait.max.ms": 10})
    values = []
    try:
        c.assign([KTP(topic, 0, start)])
        while True:
            msg = c.poll(10)
            assert msg is not None, "no end of partition within 10 s"
            if msg.error() or msg.offset() >= end:
                break
            values.append(msg.value())
    finally:
        c.close()
    return values


def test_a_transactional_source_plans_committed_records_only_and_waits_for_an_open_transaction(
        ledger, kafka_config, topics):
    """Aborted transactions leave offsets no reader sees (gaps), and a transaction
    open at the window's end holds the last stable offset: a read_committed
    planner sees the partition end there. Within the grace the window waits; once
    the transaction commits with a record past the end, the cut is that record
    and the window holds exactly the committed records before it."""
    topic = topics.create(partitions=1)
    bootstrap = kafka_config["bootstrap.servers"]
    writer, other = _transactional_producer(bootstrap), _transactional_producer(bootstrap)
    end = T0 + HOUR
    try:
        _transaction(writer, topic, range(0, 20), commit=True)
        _transaction(writer, topic, range(20, 30), commit=False)
        _transaction(writer, topic, range(30, 50), commit=True)
        _transaction(other, topic, [55, 70], commit=None)  # open at the window's end, a record past it
        with pytest.raises(WindowNotClosed) as caught:
            plan(ledger, kafka_config, "txn", T0, end, [topic], grace=timedelta(minutes=10),
                 now=lambda: end + timedelta(minutes=5))
        assert caught.value.waiting_for == [(topic, 0)]
        other.commit_transaction(15)
    finally:
        del writer, other  # freed now: no client of this test outlives its broker
    [r] = plan(ledger, kafka_config, "txn", T0, end, [topic], grace=timedelta(minutes=10),
               now=lambda: end + timedelta(minutes=5)).ranges
    values = _committed_values(bootstrap, topic, r.start_offset, r.end_offset)
    assert values == [f"m{m}".encode() for m in [*range(0, 20), *range(30, 50), 55]]
    assert r.end_offset - r.start_offset > len(values)  # the aborted records and the markers: gaps
    assert _committed_values(bootstrap, topic, r.end_offset, 10**9) == [b"m70"]


def test_a_transaction_open_past_the_grace_is_in_one_window_only(ledger, kafka_config, topics):
    """A transaction still open when the partition has idled past the grace: the
    cut is frozen at the end of the log, past the open transaction's records
    (a read_committed reader stops before them until the transaction ends).
    Whichever window they fall in, each of its records, committed later, is in
    exactly one window, and the windows tile the log."""
    topic = topics.create(partitions=1)
    bootstrap = kafka_config["bootstrap.servers"]
    writer, other = _transactional_producer(bootstrap), _transactional_producer(bootstrap)
    try:
        _transaction(writer, topic, range(0, 30), commit=True)
        _transaction(other, topic, [40, 50], commit=None)
        [first] = plan(ledger, kafka_config, "late", T0, T0 + HOUR, [topic]).ranges  # now: long after, idle
        other.commit_transaction(15)
        _transaction(writer, topic, [70, 130], commit=True)
        [second] = plan(ledger, kafka_config, "late", T0 + HOUR, T0 + 2 * HOUR, [topic]).ranges
    finally:
        del writer, other  # freed now: no client of this test outlives its broker
    assert first.start_offset == 0 and first.end_offset == second.start_offset
    windows = [_committed_values(bootstrap, topic, r.start_offset, r.end_offset) for r in (first, second)]
    assert sorted(windows[0] + windows[1]) == sorted(f"m{m}".encode() for m in [*range(0, 30), 40, 50, 70])
    assert windows[0][:30] == [f"m{m}".encode() for m in range(0, 30)]


def test_a_range_an_open_transaction_holds_short_is_reported_so_by_both_readers(ledger, kafka_config, topics):
    """The window of the test above, frozen past a transaction still open: the
    eos_kafka reader waits at the last stable offset, then fails with
    TransactionOpen naming the partition, that offset and the range's end (not
    "no answer from Kafka"); a stage job that read with Spark's own Kafka source
    and failed with an error not ours (Spark calls it lost data) is reported as
    TransactionOpen too, Spark's error after it. Once the transaction commits,
    the range is read to its end, and Spark's error is reported as it is."""
    from airflow_eos.core.errors import TransactionOpen
    from airflow_eos.spark.kafka_ranges import plan_tasks, read_range
    from airflow_eos.spark.stage_report import job_failure

    topic = topics.create(partitions=1)
    bootstrap = kafka_config["bootstrap.servers"]
    writer, other = _transactional_producer(bootstrap), _transactional_producer(bootstrap)
    spark_error = RuntimeError("An error occurred while calling o91.save.\njava.lang.IllegalStateException: "
                               "Cannot fetch offset 31 ... Some data may have been lost")
    try:
        _transaction(writer, topic, range(0, 30), commit=True)
        _transaction(other, topic, [40, 50], commit=None)
        frozen = plan(ledger, kafka_config, "held", T0, T0 + HOUR, [topic])
        [rng] = frozen.ranges
        [task] = plan_tasks(frozen, 1000)
        held_at = rf"the last stable offset of {topic}\[0\] is held at \d+ by a producer transaction still open, " \
                  rf"below {rng.end_offset}, where the planned range ends"
        with pytest.raises(TransactionOpen, match=held_at + r".* waited for 2s there\. The brokers answer"):
            list(read_range(kafka_config, task, end_grace_s=0.5, poll_timeout_s=2))
        message, error = job_failure(spark_error, frozen, kafka_config, observation=object())
        assert error == "TransactionOpen" and re.search(held_at, message), message
        assert message.endswith("Spark's Kafka source reported: IllegalStateException: Cannot fetch offset 31 ... "
                                "Some data may have been lost"), message
        assert job_failure(spark_error, frozen, kafka_config, observation=None)[1] is None  # eos_kafka's: its own
        other.commit_transaction(15)
    finally:
        del writer, other  # freed now: no client of this test outlives its broker
    read = [b.num_rows for b in read_range(kafka_config, task, end_grace_s=0.5, poll_timeout_s=10)]
    assert sum(read) == 32, read
    assert job_failure(spark_error, frozen, kafka_config, observation=object())[1] is None


def test_retention_deleting_a_planned_range_fails_the_plan_and_the_read_loudly(ledger, kafka_config, topics):
    """Kafka's own retention (not delete_records) deletes a frozen range before
    its stage: the frozen plan and the stage's reader both refuse with
    OffsetsExpired, naming what is gone; nothing is read short."""
    from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource

    from airflow_eos.spark.kafka_ranges import plan_tasks, read_range

    topic = topics.create(partitions=1)
    topics.produce(topic, [(0, ms(T0) + i * 60_000, b"x") for i in range(180)])  # stamped months ago
    frozen = plan(ledger, kafka_config, "ret", T0 + HOUR, T0 + 2 * HOUR, [topic])
    resource = ConfigResource(ConfigResource.Type.TOPIC, topic, incremental_configs=[
        ConfigEntry("retention.ms", "60000", incremental_operation=AlterConfigOpType.SET)])
    for f in topics.admin.incremental_alter_configs([resource]).values():
        f.result(15)
    deadline = time.monotonic() + 60
    watcher = Consumer({"bootstrap.servers": kafka_config["bootstrap.servers"], "group.id": "retention-watch"})
    try:  # the broker checks retention every second (embedded.KAFKA_SETTINGS)
        while watcher.get_watermark_offsets(KTP(topic, 0), timeout=5)[0] < 120:
            assert time.monotonic() < deadline, "retention deleted nothing within 60 s"
            time.sleep(0.5)
    finally:
        watcher.close()
    with pytest.raises(OffsetsExpired, match=rf"{topic}\[0\] must be read from offset 60 to 120"):
        plan(ledger, kafka_config, "ret", T0 + HOUR, T0 + 2 * HOUR, [topic])
    [task] = plan_tasks(frozen, 1000)
    with pytest.raises(OffsetsExpired, match=r"retention deleted planned records \[60, 120\)"):
        list(read_range(kafka_config, task, end_grace_s=1))


def test_a_compacted_topic_plans_windows_that_tile_what_compaction_left(ledger, kafka_config, topics):
    """Compaction removes older records of a key: offsets get holes. The windows
    still tile the log: every record that survived is in exactly one window,
    and no window's range has a record from outside it."""
    from confluent_kafka import Producer

    topic = f"compacted-{uuid.uuid4().hex[:8]}"
    config = {"cleanup.policy": "compact", "segment.ms": "100", "min.cleanable.dirty.ratio": "0.01",
              "min.compaction.lag.ms": "0", "delete.retention.ms": "100"}
    create_topic(topics.bootstrap, topic, 1, config)
    topics.created.append(topic)
    producer = Producer({**client_logging(), "bootstrap.servers": kafka_config["bootstrap.servers"]})
    try:
        for i in range(180):  # a record a minute for 3 hours; every other one of 6 keys, superseded
            key = f"k{i % 6}" if i % 2 else f"u{i}"
            producer.produce(topic, key=key.encode(), value=f"v{i}".encode(), partition=0,
                             timestamp=ms(T0 + i * MINUTE))
            if i % 30 == 29:
                producer.flush(15)
                time.sleep(0.2)  # past segment.ms: the next record starts a new segment
        producer.flush(15)
    finally:
        del producer
    deadline = time.monotonic() + 60
    while len(read_all(kafka_config["bootstrap.servers"], topic, 1)) > 120:
        assert time.monotonic() < deadline, "the log cleaner compacted nothing within 60 s"
        time.sleep(1)
    survivors = read_all(kafka_config["bootstrap.servers"], topic, 1)
    ranges = [plan(ledger, kafka_config, "compact", T0 + h * HOUR, T0 + (h + 1) * HOUR, [topic]).ranges[0]
              for h in range(3)]
    assert [r.start_offset for r in ranges[1:]] == [r.end_offset for r in ranges[:-1]]  # a tiling
    assert ranges[0].start_offset == 0 and ranges[-1].end_offset == 180  # offset 0 (key u0) is never superseded
    for h, r in enumerate(ranges):
        inside = [(p, o) for (p, o), ts in survivors.items() if r.start_offset <= o < r.end_offset]
        assert inside and all(ms(T0 + h * HOUR) <= survivors[k] < ms(T0 + (h + 1) * HOUR) for k in inside), h
    assert sum(sum(r.start_offset <= o < r.end_offset for (_, o) in survivors) for r in ranges) == len(survivors)


def test_apache_kafkas_offsets_for_times_is_used_as_a_hint_and_still_verified_by_reading(kafka_config, topics):
    """Apache Kafka answers offsets_for_times correctly: the search takes the hint
    and confirms it with two probes (the record at it is at/after t, the one before
    is not). A wrong hint (off by 37) costs probes, never the answer."""
    from airflow_eos.core.cut_search import first_offset_at_or_after
    from airflow_eos.core.windows import TopicPartition

    topic = topics.create(partitions=1)
    topics.produce(topic, [(0, ms(T0) + i * 1_000, b"x") for i in range(5_000)])  # a record a second
    tp = TopicPartition(topic, 0)

    class Counted(KafkaLog):
        shift = 0

        def __init__(self, config):
            super().__init__(config)
            self.probes, self.hints = 0, []

        def time_hint(self, tp_, timestamp_ms):
            self.hints.append(super().time_hint(tp_, timestamp_ms))
            return None if self.hints[-1] is None else self.hints[-1] + self.shift

        def first_at_or_after(self, tp_, offset, end):
            self.probes += 1
            return super().first_at_or_after(tp_, offset, end)

    t = ms(T0 + HOUR)  # the record at offset 3600
    with Counted(kafka_config) as right:
        assert first_offset_at_or_after(right, tp, t, 0, 5_000) == 3_600
    assert right.hints == [3_600] and right.probes == 2
    Counted.shift = 37
    with Counted(kafka_config) as wrong:
        assert first_offset_at_or_after(wrong, tp, t, 0, 5_000) == 3_600
    assert wrong.probes > 2


def test_the_log_start_moving_during_a_read_from_the_beginning_is_no_error(kafka_config, topics):
    """Retention (here delete_records, 1 offset at a time) moves the log start
    while the planner reads a partition's bounds from the beginning: Kafka then
    answers OFFSET_OUT_OF_RANGE for the start it had just given. That is the
    beginning moving, not planned records lost: the read starts again at the
    new beginning, and every answer is a log start the log really had. (Before
    the fix this failed within the first few dozen reads.)"""
    import threading

    from airflow_eos.core.source import KafkaLog
    from airflow_eos.core.windows import TopicPartition

    topic = topics.create(partitions=1)
    topics.produce(topic, [(0, ms(T0) + i, b"x") for i in range(1000)])
    tp = TopicPartition(topic, 0)
    log = KafkaLog(kafka_config)
    reads_done = threading.Event()
    moved = []

    def retention():  # moves the log start for as long as the reads go on
        for start in range(1, 1000):
            if reads_done.is_set():
                return
            for f in topics.admin.delete_records([KTP(topic, 0, start)]).values():
                f.result(15)
            moved.append(start)

    deleter = threading.Thread(target=retention)
    deleter.start()
    starts = []
    try:
        for _ in range(100):
            bounds = log.bounds(tp)
            starts.append(bounds.log_start)
            assert bounds.end == 1000
    finally:
        reads_done.set()
        deleter.join()
        log.close()
    assert starts == sorted(starts) and starts[-1] <= moved[-1]
    assert len(set(starts)) > 10, "the log start hardly moved during the reads: the race was not exercised"
