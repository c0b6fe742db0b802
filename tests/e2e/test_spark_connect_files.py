"""The file target on a Spark Connect server: the example DAG orders_hourly_files
through real Airflow (dag.test), with ``spark_default`` a ``spark_connect``
connection to a real local server (one warm driver JVM for the module) instead
of a spark-submit per window. The server's Spark writes the window's Parquet
files into the staging; the commit renames it into place. What a reader sees is
read back through the same server with ``spark.read.parquet(root)``; every case
ends audited by ``verify`` and by lineage. A full disk under the server's writer
(a real tmpfs) fails clearly, and the server's JVM gives the space back."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from airflow_eos import FileTarget

from test_files_dag import (  # noqa: F401 - root and run_after are fixtures
    PIPELINE, assert_published_exactly, audit, root, run_after, staging_left,
    two_windows_are_published_as_partition_directories_once)
from test_orders_dag import fresh_topic, produce_orders, sql
from harness.dags import use_spark_connect
from test_spark_connect import freeze_first_hour

from harness.full_disk import fill, orders_with_blob, small_file_system
from harness.spark import quiet_session

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def reader(connect_server):
    """A Spark Connect session of the same server, for reading the root back."""
    with quiet_session("eos-test-connect-files-reader", remote=connect_server.url) as session:
        yield session


def test_windows_staged_on_spark_connect_are_published_as_partition_directories_once(
        airflow_connections, kafka_config, topics, connect_server, monkeypatch, run_after, root,  # noqa: F811 - fixtures
        reader):
    """The file DAG's two windows, staged on the server, read back through it."""
    use_spark_connect(monkeypatch, connect_server)
    two_windows_are_published_as_partition_directories_once(airflow_connections, kafka_config, topics, run_after,
                                                            root, reader)
    assert sql(airflow_connections, "SELECT epoch, state FROM eos.attempts") == [(1, "committed")] * 2


def test_a_full_disk_on_the_server_fails_clearly_frees_its_space_and_the_rerun_publishes_once(
        pg_url, kafka_config, topics, connect_server, reader):
    """run_stage as the stage operator calls it on Spark Connect, into a root on
    a real 8 MiB tmpfs with 256 KiB left: the server's Parquet writer hits the
    full disk; the client's error says so and where, the attempt is aborted and
    its staging deleted, nothing is published, and the server's JVM no longer
    holds the failed files (their space is free again). With space freed the
    rerun publishes the window once."""
    from airflow_eos.spark.session import spark_session, stop_session
    from airflow_eos.spark.stage import StageFailed, run_stage

    fresh_topic(topics, "orders")
    counts = produce_orders(topics, hours=1)
    plan = freeze_first_hour(pg_url, PIPELINE)
    free = 256 * 1024
    with small_file_system("8m") as mount_point:
        root = Path(mount_point) / "lake" / "orders"
        root.mkdir(parents=True)
        ballast = fill(mount_point, leave=free)  # the window's files need ~600 KB
        sink = FileTarget(path=str(root), ledger_url=pg_url).sink()
        attempt = sink.begin(plan.window)  # the first begin claims the root: _eos_root.json takes some of the space
        free = shutil.disk_usage(mount_point).free
        spark = spark_session("eos-test-connect-full-disk", remote=connect_server.url)
        try:
            with pytest.raises(StageFailed) as failed:
                run_stage(spark, plan, attempt, sink, kafka_config, orders_with_blob, max_bad_records=counts["bad"][0])
            message = str(failed.value)
            assert message.startswith(f"the stage job of {attempt} failed (attempt aborted, staging dropped): the "
                                      "disk is full (No space left on device): Spark's Parquet writer could not write "
                                      f"the window's files into {root}/_eos_staging/{attempt.staging}/data, on the "
                                      f"file system mounted at {mount_point} ("), message
            assert sql(pg_url, "SELECT state FROM eos.attempts") == [("aborted",)]
            assert sorted(os.listdir(root)) == ["_eos_root.json", "_eos_staging"] and staging_left(root) == []
            assert shutil.disk_usage(mount_point).free == free  # the server's JVM closed the deleted files

            os.unlink(ballast)
            rerun = sink.begin(plan.window)
            report = run_stage(spark, plan, rerun, sink, kafka_config, orders_with_blob,
                               max_bad_records=counts["bad"][0])
        finally:
            stop_session(spark)
        assert (report.rows_staged, report.dead_letters) == (counts["good"][0], counts["bad"][0])
        assert sink.prepare(rerun).prepared and sink.commit(rerun).outcome == "published"
        audit(pg_url, kafka_config, root)
        assert len(assert_published_exactly(reader, pg_url, root)) == counts["good"][0]
        assert staging_left(root) == []
