"""The eos_kafka data source as an Avro source: a topic of records of two writer
schemas and poisoned values (not the wire format, an unknown schema id, a
writer schema the reader schema cannot resolve), read by real Spark with the
writer schemas from a real schema registry (Apicurio Registry, started by the
harness). Every record is a row: decoded, or null fields and its reason."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone

import pytest

from airflow_eos.core.errors import SourceUnavailable
from airflow_eos.core.windows import PartitionRange, Window, WindowPlan
from harness.avro import V2, values_then_each_bad_kind
from harness.spark import quiet_session

pytestmark = pytest.mark.slow

WINDOW = Window("spark_avro_test", datetime(2024, 1, 1, tzinfo=timezone.utc),
                datetime(2024, 1, 1, tzinfo=timezone.utc) + timedelta(hours=1))


@pytest.fixture(scope="module")
def spark():
    with quiet_session("eos-test-spark-avro-source") as session:
        yield session


@pytest.fixture
def avro_topic(topics, schema_registry):
    """A topic of 2 partitions: 300 records of V1, 300 of V2, then 4 poisoned values. Returns the topic and
    {offset-per-partition key: the value expected decoded (dict) or the reason's fragment (str)}."""
    topic = topics.create(partitions=2, prefix="avro")
    values = values_then_each_bad_kind(schema_registry.address, topic, 600)
    expected: dict[tuple[int, int], dict | str] = {}
    records = []
    for n, (value, outcome) in enumerate(values):
        partition = n % 2
        expected[(partition, n // 2)] = outcome
        records.append((partition, 1_700_000_000_000 + n, value))
    topics.produce(topic, records)
    return topic, expected


def _plan(topic: str, expected) -> WindowPlan:
    ends = {p: 1 + max(o for q, o in expected if q == p) for p in (0, 1)}
    return WindowPlan(WINDOW, tuple(PartitionRange(topic, p, 0, ends[p]) for p in (0, 1)))


def test_values_of_two_writer_schemas_and_poisoned_ones_become_rows(spark, kafka_config, schema_registry, avro_topic):
    from airflow_eos.spark import read_plan

    topic, expected = avro_topic
    reader = json.dumps(V2)
    df = read_plan(spark, _plan(topic, expected), kafka_config, avro_reader_schema=reader,
                   registry_config={"url": schema_registry.address}, max_records_per_task=200)
    assert df.columns[-4:] == ["id", "amount", "note", "eos_decode_error"]
    rows = {(r.partition, r.offset): r for r in df.collect()}
    assert rows.keys() == expected.keys()
    for key, outcome in expected.items():
        row = rows[key]
        if isinstance(outcome, dict):
            assert row.eos_decode_error is None and {"id": row.id, "amount": row.amount, "note": row.note} == outcome
        else:
            assert row.id is None and outcome in row.eos_decode_error, (key, row)
            assert row.value is not None  # the raw record stays with its reason


def test_an_unreachable_registry_fails_the_read(spark, kafka_config, schema_registry, avro_topic):
    from airflow_eos.embedded import free_port
    from airflow_eos.spark import read_plan

    topic, expected = avro_topic
    df = read_plan(spark, _plan(topic, expected), kafka_config, avro_reader_schema=json.dumps(V2),
                   registry_config={"url": f"http://127.0.0.1:{free_port()}/apis/ccompat/v6"})
    with pytest.raises(Exception, match=r"schema registry at http://127\.0\.0\.1:\d+/apis/ccompat/v6 did not "
                                        "answer") as failure:
        df.collect()
    assert SourceUnavailable.__name__ in str(failure.value)


def test_the_registry_password_is_redacted_in_the_plans_spark_shows(spark, kafka_config, schema_registry, avro_topic):
    """The query plans Spark's UI and event log show name the eos_kafka scan, none of its options: not the
    password (whose option name also matches spark.redaction.regex, where Spark lists options)."""
    from airflow_eos.spark import read_plan

    topic, expected = avro_topic
    df = read_plan(spark, _plan(topic, expected), kafka_config, avro_reader_schema=json.dumps(V2),
                   registry_config={"url": schema_registry.address, "basic.auth.user.info": "eos:s3cr3t-Pa55"})
    execution = df._jdf.queryExecution()
    shown = execution.toString() + execution.executedPlan().toString()
    assert "BatchScan eos_kafka" in shown and "s3cr3t-Pa55" not in shown
