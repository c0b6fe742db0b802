"""Running DAGs in-process with real Airflow (``dag.test``), for tests/e2e
and tests/chaos/test_airflow_faults.py: the connections as environment
variables, an inline DAG stored where ``dag.test`` finds it, one data
interval's run, and the stage moved onto a warm Spark Connect server.

Test modules import these from here, not from a conftest: under
pytest-xdist ``import conftest`` names whichever conftest module was imported
last, not the one beside the test.
"""

from __future__ import annotations

import json
from datetime import datetime


def set_airflow_connections(monkeypatch, pg_url: str, kafka_address: str) -> None:
    """kafka_default, postgres_default (the database at ``pg_url``) and spark_default (local[2])."""
    from psycopg.conninfo import conninfo_to_dict

    pg = conninfo_to_dict(pg_url)
    monkeypatch.setenv("AIRFLOW_CONN_KAFKA_DEFAULT", json.dumps(
        {"conn_type": "kafka", "extra": {"bootstrap.servers": kafka_address, "fetch.wait.max.ms": 10}}))
    monkeypatch.setenv("AIRFLOW_CONN_POSTGRES_DEFAULT", json.dumps(
        {"conn_type": "postgres", "host": pg["host"], "port": int(pg["port"]), "login": pg["user"],
         "schema": pg["dbname"], "password": pg.get("password")}))
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_DEFAULT", json.dumps({"conn_type": "spark", "host": "local[2]"}))
    monkeypatch.setenv("SPARK_LOCAL_IP", "127.0.0.1")


def use_spark_connect(monkeypatch, server) -> None:
    """spark_default becomes a spark_connect connection; spark-submit may not run."""
    from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook

    monkeypatch.setenv("AIRFLOW_CONN_SPARK_DEFAULT", json.dumps(
        {"conn_type": "spark_connect", "host": "127.0.0.1", "port": server.port}))

    def no_spark_submit(*args, **kwargs):
        raise AssertionError("the stage ran spark-submit, not the Spark Connect server")

    monkeypatch.setattr(SparkSubmitHook, "submit", no_spark_submit)


def run_window(dag, logical_date: datetime, run_after: datetime):
    """Run (or, called again with the same dates, clear and rerun) the DAG run
    of one data interval in-process. ``dag.test`` clears the run's task
    instances through the same path as the UI's Clear before running them."""
    return dag.test(logical_date=logical_date, run_after=run_after)


def states(dag_run) -> dict[str, str]:
    return {ti.task_id: str(ti.state) for ti in dag_run.get_task_instances()}


def register_dag(dag) -> None:
    """Store an inline DAG in Airflow's database, as dag.test needs; DAGs of the
    dags folder are stored by dag.test itself."""
    from airflow.dag_processing.bundles.manager import DagBundlesManager
    from airflow.dag_processing.dagbag import DagBag, sync_bag_to_db

    DagBundlesManager().sync_bundles_to_db()
    bag = DagBag(dag_folder="/nonexistent", collect_dags=False)
    bag.bag_dag(dag)
    sync_bag_to_db(bag, "dags-folder", None)
