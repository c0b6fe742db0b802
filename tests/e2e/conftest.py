"""Real Airflow for end-to-end tests: DAGs run with ``dag.test`` against the
session's PostgreSQL (target + ledger), the broker and local Spark, through
Airflow connections given as environment variables.

The stage runs by ``spark-submit`` (a JVM per window, as the example DAGs are
written) unless a test asks for ``spark_connect``: then on one warm local Spark
Connect server shared by the session, as a deployment runs it. Each target's
tests keep spark-submit where the Spark job is the point (windows published,
a stage failing in Spark, a full disk); the tests of commits, clears and
reruns, whose Spark job is incidental, use the warm server (it saves a JVM
start, ~25 s here, per window run)."""

from __future__ import annotations

import json
from datetime import datetime

import pytest


@pytest.fixture
def airflow_connections(airflow_db, pg_url, kafka, monkeypatch):
    """kafka_default, postgres_default (this test's database) and spark_default (local[2])."""
    from psycopg.conninfo import conninfo_to_dict

    pg = conninfo_to_dict(pg_url)
    monkeypatch.setenv("AIRFLOW_CONN_KAFKA_DEFAULT", json.dumps(
        {"conn_type": "kafka", "extra": {"bootstrap.servers": kafka.address, "fetch.wait.max.ms": 10}}))
    monkeypatch.setenv("AIRFLOW_CONN_POSTGRES_DEFAULT", json.dumps(
        {"conn_type": "postgres", "host": pg["host"], "port": int(pg["port"]), "login": pg["user"],
         "schema": pg["dbname"], "password": pg.get("password")}))
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_DEFAULT", json.dumps(
        {"conn_type": "spark", "host": "local[2]"}))
    monkeypatch.setenv("SPARK_LOCAL_IP", "127.0.0.1")
    return pg_url


@pytest.fixture(scope="session")
def connect_server():
    """One local Spark Connect server (127.0.0.1, a free port) for the session,
    started by the first test that needs it, stopped at the end."""
    from airflow_eos.embedded import SparkConnectServer

    with SparkConnectServer("local[2]") as server:
        yield server


def use_spark_connect(monkeypatch, server) -> None:
    """spark_default becomes a spark_connect connection; spark-submit may not run."""
    from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook

    monkeypatch.setenv("AIRFLOW_CONN_SPARK_DEFAULT", json.dumps(
        {"conn_type": "spark_connect", "host": "127.0.0.1", "port": server.port}))

    def no_spark_submit(*args, **kwargs):
        raise AssertionError("the stage ran spark-submit, not the Spark Connect server")

    monkeypatch.setattr(SparkSubmitHook, "submit", no_spark_submit)


@pytest.fixture
def spark_connect(airflow_connections, connect_server, monkeypatch):
    """This test's windows stage on the session's warm Spark Connect server."""
    use_spark_connect(monkeypatch, connect_server)
    return connect_server


def run_window(dag, logical_date: datetime, run_after: datetime):
    """Run (or, called again with the same dates, clear and rerun) the DAG run
    of one data interval in-process. ``dag.test`` clears the run's task
    instances through the same path as the UI's Clear before running them."""
    return dag.test(logical_date=logical_date, run_after=run_after)


def states(dag_run) -> dict[str, str]:
    return {ti.task_id: str(ti.state) for ti in dag_run.get_task_instances()}


def register_dag(dag) -> None:
    """Store an inline DAG in Airflow's database, as dag.test needs; DAGs of the
    dags folder are stored by dag.test itself. (tests/chaos/test_airflow_faults.py
    has the same few lines: the two directories cannot import each other.)"""
    from airflow.dag_processing.bundles.manager import DagBundlesManager
    from airflow.dag_processing.dagbag import DagBag, sync_bag_to_db

    DagBundlesManager().sync_bundles_to_db()
    bag = DagBag(dag_folder="/nonexistent", collect_dags=False)
    bag.bag_dag(dag)
    sync_bag_to_db(bag, "dags-folder", None)
