"""The stage on a Spark Connect server: the same example DAG through real Airflow
(dag.test), with ``spark_default`` a ``spark_connect`` connection to a real local
server (one warm driver JVM for the module) instead of a spark-submit per window.
Exactly-once is shown by lineage, as for spark-submit."""

from __future__ import annotations


import pytest

from airflow_eos.core.attempt import staging_name
from airflow_eos.embedded import SparkConnectServer

from harness.dags import run_window, use_spark_connect
from test_orders_dag import (  # noqa: F401 - run_after is a fixture
    HOUR, T0, fresh_topic, load_dag, produce_orders, run_after, sql, stage_retried_once_then_committed,
    three_consecutive_windows_publish_every_record_once, window_date)

pytestmark = pytest.mark.slow


def freeze_first_hour(pg_url: str, pipeline: str):
    """The first hour of produce_orders(topics, hours=1) planned straight into
    the ledger (migrated here), as the planner freezes it: offsets [0, 100) of
    the 4 partitions of ``orders``. Returns the WindowPlan."""
    from airflow_eos.core.ledger import Ledger
    from airflow_eos.core.windows import PartitionRange, Window, WindowPlan

    ledger = Ledger(pg_url)
    ledger.migrate()
    plan = WindowPlan(Window(pipeline, T0, T0 + HOUR), tuple(PartitionRange("orders", p, 0, 100) for p in range(4)))
    with ledger.connect() as conn, conn.transaction():
        ledger.lock_pipeline(conn, plan.pipeline)
        ledger.freeze(conn, plan, [])
    return plan


def test_consecutive_windows_on_spark_connect_publish_every_record_once(
        airflow_connections, kafka_config, topics, connect_server, monkeypatch, run_after):
    use_spark_connect(monkeypatch, connect_server)
    three_consecutive_windows_publish_every_record_once(airflow_connections, kafka_config, topics, run_after)
    assert sql(airflow_connections, "SELECT epoch, state FROM eos.attempts") == [(1, "committed")] * 3


def test_windows_into_a_table_partitioned_by_window_publish_every_record_once(
        airflow_connections, kafka_config, topics, connect_server, monkeypatch, run_after):
    """The example DAG in mode partition_per_window: each window's staging,
    sealed by the job commit on the server, became the window's partition."""
    use_spark_connect(monkeypatch, connect_server)
    three_consecutive_windows_publish_every_record_once(
        airflow_connections, kafka_config, topics, run_after,
        dag_id="orders_hourly_partitioned", table="analytics.orders_partitioned")
    partitions = sql(airflow_connections, "SELECT c.relname, pg_get_expr(c.relpartbound, c.oid) FROM pg_inherits i"
                                          " JOIN pg_class c ON c.oid = i.inhrelid WHERE c.relkind = 'r'"
                                          " AND i.inhparent = 'analytics.orders_partitioned'::regclass ORDER BY 1")
    assert [p[0] for p in partitions] == [staging_name("orders_hourly_partitioned", T0 + h * HOUR, 1)
                                          for h in range(3)]
    assert [p[1] for p in partitions] == [f"FOR VALUES FROM ('{T0 + h * HOUR:%Y-%m-%d %H:%M:%S}+00') TO "
                                          f"('{T0 + (h + 1) * HOUR:%Y-%m-%d %H:%M:%S}+00')" for h in range(3)]
    assert sql(airflow_connections, "SELECT count(*) FROM pg_tables WHERE schemaname = 'eos_staging'") == [(0,)]


def test_a_stage_failing_on_the_server_is_retried_and_commits_once(
        airflow_connections, kafka_config, topics, monkeypatch, tmp_path, run_after):
    """A write task on the server fails once (fault point in the server's Python
    workers): the job fails, the try's attempt is fenced and aborted, the retry
    stages again on the same server and commits; every record once."""
    pg_url = airflow_connections
    fresh_topic(topics, "orders")
    counts = produce_orders(topics, hours=1)
    faults = {"EOS_FAULTS": "stage.mid_write=raise*1", "EOS_FAULTS_STATE": str(tmp_path)}
    with SparkConnectServer("local[2]", env=faults) as server:
        use_spark_connect(monkeypatch, server)
        run = run_window(load_dag("orders_hourly"), window_date(0), run_after(0))
    report = stage_retried_once_then_committed(run, pg_url, kafka_config)
    (w,) = report.windows
    assert (w.published_rows, w.dead_letters) == (counts["good"][0], counts["bad"][0])


def test_too_many_bad_records_on_the_server_fail_with_a_clear_error_and_leave_nothing(
        pg_url, kafka_config, topics, connect_server):
    """run_stage as the stage operator calls it on Spark Connect: the job fails on
    the server (8 malformed orders, max_bad_records=0); the client's error names
    the cause, the attempt is aborted, its staging dropped, nothing published."""
    import psycopg

    from airflow_eos.targets.postgres.target import PostgresTarget
    from airflow_eos.examples.transforms import ORDERS_TABLE_DDL
    from airflow_eos.spark.session import spark_session, stop_session
    from airflow_eos.spark.stage import StageFailed, run_stage

    fresh_topic(topics, "orders")
    counts = produce_orders(topics, hours=1)  # 400 orders, 100 a partition, then one late record each
    assert counts["bad"][0] == 8
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(ORDERS_TABLE_DDL)
    plan = freeze_first_hour(pg_url, "orders_hourly")
    target = PostgresTarget(pg_url, "analytics.orders").sink()
    attempt = target.begin(plan.window)

    spark = spark_session("eos-test-connect-bad-records", remote=connect_server.url)
    try:
        with pytest.raises(StageFailed) as failed:
            run_stage(spark, plan, attempt, target, kafka_config, "airflow_eos.examples.transforms:orders",
                      max_bad_records=0)
    finally:
        stop_session(spark)
    message = str(failed.value)
    assert "attempt aborted, staging dropped" in message, message
    assert "TooManyBadRecords" in message and "malformed order" in message, message
    assert sql(pg_url, "SELECT state FROM eos.attempts") == [("aborted",)]
    assert sql(pg_url, "SELECT count(*) FROM pg_tables WHERE schemaname = 'eos_staging'") == [(0,)]
    assert sql(pg_url, "SELECT count(*) FROM analytics.orders") == [(0,)]
