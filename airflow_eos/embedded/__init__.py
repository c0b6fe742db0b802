"""Embedded, throwaway real services: what ``airflow-eos demo`` runs on (PostgreSQL
and Apache Kafka), and what the tests and ``make bench`` start too (with a Spark
Connect server, HDFS for the file target's tests, an Iceberg REST catalog for the
Iceberg target's and a schema registry for the Avro source's). In the package
because the demo needs it at run time; the test-only harness lives in tests/harness.

Each service listens on 127.0.0.1 on a free port and is stopped by whoever
started it (use them as context managers).  When ``EOS_POSTGRES_URL`` or
``EOS_KAFKA_BOOTSTRAP`` is set, :func:`postgres_service` / :func:`kafka_service`
hand out that external service instead of starting one.

No Airflow imports here: the demo and the benchmarks use this too. One module
per service (``postgres``, ``kafka``, ``spark_connect``, ``hdfs``,
``iceberg_rest``, ``schema_registry``) and the process helpers they share
(``processes``); import the services from here.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass

from airflow_eos.embedded.hdfs import HADOOP_VERSION, HdfsCluster, hdfs_home
from airflow_eos.embedded.iceberg_rest import ICEBERG_VERSION, IcebergRestCatalog, iceberg_rest_home
from airflow_eos.embedded.kafka import KAFKA_SETTINGS, KAFKA_VERSION, KafkaBroker, cluster_id, kafka_home
from airflow_eos.embedded.postgres import PostgresServer
from airflow_eos.embedded.processes import free_port
from airflow_eos.embedded.schema_registry import SCHEMA_REGISTRY_VERSION, SchemaRegistry, schema_registry_home
from airflow_eos.embedded.spark_connect import SparkConnectServer

__all__ = ["HADOOP_VERSION", "ICEBERG_VERSION", "KAFKA_SETTINGS", "KAFKA_VERSION", "SCHEMA_REGISTRY_VERSION",
           "HdfsCluster", "IcebergRestCatalog", "KafkaBroker", "PostgresServer", "SchemaRegistry", "ServiceHandle",
           "SparkConnectServer", "cluster_id", "free_port", "hdfs_home", "hdfs_service", "iceberg_rest_home",
           "iceberg_rest_service", "kafka_home", "kafka_service", "postgres_service", "schema_registry_home",
           "schema_registry_service"]


@dataclass(frozen=True)
class ServiceHandle:
    """What a test needs of a service, and whether it is ours to restart."""

    address: str
    embedded: object | None = None


@contextlib.contextmanager
def postgres_service(max_connections: int = 200) -> Iterator[ServiceHandle]:
    """``max_connections``: the embedded server's (an external one has its own)."""
    external = os.environ.get("EOS_POSTGRES_URL")
    if external:
        yield ServiceHandle(external)
        return
    with PostgresServer(max_connections) as server:
        yield ServiceHandle(server.url, server)


@contextlib.contextmanager
def kafka_service() -> Iterator[ServiceHandle]:
    external = os.environ.get("EOS_KAFKA_BOOTSTRAP")
    if external:
        yield ServiceHandle(external)
        return
    with KafkaBroker() as broker:
        yield ServiceHandle(broker.bootstrap, broker)


@contextlib.contextmanager
def hdfs_service() -> Iterator[ServiceHandle]:
    """Hadoop's mini-cluster; the handle's address is its ``hdfs://127.0.0.1:PORT``."""
    with HdfsCluster() as cluster:
        yield ServiceHandle(cluster.url, cluster)


@contextlib.contextmanager
def schema_registry_service() -> Iterator[ServiceHandle]:
    """Apicurio Registry; the handle's address is its Confluent-compatible API's URL."""
    with SchemaRegistry() as registry:
        yield ServiceHandle(registry.url, registry)


@contextlib.contextmanager
def iceberg_rest_service() -> Iterator[ServiceHandle]:
    """Iceberg's REST catalog test server; the handle's address is its ``http://127.0.0.1:PORT``."""
    with IcebergRestCatalog() as catalog:
        yield ServiceHandle(catalog.uri, catalog)
