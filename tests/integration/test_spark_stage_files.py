"""The stage job into a FileTarget: Spark's own Parquet writer stages the rows
(no Python hop per row), the driver checkpoints what the read tasks reported and
the files the writes left, the sink seals, prepares and publishes them.

Real broker, real Spark (local[2], one JVM for the module), real PostgreSQL for
the ledger. Exactness is proven by lineage: what ``spark.read.parquet(root)``
returns and the dead letters in the ledger, against the records produced.
"""

from __future__ import annotations

import json
import uuid
from collections import Counter
from datetime import datetime, timedelta, timezone

import psycopg
import pytest
from harness.spark import quiet_session

from airflow_eos.core.attempt import load_offsets
from airflow_eos.core.errors import AttemptClosed
from airflow_eos.core.ledger import Ledger
from airflow_eos.core.windows import PartitionRange, TopicPartition, Window, WindowPlan
from airflow_eos.targets.files import FileTarget
from airflow_eos.targets.files.storage import files_for
from airflow_eos.targets.files.writer import STAGING_DIR
from airflow_eos.verify import verify

pytestmark = pytest.mark.slow

T0 = datetime(2024, 1, 1, tzinfo=timezone.utc)
PIPELINE = "orders_files"
WINDOW = Window(PIPELINE, T0, T0 + timedelta(hours=1))
PARTITIONS = 2
PER_PARTITION = 300
ORDERS = "airflow_eos.examples.transforms:orders"


@pytest.fixture(scope="module")
def spark():
    with quiet_session("eos-test-spark-stage-files", master="local[2,3]") as session:
        yield session


def order_value(n: int) -> bytes:
    if n % 50 == 7:
        return b"{not json %d" % n
    return json.dumps({"order_id": f"o-{n}", "customer": f"c-{n % 13}", "amount": f"{n % 1000}.{n % 100:02d}"}
                      ).encode()


@pytest.fixture
def orders(topics):
    """A topic of orders, every 50th malformed; returns (topic, {(topic, partition, offset): value})."""
    topic = topics.create(PARTITIONS, prefix="files")
    truth = {}
    for p in range(PARTITIONS):
        values = [order_value(p * PER_PARTITION + i) for i in range(PER_PARTITION)]
        topics.produce(topic, [(p, 0, v) for v in values])
        truth.update({(topic, p, o): v for o, v in enumerate(values)})
    return topic, truth


@pytest.fixture
def root(request, tmp_path):
    """A fresh root: a local directory, or (``indirect`` parameter "hdfs") one
    on the session's HDFS; as the path or URL a FileTarget is given."""
    if getattr(request, "param", "local") == "hdfs":
        url = f"{request.getfixturevalue('hdfs').address}/lake/{uuid.uuid4().hex}/orders"
        files_for(url).makedirs(url)
        return url
    path = tmp_path / "lake" / "orders"
    path.mkdir(parents=True)
    return str(path)


def listed(directory) -> list[str]:
    return [e.name for e in files_for(str(directory)).entries(str(directory))]


def planned(pg_url, topic) -> WindowPlan:
    plan = WindowPlan(WINDOW, tuple(PartitionRange(topic, p, 0, PER_PARTITION) for p in range(PARTITIONS)))
    ledger = Ledger(pg_url)
    with ledger.connect() as conn, conn.transaction():
        ledger.lock_pipeline(conn, plan.pipeline)
        ledger.freeze(conn, plan, [])
    return plan


def execute(url, statement, params=None):
    with psycopg.connect(url, autocommit=True) as conn:
        cur = conn.execute(statement, params)
        return cur.fetchall() if cur.description else None


def published_lineage(spark, root) -> list[tuple]:
    """What a reader of the root sees (Spark skips names starting with "_" or ".")."""
    if not [e for e in listed(root) if not e.startswith(("_", "."))]:
        return []  # Spark cannot read a root without a visible file
    rows = spark.read.parquet(str(root)).select("eos_topic", "eos_partition", "eos_offset").collect()
    return [tuple(r) for r in rows]


def without_keys(transform):
    """The example transform without its key and value columns: dead letters
    then get their raw record read back from Kafka."""
    from airflow_eos.spark.transform import load_transform

    fn = load_transform(transform)
    return lambda df: fn(df).drop("key", "value")


@pytest.mark.parametrize("raw, reader, root", [("from the transform", "python", "local"),
                                               ("read back", "python", "local"),
                                               ("from the transform", "spark", "local"),
                                               ("from the transform", "python", "hdfs")], indirect=["root"])
def test_a_window_is_staged_by_sparks_parquet_writer_and_published_once(spark, pg_url, ledger, kafka_config, orders,
                                                                       root, raw, reader):
    from airflow_eos.spark import run_stage

    topic, truth = orders
    bad = sorted(k for k, v in truth.items() if v.startswith(b"{not json"))
    good = sorted(set(truth) - set(bad))
    plan = planned(pg_url, topic)
    sink = FileTarget(path=str(root), ledger_url=pg_url).sink()
    attempt = sink.begin(plan.window)
    transform = ORDERS if raw == "from the transform" else without_keys(ORDERS)

    report = run_stage(spark, plan, attempt, sink, kafka_config, transform, max_bad_records=len(bad), reader=reader)

    assert (report.records_read, report.rows_staged, report.dead_letters) == (len(truth), len(good), len(bad))
    assert [(r.partition, r.start_offset, r.end_offset, r.records) for r in report.consumed] == [
        (p, 0, PER_PARTITION, PER_PARTITION) for p in range(PARTITIONS)]
    assert published_lineage(spark, root) == []  # staged under _eos_staging: invisible to readers
    assert sink.prepare(attempt).prepared
    result = sink.commit(attempt)
    assert (result.outcome, result.published_rows, result.dead_letter_rows) == ("published", len(good), len(bad))

    df = spark.read.parquet(str(root))
    assert sorted(df.columns) == sorted(["order_id", "customer", "amount", "eos_topic", "eos_partition",
                                         "eos_offset", "eos_window_start"])
    assert sorted(published_lineage(spark, root)) == good  # each good record once, nothing else
    assert {str(r[0]) for r in df.select("eos_window_start").distinct().collect()} == {"2024-01-01T00:00:00Z"}
    assert execute(pg_url, 'SELECT topic, partition, "offset", key, value FROM eos.dead_letters ORDER BY 2, 3') == [
        (t, p, o, None, truth[(t, p, o)]) for t, p, o in bad]
    with psycopg.connect(pg_url) as conn:
        assert load_offsets(conn, PIPELINE) == {TopicPartition(topic, p): PER_PARTITION for p in range(PARTITIONS)}
    assert listed(f"{root}/{STAGING_DIR}") == []
    audit = verify(ledger, kafka_config, sink, PIPELINE)
    assert audit.clean, str(audit)
    assert (audit.totals.published_rows, audit.totals.dead_letters) == (len(good), len(bad))


def test_too_many_dead_letters_fail_the_job_clearly_and_stage_nothing(spark, pg_url, ledger, kafka_config, orders,
                                                                      root):
    from airflow_eos.spark import StageFailed, run_stage

    topic, truth = orders
    bad = sorted(k for k, v in truth.items() if v.startswith(b"{not json"))
    plan = planned(pg_url, topic)
    sink = FileTarget(path=str(root), ledger_url=pg_url).sink()
    attempt = sink.begin(plan.window)
    with pytest.raises(StageFailed) as failure:
        run_stage(spark, plan, attempt, sink, kafka_config, ORDERS, max_bad_records=len(bad) - 1)
    message = str(failure.value)
    assert failure.value.error == "TooManyBadRecords"
    assert (f"the job dead-lettered {len(bad)} records, more than max_bad_records={len(bad) - 1}" in message
            and "attempt aborted, staging dropped" in message), message
    t, p, o = bad[0]
    assert f"{t}[{p}] offset {o}: malformed order" in message
    assert listed(f"{root}/{STAGING_DIR}") == []
    with pytest.raises(AttemptClosed):
        sink.prepare(attempt)

    rerun = sink.begin(plan.window)  # a new attempt stages the window fully
    report = run_stage(spark, plan, rerun, sink, kafka_config, ORDERS, max_bad_records=len(bad))
    assert report.dead_letters == len(bad)
    assert sink.prepare(rerun).prepared and sink.commit(rerun).outcome == "published"
    lineage = published_lineage(spark, root)
    assert max(Counter(lineage).values()) == 1 and len(lineage) == len(truth) - len(bad)


def test_a_second_run_of_the_job_for_one_attempt_replaces_what_the_first_left(spark, pg_url, ledger, kafka_config,
                                                                              orders, root):
    """Spark's writer appends; a run of the job that died after writing (its
    process killed before the checkpoint) left files in the staging: the next
    run of the same attempt deletes them first, so nothing is counted twice."""
    from airflow_eos.spark import run_stage

    topic, truth = orders
    plan = planned(pg_url, topic)
    sink = FileTarget(path=str(root), ledger_url=pg_url).sink()
    attempt = sink.begin(plan.window)
    spark.createDataFrame([("x", 1)], "order_id string, n int").write.parquet(
        sink.spark_output(attempt).data, mode="append")  # a dead run's leftovers
    report = run_stage(spark, plan, attempt, sink, kafka_config, ORDERS, max_bad_records=100)
    assert report.records_read == len(truth)
    assert report.rows_staged + report.dead_letters == len(truth)
    assert sink.prepare(attempt).prepared
    sink.commit(attempt)
    assert sorted(published_lineage(spark, root)) == sorted(
        k for k, v in truth.items() if not v.startswith(b"{not json"))
