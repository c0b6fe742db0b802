"""Real Airflow for end-to-end tests: DAGs run with ``dag.test`` against the
session's PostgreSQL (target + ledger), the broker and local Spark, through
Airflow connections given as environment variables.

The stage runs by ``spark-submit`` (a JVM per window, as the example DAGs are
written) unless a test asks for ``spark_connect``: then on one warm local Spark
Connect server shared by the session, as a deployment runs it. Each target's
tests keep spark-submit where the Spark job is the point (windows published,
a stage failing in Spark, a full disk); the tests of commits, clears and
reruns, whose Spark job is incidental, use the warm server (it saves a JVM
start, ~25 s here, per window run).

The example DAGs read and write fixed topic names (``orders``,
``orders_curated``, ``events``): the e2e tests have a broker of their worker's
own, not the run's shared one, so that two workers' tests of one DAG never
meet on its topics."""

from __future__ import annotations

import pytest
from harness.dags import set_airflow_connections, use_spark_connect

from airflow_eos.embedded import kafka_service


@pytest.fixture(scope="session")
def kafka(pg_server):
    """A broker of this worker's e2e tests (unless EOS_KAFKA_BOOTSTRAP names one),
    started by the first that needs it."""
    with kafka_service() as handle:
        yield handle


@pytest.fixture
def airflow_connections(airflow_db, pg_url, kafka, monkeypatch):
    """kafka_default, postgres_default (this test's database) and spark_default (local[2])."""
    set_airflow_connections(monkeypatch, pg_url, kafka.address)
    return pg_url


@pytest.fixture(scope="session")
def connect_server():
    """One local Spark Connect server (127.0.0.1, a free port) for the session,
    started by the first test that needs it, stopped at the end."""
    from airflow_eos.embedded import SparkConnectServer

    with SparkConnectServer("local[2]") as server:
        yield server


@pytest.fixture
def spark_connect(airflow_connections, connect_server, monkeypatch):
    """This test's windows stage on the session's warm Spark Connect server."""
    use_spark_connect(monkeypatch, connect_server)
    return connect_server
