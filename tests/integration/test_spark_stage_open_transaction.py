"""The real stage job (run_stage, local Spark) at a range a producer transaction
still open holds short: the idle partition's cut was frozen at the end of the
log, past the transaction's records, where a read_committed reader cannot read
yet. With either reader the job fails with TransactionOpen naming the partition
and the offset it is held at (not "no answer from Kafka", nor Spark's "Some data
may have been lost"), its attempt aborted, nothing staged; once the transaction
commits, a new attempt stages the window whole.

A Spark session of its own: Spark's Kafka source waits ``spark.network.timeout``
(its ``kafkaConsumer.pollTimeoutMs``) for a record before it fails a task, 120 s
by default, on each of a task's tries.
"""

from __future__ import annotations

import json
import uuid
from datetime import datetime, timedelta, timezone

import pytest
from confluent_kafka import Producer
from harness.spark import quiet_session

from airflow_eos.core.kafka_client import client_logging
from airflow_eos.core.plan import PlanRequest, plan_window
from airflow_eos.core.source import KafkaLog
from airflow_eos.core.windows import Window, to_millis
from airflow_eos.targets.postgres.target import PostgresTarget

from test_spark_stage import attempt_state, execute, parse_orders, staging_exists

pytestmark = pytest.mark.slow

T0 = datetime(2024, 1, 1, tzinfo=timezone.utc)
# Longer than the test keeps a transaction open on a busy machine (librdkafka's default, 60 s, is not):
# a transaction that times out is aborted by the broker.
TRANSACTION_TIMEOUT_MS = 600_000
DDL = """CREATE TABLE orders (id bigint NOT NULL, amount numeric(12,2) NOT NULL, code varchar(4), note text,
    eos_topic text NOT NULL, eos_partition integer NOT NULL, eos_offset bigint NOT NULL,
    eos_pipeline text NOT NULL, eos_window_start timestamptz NOT NULL)"""


@pytest.fixture(scope="module")
def spark():
    # local[2,2]: a failed task is tried twice; Spark's Kafka source waits spark.network.timeout per try.
    with quiet_session("eos-test-open-transaction", master="local[2,2]",
                       conf={"spark.network.timeout": "12s", "spark.network.timeoutInterval": "4s",
                             "spark.executor.heartbeatInterval": "4s"}) as session:
        yield session


def transaction(producer: Producer, topic: str, orders: range | list[int], *, commit: bool) -> None:
    producer.begin_transaction()
    for n in orders:
        value = {"id": n, "amount": f"{n}.00", "code": "c", "note": None}
        producer.produce(topic, value=json.dumps(value).encode(), partition=0,
                         timestamp=to_millis(T0 + timedelta(minutes=n)))
    producer.flush(15)
    if commit:
        producer.commit_transaction(15)


@pytest.mark.parametrize("reader", ["python", "spark"])
def test_a_range_an_open_transaction_holds_short_fails_the_stage_until_it_commits(
        spark, pg_url, ledger, kafka_config, topics, reader):
    from airflow_eos.spark import StageFailed, run_stage

    topic = topics.create(partitions=1)
    execute(pg_url, DDL)
    writer, other = (Producer({**client_logging(), **kafka_config, "transactional.id": f"src-{uuid.uuid4().hex[:8]}",
                               "transaction.timeout.ms": TRANSACTION_TIMEOUT_MS}) for _ in range(2))
    try:
        writer.init_transactions(15)
        other.init_transactions(15)
        transaction(writer, topic, range(0, 30), commit=True)
        transaction(other, topic, [40, 50], commit=False)  # left open
        window = Window(f"held_{reader}", T0, T0 + timedelta(hours=1))
        with KafkaLog(dict(kafka_config)) as kafka_log:  # long after the window: the partition is idle
            plan = plan_window(ledger, kafka_log, PlanRequest(window, (topic,)))
        [rng] = plan.ranges
        target = PostgresTarget(pg_url, "orders").sink()
        options = {"read_options": {"poll_timeout_s": 5, "end_grace_s": 0.5}} if reader == "python" else {}
        held = target.begin(window)
        with pytest.raises(StageFailed) as failed:
            run_stage(spark, plan, held, target, kafka_config, parse_orders, reader=reader, **options)
        message = str(failed.value)
        assert failed.value.error == "TransactionOpen", message
        assert f"the last stable offset of {topic}[0] is held at" in message, message
        assert f"below {rng.end_offset}, where the planned range ends" in message, message
        assert "no answer from Kafka" not in message.split("Spark's Kafka source reported:")[0], message
        assert attempt_state(pg_url, held) == "aborted" and not staging_exists(pg_url, held)
        other.commit_transaction(15)
    finally:
        del writer, other  # freed now: no client of this test outlives its broker
    whole = target.begin(window)
    report = run_stage(spark, plan, whole, target, kafka_config, parse_orders, reader=reader)
    assert report.rows_staged == 32 and report.dead_letters == 0, report
    assert target.prepare(whole).prepared
    assert target.commit(whole).published_rows == 32
    assert sorted(n for (n,) in execute(pg_url, "SELECT id FROM orders")) == [*range(0, 30), 40, 50]
