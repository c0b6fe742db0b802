"""The eos_kafka data source reads exactly a frozen plan's offset ranges.

Apache Kafka, real Spark (local[2], one JVM for the module). The log has offset
gaps: committed transactions leave a marker per partition after each commit.
Every assertion compares Spark's rows with a direct confluent-kafka read of the
same log.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import uuid
from datetime import datetime, timedelta, timezone

import pytest
from confluent_kafka import Consumer, KafkaError, Producer
from confluent_kafka import TopicPartition as KafkaTopicPartition

from airflow_eos.core.kafka_client import consumer_config
from airflow_eos.core.windows import PartitionRange, Window, WindowPlan
from airflow_eos.spark.kafka_source import (
    KAFKA_SCHEMA,
    READER_KAFKA_DEFAULTS,
    split_range,
)
from harness.topics import create_topic, delete_topic
from harness.spark import quiet_session

pytestmark = pytest.mark.slow

PARTITIONS = 4
PLAIN_RECORDS = 100_000  # before the transactions, no gaps
TXN_COUNT = 100
TXN_RECORDS = 1_000  # per transaction, spread over all partitions
BASE_MS = 1_700_000_000_000
WINDOW = Window("spark_source_test", datetime(2024, 1, 1, tzinfo=timezone.utc),
                datetime(2024, 1, 1, tzinfo=timezone.utc) + timedelta(hours=1))

# Spark's own Kafka source schema (includeHeaders=true), written out independently.
DOCUMENTED_SCHEMA_DDL = (
    "key BINARY, value BINARY, topic STRING, partition INT, offset BIGINT, timestamp TIMESTAMP, "
    "timestampType INT, headers ARRAY<STRUCT<key: STRING, value: BINARY>>"
)


# --------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def spark():
    with quiet_session("eos-test-spark-source") as session:
        yield session


def _record(i: int, partition: int) -> dict:
    """Record i: JSON value, key missing on every 10th, headers on every 50th."""
    headers = [("trace", b"t%d" % i), ("empty", None)] if i % 50 == 0 else None
    return {"partition": partition, "timestamp": BASE_MS + i,
            "key": None if i % 10 == 0 else b"k%d" % i,
            "value": json.dumps({"id": i, "p": partition}).encode(), "headers": headers}


def _read_log(bootstrap: str, topic: str) -> dict[int, dict[int, tuple]]:
    """Every record of every partition, read to end of partition: the truth."""
    consumer = Consumer(consumer_config({**READER_KAFKA_DEFAULTS, "bootstrap.servers": bootstrap}))
    consumer.assign([KafkaTopicPartition(topic, p, 0) for p in range(PARTITIONS)])
    log: dict[int, dict[int, tuple]] = {p: {} for p in range(PARTITIONS)}
    ends: dict[int, int] = {}
    while len(ends) < PARTITIONS:
        for msg in consumer.consume(10_000, 1.0):
            if msg.error() is not None:
                assert msg.error().code() == KafkaError._PARTITION_EOF, msg.error()
                ends[msg.partition()] = msg.offset()
                continue
            ts_type, ts = msg.timestamp()
            headers = [(k, v) for k, v in msg.headers()] if msg.headers() else None
            log[msg.partition()][msg.offset()] = (msg.key(), msg.value(), ts, ts_type - 1, headers)
    consumer.close()
    log["ends"] = ends  # type: ignore[index]
    return log


@pytest.fixture(scope="module")
def gappy_log(kafka):
    """A 4-partition topic: 100k plain records, then 100 committed transactions of
    1k records each (a marker per partition after each commit, the last one at the
    very end of the log). Returns (topic, truth)."""
    bootstrap = kafka.address
    topic = f"spark-src-{uuid.uuid4().hex[:8]}"
    create_topic(bootstrap, topic, PARTITIONS)

    def produce(producer, i):
        while True:
            try:
                producer.produce(topic, **_record(i, i % PARTITIONS))
                return
            except BufferError:
                producer.poll(0.05)

    plain = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 5})
    for i in range(PLAIN_RECORDS):
        produce(plain, i)
    assert plain.flush(30) == 0
    txn = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"tx-{topic}", "linger.ms": 5})
    txn.init_transactions(15)
    i = PLAIN_RECORDS
    for _ in range(TXN_COUNT):
        txn.begin_transaction()
        for _ in range(TXN_RECORDS):
            produce(txn, i)
            i += 1
        txn.commit_transaction(30)
    truth = _read_log(bootstrap, topic)
    yield topic, truth
    delete_topic(bootstrap, topic)


def _gaps(truth, partition: int) -> list[int]:
    present = truth[partition]
    return [o for o in range(truth["ends"][partition]) if o not in present]


def _expected(truth, plan: WindowPlan) -> dict[tuple[int, int], tuple]:
    return {(r.partition, o): rec for r in plan.ranges for o, rec in truth[r.partition].items()
            if r.start_offset <= o < r.end_offset}


def _mid_log_plan(topic: str, truth) -> WindowPlan:
    """Ranges that start and end mid-log, on markers and on records, and one that
    runs to the very end of the log, whose last offset is a marker."""
    g0, g1 = _gaps(truth, 0), _gaps(truth, 1)
    assert len(g0) >= TXN_COUNT and g0[-1] == truth["ends"][0] - 1, "expected a commit marker per transaction"
    ranges = (
        PartitionRange(topic, 0, g0[10], g0[80]),  # starts and ends on markers
        PartitionRange(topic, 1, 12_345, g1[50] + 1),  # starts on a record, ends right after a marker
        PartitionRange(topic, 2, 0, truth["ends"][2]),  # the whole partition, ending with a marker
        PartitionRange(topic, 3, 20_000, 40_001),  # plain records only
    )
    return WindowPlan(WINDOW, ranges)


def _rows(df) -> dict[tuple[int, int], tuple]:
    table = df.selectExpr("partition", "offset", "key", "value", "unix_millis(timestamp) AS ts",
                          "timestampType", "headers").toArrow()
    rows = {}
    for r in table.to_pylist():
        headers = [(h["key"], h["value"]) for h in r["headers"]] if r["headers"] is not None else None
        key = (r["partition"], r["offset"])
        assert key not in rows, f"record {key} read twice"
        rows[key] = (r["key"], r["value"], r["ts"], r["timestampType"], headers)
    return rows


# --------------------------------------------------------------------------- splitting (no Spark)


@pytest.mark.parametrize("start,end,limit", [(0, 10, 3), (5, 6, 1), (100, 1_100, 1_000), (7, 1_000_007, 333_333),
                                             (0, 10, 100), (3, 3, 10)])
def test_split_range_tiles_the_range_exactly(start, end, limit):
    tasks = split_range(PartitionRange("t", 0, start, end), limit)
    covered = [o for t in tasks for o in range(t.start_offset, t.end_offset)] if end - start < 10_000 else None
    if covered is not None:
        assert covered == list(range(start, end))
    assert all(0 < t.end_offset - t.start_offset <= limit for t in tasks)
    assert [(t.piece, t.pieces) for t in tasks] == [(i + 1, len(tasks)) for i in range(len(tasks))]
    if tasks:
        assert tasks[0].start_offset == start and tasks[-1].end_offset == end
        assert all(a.end_offset == b.start_offset for a, b in zip(tasks, tasks[1:]))


# --------------------------------------------------------------------------- reading through Spark


def test_reads_exactly_the_planned_ranges_across_offset_gaps(spark, kafka_config, gappy_log):
    from airflow_eos.spark import read_plan

    topic, truth = gappy_log
    plan = _mid_log_plan(topic, truth)
    df = read_plan(spark, plan, kafka_config)
    assert df.rdd.getNumPartitions() == len(plan.ranges)  # one task per partition range
    expected = _expected(truth, plan)
    assert len(expected) > 100_000
    rows = _rows(df)
    assert rows.keys() == expected.keys()
    assert rows == expected  # keys, values, timestamps, timestamp types and headers too
    assert df.count() == len(expected)
    assert {r.topic for r in df.select("topic").distinct().collect()} == {topic}


def test_large_ranges_are_split_into_several_tasks_with_the_same_records(spark, kafka_config, gappy_log):
    from airflow_eos.spark import read_plan

    topic, truth = gappy_log
    plan = _mid_log_plan(topic, truth)
    limit = 7_000
    df = read_plan(spark, plan, kafka_config, max_records_per_task=limit)
    tasks = [t for r in plan.ranges for t in split_range(r, limit)]
    assert df.rdd.getNumPartitions() == len(tasks)
    assert all(len(split_range(r, limit)) > 1 for r in plan.ranges)
    rows = _rows(df)
    assert rows == _expected(truth, plan)


def test_empty_plan_and_empty_ranges_give_an_empty_dataframe_with_the_schema(spark, kafka_config, gappy_log):
    from airflow_eos.spark import read_plan

    topic, truth = gappy_log
    for plan in (WindowPlan(WINDOW, ()),
                 WindowPlan(WINDOW, tuple(PartitionRange(topic, p, 500, 500) for p in range(PARTITIONS)))):
        df = read_plan(spark, plan, kafka_config)
        assert df.schema == KAFKA_SCHEMA
        assert df.count() == 0
        assert df.selectExpr("CAST(value AS STRING) AS v").collect() == []


def test_schema_is_spark_kafka_sources_and_its_transforms_work(spark, kafka_config, gappy_log):
    from pyspark.sql import functions as F
    from pyspark.sql.types import _parse_datatype_string

    from airflow_eos.spark import read_plan

    topic, truth = gappy_log
    assert KAFKA_SCHEMA == _parse_datatype_string(DOCUMENTED_SCHEMA_DDL)
    plan = WindowPlan(WINDOW, (PartitionRange(topic, 1, 1_000, 1_100), PartitionRange(topic, 2, 0, 10)))
    df = read_plan(spark, plan, kafka_config)
    assert df.schema == KAFKA_SCHEMA
    assert all(f.nullable for f in df.schema.fields)

    # A transform as written for spark.read.format("kafka").
    parsed = (df.selectExpr("CAST(key AS STRING) AS key", "CAST(value AS STRING) AS json", "topic", "partition",
                            "offset", "timestamp")
              .select("key", F.from_json("json", "id INT, p INT").alias("v"), "partition", "offset", "timestamp")
              .select("key", "v.id", "v.p", "partition", "offset", "timestamp"))
    got = {(r.partition, r.offset): (r.key, r.id, r.p) for r in parsed.collect()}
    expected = {}
    for rng in plan.ranges:
        for offset, (key, value, _, _, _) in truth[rng.partition].items():
            if rng.start_offset <= offset < rng.end_offset:
                body = json.loads(value)
                expected[(rng.partition, offset)] = (key.decode() if key is not None else None, body["id"], body["p"])
    assert got == expected
    assert all(p == part for (part, _), (_, _, p) in got.items())
    first = df.where("partition = 2 AND offset = 0").selectExpr("CAST(timestamp AS LONG) * 1000 AS ms").first()
    assert first.ms == truth[2][0][2] // 1000 * 1000


def test_a_range_past_the_end_of_the_log_fails_loudly(spark, kafka_config, gappy_log):
    from airflow_eos.spark import read_plan

    topic, truth = gappy_log
    end0 = truth["ends"][0]
    cases = [
        # The log ends inside the range: end of partition before the end cut.
        (PartitionRange(topic, 0, end0 - 50, end0 + 100), f"[{end0}, {end0 + 100})"),
        # The whole range lies beyond the log (this broker answers with silence).
        (PartitionRange(topic, 0, end0 + 10, end0 + 20), f"[{end0 + 10}, {end0 + 20})"),
    ]
    for rng, missing in cases:
        df = read_plan(spark, WindowPlan(WINDOW, (rng,)), kafka_config, end_grace_s=0.5)
        with pytest.raises(Exception) as failure:
            df.count()
        message = str(failure.value)
        assert "LogTruncated" in message, message
        assert f"{topic}[0] [{rng.start_offset}, {rng.end_offset})" in message, message
        assert f"ends at offset {end0}" in message, message


def test_spark_submit_with_master_from_outside(kafka_config, gappy_log, tmp_path):
    """The way the stage job runs: spark-submit --master local[2], a session built
    by spark_session() taking master and conf from the command line."""
    topic, truth = gappy_log
    plan = WindowPlan(WINDOW, (PartitionRange(topic, 3, 1_000, 3_000), PartitionRange(topic, 0, 0, 100)))
    script = tmp_path / "job.py"
    script.write_text(textwrap.dedent("""
        import json, sys
        from airflow_eos.core.windows import WindowPlan
        from airflow_eos.spark import read_plan, spark_session
        spark = spark_session("eos-submit-test", master="local[1]", conf={"spark.sql.shuffle.partitions": "9"})
        df = read_plan(spark, WindowPlan.from_json(sys.argv[1]), json.loads(sys.argv[2]))
        print("RESULT " + json.dumps({"count": df.count(), "master": spark.sparkContext.master,
                                      "shuffle": spark.conf.get("spark.sql.shuffle.partitions"),
                                      "ui": spark.conf.get("spark.ui.enabled")}))
        spark.stop()
    """))
    spark_submit = os.path.join(os.path.dirname(sys.executable), "spark-submit")
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable,
           "SPARK_LOCAL_IP": "127.0.0.1"}
    proc = subprocess.run(
        [spark_submit, "--master", "local[2]", "--conf", "spark.ui.enabled=false",
         "--conf", "spark.sql.shuffle.partitions=3", str(script), plan.to_json(), json.dumps(kafka_config)],
        capture_output=True, text=True, timeout=180, env=env,
    )
    assert proc.returncode == 0, proc.stderr[-5000:]
    [line] = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
    result = json.loads(line.removeprefix("RESULT "))
    assert result == {"count": len(_expected(truth, plan)), "master": "local[2]", "shuffle": "3", "ui": "false"}
