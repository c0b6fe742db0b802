"""An Avro source through the production steps (airflow_eos.steps): plan
freezes the reader schema (the subject's latest), the stage job decodes with
it on real Spark against a real schema registry, records that do not decode
are dead letters with the reason, counted, and verify is clean. A rerun after
the registry moved on decodes as the plan froze; an unreachable registry fails
the stage (nothing published) and a retry succeeds."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone

import psycopg
import pytest
from harness.avro import V2, register, serialize, values_then_each_bad_kind
from harness.spark import quiet_session

from airflow_eos import steps
from airflow_eos.core.avro import latest_reader_schema
from airflow_eos.core.errors import WindowConflict
from airflow_eos.core.plan import PlanRequest
from airflow_eos.core.source import KafkaLog
from airflow_eos.core.windows import Window
from airflow_eos.spark.stage import StageFailed, run_stage
from airflow_eos.targets.postgres.target import PostgresTarget
from airflow_eos.verify import verify

pytestmark = pytest.mark.slow

T0 = datetime(2024, 3, 1, tzinfo=timezone.utc)
HOUR = timedelta(hours=1)
PIPELINE = "avro_orders"
# a compatible change registered after the window was planned: a field with a default
V3 = {**V2, "fields": [*V2["fields"], {"name": "currency", "type": "string", "default": "EUR"}]}
ORDERS_DDL = """
    CREATE TABLE orders (
        id bigint NOT NULL, amount double precision NOT NULL, note text,
        eos_topic text NOT NULL, eos_partition integer NOT NULL, eos_offset bigint NOT NULL,
        eos_pipeline text NOT NULL, eos_window_start timestamptz NOT NULL)
"""
GOOD = 60  # records per partition... of V1 then V2


@pytest.fixture(scope="module")
def spark():
    with quiet_session("eos-test-avro-pipeline") as session:
        yield session


@pytest.fixture
def avro_topic(topics, schema_registry):
    """2 partitions in the window: GOOD records of V1 then V2 and 4 poisoned values, then one record after the
    window's end per partition. Returns (topic, {(partition, offset): expected row or reason fragment})."""
    url = schema_registry.address
    topic = topics.create(partitions=2, prefix="avro-orders")
    values = values_then_each_bad_kind(url, topic, GOOD)
    expected, records = {}, []
    stamp = int(T0.timestamp() * 1000)
    for n, (value, outcome) in enumerate(values):
        expected[(n % 2, n // 2)] = outcome
        records.append((n % 2, stamp + n * 1000, value))
    after = serialize(url, topic, V2, {"id": 999, "amount": 1.0, "note": None})
    records += [(p, int((T0 + HOUR).timestamp() * 1000) + 1, after) for p in (0, 1)]
    topics.produce(topic, records)
    return topic, expected


RECEIVED: list[list[str]] = []  # the columns each run's transform received (it runs on the driver, here)


def orders(df):
    from pyspark.sql import functions as F

    RECEIVED.append(list(df.columns))
    return df.select("id", "amount", "note", F.col("topic").alias("eos_topic"),
                     F.col("partition").alias("eos_partition"), F.col("offset").alias("eos_offset"))


def plan_window(ledger, kafka_config, registry_url: str, topic: str):
    request = PlanRequest(Window(PIPELINE, T0, T0 + HOUR), (topic,), idle_partition_grace=timedelta(0),
                          reader_schema=lambda: latest_reader_schema({"url": registry_url}, (f"{topic}-value",)))
    with KafkaLog(kafka_config) as log_:
        return steps.plan(ledger, log_, request)


def stage_and_commit(spark, sink, plan, kafka_config, registry_config):
    staged = steps.stage(sink, plan, lambda attempt: run_stage(
        spark, plan, attempt, sink, kafka_config, orders, max_bad_records=10, max_records_per_task=40,
        registry_config=registry_config).to_dict())
    assert steps.prepare(sink, staged.attempt).prepared
    return steps.commit(sink, staged.attempt)


def published(url) -> dict:
    with psycopg.connect(url) as conn:
        rows = conn.execute("SELECT eos_partition, eos_offset, id, amount, note FROM orders").fetchall()
        dead = conn.execute('SELECT partition, "offset", error, value FROM eos.dead_letters').fetchall()
    return {"rows": {(p, o): {"id": i, "amount": a, "note": n} for p, o, i, a, n in rows},
            "dead": {(p, o): (e, bytes(v)) for p, o, e, v in dead}}


def assert_window(url, expected) -> None:
    found = published(url)
    assert found["rows"] == {k: v for k, v in expected.items() if isinstance(v, dict)}
    assert found["dead"].keys() == {k for k, v in expected.items() if isinstance(v, str)}
    for key, (error, value) in found["dead"].items():
        assert expected[key] in error and value  # the reason, and the raw value kept
    with psycopg.connect(url) as conn:
        assert conn.execute("SELECT published_rows, dead_letter_rows FROM eos.windows").fetchall() == [(GOOD, 4)]


def test_an_avro_window_publishes_decoded_rows_and_dead_letters_then_reruns_with_its_frozen_schema(
        spark, pg_url, ledger, kafka_config, schema_registry, avro_topic):
    topic, expected = avro_topic
    psycopg.connect(pg_url, autocommit=True).execute(ORDERS_DDL)
    target = PostgresTarget(pg_url, "orders", on_committed="replace")
    sink, registry = target.sink(), {"url": schema_registry.address}
    RECEIVED.clear()
    plan = plan_window(ledger, kafka_config, schema_registry.address, topic)
    assert json.loads(plan.reader_schema) == V2
    stage_and_commit(spark, sink, plan, kafka_config, registry)
    assert_window(pg_url, expected)
    report = verify(ledger, kafka_config, target, PIPELINE)
    assert report.clean, str(report)

    register(schema_registry.address, f"{topic}-value", V3)  # the registry moves on
    replanned = plan_window(ledger, kafka_config, schema_registry.address, topic)
    assert replanned == plan  # frozen: V2, not the latest
    stage_and_commit(spark, sink, replanned, kafka_config, registry)  # a clear and rerun of the window
    assert_window(pg_url, expected)
    kafka_columns = ["key", "value", "topic", "partition", "offset", "timestamp", "timestampType", "headers"]
    assert RECEIVED == [kafka_columns + ["id", "amount", "note"]] * 2  # decoded as frozen, no eos_decode_error
    report = verify(ledger, kafka_config, target, PIPELINE)
    assert report.clean, str(report)

    with KafkaLog(kafka_config) as log_, pytest.raises(WindowConflict, match="planned with Avro values"):
        steps.plan(ledger, log_, PlanRequest(Window(PIPELINE, T0, T0 + HOUR), (topic,)))  # now as raw


def test_an_unreachable_registry_fails_the_stage_and_a_retry_publishes(spark, pg_url, ledger, kafka_config,
                                                                        schema_registry, avro_topic):
    topic, expected = avro_topic
    psycopg.connect(pg_url, autocommit=True).execute(ORDERS_DDL)
    target = PostgresTarget(pg_url, "orders")
    sink = target.sink()
    plan = plan_window(ledger, kafka_config, schema_registry.address, topic)
    down = {"url": "http://127.0.0.1:9/apis/ccompat/v6", "basic.auth.user.info": "eos:s3cr3t-Pa55",
            "max.retries": 1, "retries.wait.ms": 100}
    with pytest.raises(StageFailed) as failed:
        stage_and_commit(spark, sink, plan, kafka_config, down)
    message = str(failed.value)
    assert "http://127.0.0.1:9/apis/ccompat/v6" in message and "check that the registry runs" in message
    assert "s3cr3t" not in message
    assert published(pg_url) == {"rows": {}, "dead": {}}
    with psycopg.connect(pg_url) as conn:
        assert conn.execute("SELECT state FROM eos.windows").fetchall() == [("planned",)]

    stage_and_commit(spark, sink, plan, kafka_config, {"url": schema_registry.address})  # the retry
    assert_window(pg_url, expected)
    report = verify(ledger, kafka_config, target, PIPELINE)
    assert report.clean, str(report)


def test_an_avro_window_into_files_dead_letters_its_bad_records_the_same_way(spark, pg_url, ledger, kafka_config,
                                                                              schema_registry, avro_topic, tmp_path):
    """The file target stages with Spark's Parquet writer, its dead letters by a path of its own."""
    from airflow_eos import FileTarget

    topic, expected = avro_topic
    root = tmp_path / "lake"
    root.mkdir()
    target = FileTarget(path=str(root), ledger_url=pg_url)
    sink = target.sink()
    plan = plan_window(ledger, kafka_config, schema_registry.address, topic)
    stage_and_commit(spark, sink, plan, kafka_config, {"url": schema_registry.address})
    rows = {(r.eos_partition, r.eos_offset): {"id": r.id, "amount": r.amount, "note": r.note}
            for r in spark.read.parquet(str(root)).collect()}
    assert rows == {k: v for k, v in expected.items() if isinstance(v, dict)}
    with psycopg.connect(pg_url) as conn:
        letters = conn.execute('SELECT partition, "offset", error FROM eos.dead_letters').fetchall()
    assert {(p, o) for p, o, _ in letters} == {k for k, v in expected.items() if isinstance(v, str)}
    assert all(expected[(p, o)] in error for p, o, error in letters)
    report = verify(ledger, kafka_config, target, PIPELINE)
    assert report.clean, str(report)
