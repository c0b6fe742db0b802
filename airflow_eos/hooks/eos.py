"""Hooks: each owns one Airflow connection and hands the core what it needs of it.

The core takes plain values (a libpq URL, a confluent-kafka config dict) so it
runs without Airflow in Spark executors; these hooks turn connections into them.
The two waits of a window (plan_or_none, prepared_or_none) live here too: they
turn connection ids into values and call the core, and both the operators (in a
worker) and the triggers (in the triggerer) call them, so triggers import only
hooks and the core.

This module loads the Kafka and Postgres providers' hooks (confluent_kafka,
psycopg2): operators and sensors import it when they execute, never while a DAG
file is parsed.
"""

from __future__ import annotations

import contextlib
import logging
from functools import cached_property
from collections.abc import Callable, Iterator, Mapping, Sequence
from datetime import timedelta
from typing import Any

from airflow.providers.apache.kafka.hooks.base import KafkaBaseHook
from airflow.providers.postgres.hooks.postgres import PostgresHook
from airflow.sdk import BaseHook
from airflow.sdk.exceptions import AirflowException, AirflowFailException
from airflow_eos import steps
from airflow_eos.core.attempt import Attempt
from airflow_eos.core.errors import ConfigurationError, EosError, error_class
from airflow_eos.core.ledger import Ledger
from airflow_eos.core.plan import DEFAULT_MAX_TIMESTAMP_SKEW, ON_SKEWED_FAIL, PlanRequest
from airflow_eos.core.sink import Sink
from airflow_eos.core.source import KafkaLog
from airflow_eos.core.target import (
    CONNECTION,
    DEFAULT_CONN_IDS,
    KAFKA,
    POSTGRES,
    ConnectionRef,
    TargetSpec,
    as_spec,
    with_kind,
)
from airflow_eos.core.windows import Window, WindowPlan

log = logging.getLogger(__name__)


class EosKafkaHook(KafkaBaseHook):
    """The Kafka provider's ``kafka`` connection (extra = librdkafka config dict),
    as the client configuration the core's readers are built from."""

    hook_name = "Apache Kafka (airflow-eos)"
    default_conn_name = DEFAULT_CONN_IDS[KAFKA]

    def _get_client(self, config: dict[str, Any]) -> dict[str, Any]:
        return config

    @property
    def kafka_config(self) -> dict[str, Any]:
        return dict(self.get_conn)


class EosPostgresHook(PostgresHook):
    """The Postgres provider's ``postgres`` connection, as the libpq URL of the
    target database (which also holds the ledger, schema ``eos``)."""

    hook_name = "Postgres (airflow-eos)"
    default_conn_name = DEFAULT_CONN_IDS[POSTGRES]

    @property
    def ledger_url(self) -> str:
        from psycopg.conninfo import make_conninfo

        conn = self.connection
        extra = conn.extra_dejson
        if extra.get("iam", False):
            conn.login, conn.password, conn.port = self.get_iam_token(conn)
        params = {k: v for k, v in extra.items() if k in _LIBPQ_KEYS}
        return make_conninfo(
            "",
            host=conn.host or "localhost",
            port=conn.port or 5432,
            user=conn.login or None,
            password=conn.password or None,
            dbname=self.database or conn.schema or None,
            **params,
        )


class EosTargetHook(BaseHook):
    """A target spec's Airflow connections (the ledger's database, a Kafka
    cluster, ...), resolved into the values its runtime Sink is built from."""

    hook_name = "airflow-eos target"

    def __init__(self, target: TargetSpec | Mapping[str, Any], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.target = as_spec(_with_kind(target))

    @cached_property
    def bound(self) -> TargetSpec:
        """The spec with its connections' values (for the stage job's environment)."""
        return self.target.bind({ref.role: connection_value(ref) for ref in self.target.connections()})

    @cached_property
    def sink(self) -> Sink:
        return self.bound.sink()

    def get_conn(self) -> Sink:
        return self.sink


def connection_value(ref: ConnectionRef) -> Any:
    """The value a target needs of one Airflow connection (core/target.py)."""
    if ref.conn_type == POSTGRES:
        return EosPostgresHook(postgres_conn_id=ref.conn_id).ledger_url
    if ref.conn_type == KAFKA:
        return EosKafkaHook(kafka_config_id=ref.conn_id).kafka_config
    if ref.conn_type == CONNECTION:
        conn = BaseHook.get_connection(ref.conn_id)
        return {"conn_type": conn.conn_type, "host": conn.host, "port": conn.port, "login": conn.login,
                "password": conn.password, "schema": conn.schema, "extra": conn.extra_dejson}
    raise ConfigurationError(f"connection {ref.conn_id!r} ({ref.role}) has type {ref.conn_type!r}, which airflow-eos "
                             f"cannot resolve (it knows {POSTGRES!r}, {KAFKA!r} and {CONNECTION!r})")


def resolve_target(target: TargetSpec | Mapping[str, Any]) -> Sink:
    """The runtime sink of a target spec, its connections resolved here."""
    return EosTargetHook(target).sink


def _with_kind(target: Any) -> Any:
    """A spec dict with its kind (a trigger serialised by a version before
    specs carried their kind has none: see core.target.with_kind)."""
    return with_kind(target) if isinstance(target, Mapping) else target


def ledger_for(postgres_conn_id: str) -> Ledger:
    """The ledger in the target database, migrated to this version's schema."""
    ledger = Ledger(EosPostgresHook(postgres_conn_id=postgres_conn_id).ledger_url)
    ledger.migrate()
    return ledger


def plan_or_none(
    *,
    pipeline: str,
    topics: Sequence[str],
    window_start: str,
    window_end: str,
    idle_partition_grace_seconds: float,
    kafka_conn_id: str,
    postgres_conn_id: str,
    # Defaults: triggers serialised by a version without these arguments still run.
    max_timestamp_skew_seconds: float = DEFAULT_MAX_TIMESTAMP_SKEW.total_seconds(),
    on_skewed_timestamp: str = ON_SKEWED_FAIL,
    dag_id: str | None = None,
    target_id: str | None = None,
    target_exclusive: bool = False,
    target_aliases: Sequence[str] = (),
    target: Mapping[str, Any] | None = None,
    schema_registry_conn_id: str | None = None,
    reader_schema: str | None = None,
) -> WindowPlan | None:
    """steps.plan with the connections resolved: the window's frozen plan, or
    None while the window is not closed.

    ``dag_id``, ``target_id`` and ``target_exclusive`` are the plan's claim on
    the pipeline (see core/ownership.py); None where the caller does not know
    (a trigger serialised by an older version names neither). ``target`` (the
    unbound spec's to_dict) is resolved here, where its connections can be
    read, into the physical place the claim records (``Sink.claim_identity``).
    ``schema_registry_conn_id`` (an Avro source): the plan freezes
    ``reader_schema``, or, None, the latest schema of the topics' value subjects
    in that registry, read when the window is frozen (not while it waits)."""
    place = resolve_target(target).claim_identity() if target is not None and target_id is not None else None
    request = PlanRequest(Window(pipeline, window_start, window_end), tuple(topics),
                          timedelta(seconds=idle_partition_grace_seconds),
                          timedelta(seconds=max_timestamp_skew_seconds), on_skewed_timestamp,
                          dag_id=dag_id, target_id=target_id, target_exclusive=target_exclusive,
                          target_aliases=tuple(target_aliases), target_place=place,
                          reader_schema=_reader_schema(schema_registry_conn_id, reader_schema, topics))
    with KafkaLog(EosKafkaHook(kafka_config_id=kafka_conn_id).kafka_config) as kafka_log:
        return steps.plan(ledger_for(postgres_conn_id), kafka_log, request)


def _reader_schema(schema_registry_conn_id: str | None, given: str | None,
                   topics: Sequence[str]) -> str | Callable[[], str] | None:
    """PlanRequest's reader_schema: None for raw values, ``given``, or what reads the subjects' latest."""
    if schema_registry_conn_id is None:
        return None
    if given is not None:
        return given

    def latest() -> str:
        from airflow_eos.core.avro import latest_reader_schema
        from airflow_eos.hooks.schema_registry import EosSchemaRegistryHook

        subjects = tuple(f"{topic}-value" for topic in sorted(topics))
        return latest_reader_schema(EosSchemaRegistryHook(schema_registry_conn_id).registry_config, subjects)

    return latest


def prepared_or_none(*, target: Mapping[str, Any], attempt: Mapping[str, Any]) -> str | None:
    """steps.prepare with the target's connections resolved: the attempt's
    detail once prepared, None while its checkpoint is not written yet. Raises
    when waiting cannot help (fenced, aborted, incomplete)."""
    readiness = steps.prepare(resolve_target(target), Attempt.from_dict(attempt))
    return readiness.detail if readiness.prepared else None


@contextlib.contextmanager
def failing_terminally() -> Iterator[None]:
    """An EosError that retrying cannot cure (``terminal``: fenced attempt, window
    or ownership conflict, expired offsets, bad configuration, ...) fails the
    task without using its retries; its type and message stay in the chain."""
    try:
        yield
    except EosError as exc:
        if is_terminal(exc):
            raise AirflowFailException(f"{type(exc).__name__}: {exc}") from exc
        raise


def is_terminal(exc: EosError) -> bool:
    """``exc`` or, for a failed Spark job, the error inside it (``error``: its class name) is terminal."""
    inner = error_class(getattr(exc, "error", None) or "")
    return exc.terminal or bool(inner is not None and inner.terminal)


def reraise_event_error(event: Mapping[str, Any], doing: str) -> None:
    """A trigger's ``error`` event, raised in the task as the error the trigger
    caught: its own type and message (terminal ones fail without retries)."""
    name, message = event.get("error") or "Exception", event.get("message") or ""
    cls = error_class(name)
    if cls is None:
        raise AirflowException(f"{doing} failed in the triggerer: {name}: {message}")
    with failing_terminally():
        raise _rebuilt(cls, message)


def _rebuilt(cls: type[EosError], message: str) -> EosError:
    try:
        return cls(message)
    except TypeError:  # an error with keyword-only details (NotPrepared's missing)
        exc = cls.__new__(cls)
        Exception.__init__(exc, message)
        return exc


# Connection extras that are libpq parameters (the rest are the hook's own).
_LIBPQ_KEYS = frozenset({
    "sslmode", "sslcert", "sslkey", "sslrootcert", "sslcrl", "application_name", "connect_timeout",
    "options", "keepalives", "keepalives_idle", "target_session_attrs", "gssencmode",
})
