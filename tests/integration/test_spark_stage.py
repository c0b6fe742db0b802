"""The stage job: read a frozen plan, transform, stage, checkpoint on Spark's job commit.

Real broker, real Spark (local[2] with up to 3 attempts per task, one JVM for the
module), real PostgreSQL. Exactness is proven by lineage: the staged and then
published rows' (topic, partition, offset) are compared with a direct
confluent-kafka read of the same log, and no row may appear twice.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import threading
import uuid
from datetime import datetime, timedelta, timezone
from decimal import Decimal

import psycopg
import pytest
from confluent_kafka import Consumer, KafkaError, Producer
from confluent_kafka import TopicPartition as KafkaTopicPartition
from psycopg import sql

from airflow_eos.core.attempt import load_checkpoint
from airflow_eos.core.errors import AttemptClosed, AttemptFenced, ConfigurationError, WindowConflict
from airflow_eos.core.ledger import Ledger
from airflow_eos.targets.postgres.target import PostgresTarget
from airflow_eos.core.windows import PartitionRange, Window, WindowPlan
from airflow_eos.spark.kafka_source import READER_KAFKA_DEFAULTS
from harness.topics import create_topic, delete_topic
from harness.spark import quiet_session

pytestmark = pytest.mark.slow

T0 = datetime(2024, 1, 1, tzinfo=timezone.utc)
WINDOW = Window("stage_test", T0, T0 + timedelta(hours=1))

GAPPY_PARTITIONS = 4
GAPPY_ROUNDS = 50  # each: plain records, then one committed transaction
GAPPY_PLAIN = 3_000
GAPPY_TXN_RECORDS = 1_000

MIXED_PARTITIONS = 2
MIXED_RECORDS = 6_000


# --------------------------------------------------------------------------- services and data


@pytest.fixture(scope="module")
def spark():
    # local[2,3]: two cores, and a failed task is retried (up to 3 attempts), as on a cluster.
    with quiet_session("eos-test-spark-stage", master="local[2,3]") as session:
        yield session


def _produce_all(producer: Producer, topic: str, records) -> None:
    for partition, key, value, headers in records:
        while True:
            try:
                producer.produce(topic, key=key, value=value, partition=partition, headers=headers)
                break
            except BufferError:
                producer.poll(0.05)


def _read_log(bootstrap: str, topic: str, partitions: int) -> dict:
    """Every record of every partition, read to end of partition: the truth.
    {partition: {offset: (key, value, timestamp_ms, headers)}, "ends": {partition: end}}"""
    consumer = Consumer({**READER_KAFKA_DEFAULTS, "bootstrap.servers": bootstrap, "group.id": "truth",
                         "enable.partition.eof": True, "enable.auto.commit": False,
                         "isolation.level": "read_committed"})
    consumer.assign([KafkaTopicPartition(topic, p, 0) for p in range(partitions)])
    log: dict = {p: {} for p in range(partitions)}
    ends: dict[int, int] = {}
    while len(ends) < partitions:
        for msg in consumer.consume(10_000, 1.0):
            if msg.error() is not None:
                assert msg.error().code() == KafkaError._PARTITION_EOF, msg.error()
                ends[msg.partition()] = msg.offset()
                continue
            log[msg.partition()][msg.offset()] = (msg.key(), msg.value(), msg.timestamp()[1], msg.headers())
    consumer.close()
    log["ends"] = ends
    return log


@pytest.fixture(scope="module")
def gappy(kafka):
    """4 partitions, 200k records: 50 rounds of 3k plain records and a committed
    transaction of 1k (a commit marker per partition after each: offsets with
    gaps all along the log, the last offset of each partition a marker).
    Returns (topic, truth)."""
    topic = f"stage-gappy-{uuid.uuid4().hex[:8]}"
    create_topic(kafka.address, topic, GAPPY_PARTITIONS)

    def record(i):
        headers = [("trace", b"t%d" % i)] if i % 50 == 0 else None
        return (i % GAPPY_PARTITIONS, None if i % 10 == 0 else b"k%d" % i,
                json.dumps({"id": i, "note": "two\nlines" if i % 7 == 0 else "x"}).encode(), headers)

    plain = Producer({"bootstrap.servers": kafka.address, "enable.idempotence": True, "linger.ms": 5})
    txn = Producer({"bootstrap.servers": kafka.address, "transactional.id": f"tx-{topic}", "linger.ms": 5})
    txn.init_transactions(15)
    i = 0
    for _ in range(GAPPY_ROUNDS):
        _produce_all(plain, topic, map(record, range(i, i + GAPPY_PLAIN)))
        assert plain.flush(30) == 0
        i += GAPPY_PLAIN
        txn.begin_transaction()
        _produce_all(txn, topic, map(record, range(i, i + GAPPY_TXN_RECORDS)))
        txn.commit_transaction(30)
        i += GAPPY_TXN_RECORDS
    truth = _read_log(kafka.address, topic, GAPPY_PARTITIONS)
    yield topic, truth
    delete_topic(kafka.address, topic)


def mixed_value(i: int) -> bytes:
    """Order i of the mixed topic; some are bad in one of three ways (see expected_kind)."""
    if i % 401 == 7:
        return b"{not json %d" % i
    return json.dumps({
        "id": i,
        "amount": None if i % 409 == 11 else f"{i % 1000}.{i % 100:02d}",
        "code": "TOOLONG" if i % 419 == 13 else f"c{i % 100}",
        "note": f"note {i}" + ("\nsecond line, \"quoted\"" if i % 3 == 0 else ""),
    }).encode()


def expected_kind(value: bytes) -> str:
    """good, or why the record is a dead letter: the transform raised, a NOT NULL
    column would be null, or the target refuses a value (varchar(4))."""
    try:
        order = json.loads(value)
    except ValueError:
        return "raised"
    if order["amount"] is None:
        return "null"
    if len(order["code"]) > 4:
        return "refused"
    return "good"


@pytest.fixture(scope="module")
def mixed(kafka):
    """2 partitions, 6000 orders, some malformed. Returns (topic, truth)."""
    topic = f"stage-mixed-{uuid.uuid4().hex[:8]}"
    create_topic(kafka.address, topic, MIXED_PARTITIONS)
    producer = Producer({"bootstrap.servers": kafka.address, "enable.idempotence": True, "linger.ms": 5})
    _produce_all(producer, topic, ((i % MIXED_PARTITIONS, b"k%d" % i, mixed_value(i), None)
                                   for i in range(MIXED_RECORDS)))
    assert producer.flush(30) == 0
    truth = _read_log(kafka.address, topic, MIXED_PARTITIONS)
    yield topic, truth
    delete_topic(kafka.address, topic)


# --------------------------------------------------------------------------- targets and ledger


RAW_DDL = """
    CREATE TABLE raw_records (
        key              bytea,
        value            bytea,
        "timestamp"      timestamptz   NOT NULL,
        headers          jsonb,
        eos_topic        text          NOT NULL,
        eos_partition    integer       NOT NULL,
        eos_offset       bigint        NOT NULL,
        eos_pipeline     text          NOT NULL,
        eos_window_start timestamptz   NOT NULL
    )
"""

ORDERS_DDL = """
    CREATE TABLE orders (
        id               bigint        NOT NULL,
        amount           numeric(12,2) NOT NULL,
        code             varchar(4),
        note             text,
        eos_topic        text          NOT NULL,
        eos_partition    integer       NOT NULL,
        eos_offset       bigint        NOT NULL,
        eos_pipeline     text          NOT NULL,
        eos_window_start timestamptz   NOT NULL
    )
"""


def execute(url, statement, params=None):
    with psycopg.connect(url, autocommit=True) as conn:
        cur = conn.execute(statement, params)
        return cur.fetchall() if cur.description else None


def freeze(url: str, plan: WindowPlan) -> None:
    ledger = Ledger(url)
    with ledger.connect() as conn, conn.transaction():
        ledger.lock_pipeline(conn, plan.pipeline)
        ledger.freeze(conn, plan, [])


def whole_plan(topic: str, truth, partitions: int) -> WindowPlan:
    return WindowPlan(WINDOW, tuple(PartitionRange(topic, p, 0, truth["ends"][p]) for p in range(partitions)))


def in_plan(truth, plan: WindowPlan) -> dict[tuple[str, int, int], tuple]:
    return {(r.topic, r.partition, o): rec for r in plan.ranges for o, rec in truth[r.partition].items()
            if r.start_offset <= o < r.end_offset}


def staged_lineage(url, attempt, dead=False) -> list[tuple]:
    table = attempt.staging + ("_dl" if dead else "")
    cols = 'topic, partition, "offset"' if dead else "eos_topic, eos_partition, eos_offset"
    return execute(url, sql.SQL("SELECT {} FROM {}").format(sql.SQL(cols), sql.Identifier("eos_staging", table)))


def staging_exists(url, attempt) -> bool:
    return execute(url, "SELECT to_regclass(%s) IS NOT NULL", (f"eos_staging.{attempt.staging}",))[0][0]


def attempt_state(url, attempt) -> str:
    return execute(url, "SELECT state FROM eos.attempts WHERE pipeline = %s AND window_start = %s AND epoch = %s",
                   (attempt.pipeline, attempt.window_start, attempt.epoch))[0][0]


def checkpoint_rows(url, attempt) -> int:
    return execute(url, "SELECT (SELECT count(*) FROM eos.checkpoint_ranges WHERE pipeline = %(p)s AND epoch = %(e)s)"
                        " + (SELECT count(*) FROM eos.checkpoint_chunks WHERE pipeline = %(p)s AND epoch = %(e)s)",
                   {"p": attempt.pipeline, "e": attempt.epoch})[0][0]


def assert_exact(rows: list[tuple], expected_keys) -> None:
    """Each expected record once, nothing else."""
    assert len(rows) == len(set(rows)), f"{len(rows) - len(set(rows))} duplicate rows"
    got = set(rows)
    expected = set(expected_keys)
    assert got == expected, (f"missing {sorted(expected - got)[:5]} ({len(expected - got)}), "
                             f"unexpected {sorted(got - expected)[:5]} ({len(got - expected)})")


# --------------------------------------------------------------------------- transforms (run in Spark workers)


def parse_orders(df):
    """Record-level: JSON orders; a record the UDF cannot parse is a dead letter."""
    from pyspark.sql import functions as F

    from airflow_eos.spark import safe_udf

    @safe_udf("id bigint, amount string, code string, note string")
    def parse(value: bytes):
        order = json.loads(value)
        return {"id": order["id"], "amount": order["amount"], "code": order["code"], "note": order["note"]}

    return (df.select(parse("value").alias("o"), "key", "value", F.col("topic").alias("eos_topic"),
                      F.col("partition").alias("eos_partition"), F.col("offset").alias("eos_offset"))
            .select("o.id", F.col("o.amount").cast("decimal(12,2)").alias("amount"), "o.code", "o.note",
                    "o.eos_error", "key", "value", "eos_topic", "eos_partition", "eos_offset"))


def failing_orders(url: str, staging: str, at: tuple[int, int], marker: str | None):
    """parse_orders whose UDF, at record ``at`` (partition, offset), waits until
    the staging holds a committed chunk of that partition (so its task fails
    mid-write, after a commit), then SIGKILLs its Python worker once (``marker``:
    a file made the first time) or, without a marker, raises every time."""
    from pyspark.sql import functions as F

    def transform(df):
        def check(partition, offset, value):
            if (partition, offset) == at:
                import signal
                import time

                import psycopg

                deadline = time.monotonic() + 60
                while time.monotonic() < deadline:
                    with psycopg.connect(url, autocommit=True) as conn:
                        if conn.execute(f'SELECT EXISTS (SELECT FROM eos_staging."{staging}"'
                                        " WHERE eos_partition = %s)", (partition,)).fetchone()[0]:
                            break
                    time.sleep(0.05)
                if marker is None:
                    raise RuntimeError(f"injected failure at offset {offset}")
                try:
                    os.close(os.open(marker, os.O_CREAT | os.O_EXCL))
                except FileExistsError:
                    return value
                os.kill(os.getpid(), signal.SIGKILL)
            return value

        checked = F.udf(check, "binary")
        return parse_orders(df.withColumn("value", checked("partition", "offset", "value")))

    return transform


# --------------------------------------------------------------------------- tests


def test_a_gappy_window_is_staged_exactly_then_published(spark, pg_url, ledger, kafka_config, gappy):
    """~190k records over 4 partitions whose offsets have gaps (transaction
    markers; ranges start on a marker and end on one), split over several read
    tasks and written in several chunks per task: staged rows == planned
    records, lineage exact, values intact; then prepare and commit publish them."""
    from airflow_eos.spark import run_stage
    from airflow_eos.spark.kafka_source import split_range

    topic, truth = gappy
    gaps = [sorted(set(range(truth["ends"][p])) - set(truth[p])) for p in range(GAPPY_PARTITIONS)]
    assert all(len(g) == GAPPY_ROUNDS and g[-1] == truth["ends"][p] - 1 for p, g in enumerate(gaps))
    plan = WindowPlan(WINDOW, (
        PartitionRange(topic, 0, gaps[0][2], truth["ends"][0]),  # starts on a marker
        PartitionRange(topic, 1, 0, gaps[1][40] + 1),  # ends right after a marker
        PartitionRange(topic, 2, 0, truth["ends"][2]),  # the whole partition, ending with a marker
        PartitionRange(topic, 3, 1_234, truth["ends"][3]),
    ))
    expected = in_plan(truth, plan)
    assert 180_000 < len(expected) < plan.max_records
    execute(pg_url, RAW_DDL)
    freeze(pg_url, plan)
    target = PostgresTarget(pg_url, "raw_records").sink()
    attempt = target.begin(plan.window)

    report = run_stage(spark, plan, attempt, target, kafka_config, max_records_per_task=30_000,
                       rows_per_chunk=20_000)

    assert report.records_read == report.rows_staged == len(expected)
    assert report.dead_letters == 0
    assert [(r.partition, r.start_offset, r.end_offset) for r in report.consumed] == \
           [(r.partition, r.start_offset, r.end_offset) for r in plan.ranges]
    for r in report.consumed:  # exact record counts per partition, gaps excluded
        assert r.records == sum(1 for (_, p, _) in expected if p == r.partition)
    tasks = sum(len(split_range(r, 30_000)) for r in plan.ranges)
    assert report.read_tasks == tasks == 8  # ranges split over several read tasks
    assert report.chunks > tasks  # several chunks per write task
    assert_exact(staged_lineage(pg_url, attempt), expected)
    assert execute(pg_url, "SELECT count(*) FROM eos.read_ranges")[0][0] == tasks

    assert target.prepare(attempt).prepared
    result = target.commit(attempt)
    assert result.published_rows == len(expected)
    published = execute(pg_url, "SELECT eos_topic, eos_partition, eos_offset, key, value,"
                                " (extract(epoch from \"timestamp\") * 1000)::bigint, headers FROM raw_records")
    assert_exact([r[:3] for r in published], expected)
    for t, p, o, key, value, ts, headers in published:
        k, v, ts_ms, h = expected[(t, p, o)]
        assert (key, value, ts) == (k, v, ts_ms)
        assert (headers is None) == (h is None)
        if h:
            assert [(x["key"], x["value"]) for x in headers] == [(hk, base64.b64encode(hv).decode()) for hk, hv in h]


def test_bad_records_become_dead_letters_with_offsets_and_the_rest_is_staged(spark, pg_url, ledger, kafka_config,
                                                                             mixed):
    """A transform that raises for some records (safe_udf), rows null in a NOT NULL
    column, and values the target refuses (too long for varchar(4), some rows
    with newlines in a value): each becomes a dead letter with its offset and
    error; every other record is staged; all is published with the window."""
    from airflow_eos.spark import run_stage

    topic, truth = mixed
    plan = whole_plan(topic, truth, MIXED_PARTITIONS)
    records = in_plan(truth, plan)
    kinds = {k: expected_kind(rec[1]) for k, rec in records.items()}
    by_kind = {kind: {k for k, v in kinds.items() if v == kind} for kind in ("good", "raised", "null", "refused")}
    assert all(len(v) >= 10 for v in by_kind.values()), {k: len(v) for k, v in by_kind.items()}
    execute(pg_url, ORDERS_DDL)
    freeze(pg_url, plan)
    target = PostgresTarget(pg_url, "orders").sink()
    attempt = target.begin(plan.window)

    report = run_stage(spark, plan, attempt, target, kafka_config, parse_orders, max_records_per_task=1_000,
                       max_bad_records=1_000)

    bad = len(records) - len(by_kind["good"])
    assert (report.records_read, report.rows_staged, report.dead_letters) == (len(records), len(by_kind["good"]), bad)
    assert_exact(staged_lineage(pg_url, attempt), by_kind["good"])
    assert_exact(staged_lineage(pg_url, attempt, dead=True), records.keys() - by_kind["good"])

    assert target.prepare(attempt).prepared
    result = target.commit(attempt)
    assert (result.published_rows, result.dead_letter_rows) == (len(by_kind["good"]), bad)
    dead = {(t, p, o): (error, key, value) for t, p, o, error, key, value in execute(
        pg_url, 'SELECT topic, partition, "offset", error, key, value FROM eos.dead_letters')}
    assert dead.keys() == records.keys() - by_kind["good"]
    for k in by_kind["raised"]:
        error, key, value = dead[k]
        assert error.startswith("JSONDecodeError: "), error
        assert (key, value) == records[k][:2]  # the raw record is kept
    for k in by_kind["null"]:
        assert dead[k][0] == "null in column amount, which is NOT NULL in orders"
    for k in by_kind["refused"]:
        assert dead[k][0] == ('orders refused the row: value too long for type character varying(4) '
                              '(column code: "TOOLONG")'), dead[k]
        assert dead[k][1:] == records[k][:2]  # the raw record is kept, read back from Kafka by its offset
    published = execute(pg_url, "SELECT eos_topic, eos_partition, eos_offset, id, amount, code, note FROM orders")
    assert_exact([r[:3] for r in published], by_kind["good"])
    for t, p, o, id_, amount, code, note in published:
        order = json.loads(records[(t, p, o)][1])
        assert (id_, amount, code, note) == (order["id"], Decimal(order["amount"]), order["code"], order["note"])


def test_more_dead_letters_than_allowed_fail_clearly_and_leave_no_checkpoint(spark, pg_url, ledger, kafka_config,
                                                                            mixed):
    """Over max_bad_records in all (checked at the job commit) or in one write
    task (that task fails at once): a clear error naming the count and the first
    offsets; no checkpoint; the attempt aborted and its staging dropped."""
    from airflow_eos.spark import StageFailed, run_stage

    topic, truth = mixed
    plan = whole_plan(topic, truth, MIXED_PARTITIONS)
    records = in_plan(truth, plan)
    bad = sorted(k for k, rec in records.items() if expected_kind(rec[1]) != "good")
    per_partition = max(sum(1 for k in bad if k[1] == p) for p in range(MIXED_PARTITIONS))
    execute(pg_url, ORDERS_DDL)
    freeze(pg_url, plan)
    target = PostgresTarget(pg_url, "orders").sink()
    for limit, where in ((per_partition, "the job dead-lettered"), (3, "this write task dead-lettered")):
        attempt = target.begin(plan.window)
        with pytest.raises(StageFailed) as failure:
            run_stage(spark, plan, attempt, target, kafka_config, parse_orders, max_bad_records=limit,
                      max_records_per_task=10_000)
        message = str(failure.value)
        assert failure.value.error == "TooManyBadRecords"
        assert f"more than max_bad_records={limit}" in message and where in message, message
        if where.startswith("the job"):
            assert f"dead-lettered {len(bad)} records" in message
            t, p, o = bad[0]
            assert f"{t}[{p}] offset {o}: " in message, message  # the first dead letter
        assert "attempt aborted, staging dropped" in message
        assert attempt_state(pg_url, attempt) == "aborted"
        assert not staging_exists(pg_url, attempt)
        assert checkpoint_rows(pg_url, attempt) == 0
        with pytest.raises(AttemptClosed):
            target.prepare(attempt)


def test_a_task_failing_mid_write_aborts_the_attempt_and_a_rerun_stages_fully(spark, pg_url, ledger, kafka_config,
                                                                              mixed, tmp_path):
    """A task that raises after its writer committed a chunk, on every try: Spark
    aborts the write, no checkpoint, the attempt is aborted and its staging
    dropped. The rerun (a new attempt, as the operator's retry opens) stages and
    publishes every record exactly once."""
    from airflow_eos.spark import StageFailed, run_stage

    topic, truth = mixed
    plan = whole_plan(topic, truth, MIXED_PARTITIONS)
    records = in_plan(truth, plan)
    good = {k for k, rec in records.items() if expected_kind(rec[1]) == "good"}
    execute(pg_url, ORDERS_DDL)
    freeze(pg_url, plan)
    target = PostgresTarget(pg_url, "orders").sink()
    attempt = target.begin(plan.window)
    last = (1, truth["ends"][1] - 1)
    batch_rows = spark.conf.get("spark.sql.execution.arrow.maxRecordsPerBatch")
    spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", "200")  # writers see input in small batches
    try:
        with pytest.raises(StageFailed) as failure:
            run_stage(spark, plan, attempt, target, kafka_config,
                      failing_orders(pg_url, attempt.staging, last, marker=None),
                      max_bad_records=1_000, rows_per_chunk=200)
    finally:
        spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", batch_rows)
    assert f"RuntimeError: injected failure at offset {last[1]}" in str(failure.value)
    assert "attempt aborted, staging dropped" in str(failure.value)
    assert attempt_state(pg_url, attempt) == "aborted"
    assert not staging_exists(pg_url, attempt)
    assert checkpoint_rows(pg_url, attempt) == 0

    rerun = target.begin(plan.window)
    report = run_stage(spark, plan, rerun, target, kafka_config, parse_orders, max_bad_records=1_000)
    assert report.rows_staged == len(good)
    assert target.prepare(rerun).prepared
    assert target.commit(rerun).published_rows == len(good)
    assert_exact(execute(pg_url, "SELECT eos_topic, eos_partition, eos_offset FROM orders"), good)


def test_a_killed_task_is_retried_and_the_chunks_it_committed_are_never_published(spark, pg_url, ledger, kafka_config,
                                                                                  mixed, tmp_path):
    """A task whose Python worker is killed (SIGKILL) after its writer committed a
    chunk; Spark retries it and the job succeeds. The dead task's committed
    chunk stays in the staging but not in the checkpoint: each record is
    published once."""
    from airflow_eos.spark import run_stage

    topic, truth = mixed
    plan = whole_plan(topic, truth, MIXED_PARTITIONS)
    records = in_plan(truth, plan)
    good = {k for k, rec in records.items() if expected_kind(rec[1]) == "good"}
    execute(pg_url, ORDERS_DDL)
    freeze(pg_url, plan)
    target = PostgresTarget(pg_url, "orders").sink()
    attempt = target.begin(plan.window)
    marker = tmp_path / "killed-once"
    batch_rows = spark.conf.get("spark.sql.execution.arrow.maxRecordsPerBatch")
    spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", "200")
    try:
        report = run_stage(spark, plan, attempt, target, kafka_config,
                           failing_orders(pg_url, attempt.staging, (0, truth["ends"][0] - 1), str(marker)),
                           max_bad_records=1_000, rows_per_chunk=200)
    finally:
        spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", batch_rows)
    assert marker.exists()  # the kill happened
    assert report.rows_staged == len(good)
    staged = target.count_staged(attempt)
    with psycopg.connect(pg_url) as conn:
        checkpointed = {c.chunk for c in load_checkpoint(conn, attempt).chunks}
    orphans = staged.keys() - checkpointed
    assert orphans, "the killed task should have left a committed chunk behind"
    assert sum(staged[c][0] for c in checkpointed) == len(good)
    assert target.prepare(attempt).prepared
    assert target.commit(attempt).published_rows == len(good)
    assert_exact(execute(pg_url, "SELECT eos_topic, eos_partition, eos_offset FROM orders"), good)


@pytest.mark.parametrize("reader", ["python", "spark"])
def test_two_attempts_staged_concurrently_only_the_newer_can_be_prepared(spark, pg_url, ledger, kafka_config, mixed,
                                                                        reader):
    """Attempt 1 starts; attempt 2 of the same window is opened (fencing 1) while 1
    is still staging; both jobs run at once. Attempt 1's job commit is refused
    (fenced), its staging dropped; attempt 2 is checkpointed, prepared and
    committed; only its rows are published. With either reader: the eos_kafka
    read tasks of attempt 1 report what they read before its job commit is
    refused; with Spark's source, its job commit is refused before it records
    its chunks for the driver's checkpoint."""
    from airflow_eos.spark import StageFailed, run_stage

    topic, truth = mixed
    plan = whole_plan(topic, truth, MIXED_PARTITIONS)
    good = {k for k, rec in in_plan(truth, plan).items() if expected_kind(rec[1]) == "good"}
    execute(pg_url, ORDERS_DDL)
    freeze(pg_url, plan)
    target = PostgresTarget(pg_url, "orders").sink()
    older = target.begin(plan.window)
    older_checked, newer_opened = threading.Event(), threading.Event()
    outcomes: dict[str, object] = {}

    def held_until_newer(df):
        # run_stage calls the transform after checking its attempt is current:
        # hold attempt 1 there until attempt 2 is opened.
        older_checked.set()
        assert newer_opened.wait(60)
        return parse_orders(df)

    def stage(name, attempt, transform):
        try:
            outcomes[name] = run_stage(spark, plan, attempt, target, kafka_config, transform, max_bad_records=1_000,
                                       reader=reader)
        except Exception as exc:  # noqa: BLE001 - the outcome is what the test checks
            outcomes[name] = exc

    first = threading.Thread(target=stage, args=("older", older, held_until_newer))
    first.start()
    assert older_checked.wait(60)
    newer = target.begin(plan.window)
    newer_opened.set()
    second = threading.Thread(target=stage, args=("newer", newer, parse_orders))
    second.start()
    first.join(180)
    second.join(180)

    assert isinstance(outcomes["older"], StageFailed), outcomes["older"]
    assert outcomes["older"].error == "AttemptFenced", str(outcomes["older"])[:3000]
    assert f"attempt {newer.epoch} of the window was opened after it" in str(outcomes["older"])
    if reader == "python":
        assert execute(pg_url, "SELECT count(*) FROM eos.read_ranges WHERE epoch = %s", (older.epoch,))[0][0] > 0
    else:
        assert execute(pg_url, "SELECT count(*) FROM eos.checkpoint_chunks WHERE epoch = %s", (older.epoch,)) == [(0,)]
    assert attempt_state(pg_url, older) == "aborted" and not staging_exists(pg_url, older)
    assert outcomes["newer"].rows_staged == len(good)
    with pytest.raises((AttemptFenced, AttemptClosed)):
        target.prepare(older)
    assert target.prepare(newer).prepared
    assert target.commit(newer).published_rows == len(good)
    assert_exact(execute(pg_url, "SELECT eos_topic, eos_partition, eos_offset FROM orders"), good)


def test_what_cannot_be_staged_is_refused_before_any_spark_work(spark, pg_url, ledger, kafka_config, mixed):
    """A plan that differs from the frozen one, a fenced attempt, a transform
    whose output does not fit the target: clear errors before a Spark job runs.
    A transform's failure aborts its attempt (nothing was staged)."""
    from pyspark.sql import functions as F

    from airflow_eos.spark import run_stage

    topic, truth = mixed
    plan = whole_plan(topic, truth, MIXED_PARTITIONS)
    execute(pg_url, ORDERS_DDL)
    freeze(pg_url, plan)
    target = PostgresTarget(pg_url, "orders").sink()
    older = target.begin(plan.window)
    attempt = target.begin(plan.window)

    other = WindowPlan(WINDOW, (PartitionRange(topic, 0, 0, 10),))
    with pytest.raises(WindowConflict, match="differs from its frozen plan"):
        run_stage(spark, other, attempt, target, kafka_config, parse_orders)
    with pytest.raises(AttemptFenced):
        run_stage(spark, plan, older, target, kafka_config, parse_orders)
    assert attempt_state(pg_url, attempt) == "open"

    def extra_column(df):
        return parse_orders(df).withColumn("surprise", F.lit(1))

    with pytest.raises(ConfigurationError, match=r"columns \['surprise'\] that target orders does not stage"):
        run_stage(spark, plan, attempt, target, kafka_config, extra_column)
    assert attempt_state(pg_url, attempt) == "aborted" and not staging_exists(pg_url, attempt)

    attempt = target.begin(plan.window)
    with pytest.raises(ConfigurationError, match=r"lacks columns \['note'\]"):
        run_stage(spark, plan, attempt, target, kafka_config, lambda df: parse_orders(df).drop("note"))
    attempt = target.begin(plan.window)
    with pytest.raises(ConfigurationError, match="column 'eos_error' must be a string"):
        run_stage(spark, plan, attempt, target, kafka_config,
                  lambda df: parse_orders(df).withColumn("eos_error", F.lit(1)))
    attempt = target.begin(plan.window)
    with pytest.raises(ConfigurationError, match="cannot import 'no_such_module'"):
        run_stage(spark, plan, attempt, target, kafka_config, "no_such_module:transform")


EXAMPLE_ORDERS = [  # value -> (order_id, customer, amount, dead letter reason or None)
    (b'{"order_id": "a", "customer": "c", "amount": 12.95}', ("a", "c", Decimal("12.95"), None)),
    (b'{"order_id": "b", "amount": "7.5"}', ("b", None, Decimal("7.50"), None)),  # a numeric string is a number
    (b'{"order_id": "f", "amount": 0.125}', ("f", None, Decimal("0.13"), None)),  # rounded half up, no double
    (b'{"order_id": "h", "amount": 9999999999.99}', ("h", None, Decimal("9999999999.99"), None)),  # decimal(12,2)'s max
    (b'{"order_id": "i", "amount": 10000000000}', ("i", None, None, "malformed order: amount not a number or out of range")),
    (b'{malformed', (None, None, None, "malformed order: not JSON or no order_id")),
    (b'[1, 2]', (None, None, None, "malformed order: not JSON or no order_id")),
    (b'{"order_id": null, "amount": 1}', (None, None, Decimal("1.00"), "malformed order: not JSON or no order_id")),
    (b'\xff\xfe', (None, None, None, "malformed order: not JSON or no order_id")),
    (b'{"order_id": "c", "customer": 5}', ("c", "5", None, "malformed order: no amount")),
    (b'{"order_id": "d", "amount": "abc"}', ("d", None, None, "malformed order: amount not a number or out of range")),
    (b'{"order_id": "e", "amount": 1e30}', ("e", None, None, "malformed order: amount not a number or out of range")),
    (b'{"order_id": "g", "amount": {"x": 1}}', ("g", None, None, "malformed order: amount not a number or out of range")),
]


def test_the_example_orders_transform_keeps_every_record_as_an_order_or_a_dead_letter(spark):
    """The transform of the example DAGs and the benchmark (json_tuple, amount
    from its JSON text to decimal): one output row per record, with lineage; a
    record that is not an order is a dead letter with its reason, never dropped."""
    from airflow_eos.examples.transforms import orders
    from airflow_eos.spark.kafka_source import KAFKA_SCHEMA

    records = [(b"k", value, "orders", 3, offset, datetime(2026, 1, 1), 0, None)
               for offset, (value, _) in enumerate(EXAMPLE_ORDERS)]
    out = orders(spark.createDataFrame(records, KAFKA_SCHEMA)).collect()
    assert sorted(r.eos_offset for r in out) == list(range(len(EXAMPLE_ORDERS)))  # nothing dropped, nothing added
    for row in out:
        value, expected = EXAMPLE_ORDERS[row.eos_offset]
        assert (row.order_id, row.customer, row.amount, row.eos_error) == expected, value
        assert (row.eos_topic, row.eos_partition, row.key, row.value) == ("orders", 3, b"k", value)


def test_job_commit_refuses_a_read_that_does_not_cover_the_plan(pg_url, ledger):
    """The checkpoint's consumed ranges come from the read reports: a sub-range
    never reported (its task did not finish reading) or a partition short of its
    end cut fails the job commit, and nothing is checkpointed."""
    from airflow_eos.core.attempt import StagedChunk
    from airflow_eos.core.errors import InvalidCheckpoint
    from airflow_eos.spark.kafka_source import KafkaRangePartition, ReadStats
    from airflow_eos.spark.layout import Layout
    from airflow_eos.spark.stage_settings import StageSettings, report_options, report_read
    from airflow_eos.spark.stager import StagedTask
    from airflow_eos.spark.staging_source import commit_stage

    plan = WindowPlan(WINDOW, (PartitionRange("t", 0, 0, 300), PartitionRange("t", 1, 10, 20)))
    execute(pg_url, ORDERS_DDL)
    freeze(pg_url, plan)
    target = PostgresTarget(pg_url, "orders").sink()
    attempt = target.begin(plan.window)
    settings = StageSettings(target, attempt, plan, "run1", Layout(("id",)), max_bad_records=0)
    options = report_options(pg_url, attempt, "run1")
    messages = [StagedTask((StagedChunk(1, 0, 0, "0" * 32),), 0, 0, 0, (), 0.0, 0.0)]

    def read(partition, start, end, records):
        report_read(options, KafkaRangePartition("t", partition, start, end), ReadStats(records=records))

    read(0, 0, 100, 90)
    read(0, 200, 300, 100)  # [100, 200) never reported
    read(1, 10, 20, 10)
    read(1, 10, 20, 10)  # a retried task reports the same again: harmless
    with pytest.raises(InvalidCheckpoint, match=r"t\[0\]: consumed ranges \[0, 100\) and \[200, 300\) leave a gap"):
        commit_stage(settings, messages)
    read(0, 100, 200, 100)
    with pytest.raises(InvalidCheckpoint, match="changed under a frozen plan"):
        read(0, 100, 200, 99)  # a second read of the same range must find the same records
    execute(pg_url, "DELETE FROM eos.read_ranges WHERE partition = 1")
    with pytest.raises(InvalidCheckpoint,
                       match=r"did not read its plan completely, no checkpoint written:\n  t\[1\]: planned \[10, 20\)"):
        commit_stage(settings, messages)
    assert checkpoint_rows(pg_url, attempt) == 0
    read(1, 10, 20, 10)
    checkpoint = commit_stage(settings, messages)
    assert [(r.partition, r.start_offset, r.end_offset, r.records) for r in checkpoint.ranges] == \
           [(0, 0, 300, 290), (1, 10, 20, 10)]
    assert attempt_state(pg_url, attempt) == "checkpointed"


@pytest.mark.parametrize("reader", ["python", "spark"])
def test_spark_submit_runs_the_job_with_the_operators_contract(pg_url, ledger, kafka_config, kafka, tmp_path, reader):
    """The stage operator's way: ``spark-submit --master local[2] --jars CONNECTOR job.py``
    with the arguments and environment of airflow_eos.spark.submit, the example DAG's
    transform and table. Exit 0 with the checkpoint written (by the job commit
    after the eos_kafka source's read; by the driver after the job with Spark's
    own source), then prepare and commit publish the orders and dead-letter the
    malformed ones. A window with more bad records than allowed exits 1 with a
    clear message."""
    from airflow_eos.examples.transforms import ORDERS_TABLE_DDL
    from airflow_eos.spark.connector import kafka_connector_jars
    from airflow_eos.spark.submit import stage_job_arguments, stage_job_environment, stage_job_path

    topic = f"stage-submit-{uuid.uuid4().hex[:8]}"
    create_topic(kafka.address, topic, 2)
    producer = Producer({"bootstrap.servers": kafka.address, "linger.ms": 5})

    def order(i):
        if i % 100 == 42:
            return b"not an order"
        return json.dumps({"order_id": f"o{i}", "customer": f"c{i % 7}", "amount": i / 4}).encode()

    _produce_all(producer, topic, ((i % 2, b"k%d" % i, order(i), None) for i in range(4_000)))
    assert producer.flush(30) == 0
    truth = _read_log(kafka.address, topic, 2)
    plan = whole_plan(topic, truth, 2)
    records = in_plan(truth, plan)
    malformed = {k for k, rec in records.items() if rec[1] == b"not an order"}
    execute(pg_url, ORDERS_TABLE_DDL)
    freeze(pg_url, plan)
    # The test server trusts every client, so a password in the URL is ignored;
    # it must still never reach the job's output.
    password = "s3cret-pw"
    spec = PostgresTarget(pg_url.replace("postgres@", f"postgres:{password}@", 1), "analytics.orders")
    target = spec.sink()

    def submit(attempt, max_bad_records):
        env = {**os.environ, **stage_job_environment(spec, kafka_config, local=True),
               "PYSPARK_DRIVER_PYTHON": sys.executable}
        spark_submit = os.path.join(os.path.dirname(sys.executable), "spark-submit")
        return subprocess.run(
            [spark_submit, "--master", "local[2]", "--conf", "spark.ui.enabled=false",
             "--jars", ",".join(kafka_connector_jars()), stage_job_path(),
             *stage_job_arguments(plan, attempt, max_records_per_task=1000, max_bad_records=max_bad_records,
                                  transform="airflow_eos.examples.transforms:orders", reader=reader)],
            capture_output=True, text=True, timeout=240, env=env,
        )

    attempt = target.begin(plan.window)
    proc = submit(attempt, max_bad_records=len(malformed))
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-5000:]
    [line] = [x for x in proc.stdout.splitlines() if x.startswith("EOS_STAGE_REPORT ")]
    report = json.loads(line.removeprefix("EOS_STAGE_REPORT "))
    assert (report["records_read"], report["rows_staged"], report["dead_letters"]) == \
           (len(records), len(records) - len(malformed), len(malformed))
    assert report["read_tasks"] == 4
    wrote = "job commit wrote the checkpoint" if reader == "python" else "the driver wrote the checkpoint"
    for progress in ("planned " + topic, "records read by 4 read task(s)", wrote,
                     f"read {topic}[1] [0, 2000): 2000 records"):
        assert progress in output, progress  # progress reaches the job's log
    assert password not in output
    assert target.prepare(attempt).prepared
    result = target.commit(attempt)
    assert (result.published_rows, result.dead_letter_rows) == (len(records) - len(malformed), len(malformed))
    assert_exact(execute(pg_url, "SELECT eos_topic, eos_partition, eos_offset FROM analytics.orders"),
                 records.keys() - malformed)
    assert_exact(execute(pg_url, 'SELECT topic, partition, "offset" FROM eos.dead_letters'), malformed)

    failing = target.begin(plan.window)
    proc = submit(failing, max_bad_records=len(malformed) - 1)
    # spark-submit passes on the Python driver's stderr as its own stdout.
    output = proc.stdout + proc.stderr
    assert proc.returncode == 1, output[-5000:]
    assert f"stage job failed: the stage job of {failing} failed (attempt aborted, staging dropped): " \
           f"TooManyBadRecords: {failing}: the job dead-lettered {len(malformed)} records, more than " \
           f"max_bad_records={len(malformed) - 1}" in output, output[-5000:]
    assert attempt_state(pg_url, failing) == "aborted"
    delete_topic(kafka.address, topic)


def test_a_failed_stage_job_is_reported_by_the_operator_with_the_jobs_error_first(pg_url, ledger, kafka,
                                                                                     topics, monkeypatch):
    """The stage operator through spark-submit, with a transform that loads on
    the worker but fails in the job: the task's exception starts with the job's
    own error; spark-submit's command line and exit code come after it."""
    from airflow.sdk import DAG
    from airflow.sdk.exceptions import AirflowException

    from airflow_eos.core.source import KafkaSource
    from airflow_eos.examples.transforms import ORDERS_TABLE_DDL
    from airflow_eos.operators.eos import EosSparkStageOperator

    topic = topics.create(partitions=1)
    topics.produce(topic, [(0, 1_700_000_000_000, b'{"order_id": "o1"}')] * 3)
    plan = WindowPlan(WINDOW, (PartitionRange(topic, 0, 0, 3),))
    execute(pg_url, ORDERS_TABLE_DDL)
    freeze(pg_url, plan)
    host, port = pg_url.split("@", 1)[1].split("/", 1)[0].split(":")
    monkeypatch.setenv("AIRFLOW_CONN_EOS_PG", json.dumps({"conn_type": "postgres", "host": host, "port": int(port),
                                                          "login": "postgres", "schema": pg_url.rsplit("/", 1)[1]}))
    monkeypatch.setenv("AIRFLOW_CONN_EOS_KAFKA", json.dumps({"conn_type": "kafka",
                                                             "extra": {"bootstrap.servers": kafka.address}}))
    monkeypatch.setenv("AIRFLOW_CONN_EOS_SPARK", json.dumps({"conn_type": "spark", "host": "local[2]"}))
    with DAG("stage_failure", schedule=None, start_date=T0):
        stage = EosSparkStageOperator(
            task_id="stage", plan=plan.to_dict(), source=KafkaSource([topic], kafka_conn_id="eos_kafka"),
            target=PostgresTarget(table="analytics.orders", postgres_conn_id="eos_pg"),
            transform="json:dumps", conn_id="eos_spark")  # callable, but not DataFrame -> DataFrame
    with pytest.raises(AirflowException) as caught:
        stage.execute(context={})
    headline, *rest = str(caught.value).splitlines()
    assert headline == "TypeError: Object of type DataFrame is not JSON serializable", caught.value
    assert "spark-submit of the stage job of" in rest[0] and "Cannot execute: spark-submit" in "\n".join(rest)
    assert execute(pg_url, "SELECT state FROM eos.attempts") == [("aborted",)]


def test_refused_rows_are_found_from_the_copy_line_even_across_multiline_values(pg_url, ledger):
    """Without Spark: a write task's input with values spanning several lines
    (the first row too, which PostgreSQL counts differently) and two rows the
    target refuses without naming a column (a NUL byte: the line's encoding is
    refused; a refused column is isolated by one check instead, see below). The
    refused rows are found from the COPY's line number at the first try (three
    chunks: before, between and after them), become dead letters with their
    lineage, and every other row is staged once. The ids are text, which has no
    exact binary form for bigint: the chunk is a CSV COPY (in binary a NUL is
    refused on its column: test_stage_binary_copy.py)."""
    import pyarrow as pa

    from airflow_eos.spark.layout import Layout
    from airflow_eos.spark.stage_settings import StageSettings
    from airflow_eos.spark.stager import TaskStager

    plan = WindowPlan(WINDOW, (PartitionRange("t", 0, 0, 200),))
    execute(pg_url, ORDERS_DDL)
    freeze(pg_url, plan)
    target = PostgresTarget(pg_url, "orders").sink()
    attempt = target.begin(plan.window)
    staged = target.writer(attempt).columns
    refused = {37, 105}

    def batch(offsets):
        return pa.record_batch({
            "id": pa.array([str(o) for o in offsets]),
            "amount": pa.array([Decimal(o) / 4 for o in offsets], pa.decimal128(12, 2)),
            "code": pa.array([f"c{o}" for o in offsets]),
            "note": pa.array([f"note {o}" + "\nmore, \"quoted\"\n" * (o % 3) + ("\x00" if o in refused else "")
                              for o in offsets]),
            "eos_topic": pa.array(["t"] * len(offsets)),
            "eos_partition": pa.array([0] * len(offsets), pa.int32()),
            "eos_offset": pa.array(offsets, pa.int64()),
        })

    batches = [batch(list(range(0, 100))), batch(list(range(100, 200)))]
    assert batches[0].column("note")[0].as_py().count("\n") == 0 and batches[0].column("note")[2].as_py().count("\n")
    settings = StageSettings(target, attempt, plan, "run1", Layout(tuple(staged), None, tuple(
        ["eos_topic", "eos_partition", "eos_offset"]), None), max_bad_records=2)
    result = TaskStager(settings, iter(batches)).run()

    assert (result.rows, result.dead_letters, result.refused) == (198, 2, 2)
    assert len(result.chunks) == 3, result.chunks  # no halving: each refused row found at once
    assert_exact(staged_lineage(pg_url, attempt), {("t", 0, o) for o in range(200)} - {("t", 0, o) for o in refused})
    dead = execute(pg_url, sql.SQL('SELECT "offset", error FROM {}').format(
        sql.Identifier("eos_staging", attempt.staging + "_dl")))
    assert sorted(o for o, _ in dead) == sorted(refused)
    assert all(e == 'orders refused the row: invalid byte sequence for encoding "UTF8": 0x00' for _, e in dead), dead
    notes = dict(execute(pg_url, sql.SQL("SELECT id, note FROM {}").format(
        sql.Identifier("eos_staging", attempt.staging))))
    assert notes[2] == "note 2" + "\nmore, \"quoted\"\n" * 2


ITEMS_DDL = """
    CREATE TABLE items (
        qty              integer,
        code             varchar(4),
        eos_topic        text          NOT NULL,
        eos_partition    integer       NOT NULL,
        eos_offset       bigint        NOT NULL,
        eos_pipeline     text          NOT NULL,
        eos_window_start timestamptz   NOT NULL
    )
"""


def test_refused_values_are_isolated_per_column_not_per_row(pg_url, ledger, kafka_config, kafka):
    """Without Spark: one write task's 10,000 rows of which the target refuses
    2,000 values of qty (integer) and 100 of code (varchar(4)), in other rows.
    Each refused column costs one check on the server and one more COPY, not a
    COPY per row: 3 COPYs, 2 checks, one chunk. Exactly the refused rows are dead
    letters, with the error naming the column and value, and with their
    record's key and value (read back from Kafka by lineage); every other row
    is staged once."""
    import pyarrow as pa

    from airflow_eos.spark.layout import Layout
    from airflow_eos.spark.stage_settings import StageSettings
    from airflow_eos.spark.stager import TaskStager

    topic = f"stage-items-{uuid.uuid4().hex[:8]}"
    create_topic(kafka.address, topic, 1)
    producer = Producer({"bootstrap.servers": kafka.address, "linger.ms": 5})
    _produce_all(producer, topic, ((0, b"k%d" % i, b"v%d" % i, None) for i in range(10_000)))
    assert producer.flush(30) == 0
    truth = _read_log(kafka.address, topic, 1)
    plan = whole_plan(topic, truth, 1)
    records = in_plan(truth, plan)
    assert len(records) == 10_000
    bad_qty = {o for o in range(10_000) if o % 5 == 3}
    bad_code = {o for o in range(10_000) if o % 100 == 1}
    execute(pg_url, ITEMS_DDL)
    freeze(pg_url, plan)
    target = PostgresTarget(pg_url, "items").sink()
    attempt = target.begin(plan.window)

    def batch(offsets):
        return pa.record_batch({
            "qty": pa.array([f"x{o}" if o in bad_qty else str(o) for o in offsets]),
            "code": pa.array(["TOOLONG" if o in bad_code else f"c{o % 100}" for o in offsets]),
            "eos_topic": pa.array([topic] * len(offsets)),
            "eos_partition": pa.array([0] * len(offsets), pa.int32()),
            "eos_offset": pa.array(offsets, pa.int64()),
        })

    settings = StageSettings(target, attempt, plan, "run1", Layout(
        tuple(target.writer(attempt).columns), None, ("eos_topic", "eos_partition", "eos_offset"), None),
        max_bad_records=3_000, kafka_config=kafka_config)
    result = TaskStager(settings, iter([batch(list(range(i, i + 1_000))) for i in range(0, 10_000, 1_000)])).run()

    refused = bad_qty | bad_code
    assert (result.rows, result.dead_letters, result.refused) == (10_000 - len(refused), len(refused), len(refused))
    assert (result.copies, result.column_checks, len(result.chunks)) == (3, 2, 1)
    assert_exact(staged_lineage(pg_url, attempt), {(topic, 0, o) for o in range(10_000)} - {
        (topic, 0, o) for o in refused})
    dead = execute(pg_url, sql.SQL('SELECT topic, partition, "offset", error, key, value FROM {}').format(
        sql.Identifier("eos_staging", attempt.staging + "_dl")))
    assert_exact([d[:3] for d in dead], {(topic, 0, o) for o in refused})
    for t, p, o, error, key, value in dead:
        assert (key, value) == records[(t, p, o)][:2]
        if o in bad_qty:
            assert error == f'items refused the row: invalid input syntax for type integer: "x{o}" (column qty: "x{o}")'
        else:
            assert error == ('items refused the row: value too long for type character varying(4) '
                             '(column code: "TOOLONG")'), error
    delete_topic(kafka.address, topic)


def test_a_column_the_target_refuses_for_every_row_fails_the_stage(spark, pg_url, ledger, kafka_config, mixed):
    """A table whose column has the wrong type (code integer; the transform gives
    text): with max_bad_records above the window's records (as the example DAG's
    1,000), every record used to become a dead letter and the window committed
    with 0 rows. Now the stage fails, naming the table, the column, both types,
    a sample value and what to do; the attempt is aborted, nothing checkpointed,
    nothing published, no dead letter. A window of one record whose value is
    refused still stages it as a dead letter (with its key and value)."""
    from airflow_eos.spark import StageFailed, run_stage

    topic, truth = mixed
    plan = WindowPlan(WINDOW, tuple(PartitionRange(topic, p, 0, 400) for p in range(MIXED_PARTITIONS)))
    execute(pg_url, ORDERS_DDL.replace("varchar(4)", "integer"))
    freeze(pg_url, plan)
    target = PostgresTarget(pg_url, "orders").sink()
    attempt = target.begin(plan.window)

    with pytest.raises(StageFailed) as failure:
        run_stage(spark, plan, attempt, target, kafka_config, parse_orders, max_bad_records=1_000)

    message = str(failure.value)
    assert failure.value.error == "TargetError", message[:3000]
    assert "target table orders refuses column 'code' for every row: it is integer there, and the transform's " \
           "output gives string values the type cannot take (e.g. \"c" in message, message[:3000]
    assert "invalid input syntax for type integer" in message
    assert "fix the transform (make code integer) or the table's column, then clear the window's run" in message
    assert "attempt aborted, staging dropped" in message
    assert attempt_state(pg_url, attempt) == "aborted" and not staging_exists(pg_url, attempt)
    assert checkpoint_rows(pg_url, attempt) == 0
    with pytest.raises(AttemptClosed):
        target.prepare(attempt)
    assert execute(pg_url, "SELECT count(*) FROM orders")[0][0] == 0
    assert execute(pg_url, "SELECT count(*) FROM eos.dead_letters")[0][0] == 0

    one = WindowPlan(Window("stage_one", T0, T0 + timedelta(hours=1)), (PartitionRange(topic, 0, 0, 1),))
    freeze(pg_url, one)
    attempt = target.begin(one.window)
    report = run_stage(spark, one, attempt, target, kafka_config, parse_orders, max_bad_records=1)
    assert (report.rows_staged, report.dead_letters) == (0, 1)
    assert target.prepare(attempt).prepared
    target.commit(attempt)
    [(offset, error, key, value)] = execute(pg_url, 'SELECT "offset", error, key, value FROM eos.dead_letters')
    assert offset == 0 and (key, value) == truth[0][0][:2]
    assert error.startswith("orders refused the row: invalid input syntax for type integer"), error
