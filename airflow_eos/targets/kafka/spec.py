"""KafkaTarget: the spec a DAG names (plain values, cheap to import).

A DAG file builds ``KafkaTarget(topic="orders_curated", kafka_conn_id=...,
postgres_conn_id=...)`` at parse time, so this module imports neither
confluent_kafka nor psycopg. What can be refused without a broker or a ledger
is refused here: ``on_committed="replace"`` (a topic is append-only), a bad
topic name, a column named twice.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from airflow_eos.core.client_settings import refuse_inline_secrets
from airflow_eos.core.columns import LINEAGE_COLUMNS
from airflow_eos.core.database import redact
from airflow_eos.core.errors import ConfigurationError
from airflow_eos.core.migrations import TargetMigration
from airflow_eos.core.target import (
    DEFAULT_CONN_IDS,
    KAFKA,
    POSTGRES,
    ConnectionRef,
    TargetCommand,
    TargetSpec,
    kafka_asset_uri,
)

if TYPE_CHECKING:
    from airflow_eos.targets.kafka.sink import KafkaSink

ON_COMMITTED = ("skip",)
_TOPIC = re.compile(r"^[A-Za-z0-9._\-]{1,249}$")
_CONN_ID = re.compile(r"^[\w.\-]+$")
_PREFIX = re.compile(r"^[A-Za-z0-9._\-]{1,100}$")
# librdkafka settings a user may not override: the sink owns them.
OWNED_SETTINGS = ("transactional.id", "enable.idempotence", "acks", "group.id", "isolation.level")


@dataclass(frozen=True)
class KafkaTarget(TargetSpec):
    """A Kafka topic as a two-phase-commit target (see
    :mod:`airflow_eos.targets.kafka.sink`): each window is published in one
    producer transaction, with its commit marker, exactly once.

    - ``topic``: the target topic. It must exist: it is never created.
    - ``key_column``, ``value_column``: the transform's output columns that
      become each record's key and value (binary, or strings sent as UTF-8);
      ``key_column=None``: records without a key.
    - ``header_columns``: output columns sent as headers (header name = column
      name) besides the lineage headers the sink adds.
    - ``kafka_conn_id``: the Kafka connection of the target cluster.
    - ``postgres_conn_id``: the PostgreSQL database of the ledger (schema
      ``eos``) and of the staging: a topic has no ledger of its own.
    - ``on_committed``: ``skip`` (the default, and the only choice): a window
      committed already is never published again. ``replace`` cannot exist for
      an append-only topic and is refused at parse time.
    - ``transactional_id_prefix``: the prefix of the per-window
      ``transactional.id`` and of the marker consumer groups (ACLs).
    - ``producer_config``: extra librdkafka settings of the producer (e.g.
      ``message.max.bytes``, ``compression.type``); the transactional ones
      are the sink's.
    - ``kafka_config``, ``ledger_url``: the resolved connections (bound by the
      hook layer; tests and scripts may give them directly, a DAG may not).
    """

    topic: str = ""
    key_column: str | None = "key"
    value_column: str = "value"
    header_columns: tuple[str, ...] = ()
    kafka_conn_id: str = DEFAULT_CONN_IDS[KAFKA]
    postgres_conn_id: str = DEFAULT_CONN_IDS[POSTGRES]
    on_committed: str = "skip"
    transactional_id_prefix: str = "airflow-eos"
    producer_config: Mapping[str, Any] = field(default_factory=dict)
    kafka_config: Mapping[str, Any] | None = field(default=None, repr=False)
    ledger_url: str | None = field(default=None, repr=False)

    kind: ClassVar[str] = "kafka"
    id_scheme: ClassVar[str] = "kafka"

    def __post_init__(self) -> None:
        if not isinstance(self.topic, str) or not _TOPIC.match(self.topic) or self.topic in (".", ".."):
            raise ConfigurationError(f"KafkaTarget needs topic='name' (letters, digits, '.', '_', '-'; at most 249), "
                                     f"not {self.topic!r}")
        if self.on_committed == "replace":
            raise ConfigurationError(
                "KafkaTarget cannot take on_committed='replace': a Kafka topic is append-only, so a committed "
                "window's records cannot be taken back and replaced; its consumers have read them. Use "
                "on_committed='skip' (the default: a window committed already is never published again), or "
                "publish a corrected window into another topic")
        if self.on_committed not in ON_COMMITTED:
            raise ConfigurationError(f"on_committed must be one of {ON_COMMITTED}, not {self.on_committed!r}")
        object.__setattr__(self, "header_columns", tuple(self.header_columns or ()))
        object.__setattr__(self, "producer_config", dict(self.producer_config or {}))
        if not isinstance(self.value_column, str) or not self.value_column:
            raise ConfigurationError("value_column must name the output column of the records' values")
        if self.key_column is not None and (not isinstance(self.key_column, str) or not self.key_column):
            raise ConfigurationError("key_column must name an output column, or be None (records without a key)")
        columns = self.record_columns
        if len(set(columns)) != len(columns):
            raise ConfigurationError(f"KafkaTarget names a column twice among key, value and headers: {columns}")
        reserved = sorted(set(columns) & set(LINEAGE_COLUMNS))
        if reserved:
            raise ConfigurationError(f"KafkaTarget columns {reserved} are the lineage columns: the sink sends them as "
                                     "lineage headers itself")
        bad = [h for h in self.header_columns if not isinstance(h, str) or not h or h.startswith("eos-")]
        if bad:
            raise ConfigurationError(f"header columns {bad}: a header name is a non-empty string not starting with "
                                     "'eos-' (the sink's lineage headers)")
        for name, value in (("kafka_conn_id", self.kafka_conn_id), ("postgres_conn_id", self.postgres_conn_id)):
            if not isinstance(value, str) or not _CONN_ID.match(value):
                raise ConfigurationError(f"{name} must name an Airflow connection, not {value!r}")
        if not isinstance(self.transactional_id_prefix, str) or not _PREFIX.match(self.transactional_id_prefix):
            raise ConfigurationError("transactional_id_prefix: letters, digits, '.', '_', '-' (at most 100), not "
                                     f"{self.transactional_id_prefix!r}")
        owned = sorted(set(self.producer_config) & set(OWNED_SETTINGS))
        if owned:
            raise ConfigurationError(f"producer_config may not set {owned}: the Kafka target's commit owns them")
        refuse_inline_secrets(self.producer_config, f"KafkaTarget(topic={self.topic!r}, producer_config=...)")

    def __repr__(self) -> str:
        where = redact(self.ledger_url) if self.ledger_url else f"connection {self.postgres_conn_id!r}"
        return (f"KafkaTarget({self.topic!r}, key={self.key_column!r}, value={self.value_column!r}, "
                f"headers={list(self.header_columns)}, kafka connection {self.kafka_conn_id!r}, ledger in {where})")

    @property
    def record_columns(self) -> tuple[str, ...]:
        """The output columns that make a record (key, value, headers)."""
        return ((self.key_column,) if self.key_column else ()) + (self.value_column,) + self.header_columns

    # ------------------------------------------------------------------ the spec (core/target.py)

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "topic": self.topic, "key_column": self.key_column,
                "value_column": self.value_column, "header_columns": list(self.header_columns),
                "kafka_conn_id": self.kafka_conn_id, "postgres_conn_id": self.postgres_conn_id,
                "on_committed": self.on_committed, "transactional_id_prefix": self.transactional_id_prefix,
                "producer_config": dict(self.producer_config),
                "kafka_config": dict(self.kafka_config) if self.kafka_config is not None else None,
                "ledger_url": self.ledger_url}

    @classmethod
    def from_fields(cls, fields: Mapping[str, Any]) -> "KafkaTarget":
        data = dict(fields)
        data["header_columns"] = tuple(data.get("header_columns") or ())
        return cls(**data)

    @classmethod
    def from_target_name(cls, name: str) -> "KafkaTarget":
        """``<kafka_conn_id>/<topic>``, as :attr:`target_id` writes it."""
        conn_id, _, topic = name.partition("/")
        return cls(topic=topic, kafka_conn_id=conn_id)

    def connections(self) -> tuple[ConnectionRef, ...]:
        refs = []
        if not self.ledger_url:
            refs.append(ConnectionRef("ledger", POSTGRES, self.postgres_conn_id))
        if self.kafka_config is None:
            refs.append(ConnectionRef("kafka", KAFKA, self.kafka_conn_id))
        return tuple(refs)

    def bind(self, values: Mapping[str, Any]) -> "KafkaTarget":
        changes: dict[str, Any] = {}
        if not self.ledger_url:
            changes["ledger_url"] = values["ledger"]
        if self.kafka_config is None:
            changes["kafka_config"] = dict(values["kafka"])
        return dataclasses.replace(self, **changes) if changes else self

    def sink(self) -> "KafkaSink":
        if not self.bound:
            raise ConfigurationError(f"{self!r} is not bound: resolve postgres_conn_id and kafka_conn_id (bind) "
                                     "before building its sink")
        from airflow_eos.targets.kafka.sink import KafkaSink
        return KafkaSink(topic=self.topic, kafka_config=dict(self.kafka_config or {}), ledger_url=self.ledger_url,
                         key_column=self.key_column, value_column=self.value_column,
                         header_columns=self.header_columns, target_id=self.target_id,
                         transactional_id_prefix=self.transactional_id_prefix,
                         producer_config=dict(self.producer_config), on_committed=self.on_committed,
                         spec=self)

    @property
    def ledger_conn_id(self) -> str:
        return self.postgres_conn_id

    @property
    def target_id(self) -> str:
        """``kafka:<kafka_conn_id>/<topic>``: the cluster by its connection, then the topic."""
        return f"{self.id_scheme}:{self.kafka_conn_id}/{self.topic}"

    @property
    def asset_uri(self) -> str:
        if self.kafka_config is None:
            raise ConfigurationError(f"{self.label}: its asset URI names the cluster: resolve kafka_conn_id first (bind)")
        return kafka_asset_uri(self.kafka_config, self.topic)

    @property
    def label(self) -> str:
        return f"topic {self.topic}"

    def check_for_dag(self) -> None:
        if self.ledger_url or self.kafka_config is not None:
            raise ConfigurationError("in a DAG, name the ledger's database with postgres_conn_id and the cluster with "
                                     "kafka_conn_id, not ledger_url / kafka_config: they would put secrets into the "
                                     "DAG and the task logs")

    @classmethod
    def commands(cls) -> tuple[TargetCommand, ...]:
        from airflow_eos.targets.kafka.cli import RESOLVE  # the ledger and psycopg: only the CLI needs them
        return (RESOLVE,)

    @classmethod
    def ledger_migrations(cls) -> tuple[TargetMigration, ...]:
        from airflow_eos.targets.kafka.migrations import MIGRATIONS
        return MIGRATIONS
