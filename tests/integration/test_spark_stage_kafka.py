"""The stage job into a KafkaTarget: Spark's write tasks stage the window's
records (key, value, header columns and lineage) into the PostgreSQL staging
table through the sink's KafkaStagingWriter, the job commit checkpoints them,
the sink prepares and publishes them in one Kafka transaction.

Real broker, real Spark (local[2], one JVM for the module), real PostgreSQL for
the ledger and the staging. Exactness is proven by lineage: the records of
committed transactions in the target topic (what verify reads) and the dead
letters in the ledger, against the records produced.
"""

from __future__ import annotations

import io
import json
from collections import Counter

import psycopg
import pytest

from airflow_eos import cli
from airflow_eos.core.attempt import load_offsets
from airflow_eos.core.errors import AttemptClosed, ConfigurationError
from airflow_eos.core.windows import TopicPartition
from airflow_eos.targets.kafka import KafkaTarget
from airflow_eos.verify import verify

import test_spark_stage_files
from test_spark_stage_files import execute

pytestmark = pytest.mark.slow

PIPELINE = "orders_to_topic"
PARTITIONS = 2
PER_PARTITION = 200
ORDERS_TO_TOPIC = "airflow_eos.examples.transforms:orders_to_topic"

spark = test_spark_stage_files.spark  # the Spark session fixture (local, one per module)


def order_value(n: int) -> bytes | None:
    if n % 40 == 7:
        return b"{not json %d" % n
    return json.dumps({"order_id": f"o-{n}", "customer": f"c-{n % 13}", "amount": f"{n % 1000}.{n % 100:02d}"}
                      ).encode()


def produce(topics, topic, value_of) -> dict:
    """Each partition's records, keyed ``k<n>``; returns {(topic, partition, offset): (key, value)}."""
    truth = {}
    producer = topics.producer
    for p in range(PARTITIONS):
        for o in range(PER_PARTITION):
            n = p * PER_PARTITION + o
            key, value = f"k{n}".encode(), value_of(n)
            producer.produce(topic, key=key, value=value, partition=p, timestamp=1_700_000_000_000 + n)
            truth[(topic, p, o)] = (key, value)
    assert producer.flush(30) == 0
    return truth


@pytest.fixture
def source(topics):
    return topics.create(PARTITIONS, prefix="orders")


@pytest.fixture
def target_topic(topics):
    """The target topic exists before the pipeline runs: the target never creates it."""
    return topics.create(3, prefix="curated")


@pytest.fixture
def planned(freeze_windows, source):
    """The window's plan, frozen as the planner would: every offset of both partitions."""
    [plan] = freeze_windows(PIPELINE, [0], partitions=[(source, p) for p in range(PARTITIONS)],
                            per_window=PER_PARTITION)
    return plan


def committed_lineage(sink, pg_url) -> list[tuple]:
    """(topic, partition, offset) of every record the topic holds from committed transactions."""
    with psycopg.connect(pg_url) as conn, conn.transaction():
        relation = sink.published_relation(conn, PIPELINE)
        rows = conn.execute(f"SELECT eos_topic, eos_partition, eos_offset FROM {relation.as_string(conn)}").fetchall()
    return [tuple(r) for r in rows]


@pytest.mark.parametrize("reader", ["python", "spark"])
def test_a_window_is_staged_by_spark_published_once_and_verified(spark, pg_url, ledger, kafka_config, topics,
                                                                 source, target_topic, planned, reader):
    from airflow_eos.spark import run_stage

    truth = produce(topics, source, order_value)
    bad = sorted(k for k, (_, v) in truth.items() if v.startswith(b"{not json"))
    good = sorted(set(truth) - set(bad))
    plan = planned
    sink = KafkaTarget(topic=target_topic, key_column="key", value_column="value", header_columns=("customer",),
                       ledger_url=pg_url, kafka_config=kafka_config).sink()
    attempt = sink.begin(plan.window)

    report = run_stage(spark, plan, attempt, sink, kafka_config, ORDERS_TO_TOPIC, max_bad_records=len(bad),
                       reader=reader)

    assert (report.records_read, report.rows_staged, report.dead_letters) == (len(truth), len(good), len(bad))
    assert sink.published_records(PIPELINE) == []  # staged in PostgreSQL: nothing in the topic yet
    assert sink.prepare(attempt).prepared
    result = sink.commit(attempt)
    assert (result.outcome, result.published_rows, result.dead_letter_rows) == ("published", len(good), len(bad))

    assert sorted(committed_lineage(sink, pg_url)) == good  # each good record once, nothing else
    records = sink.published_records(PIPELINE)
    assert len(records) == len(good)
    for r in records[:50]:
        h = r["headers"]
        n = int(h["eos-partition"]) * PER_PARTITION + int(h["eos-offset"])
        order = json.loads(r["value"])
        assert r["key"] == f"o-{n}".encode() and order == {"order_id": f"o-{n}", "customer": f"c-{n % 13}",
                                                           "amount": f"{n % 1000}.{n % 100:02d}"}
        assert h["customer"] == f"c-{n % 13}".encode() and h["eos-topic"] == source and h["eos-epoch"] == "1"
    # Dead letters keep their source record as read.
    assert execute(pg_url, 'SELECT topic, partition, "offset", key, value FROM eos.dead_letters ORDER BY 2, 3') == [
        (t, p, o, *truth[(t, p, o)]) for t, p, o in bad]
    with psycopg.connect(pg_url) as conn:
        assert load_offsets(conn, PIPELINE) == {TopicPartition(source, p): PER_PARTITION for p in range(PARTITIONS)}
    audit = verify(ledger, kafka_config, sink, PIPELINE)
    assert audit.clean, str(audit)
    assert (audit.totals.published_rows, audit.totals.dead_letters) == (len(good), len(bad))
    out, err = io.StringIO(), io.StringIO()  # the same audit by the CLI
    code = cli.main(["verify", "--pipeline", PIPELINE, "--topic", target_topic, "--postgres-url", pg_url,
                     "--kafka-bootstrap", kafka_config["bootstrap.servers"]], out=out, err=err)
    assert code == 0, out.getvalue() + err.getvalue()
    assert out.getvalue().startswith(f"verify {PIPELINE} against topic {target_topic} (record lineage)"), out.getvalue()


def test_without_a_transform_records_are_published_as_read_and_tombstones_are_dead_letters(
        spark, pg_url, ledger, kafka_config, topics, source, target_topic, planned):
    """No transform: the key and value bytes as read (the default key_column
    and value_column, ``key`` and ``value``); a record without a value (a
    tombstone) is a dead letter, counted, never dropped. header_columns may
    name any column of the records as read (``timestampType`` here)."""
    from airflow_eos.spark import run_stage

    truth = produce(topics, source, lambda n: None if n % 25 == 3 else b"payload %d" % n)
    tombstones = sorted(k for k, (_, v) in truth.items() if v is None)
    plan = planned
    sink = KafkaTarget(topic=target_topic, header_columns=("timestampType",), ledger_url=pg_url,
                       kafka_config=kafka_config).sink()
    attempt = sink.begin(plan.window)
    report = run_stage(spark, plan, attempt, sink, kafka_config, None, max_bad_records=len(tombstones))
    assert (report.rows_staged, report.dead_letters) == (len(truth) - len(tombstones), len(tombstones))
    assert sink.prepare(attempt).prepared and sink.commit(attempt).outcome == "published"

    records = sink.published_records(PIPELINE)
    got = {(r["headers"]["eos-topic"], int(r["headers"]["eos-partition"]), int(r["headers"]["eos-offset"])):
           (r["key"], r["value"]) for r in records}
    assert len(records) == len(got) == len(truth) - len(tombstones)
    assert got == {k: kv for k, kv in truth.items() if kv[1] is not None}  # bytes as read, each once
    assert {r["headers"]["timestampType"] for r in records} == {b"0"}
    assert execute(pg_url, 'SELECT topic, partition, "offset", error FROM eos.dead_letters ORDER BY 2, 3') == [
        (t, p, o, f"null in column value, which is NOT NULL in topic {target_topic}") for t, p, o in tombstones]
    audit = verify(ledger, kafka_config, sink, PIPELINE)
    assert audit.clean, str(audit)


def test_a_transform_without_the_value_column_fails_at_the_job_and_publishes_nothing(
        spark, pg_url, ledger, kafka_config, topics, source, target_topic, planned):
    from airflow_eos.spark import run_stage
    from airflow_eos.spark.transform import load_transform

    produce(topics, source, order_value)
    plan = planned
    sink = KafkaTarget(topic=target_topic, key_column="key", value_column="value", header_columns=("customer",),
                       ledger_url=pg_url, kafka_config=kafka_config).sink()
    attempt = sink.begin(plan.window)
    fn = load_transform(ORDERS_TO_TOPIC)

    with pytest.raises(ConfigurationError) as failure:
        run_stage(spark, plan, attempt, sink, kafka_config, lambda df: fn(df).drop("value"), max_bad_records=100)
    message = str(failure.value)
    assert f"the transform's output lacks columns ['value'] of target topic {target_topic}" in message, message
    with pytest.raises(AttemptClosed):  # aborted at once, its staging dropped
        sink.prepare(attempt)
    assert execute(pg_url, "SELECT to_regclass(%s) IS NULL", (f"eos_staging.{attempt.staging}",)) == [(True,)]
    assert sink.published_records(PIPELINE) == []  # nothing in the topic, not even an aborted try

    rerun = sink.begin(plan.window)  # the fixed transform stages the window fully
    report = run_stage(spark, plan, rerun, sink, kafka_config, ORDERS_TO_TOPIC, max_bad_records=100)
    assert sink.prepare(rerun).prepared and sink.commit(rerun).outcome == "published"
    lineage = committed_lineage(sink, pg_url)
    assert max(Counter(lineage).values()) == 1 and len(lineage) == report.rows_staged == PARTITIONS * PER_PARTITION - \
        report.dead_letters
