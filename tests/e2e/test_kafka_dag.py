"""The example DAG orders_to_topic through real Airflow (dag.test), real Spark
(spark-submit, local[2]; the tests of commits and clears on the session's warm
Spark Connect server, tests/e2e/conftest.py), the broker (source and target topic) and PostgreSQL
(the ledger and the staging): each window published into the topic
``orders_curated`` in one Kafka transaction. Every case ends audited by
``verify`` and by a ``read_committed`` consumer of the topic that sees each
source record of the committed windows exactly once, except the dead letters,
nothing else: every record it reads belongs to a commit the ledger records."""

from __future__ import annotations

import itertools
from collections import Counter
from datetime import datetime, timedelta, timezone

import pytest
from confluent_kafka import Consumer, KafkaError
from confluent_kafka import TopicPartition as KafkaTP

from airflow_eos import KafkaTarget
from airflow_eos.core.ledger import Ledger
from airflow_eos.core.windows import to_utc
from airflow_eos.verify import verify

from harness.dags import run_window, states
from test_files_dag import commit_summary, expected_lineage, skipped_rerun_summary
from test_orders_dag import HOUR, T0, fresh_topic, load_dag, produce_orders, sql, window_date

pytestmark = pytest.mark.slow

PIPELINE = "orders_to_topic"
TOPIC = "orders_curated"
TOPIC_PARTITIONS = 3
_runs = itertools.count()


@pytest.fixture
def run_after():
    """One fixed run_after per window of a test (a second run is a Clear of the
    same run); a base of its own per test, apart from the other DAG tests'."""
    base = datetime(2026, 10, 1, tzinfo=timezone.utc) + next(_runs) * timedelta(days=1)
    return lambda h: base + h * timedelta(minutes=1)


@pytest.fixture
def curated(topics):
    """This test's own source topic and target topic: the target topic is
    created explicitly, as a deployment must (the target never creates it)."""
    fresh_topic(topics, "orders")
    fresh_topic(topics, TOPIC, partitions=TOPIC_PARTITIONS)
    return TOPIC


def sink(pg_url, kafka_config):
    """The DAG's target, bound to this test's ledger and broker (verify reads through it)."""
    return KafkaTarget(topic=TOPIC, key_column="key", value_column="value", header_columns=("customer",),
                       ledger_url=pg_url, kafka_config=kafka_config).sink()


def audit(pg_url, kafka_config):
    report = verify(Ledger(pg_url), kafka_config, sink(pg_url, kafka_config), PIPELINE)
    assert report.clean, str(report)
    return report


def read_committed(kafka_config) -> list[dict]:
    """Every record of the topic, as a read_committed consumer sees it, read
    to the end of each partition: its lineage headers and its key."""
    consumer = Consumer({**kafka_config, "group.id": "curated-reader", "isolation.level": "read_committed",
                         "enable.partition.eof": True, "enable.auto.commit": False})
    consumer.assign([KafkaTP(TOPIC, p, 0) for p in range(TOPIC_PARTITIONS)])
    seen, at_end = [], set()
    try:
        while len(at_end) < TOPIC_PARTITIONS:
            msg = consumer.poll(1)
            if msg is None:
                continue
            if msg.error():
                assert msg.error().code() == KafkaError._PARTITION_EOF, msg.error()
                at_end.add(msg.partition())
                continue
            headers = {k: v.decode() for k, v in msg.headers() or [] if k.startswith("eos-")}
            seen.append({**headers, "key": msg.key()})
    finally:
        consumer.close()
    return seen


def assert_consumer_sees_each_record_once(pg_url, kafka_config) -> list[dict]:
    """Among the records of the commits the ledger records (window, commit
    token), each source record of the committed windows once, but for the
    dead letters; nothing else. Returns every record read."""
    commits = {(to_utc(w).isoformat(), str(token))
               for w, token in sql(pg_url, "SELECT window_start, token FROM eos.kafka_commits WHERE pipeline = %s",
                                   PIPELINE)}
    everything = read_committed(kafka_config)
    committed = [r for r in everything if (r["eos-window-start"], r["eos-commit"]) in commits]
    assert len(committed) == len(everything), "a read_committed reader sees records of no committed window"
    lineage = [(r["eos-topic"], int(r["eos-partition"]), int(r["eos-offset"])) for r in committed]
    assert max(Counter(lineage).values(), default=1) == 1, "a source record published twice"
    assert sorted(lineage) == expected_lineage(pg_url, PIPELINE)
    assert all(r["eos-pipeline"] == PIPELINE and r["key"].startswith(b"o-") for r in committed)
    return everything


def test_windows_are_published_into_the_topic_once(airflow_connections, kafka_config, topics, curated, run_after):
    pg_url = airflow_connections
    counts = produce_orders(topics, hours=2)
    dag = load_dag(PIPELINE)
    for h in range(2):
        run = run_window(dag, window_date(h), run_after(h))
        assert run.state == "success", states(run)
        assert commit_summary(run)["outcome"] == "published"

    report = audit(pg_url, kafka_config)
    assert report.committed_windows == 2 and report.lineage
    by_window = {w.window_start: w for w in report.windows}
    for h in range(2):
        w = by_window[T0 + h * HOUR]
        assert (w.published_rows, w.dead_letters) == (counts["good"][h], counts["bad"][h])
    seen = assert_consumer_sees_each_record_once(pg_url, kafka_config)
    assert len(seen) == counts["good"][0] + counts["good"][1]  # nothing but the committed records in the topic
    assert dict(sql(pg_url, 'SELECT partition, "offset" FROM eos.partition_offsets')) == {p: 200 for p in range(4)}
    assert sql(pg_url, "SELECT count(*) FROM pg_tables WHERE schemaname = 'eos_staging'") == [(0,)]


def test_a_stage_failing_on_its_first_try_is_retried_and_publishes_once(
        airflow_connections, kafka_config, topics, curated, monkeypatch, tmp_path, run_after):
    pg_url = airflow_connections
    counts = produce_orders(topics, hours=1)
    monkeypatch.setenv("EOS_FAULTS", "stage.mid_write=raise*1")  # the first job fails after writing rows
    monkeypatch.setenv("EOS_FAULTS_STATE", str(tmp_path))

    run = run_window(load_dag(PIPELINE), window_date(0), run_after(0))
    assert run.state == "success", states(run)
    stage = next(ti for ti in run.get_task_instances() if ti.task_id == "window.stage")
    assert stage.try_number == 2
    assert sql(pg_url, "SELECT epoch, state FROM eos.attempts ORDER BY epoch") == [(1, "aborted"), (2, "committed")]
    audit(pg_url, kafka_config)
    assert len(assert_consumer_sees_each_record_once(pg_url, kafka_config)) == counts["good"][0]


@pytest.mark.parametrize(("fault", "outcome"), [
    ("commit.mid_produce", "published"),  # the first try's transaction aborted, the retry publishes
    ("commit.after_kafka_commit", "already_committed"),  # Kafka committed, the ledger was not told: the marker says
])
def test_a_commit_crashing_on_its_first_try_is_retried_and_publishes_once(
        airflow_connections, kafka_config, topics, curated, monkeypatch, tmp_path, run_after, fault, outcome,
        spark_connect):
    pg_url = airflow_connections
    counts = produce_orders(topics, hours=1)
    monkeypatch.setenv("EOS_FAULTS", f"{fault}=raise*1")
    monkeypatch.setenv("EOS_FAULTS_STATE", str(tmp_path))

    run = run_window(load_dag(PIPELINE), window_date(0), run_after(0))
    assert run.state == "success", states(run)
    commit = next(ti for ti in run.get_task_instances() if ti.task_id == "window.commit")
    assert commit.try_number == 2
    assert commit_summary(run)["outcome"] == outcome
    assert sql(pg_url, "SELECT epoch, state FROM eos.attempts") == [(1, "committed")]
    assert sql(pg_url, "SELECT count(*) FROM eos.kafka_commits WHERE pipeline = %s", PIPELINE) == [(1,)]
    audit(pg_url, kafka_config)
    seen = assert_consumer_sees_each_record_once(pg_url, kafka_config)
    assert len(seen) == counts["good"][0]  # the crashed try's records were aborted: read_committed hides them


def test_clearing_a_committed_window_skips_it(airflow_connections, kafka_config, topics, curated, run_after,
                                              spark_connect):
    pg_url = airflow_connections
    counts = produce_orders(topics, hours=1)
    dag = load_dag(PIPELINE)
    assert run_window(dag, window_date(0), run_after(0)).state == "success"
    before = read_committed(kafka_config)

    rerun = run_window(dag, window_date(0), run_after(0))  # the UI's Clear of the committed run
    assert rerun.state == "success", states(rerun)
    assert skipped_rerun_summary(rerun)["committed_epoch"] == 1  # no attempt, no Spark job, no Asset event
    assert sql(pg_url, "SELECT epoch, state FROM eos.attempts ORDER BY epoch") == [(1, "committed")]
    assert sql(pg_url, "SELECT count(*) FROM pg_tables WHERE schemaname = 'eos_staging'") == [(0,)]
    audit(pg_url, kafka_config)
    after = assert_consumer_sees_each_record_once(pg_url, kafka_config)
    assert len(after) == len(before) == counts["good"][0]  # the rerun published nothing


def test_a_window_staged_on_spark_connect_is_published_once(airflow_connections, kafka_config, topics, curated,
                                                            spark_connect, run_after):
    """The stage on a Spark Connect server's driver (run_stage there, the
    KafkaSink's spec shipped to the write tasks in the data source's options)
    instead of a spark-submit: the same records, once."""
    pg_url = airflow_connections
    counts = produce_orders(topics, hours=1)
    run = run_window(load_dag(PIPELINE), window_date(0), run_after(0))
    assert run.state == "success", states(run)
    (w,) = audit(pg_url, kafka_config).windows
    assert (w.published_rows, w.dead_letters) == (counts["good"][0], counts["bad"][0])
    assert len(assert_consumer_sees_each_record_once(pg_url, kafka_config)) == counts["good"][0]
