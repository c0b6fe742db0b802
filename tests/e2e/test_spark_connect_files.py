"""The file target on a Spark Connect server: the example DAG orders_hourly_files
through real Airflow (dag.test), with ``spark_default`` a ``spark_connect``
connection to a real local server (one warm driver JVM for the module) instead
of a spark-submit per window. The server's Spark writes the window's Parquet
files into the staging; the commit renames it into place. What a reader sees is
read back through the same server with ``spark.read.parquet(root)``; every case
ends audited by ``verify`` and by lineage."""

from __future__ import annotations

import pytest

from conftest import run_window, states  # tests/e2e/conftest.py
from test_files_dag import (  # noqa: F401 - root and run_after are fixtures
    assert_published_exactly, audit, load_files_dag, root, run_after, staging_left)
from test_orders_dag import fresh_topic, produce_orders, sql, window_date
from test_spark_connect import connect_server, use_spark_connect  # noqa: F401 - connect_server is a fixture

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def reader(connect_server):  # noqa: F811 - test_spark_connect's fixture
    """A Spark Connect session of the same server, for reading the root back."""
    from airflow_eos.spark.session import spark_session, stop_session

    session = spark_session("eos-test-connect-files-reader", remote=connect_server.url)
    yield session
    stop_session(session)


def test_windows_staged_on_spark_connect_are_published_as_partition_directories_once(
        airflow_connections, kafka_config, topics, connect_server, monkeypatch, run_after, root,  # noqa: F811
        reader):
    pg_url = airflow_connections
    use_spark_connect(monkeypatch, connect_server)
    fresh_topic(topics, "orders")
    counts = produce_orders(topics, hours=2)
    dag = load_files_dag()
    for h in range(2):
        run = run_window(dag, window_date(h), run_after(h))
        assert run.state == "success", states(run)

    assert sql(pg_url, "SELECT epoch, state FROM eos.attempts") == [(1, "committed")] * 2
    report = audit(pg_url, kafka_config, root)
    assert [(w.published_rows, w.dead_letters) for w in sorted(report.windows, key=lambda w: w.window_start)] == [
        (counts["good"][h], counts["bad"][h]) for h in range(2)]
    seen = assert_published_exactly(reader, pg_url, root)  # spark.read.parquet(root) on the server: each row once
    assert len(seen) == counts["good"][0] + counts["good"][1]
    assert sorted(reader.read.parquet(str(root)).columns) == sorted(
        ["order_id", "customer", "amount", "eos_topic", "eos_partition", "eos_offset", "eos_window_start"])
    assert staging_left(root) == []
