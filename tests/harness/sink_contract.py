"""What the sink contract suite (tests/integration/test_sink_contract.py)
needs to know of each registered target: how to make one in the test's
services, and rows of its shape. The suite itself knows no target: it runs
the same tests for every kind that ``airflow_eos.core.target`` registers, as
Spark's and Flink's connector test bases do for each connector that supplies
its environment. A new target registers its kind and adds its entry to
:data:`CONTRACT_TARGETS` below (the suite fails for a registered kind
without one); a kind that lives on more than one kind of store has an entry
per store (the file target: a local directory, HDFS; the Iceberg target: the
ledger's SQL catalog, a REST catalog, an object store)."""

from __future__ import annotations

import os
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import psycopg
import pyarrow as pa

from airflow_eos.core.target import TargetSpec

# What the whole suite stages: window i of a pipeline holds offsets
# [i * PER_WINDOW, (i + 1) * PER_WINDOW) of each of two source partitions.
PARTITIONS = 2


@dataclass
class Services:
    """The real services of one test: a fresh ledger database, a directory,
    and (asked for only by the targets that need it) the Kafka broker."""

    pg_url: str
    tmp_path: Path
    fixture: Callable[[str], Any]  # pytest's request.getfixturevalue

    @property
    def kafka_config(self) -> dict:
        return self.fixture("kafka_config")

    def topic(self, partitions: int, prefix: str) -> str:
        return self.fixture("topics").create(partitions=partitions, prefix=prefix)


class ContractTarget:
    """One registered target as the contract suite makes it."""

    kind: str
    on_committed: tuple[str, ...] = ("skip", "replace")  # what clearing a committed window may do
    commit_points: frozenset[str] = frozenset({"commit.before_publish"})  # the commit fault points it reaches
    decided_points: frozenset[str] = frozenset()  # those of them where the window's commit is decided already

    def source_topic(self, services: Services) -> str:
        """The source topic the windows are planned over (it must exist only
        for a target that reads or writes the source's cluster)."""
        return "orders"

    def spec(self, services: Services, on_committed: str = "skip") -> TargetSpec:
        """A bound spec of a new, empty target in ``services``."""
        raise NotImplementedError

    def batch(self, topic: str, partition: int, offsets: list[int], version: int) -> pa.RecordBatch:
        """The rows a transform makes of these source records, lineage included."""
        return pa.record_batch({
            "id": pa.array([partition * 1_000_000 + o for o in offsets], pa.int64()),
            "note": pa.array([f"v{version} {topic}/{partition}/{o}" for o in offsets]),
            "eos_topic": pa.array([topic] * len(offsets)),
            "eos_partition": pa.array([partition] * len(offsets), pa.int32()),
            "eos_offset": pa.array(offsets, pa.int64()),
        })


class PostgresContract(ContractTarget):
    kind = "postgres"
    commit_points = frozenset({"commit.before_publish", "commit.after_publish"})

    def spec(self, services: Services, on_committed: str = "skip") -> TargetSpec:
        from airflow_eos.targets.postgres import PostgresTarget
        with psycopg.connect(services.pg_url, autocommit=True) as conn:
            conn.execute("CREATE TABLE IF NOT EXISTS orders (id bigint NOT NULL, note text, eos_topic text NOT NULL,"
                         " eos_partition integer NOT NULL, eos_offset bigint NOT NULL, eos_pipeline text NOT NULL,"
                         " eos_window_start timestamptz NOT NULL)")
        return PostgresTarget(services.pg_url, "orders", on_committed=on_committed)


class FilesContract(ContractTarget):
    kind = "files"
    commit_points = frozenset({"commit.before_publish", "commit.after_decision", "commit.after_rename",
                               "commit.before_cleanup"})
    decided_points = commit_points - {"commit.before_publish"}  # the ledger decided

    def spec(self, services: Services, on_committed: str = "skip") -> TargetSpec:
        from airflow_eos.targets.files import FileTarget
        root = services.tmp_path / "lake"
        os.makedirs(root, exist_ok=True)
        return FileTarget(path=str(root), ledger_url=services.pg_url, on_committed=on_committed)


class FilesOnHdfsContract(FilesContract):
    """The file target with its root on HDFS (the session's mini-cluster)."""

    def spec(self, services: Services, on_committed: str = "skip") -> TargetSpec:
        from airflow_eos.targets.files import FileTarget
        from airflow_eos.targets.files.storage import files_for
        root = f"{services.fixture('hdfs').address}/lake/{uuid.uuid4().hex}"
        files_for(root).makedirs(root)
        return FileTarget(path=root, ledger_url=services.pg_url, on_committed=on_committed)


class KafkaContract(ContractTarget):
    kind = "kafka"
    on_committed = ("skip",)  # a topic is append-only: the spec refuses "replace"
    commit_points = frozenset({"commit.before_publish", "commit.after_publish", "commit.mid_produce",
                               "commit.after_kafka_commit"})
    decided_points = frozenset({"commit.after_kafka_commit"})  # Kafka decided; the ledger follows

    def source_topic(self, services: Services) -> str:
        return services.topic(PARTITIONS, "src")

    def spec(self, services: Services, on_committed: str = "skip") -> TargetSpec:
        from airflow_eos.targets.kafka import KafkaTarget
        return KafkaTarget(topic=services.topic(3, "out"), key_column="key", value_column="value",
                           ledger_url=services.pg_url, kafka_config=services.kafka_config, on_committed=on_committed)

    def batch(self, topic: str, partition: int, offsets: list[int], version: int) -> pa.RecordBatch:
        return pa.record_batch({
            "key": pa.array([f"k{o}" for o in offsets]),
            "value": pa.array([f"v{version} {topic}/{partition}/{o}" for o in offsets]),
            "eos_topic": pa.array([topic] * len(offsets)),
            "eos_partition": pa.array([partition] * len(offsets), pa.int32()),
            "eos_offset": pa.array(offsets, pa.int64()),
        })


class IcebergContract(ContractTarget):
    kind = "iceberg"
    commit_points = frozenset({"commit.before_publish", "commit.after_decision", "commit.after_publish",
                               "commit.before_cleanup"})
    decided_points = commit_points - {"commit.before_publish"}  # the ledger decided

    def spec(self, services: Services, on_committed: str = "skip") -> TargetSpec:
        from harness.iceberg import create_table
        from airflow_eos.targets.iceberg import IcebergTarget
        create_table(services.pg_url, "contract.orders", services.tmp_path / "warehouse")
        return IcebergTarget(table="contract.orders", ledger_url=services.pg_url, on_committed=on_committed)


class IcebergOnRestContract(IcebergContract):
    """The Iceberg target with its table in a REST catalog (the session's
    Iceberg REST catalog server): the catalog outlives the test, so each
    test's table has a namespace of its own."""

    def spec(self, services: Services, on_committed: str = "skip") -> TargetSpec:
        from harness.iceberg import create_table, rest_catalog_properties
        from airflow_eos.targets.iceberg import IcebergTarget
        properties = rest_catalog_properties(services.fixture("iceberg_rest").address)
        table = f"contract_{uuid.uuid4().hex[:12]}.orders"
        create_table(services.pg_url, table, services.tmp_path / "warehouse", properties=properties)
        return IcebergTarget(table=table, ledger_url=services.pg_url, catalog_conn_id="iceberg_rest",
                             catalog_properties=properties, on_committed=on_committed)


class IcebergOnS3Contract(IcebergContract):
    """The Iceberg target with its table's files on an object store (the
    session's S3 endpoint, tests/harness/object_store.py), its catalog the
    SQL catalog in the ledger's database given the store's ``s3.*``
    properties: no directory, no rename."""

    def spec(self, services: Services, on_committed: str = "skip") -> TargetSpec:
        from harness.iceberg import create_table
        from airflow_eos.targets.iceberg import IcebergTarget
        from airflow_eos.targets.iceberg.table import ledger_catalog_properties
        s3 = services.fixture("s3")
        properties = {**ledger_catalog_properties(services.pg_url), **s3.io_properties()}
        warehouse = f"{s3.create_bucket('lake')}/{uuid.uuid4().hex}"
        create_table(services.pg_url, "contract.orders", warehouse, properties=properties)
        return IcebergTarget(table="contract.orders", ledger_url=services.pg_url, catalog_conn_id="iceberg_s3",
                             catalog_properties=properties, on_committed=on_committed)


# by test id: the kind, or the kind and its store
CONTRACT_TARGETS: dict[str, ContractTarget] = {"postgres": PostgresContract(), "files": FilesContract(),
                                               "files-hdfs": FilesOnHdfsContract(), "kafka": KafkaContract(),
                                               "iceberg": IcebergContract(), "iceberg-rest": IcebergOnRestContract(),
                                               "iceberg-s3": IcebergOnS3Contract()}


def contract_ids(kinds: list[str]) -> list[str]:
    """The contract's test ids for the registered ``kinds``: each kind's
    entries, and a kind without one as itself (its tests fail, saying so)."""
    ids = [name for name, c in CONTRACT_TARGETS.items() if c.kind in kinds]
    return ids + [k for k in kinds if not any(c.kind == k for c in CONTRACT_TARGETS.values())]
