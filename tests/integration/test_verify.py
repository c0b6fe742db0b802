"""The auditor against real services: windows planned from the broker, staged
with lineage read from Kafka, committed through the sink, then verified; every
kind of tampering is caught and named by window, topic, partition and offset.

Records are produced in transactions, so every partition has offsets without a
record (commit markers): verify must count the records actually there."""

from __future__ import annotations

import io
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone

import psycopg
import psycopg.sql
import pyarrow as pa
import pytest
from confluent_kafka import Producer

from airflow_eos import verify as v
from airflow_eos.core.attempt import ConsumedRange
from airflow_eos.core.errors import ConfigurationError, LedgerUnavailable, TargetError
from airflow_eos.core.plan import PlanRequest, plan_window
from airflow_eos.core.sink import Sink
from airflow_eos.targets.postgres.target import PostgresTarget
from airflow_eos.core.source import KafkaLog
from airflow_eos.verify import verify
from airflow_eos.core.windows import Cut, PartitionRange, TopicPartition, Window, WindowPlan, to_millis
from harness.topics import create_topic, delete_topic

T0 = datetime(2024, 1, 1, tzinfo=timezone.utc)
HOUR = timedelta(hours=1)
PIPELINE = "orders_hourly"

ORDERS_DDL = """
    CREATE TABLE orders (
        id bigint NOT NULL, value text,
        eos_topic text NOT NULL, eos_partition integer NOT NULL, eos_offset bigint NOT NULL,
        eos_pipeline text NOT NULL, eos_window_start timestamptz NOT NULL)
"""
COUNTS_DDL = """
    CREATE TABLE order_counts (
        partition integer NOT NULL, n bigint NOT NULL,
        eos_pipeline text NOT NULL, eos_window_start timestamptz NOT NULL)
"""


def execute(url, statement, params=None):
    with psycopg.connect(url, autocommit=True) as conn:
        cur = conn.execute(statement, params)
        return cur.fetchall() if cur.description else None


def produce_in_transactions(bootstrap, topic, records, per_transaction=3):
    """records: (partition, timestamp_ms, value); each transaction's commit
    marker takes an offset, so the log has gaps."""
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"verify-{uuid.uuid4().hex[:8]}",
                         "linger.ms": 1})
    producer.init_transactions(15)
    records = list(records)
    for i in range(0, len(records), per_transaction):
        producer.begin_transaction()
        for partition, ts, value in records[i:i + per_transaction]:
            producer.produce(topic, value=value, partition=partition, timestamp=ts)
        producer.commit_transaction(15)


@dataclass
class Built:
    """A pipeline committed through the sink, and what Kafka holds for it."""

    topic: str
    plans: list[WindowPlan]
    offsets: dict[TopicPartition, list[int]]  # offsets of the records present, per partition

    def records(self, plan: WindowPlan, partition: int) -> list[int]:
        r = next(r for r in plan.ranges if r.partition == partition)
        return [o for o in self.offsets[r.tp] if r.start_offset <= o < r.end_offset]


def build(ledger, kafka_config, target, *, windows=3, commit=None, dead=(), aggregate=False, minutes=(5, 20, 40),
          stamps=None, frozen=None):
    """Produce records for ``windows`` hourly windows into a 2-partition topic
    (plus one closing record per partition; or ``stamps``: (partition,
    timestamp_ms, value) tuples), plan every window from the
    broker, and stage each with rows read from Kafka (one row per record with
    lineage, or one count per partition when ``aggregate``), checkpoint,
    prepare and commit the windows in ``commit`` (default all). ``dead`` holds
    (partition, offset) pairs that the transform dead-letters. ``frozen``:
    ``(log, topic) -> plans`` frozen into the ledger as they are (as an older
    planner or a person froze them) instead of planning."""

    topic = f"orders-{uuid.uuid4().hex[:10]}"
    create_topic(kafka_config["bootstrap.servers"], topic, 2)
    if stamps is None:
        stamps = [(p, to_millis(T0 + i * HOUR + timedelta(minutes=m)), f"{p}:{i}:{m}".encode())
                  for i in range(windows) for p in (0, 1) for m in minutes]
        stamps += [(p, to_millis(T0 + windows * HOUR), b"closing") for p in (0, 1)]
    produce_in_transactions(kafka_config["bootstrap.servers"], topic, stamps)

    with KafkaLog(kafka_config) as log_:
        if frozen is None:
            plans = [plan_window(ledger, log_, PlanRequest(Window(PIPELINE, T0 + i * HOUR, T0 + (i + 1) * HOUR),
                                                           (topic,)), now=lambda: T0 + timedelta(days=1))
                     for i in range(windows)]
        else:
            plans = frozen(log_, topic)
            with ledger.connect() as conn, conn.transaction():
                for plan in plans:
                    ledger.lock_pipeline(conn, PIPELINE)
                    cuts = {(r.tp, at): Cut(r.tp, at, offset, "record") for r in plan.ranges
                            for at, offset in ((plan.window.start, r.start_offset), (plan.window.end, r.end_offset))}
                    known = {(TopicPartition(t, p), at) for t, p, at in conn.execute(
                        "SELECT topic, partition, at FROM eos.cuts WHERE pipeline = %s", (PIPELINE,))}
                    ledger.freeze(conn, plan, [c for key, c in cuts.items() if key not in known])
        present = {tp: [rec.offset for rec in log_.records(tp, 0, log_.bounds(tp).end)]
                   for tp in (TopicPartition(topic, 0), TopicPartition(topic, 1))}
    built = Built(topic, plans, present)
    for i in (range(windows) if commit is None else commit):
        plan = plans[i]
        attempt = target.begin(plan.window)
        writer = target.writer(attempt)
        chunks, consumed = [], []
        for r in plan.ranges:  # one Spark task per partition range
            offsets = built.records(plan, r.partition)
            good = [o for o in offsets if (r.partition, o) not in dead]
            dead_letters = [{"topic": topic, "partition": r.partition, "offset": o, "error": "unparseable"}
                            for o in offsets if (r.partition, o) in dead]
            if aggregate:
                batch = pa.record_batch({"partition": pa.array([r.partition], pa.int32()),
                                         "n": pa.array([len(good)], pa.int64())})
            else:
                batch = pa.record_batch({
                    "id": pa.array([r.partition * 1000 + o for o in good], pa.int64()),
                    "value": pa.array([f"{r.partition}/{o}" for o in good]),
                    "eos_topic": pa.array([topic] * len(good)),
                    "eos_partition": pa.array([r.partition] * len(good), pa.int32()),
                    "eos_offset": pa.array(good, pa.int64())})
            chunks.append(writer.write([batch], dead_letters))
            consumed.append(ConsumedRange(topic, r.partition, r.start_offset, r.end_offset, len(offsets)))
        target.checkpoint(attempt, consumed, chunks)
        assert target.prepare(attempt).prepared
        target.commit(attempt)
    return built


@pytest.fixture
def orders(pg_url, ledger):
    execute(pg_url, ORDERS_DDL)
    return PostgresTarget(pg_url, "orders")


@pytest.fixture
def counts(pg_url, ledger):
    execute(pg_url, COUNTS_DDL)
    return PostgresTarget(pg_url, "order_counts")


def kinds(report):
    return sorted(x.kind for x in report.violations)


def located(report, kind):
    """(window_start, topic, partition, offset) of each violation of a kind."""
    return sorted((x.window_start, x.topic, x.partition, x.offset) for x in report.violations if x.kind == kind)


def audit_of(report, window_start):
    return next(a for a in report.windows if a.window_start == window_start)


# --------------------------------------------------------------------------- a correct pipeline


def test_a_correct_pipeline_is_clean_and_counts_records_not_offsets(ledger, kafka_config, orders):
    built = build(ledger, kafka_config, orders.sink(), dead={(1, 4)})
    report = verify(ledger, kafka_config, orders, PIPELINE)
    assert report.clean, str(report)
    assert report.lineage and report.committed_windows == 3
    # the transaction markers make every window's offset width larger than its record count
    assert all(p.max_records > 6 for p in built.plans)
    assert [(a.state, a.kafka_records, a.published_rows, a.dead_letters, a.duplicates, a.missing, a.extra)
            for a in report.windows] == [("committed", 6, 6, 0, 0, 0, 0), ("committed", 6, 5, 1, 0, 0, 0),
                                         ("committed", 6, 6, 0, 0, 0, 0)]
    assert report.totals == v.Totals(18, 17, 1, 0, 0, 0)
    end = {r.tp: r.end_offset for r in built.plans[-1].ranges}
    assert report.offsets == report.expected_offsets == end
    assert str(report).endswith(": clean")


def test_a_partition_log_gives_the_same_report(ledger, kafka_config, orders):
    build(ledger, kafka_config, orders.sink(), windows=2)
    with KafkaLog(kafka_config) as log_:
        by_log = verify(ledger, log_, orders.table, PIPELINE)
    by_config = verify(ledger, kafka_config, orders, PIPELINE)
    assert by_log.clean and by_config.clean
    assert by_log.windows == by_config.windows


def test_uncommitted_windows_are_not_audited_and_keep_offsets_back(ledger, kafka_config, orders):
    built = build(ledger, kafka_config, orders.sink(), commit=[1])  # window 0 is only planned
    report = verify(ledger, kafka_config, orders, PIPELINE)
    assert report.clean, str(report)
    assert [a.state for a in report.windows] == ["planned", "committed", "planned"]
    assert audit_of(report, built.plans[0].window.start).kafka_records is None
    assert report.offsets == report.expected_offsets == {}


# --------------------------------------------------------------------------- tampering, each caught precisely


def test_a_duplicated_row(pg_url, ledger, kafka_config, orders):
    built = build(ledger, kafka_config, orders.sink())
    w1 = built.plans[1].window.start
    offset = built.records(built.plans[1], 0)[1]
    execute(pg_url, "INSERT INTO orders SELECT * FROM orders WHERE eos_partition = 0 AND eos_offset = %s", (offset,))
    report = verify(ledger, kafka_config, orders, PIPELINE)
    assert kinds(report) == [v.COUNT, v.DUPLICATE]
    assert located(report, v.DUPLICATE) == [(w1, built.topic, 0, offset)]
    [dup] = [x for x in report.violations if x.kind == v.DUPLICATE]
    assert dup.message == f"window {w1.isoformat()}: {built.topic}[0] offset {offset} is published 2 times"
    [count] = [x for x in report.violations if x.kind == v.COUNT]
    assert count.message == f"window {w1.isoformat()}: the target holds 7 rows, the ledger recorded 6 published by attempt 1"
    assert (audit_of(report, w1).duplicates, report.totals.duplicates, report.totals.published_rows) == (1, 1, 19)


def test_a_deleted_row(pg_url, ledger, kafka_config, orders):
    built = build(ledger, kafka_config, orders.sink())
    w2 = built.plans[2].window.start
    offset = built.records(built.plans[2], 1)[-1]
    execute(pg_url, "DELETE FROM orders WHERE eos_partition = 1 AND eos_offset = %s", (offset,))
    report = verify(ledger, kafka_config, orders, PIPELINE)
    assert kinds(report) == [v.COUNT, v.MISSING]
    assert located(report, v.MISSING) == [(w2, built.topic, 1, offset)]
    assert f"{built.topic}[1] offset {offset} is in Kafka but neither published nor a dead letter" in str(report)
    assert audit_of(report, w2).missing == 1


def test_rows_without_a_record_of_their_committed_window(pg_url, ledger, kafka_config, orders):
    built = build(ledger, kafka_config, orders.sink(), commit=[0, 1])
    w0, w1, w2 = (p.window.start for p in built.plans)
    topic = built.topic
    beyond = max(r.end_offset for p in built.plans for r in p.ranges) + 100
    r0 = next(r for r in built.plans[0].ranges if r.partition == 0)
    marker = next(o for o in range(r0.start_offset, r0.end_offset) if o not in built.offsets[r0.tp])
    of_w1 = built.records(built.plans[1], 0)[0]
    of_w2 = built.records(built.plans[2], 0)[0]
    rows = [(0, beyond, w0),     # outside every planned window
            (0, marker, w0),     # inside window 0's range, but a commit marker: no record
            (0, of_w1, w0),      # a record of window 1 published again under window 0
            (0, of_w2, w2)]      # under window 2, which is planned but not committed
    for partition, offset, ws in rows:
        execute(pg_url, "INSERT INTO orders VALUES (0, 'forged', %s, %s, %s, %s, %s)",
                (topic, partition, offset, PIPELINE, ws))
    report = verify(ledger, kafka_config, orders, PIPELINE)
    assert located(report, v.EXTRA) == sorted([(w0, topic, 0, beyond), (w0, topic, 0, marker),
                                               (w0, topic, 0, of_w1), (w2, topic, 0, of_w2)])
    assert kinds(report) == [v.COUNT, v.EXTRA, v.EXTRA, v.EXTRA, v.EXTRA]  # window 0 holds 3 rows too many
    text = str(report)
    assert f"row with lineage {topic}[0] offset {beyond} lies outside every planned window" in text
    assert f"row with lineage {topic}[0] offset {marker} has no record at that offset in Kafka" in text
    assert (f"row with lineage {topic}[0] offset {of_w1} belongs to window {w1.isoformat()} (committed), "
            "not to this one") in text
    assert f"window {w2.isoformat()}: row with lineage {topic}[0] offset {of_w2} is published under a window " \
           "that is not committed (state planned)" in text
    assert (audit_of(report, w0).extra, audit_of(report, w2).extra) == (3, 1)
    # the record of window 1 is still once in window 1: no duplicate there
    assert audit_of(report, w1).duplicates == 0


def test_a_record_both_dead_letter_and_published(pg_url, ledger, kafka_config, orders):
    built = build(ledger, kafka_config, orders.sink(), dead={(0, 1)})
    w0 = built.plans[0].window.start
    assert 1 in built.records(built.plans[0], 0)
    execute(pg_url, "INSERT INTO orders VALUES (1, 'again', %s, 0, 1, %s, %s)", (built.topic, PIPELINE, w0))
    report = verify(ledger, kafka_config, orders, PIPELINE)
    assert kinds(report) == [v.COUNT, v.DEAD_AND_PUBLISHED]
    assert located(report, v.DEAD_AND_PUBLISHED) == [(w0, built.topic, 0, 1)]
    assert f"{built.topic}[0] offset 1 is a dead letter of attempt 1 and also published" in str(report)
    assert audit_of(report, w0).duplicates == 1


def test_a_dead_letter_of_another_attempt_or_no_record(pg_url, ledger, kafka_config, orders):
    built = build(ledger, kafka_config, orders.sink(), windows=1, dead={(1, 0)})
    w0 = built.plans[0].window.start
    execute(pg_url, "UPDATE eos.dead_letters SET epoch = 7")
    report = verify(ledger, kafka_config, orders, PIPELINE)
    # a stale dead letter does not account for its record either
    assert located(report, v.EXTRA) == [(w0, built.topic, 1, 0)]
    assert located(report, v.MISSING) == [(w0, built.topic, 1, 0)]
    assert f"dead letter {built.topic}[1] offset 0 is from attempt 7, but attempt 1 committed the window" in str(report)


def test_a_wrong_or_missing_partition_offset(pg_url, ledger, kafka_config, orders):
    built = build(ledger, kafka_config, orders.sink(), windows=2)
    end = {r.partition: r.end_offset for r in built.plans[-1].ranges}
    execute(pg_url, 'UPDATE eos.partition_offsets SET "offset" = "offset" - 1 WHERE partition = 0')
    execute(pg_url, "DELETE FROM eos.partition_offsets WHERE partition = 1")
    report = verify(ledger, kafka_config, orders, PIPELINE)
    assert kinds(report) == [v.OFFSETS, v.OFFSETS]
    assert [str(x) for x in report.violations] == [
        f"eos.partition_offsets holds {built.topic}[0] at {end[0] - 1}; the contiguous committed prefix ends at {end[0]}",
        f"eos.partition_offsets has no offset for {built.topic}[1]; the contiguous committed prefix ends at {end[1]}",
    ]
    assert located(report, v.OFFSETS) == [(None, built.topic, 0, end[0] - 1), (None, built.topic, 1, None)]


def test_a_tampered_checkpoint_count(pg_url, ledger, kafka_config, orders):
    built = build(ledger, kafka_config, orders.sink(), windows=1)
    r = next(r for r in built.plans[0].ranges if r.partition == 1)
    execute(pg_url, "UPDATE eos.checkpoint_ranges SET records = records + 1 WHERE partition = 1")
    report = verify(ledger, kafka_config, orders, PIPELINE)
    assert [str(x) for x in report.violations] == [
        f"window {T0.isoformat()}: the checkpoint of attempt 1 counted 4 records in {built.topic}[1] "
        f"[{r.start_offset}, {r.end_offset}), Kafka holds 3"]


def test_examples_are_capped_per_window_but_counts_are_exact(pg_url, ledger, kafka_config, orders):
    build(ledger, kafka_config, orders.sink(), windows=1, minutes=range(0, 60, 6))  # 10 records per partition
    execute(pg_url, "DELETE FROM orders WHERE eos_partition = 0")
    report = verify(ledger, kafka_config, orders, PIPELINE, max_examples=3)
    assert report.windows[0].missing == 10 and report.totals.missing == 10
    assert kinds(report) == [v.COUNT, v.MISSING, v.MISSING, v.MISSING, v.MORE]
    assert f"window {T0.isoformat()}: 7 more missing finding(s) not listed" in str(report)


def test_a_partition_held_by_a_far_future_cut_is_not_clean(ledger, kafka_config, orders):
    """Issue 16: a record stamped 2030 after the 10th record of partition 1, and
    the cuts an older planner froze on it ([c, c) window after window). Every
    committed window holds exactly its records, yet the records behind the cut
    wait for a window past 2030: verify says so, naming partition, offset and
    timestamp, and exits 1."""
    from airflow_eos.cli import main

    y2030 = to_millis(datetime(2030, 1, 1, tzinfo=timezone.utc))
    sane = [to_millis(T0) + i * 360_000 for i in range(40)]
    stamps = [(0, ts, b"x") for ts in sane] + [(1, ts, b"x") for ts in sane[:10] + [y2030] + sane[10:]]

    def old_planner(log_, topic):
        """Cuts as the planner before issue 16 froze them: the first record at/after
        the cut before, stamped at/after the boundary."""
        lower = {p: 0 for p in (0, 1)}
        plans = []
        for i in range(3):
            ranges = []
            for p in (0, 1):
                tp = TopicPartition(topic, p)
                recs = log_.records(tp, 0, log_.bounds(tp).end)
                boundary = to_millis(T0 + (i + 1) * HOUR)
                end = next(r.offset for r in recs if r.offset >= lower[p] and r.timestamp_ms >= boundary)
                ranges.append(PartitionRange(topic, p, lower[p], end))
                lower[p] = end
            plans.append(WindowPlan(Window(PIPELINE, T0 + i * HOUR, T0 + (i + 1) * HOUR), tuple(ranges)))
        return plans

    built = build(ledger, kafka_config, orders.sink(), stamps=stamps, frozen=old_planner)
    p1 = [next(r for r in plan.ranges if r.partition == 1) for plan in built.plans]
    outlier = built.offsets[TopicPartition(built.topic, 1)][10]
    assert [(r.start_offset, r.end_offset) for r in p1[1:]] == [(outlier, outlier)] * 2  # the stall
    report = verify(ledger, kafka_config, orders, PIPELINE)
    w2 = built.plans[2].window.start
    assert kinds(report) == [v.HELD]
    assert located(report, v.HELD) == [(w2, built.topic, 1, outlier)]
    next_record = built.offsets[TopicPartition(built.topic, 1)][11]
    [held] = report.violations
    assert held.message.startswith(
        f"window {w2.isoformat()}: {built.topic}[1] is held at offset {outlier}, the window's end cut: that record "
        f"is stamped 2030-01-01T00:00:00+00:00, more than max_timestamp_skew (1:00:00) beyond the window's end "
        f"2024-01-01T03:00:00+00:00, and offset {next_record} after it is stamped 2024-01-01T01:00:00+00:00, "
        f"before that end. At least 31 record(s) from offset {outlier} on wait")
    # a skew beyond 2030 reads the record as in time: nothing is held then
    assert verify(ledger, kafka_config, orders, PIPELINE, max_timestamp_skew=timedelta(days=3000)).clean

    out = io.StringIO()
    code = main(["verify", "--pipeline", PIPELINE, "--table", orders.table, "--postgres-url", orders.url,
                 "--kafka-bootstrap", kafka_config["bootstrap.servers"]], out=out, err=io.StringIO())
    assert code == 1
    assert f"held               window {w2.isoformat()}: {built.topic}[1] is held at offset {outlier}" in out.getvalue()


# --------------------------------------------------------------------------- aggregate pipelines


def test_an_aggregate_pipeline_is_clean_then_a_tampered_count_is_caught(pg_url, ledger, kafka_config, counts):
    built = build(ledger, kafka_config, counts.sink(), aggregate=True, dead={(0, 0)})
    report = verify(ledger, kafka_config, counts, PIPELINE, count_column="n")
    assert report.clean, str(report)
    assert not report.lineage
    assert [(a.kafka_records, a.published_rows, a.dead_letters, a.missing, a.extra) for a in report.windows] == [
        (6, 2, 1, 0, 0), (6, 2, 0, 0, 0), (6, 2, 0, 0, 0)]

    w1 = built.plans[1].window.start
    execute(pg_url, "UPDATE order_counts SET n = n + 2 WHERE partition = 1 AND eos_window_start = %s", (w1,))
    report = verify(ledger, kafka_config, counts, PIPELINE, count_column="n")
    assert [str(x) for x in report.violations] == [
        f"window {w1.isoformat()}: n adds up to 8 plus 0 dead letters = 8, but Kafka holds 6 records in the "
        "window's ranges"]
    assert (audit_of(report, w1).extra, report.violations[0].kind) == (2, v.EXTRA)


def test_an_aggregate_window_with_a_row_too_many_or_unplanned(pg_url, ledger, kafka_config, counts):
    built = build(ledger, kafka_config, counts.sink(), aggregate=True, windows=2)
    w0 = built.plans[0].window.start
    unplanned = T0 + 10 * HOUR
    execute(pg_url, "INSERT INTO order_counts VALUES (0, 0, %s, %s), (0, 5, %s, %s)",
            (PIPELINE, w0, PIPELINE, unplanned))
    report = verify(ledger, kafka_config, counts, PIPELINE)  # no count column: row counts only
    assert [str(x) for x in report.violations] == [
        f"window {unplanned.isoformat()}: the target holds 1 row(s) under a window that the pipeline never planned",
        f"window {w0.isoformat()}: the target holds 3 rows, the ledger recorded 2 published by attempt 1",
    ]
    assert [(a.state, a.duplicates, a.extra) for a in report.windows] == [
        ("committed", None, None), ("committed", None, None), ("unplanned", None, 1)]


def test_an_aggregate_dead_letter_must_be_a_record_of_its_window(pg_url, ledger, kafka_config, counts):
    built = build(ledger, kafka_config, counts.sink(), aggregate=True, windows=1, dead={(0, 0)})
    marker = next(o for o in range(10) if o not in built.offsets[TopicPartition(built.topic, 0)])
    execute(pg_url, 'UPDATE eos.dead_letters SET "offset" = %s', (marker,))
    report = verify(ledger, kafka_config, counts, PIPELINE, count_column="n")
    assert [str(x) for x in report.violations] == [
        f"window {T0.isoformat()}: dead letter {built.topic}[0] offset {marker} is not a record of the window in Kafka"]
    assert located(report, v.EXTRA) == [(T0, built.topic, 0, marker)]
    assert (report.windows[0].extra, report.windows[0].missing) == (1, 0)


# --------------------------------------------------------------------------- what verify refuses


def test_an_unknown_pipeline_a_missing_table_or_no_ledger_is_an_error(pg_url, ledger, kafka_config, orders):
    build(ledger, kafka_config, orders.sink(), windows=1)
    with pytest.raises(ConfigurationError, match=r"pipeline 'nope' has no windows .*; it knows orders_hourly"):
        verify(ledger, kafka_config, orders, "nope")
    with pytest.raises(TargetError, match="target table missing does not exist"):
        verify(ledger, kafka_config, "missing", PIPELINE)
    execute(pg_url, "CREATE TABLE plain (x int)")
    with pytest.raises(TargetError, match="has no columns eos_pipeline and eos_window_start"):
        verify(ledger, kafka_config, "plain", PIPELINE)
    execute(pg_url, "ALTER SCHEMA eos RENAME TO not_eos")
    with pytest.raises(LedgerUnavailable, match="schema eos is missing"):
        verify(ledger, kafka_config, "orders", PIPELINE)


class _Sink(Sink):
    """A sink verify knows only by the interface; the window's life is not its business here."""

    def __init__(self, target: PostgresTarget):
        self.ledger = target.sink().ledger
        self.target = target

    def begin(self, window):
        raise AssertionError("verify must not begin")

    def writer(self, attempt):
        raise AssertionError("verify must not stage")

    def count_staged(self, attempt):
        raise AssertionError("verify must not count the staging")

    def commit(self, attempt):
        raise AssertionError("verify must not commit")

    def abort(self, attempt, reason):
        raise AssertionError("verify must not abort")

    def __repr__(self):
        return "_Sink(orders)"


class _CopiedSink(_Sink):
    """Published rows that live outside the ledger's database (as a file
    target's do): loaded into a temp table in the audit's snapshot."""

    def published_relation(self, conn, pipeline, columns=()):
        conn.execute("CREATE TEMP TABLE eos_test_published ON COMMIT DROP AS"
                     " SELECT * FROM orders WHERE eos_pipeline = %s", (pipeline,))
        return psycopg.sql.Identifier("eos_test_published")


def test_verify_reads_any_sink_through_its_published_relation(ledger, kafka_config, orders):
    build(ledger, kafka_config, orders.sink(), windows=2, dead={(1, 4)})
    by_table = verify(ledger, kafka_config, orders, PIPELINE)
    by_sink = verify(ledger, kafka_config, _CopiedSink(orders), PIPELINE)
    assert by_table.clean and by_sink.clean and by_sink.lineage
    assert by_sink.windows == by_table.windows and by_sink.table == "_Sink(orders)"
    execute(orders.url, "DELETE FROM orders WHERE eos_offset = (SELECT min(eos_offset) FROM orders)")
    assert kinds(verify(ledger, kafka_config, _CopiedSink(orders), PIPELINE)) == kinds(
        verify(ledger, kafka_config, orders, PIPELINE)) != []
    with pytest.raises(NotImplementedError, match=r"verify cannot read what _Sink\(orders\) published: _Sink does "
                                                  "not implement Sink.published_relation"):
        verify(ledger, kafka_config, _Sink(orders), PIPELINE)


def test_an_unbound_spec_is_read_in_the_ledgers_database(ledger, kafka_config, orders):
    build(ledger, kafka_config, orders.sink(), windows=1)
    report = verify(ledger, kafka_config, PostgresTarget(table="orders", postgres_conn_id="elsewhere"), PIPELINE)
    assert report.clean and report.table == "orders"


def test_a_hostile_table_name_is_quoted(pg_url, ledger, kafka_config, orders):
    build(ledger, kafka_config, orders.sink(), windows=1)
    execute(pg_url, """CREATE SCHEMA "s%(p)s"; ALTER TABLE orders SET SCHEMA "s%(p)s";"""
                    """ ALTER TABLE "s%(p)s".orders RENAME TO "or%s'ders"" x; --" """)
    report = verify(ledger, kafka_config, '"s%(p)s"."or%s\'ders"" x; --"', PIPELINE)
    assert report.clean and report.totals.published_rows == 6


def test_a_recreated_topic_is_reported_not_mistaken_for_extra_rows(ledger, kafka_config, orders):
    """Records the plan names but Kafka no longer has cannot be checked: said
    loudly per range; the window's rows are not called extra for it."""

    built = build(ledger, kafka_config, orders.sink(), windows=2)
    delete_topic(kafka_config["bootstrap.servers"], built.topic)
    create_topic(kafka_config["bootstrap.servers"], built.topic, 2)
    report = verify(ledger, kafka_config, orders, PIPELINE)
    assert kinds(report) == [v.SOURCE] * 4
    r = built.plans[1].ranges[1]
    assert (f"window {built.plans[1].window.start.isoformat()}: {built.topic}[1] [{r.start_offset}, {r.end_offset}) "
            "cannot be read from Kafka, so its records cannot be checked: the log ends at offset 0 (the topic was "
            "recreated or lost data)") in str(report)
    assert [(a.kafka_records, a.published_rows, a.missing, a.extra) for a in report.windows] == [(None, 6, 0, 0)] * 2


# --------------------------------------------------------------------------- the whole table (issue 33)


def test_rows_of_another_pipeline_from_this_pipelines_topics_are_foreign(pg_url, ledger, kafka_config, orders):
    """verify reads the whole table, as its readers do: rows another pipeline id
    published (or left over) for this pipeline's source records are violations
    naming that pipeline, by lineage; rows of a pipeline with other topics are
    that pipeline's and not reported."""
    built = build(ledger, kafka_config, orders.sink())
    assert verify(ledger, kafka_config, orders, PIPELINE).clean
    execute(pg_url, "INSERT INTO orders SELECT id, value, 'elsewhere', eos_partition, eos_offset, 'other',"
                    " eos_window_start FROM orders")  # a pipeline with disjoint topics shares the table
    assert verify(ledger, kafka_config, orders, PIPELINE).clean

    w1 = built.plans[1].window.start
    copied = execute(pg_url, "INSERT INTO orders SELECT id, value, eos_topic, eos_partition, eos_offset, 'orders_copy',"
                             " eos_window_start FROM orders WHERE eos_pipeline = %s AND eos_window_start = %s"
                             " RETURNING eos_topic, eos_partition, eos_offset", (PIPELINE, w1))
    report = verify(ledger, kafka_config, orders, PIPELINE)
    assert not report.clean and set(kinds(report)) == {v.FOREIGN}
    foreign = [x for x in report.violations if x.kind == v.FOREIGN]
    assert sorted((x.topic, x.partition, x.offset) for x in foreign) == sorted(copied)
    assert all("pipeline 'orders_copy'" in x.message and "table orders" in x.message for x in foreign)
