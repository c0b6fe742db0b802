"""The example DAG orders_hourly_files through real Airflow (dag.test), real
Spark (spark-submit, local[2]; the tests of commits and clears on the
session's warm Spark Connect server, tests/e2e/conftest.py), the real broker and PostgreSQL (the ledger):
each window published as a Parquet partition directory. Every case ends audited
by ``verify`` and by what ``spark.read.parquet(root)`` returns: every record of
the committed windows' frozen ranges once, except the dead letters, nothing else."""

from __future__ import annotations

import itertools
import os
import time
import uuid
from collections import Counter
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from airflow_eos import FileTarget
from airflow_eos.core.ledger import Ledger
from airflow_eos.targets.files.storage import files_for
from airflow_eos.verify import verify

from harness.full_disk import fill, small_file_system

from harness.dags import register_dag, run_window, states, use_spark_connect
from harness.spark import quiet_session
from test_orders_dag import HOUR, T0, fresh_topic, load_dag, produce_orders, sql, window_date

pytestmark = pytest.mark.slow

PIPELINE = "orders_hourly_files"
_runs = itertools.count()


@pytest.fixture
def run_after():
    """One fixed run_after per window of a test (a second run is a Clear of the
    same run); a base of its own per test, apart from test_orders_dag's."""
    base = datetime(2026, 7, 1, tzinfo=timezone.utc) + next(_runs) * timedelta(days=1)
    return lambda h: base + h * timedelta(minutes=1)


@pytest.fixture
def root(request, tmp_path, monkeypatch):
    """The example DAG's root, this test's own (read when the DAG file is parsed):
    a local directory, or (``indirect`` parameter "hdfs") an hdfs:// URL on the
    session's HDFS."""
    if getattr(request, "param", "local") == "hdfs":
        path = f"{request.getfixturevalue('hdfs').address}/lake/{uuid.uuid4().hex}/orders"
    else:
        path = tmp_path / "lake" / "orders"
    monkeypatch.setenv("EOS_ORDERS_FILES_ROOT", str(path))
    return path


def listed(directory) -> list[str]:
    return [e.name for e in files_for(str(directory)).entries(str(directory))]


@pytest.fixture(scope="module")
def spark():
    with quiet_session("eos-test-files-dag", master="local[1]") as session:
        yield session


def load_files_dag():
    """The example DAG, parsed again (it reads its root from the environment when
    its file runs, as the DAG processor runs it afresh each parse)."""
    return load_dag(PIPELINE)


def audit(pg_url, kafka_config, root, pipeline=PIPELINE):
    report = verify(Ledger(pg_url), kafka_config, FileTarget(path=str(root)), pipeline)
    assert report.clean, str(report)
    return report


def expected_lineage(pg_url, pipeline=PIPELINE) -> list[tuple]:
    """Every record of the committed windows' frozen ranges, minus their dead letters."""
    ranges = sql(pg_url, "SELECT r.topic, r.partition, r.start_offset, r.end_offset FROM eos.window_ranges r"
                         " JOIN eos.windows w USING (pipeline, window_start) WHERE w.pipeline = %s"
                         " AND w.state = 'committed'", pipeline)
    dead = set(sql(pg_url, 'SELECT topic, partition, "offset" FROM eos.dead_letters WHERE pipeline = %s', pipeline))
    return sorted((t, p, o) for t, p, start, end in ranges for o in range(start, end) if (t, p, o) not in dead)


def read_back(spark, root) -> list[tuple]:
    """(topic, partition, offset) of every row ``spark.read.parquet(root)`` returns."""
    if not [e for e in listed(root) if not e.startswith(("_", "."))]:
        return []
    rows = spark.read.parquet(str(root)).select("eos_topic", "eos_partition", "eos_offset").collect()
    return [tuple(r) for r in rows]


def assert_published_exactly(spark, pg_url, root, pipeline=PIPELINE) -> list[tuple]:
    seen = read_back(spark, root)
    assert max(Counter(seen).values(), default=1) == 1, "a record published twice"
    expected = expected_lineage(pg_url, pipeline)
    assert sorted(seen) == expected
    return seen


def staging_left(root) -> list[str]:
    try:
        return listed(f"{root}/_eos_staging")
    except FileNotFoundError:
        return []


def commit_summary(run) -> dict:
    return next(ti for ti in run.get_task_instances() if ti.task_id == "window.commit").xcom_pull(
        task_ids="window.commit")


def skipped_rerun_summary(run) -> dict:
    """The rerun of a committed window that its target skips: no attempt, no
    Spark job; the checkpoint and commit are skipped (no Asset event) and the
    stage's XCom says who committed the window."""
    tis = {ti.task_id: ti for ti in run.get_task_instances()}
    assert (tis["window.stage"].state, tis["window.await_checkpoint"].state, tis["window.commit"].state) == (
        "skipped", "skipped", "skipped")
    summary = tis["window.stage"].xcom_pull(task_ids="window.stage")
    assert (summary["outcome"], summary["epoch"]) == ("skipped", None), summary
    return summary


@pytest.mark.parametrize("root", ["local", "hdfs"], indirect=True)
def test_windows_are_published_as_partition_directories_once(airflow_connections, kafka_config, topics, run_after,
                                                              root, spark):
    two_windows_are_published_as_partition_directories_once(airflow_connections, kafka_config, topics, run_after,
                                                            root, spark)


def two_windows_are_published_as_partition_directories_once(pg_url, kafka_config, topics, run_after, root,
                                                            spark) -> None:
    """Two hourly windows of the example DAG, each run once: audited by verify
    and by what ``spark.read.parquet(root)`` of ``spark`` returns."""
    fresh_topic(topics, "orders")
    counts = produce_orders(topics, hours=2)
    dag = load_files_dag()
    for h in range(2):
        run = run_window(dag, window_date(h), run_after(h))
        assert run.state == "success", states(run)

    report = audit(pg_url, kafka_config, root)
    assert report.committed_windows == 2 and report.lineage
    by_window = {w.window_start: w for w in report.windows}
    for h in range(2):
        w = by_window[T0 + h * HOUR]
        assert (w.published_rows, w.dead_letters) == (counts["good"][h], counts["bad"][h])
    seen = assert_published_exactly(spark, pg_url, root)
    assert len(seen) == counts["good"][0] + counts["good"][1]
    assert sorted(e for e in listed(root) if not e.startswith("_")) == [
        "eos_window_start=2026-03-01T00%3A00%3A00Z", "eos_window_start=2026-03-01T01%3A00%3A00Z"]
    df = spark.read.parquet(str(root))
    assert sorted(df.columns) == sorted(["order_id", "customer", "amount", "eos_topic", "eos_partition",
                                         "eos_offset", "eos_window_start"])
    assert dict(sql(pg_url, 'SELECT partition, "offset" FROM eos.partition_offsets')) == {p: 200 for p in range(4)}
    assert staging_left(root) == []


def test_a_stage_failing_on_its_first_try_is_retried_and_commits_once(
        airflow_connections, kafka_config, topics, monkeypatch, tmp_path, run_after, root, spark):
    pg_url = airflow_connections
    fresh_topic(topics, "orders")
    produce_orders(topics, hours=1)
    monkeypatch.setenv("EOS_FAULTS", "stage.mid_write=raise*1")  # the first job fails after writing its rows
    monkeypatch.setenv("EOS_FAULTS_STATE", str(tmp_path / "faults"))
    (tmp_path / "faults").mkdir()

    run = run_window(load_files_dag(), window_date(0), run_after(0))
    assert run.state == "success", states(run)
    stage = next(ti for ti in run.get_task_instances() if ti.task_id == "window.stage")
    assert stage.try_number == 2
    assert sql(pg_url, "SELECT epoch, state FROM eos.attempts ORDER BY epoch") == [(1, "aborted"), (2, "committed")]
    assert staging_left(root) == []
    audit(pg_url, kafka_config, root)
    assert_published_exactly(spark, pg_url, root)


def test_a_failed_window_publishes_nothing_and_a_clear_reruns_it_exactly_once(
        airflow_connections, kafka_config, topics, monkeypatch, run_after, root, spark, spark_connect):
    pg_url = airflow_connections
    fresh_topic(topics, "orders")
    produce_orders(topics, hours=1)
    dag = load_files_dag()

    monkeypatch.setenv("EOS_FAULTS", "commit.before_publish=raise")  # every commit try fails before its decision
    run = run_window(dag, window_date(0), run_after(0))
    assert run.state == "failed", states(run)
    assert states(run)["window.commit"] == "failed" and states(run)["window.abort"] == "success"
    assert read_back(spark, root) == []  # nothing visible
    assert sql(pg_url, "SELECT state FROM eos.attempts") == [("aborted",)]
    assert staging_left(root) == []  # abort deleted the staging

    monkeypatch.delenv("EOS_FAULTS")
    rerun = run_window(dag, window_date(0), run_after(0))  # the UI's Clear of the run
    assert rerun.run_id == run.run_id and rerun.state == "success", states(rerun)
    assert sql(pg_url, "SELECT epoch, state FROM eos.attempts ORDER BY epoch") == [(1, "aborted"), (2, "committed")]
    audit(pg_url, kafka_config, root)
    assert_published_exactly(spark, pg_url, root)


def test_clearing_a_committed_window_skips_by_default(airflow_connections, kafka_config, topics, run_after, root,
                                                      spark, spark_connect):
    pg_url = airflow_connections
    fresh_topic(topics, "orders")
    produce_orders(topics, hours=1)
    dag = load_files_dag()
    assert run_window(dag, window_date(0), run_after(0)).state == "success"
    partition = root / "eos_window_start=2026-03-01T00%3A00%3A00Z"
    before = {e.name: e.inode() for e in os.scandir(partition)}

    rerun = run_window(dag, window_date(0), run_after(0))
    assert rerun.state == "success", states(rerun)
    assert skipped_rerun_summary(rerun)["committed_epoch"] == 1
    assert {e.name: e.inode() for e in os.scandir(partition)} == before  # untouched
    assert sql(pg_url, "SELECT epoch, state FROM eos.attempts ORDER BY epoch") == [(1, "committed")]
    assert staging_left(root) == []
    audit(pg_url, kafka_config, root)
    assert_published_exactly(spark, pg_url, root)


def test_clearing_a_committed_window_with_replace_swaps_its_directory(airflow_connections, kafka_config, topics,
                                                                     run_after, root, spark, spark_connect):
    """The same pipeline in a DAG whose FileTarget has on_committed='replace': a
    Clear of the committed window publishes the new attempt's files in place of
    the old ones, in one atomic exchange; the window's rows are there once."""
    from airflow.sdk import DAG
    from airflow.timetables.interval import CronDataIntervalTimetable

    from airflow_eos import KafkaSource, exactly_once_window

    pg_url = airflow_connections
    fresh_topic(topics, "orders")
    produce_orders(topics, hours=1)
    root.mkdir(parents=True)
    with DAG("orders_hourly_files_replace", schedule=CronDataIntervalTimetable("0 * * * *", timezone="UTC"),
             start_date=T0, catchup=False, default_args={"retries": 1, "retry_delay": timedelta(seconds=0)}) as dag:
        exactly_once_window(pipeline="orders_files_replace", source=KafkaSource(topics=["orders"]),
                            transform="airflow_eos.examples.transforms:orders",
                            target=FileTarget(path=str(root), on_committed="replace"), max_bad_records=1_000)
    register_dag(dag)

    assert run_window(dag, window_date(0), run_after(0)).state == "success"
    partition = root / "eos_window_start=2026-03-01T00%3A00%3A00Z"
    first = {e.name for e in os.scandir(partition)}
    rerun = run_window(dag, window_date(0), run_after(0))
    assert rerun.state == "success", states(rerun)
    summary = commit_summary(rerun)
    assert (summary["outcome"], summary["committed_epoch"]) == ("replaced", 2)
    second = {e.name for e in os.scandir(partition)}
    assert first & second == {"_eos_commit.json"}  # every data file is the new attempt's
    assert sql(pg_url, "SELECT committed_epoch FROM eos.windows") == [(2,)]
    assert staging_left(root) == []
    (kept,) = os.listdir(root / "_eos_trash")  # the old version, kept its retention for readers still listing it
    assert {e.name for e in os.scandir(root / "_eos_trash" / kept)} == first
    assert FileTarget(path=str(root), ledger_url=pg_url).sink().delete_expired_trash(now=time.time() + 600) == [kept]
    audit(pg_url, kafka_config, root, pipeline="orders_files_replace")
    assert_published_exactly(spark, pg_url, root, pipeline="orders_files_replace")


def test_a_full_disk_fails_the_window_saying_so_publishes_nothing_and_a_clear_reruns_it_once(
        airflow_connections, kafka_config, topics, monkeypatch, run_after, spark, connect_server):
    """The example DAG, the stage job by spark-submit, the root on a real tmpfs
    that a ballast file fills: both tries of the stage fail at Spark's first
    Parquet write, with an error that says the disk is full and where; the abort
    deletes the staging, nothing is published. With space freed, a Clear of the
    run publishes the window once (staged on the session's warm Spark Connect
    server: the rerun's Spark job is not what this test is about, and a third
    spark-submit cost ~40 s)."""
    pg_url = airflow_connections
    fresh_topic(topics, "orders")
    counts = produce_orders(topics, hours=1)
    with small_file_system("8m") as mount_point:
        root = Path(mount_point) / "lake" / "orders"
        monkeypatch.setenv("EOS_ORDERS_FILES_ROOT", str(root))
        # room for the root and its claim (the first begin writes _eos_root.json), none for the window's files
        ballast = fill(mount_point, leave=16 * 1024)
        dag = load_files_dag()
        run = run_window(dag, window_date(0), run_after(0))
        assert run.state == "failed", states(run)
        assert states(run)["window.stage"] == "failed" and states(run)["window.abort"] == "success", states(run)
        attempts = sql(pg_url, "SELECT epoch, state, reason FROM eos.attempts ORDER BY epoch")
        assert [(e, s) for e, s, _ in attempts] == [(1, "aborted"), (2, "aborted")]  # the try and its retry
        for _, _, reason in attempts:
            assert "the disk is full (No space left on device): Spark's Parquet writer could not write the " \
                   f"window's files into {root}/_eos_staging/" in reason and f"mounted at {mount_point} (" in reason, \
                reason
        # nothing published (the root's claim only: readers skip it), nothing left
        assert sorted(os.listdir(root)) == ["_eos_root.json", "_eos_staging"] and staging_left(root) == []

        os.unlink(ballast)  # space freed
        use_spark_connect(monkeypatch, connect_server)
        rerun = run_window(dag, window_date(0), run_after(0))  # the UI's Clear of the run
        assert rerun.run_id == run.run_id and rerun.state == "success", states(rerun)
        assert [s for _, s, _ in sql(pg_url, "SELECT epoch, state, reason FROM eos.attempts ORDER BY epoch")] == [
            "aborted", "aborted", "committed"]
        report = audit(pg_url, kafka_config, root)
        assert [(w.published_rows, w.dead_letters) for w in report.windows] == [(counts["good"][0], counts["bad"][0])]
        assert len(assert_published_exactly(spark, pg_url, root)) == counts["good"][0]
        assert staging_left(root) == []
