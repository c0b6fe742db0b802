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

import logging
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

from airflow.providers.apache.kafka.hooks.base import KafkaBaseHook
from airflow.providers.postgres.hooks.postgres import PostgresHook
from airflow_eos.core.attempt import Attempt
from airflow_eos.core.errors import WindowNotClosed
from airflow_eos.core.ledger import Ledger
from airflow_eos.core.plan import DEFAULT_MAX_TIMESTAMP_SKEW, ON_SKEWED_FAIL, PlanRequest, plan_window
from airflow_eos.targets.postgres.target import PostgresTarget
from airflow_eos.core.source import KafkaLog
from airflow_eos.core.windows import Window, WindowPlan

log = logging.getLogger(__name__)


class EosKafkaHook(KafkaBaseHook):
    """The Kafka provider's ``kafka`` connection (extra = librdkafka config dict),
    as the client configuration the core's readers are built from."""

    hook_name = "Apache Kafka (airflow-eos)"

    def _get_client(self, config: dict[str, Any]) -> dict[str, Any]:
        return config

    @property
    def kafka_config(self) -> dict[str, Any]:
        return dict(self.get_conn)


class EosPostgresHook(PostgresHook):
    """The Postgres provider's ``postgres`` connection, as the libpq URL of the
    target database (which also holds the ledger, schema ``eos``)."""

    hook_name = "Postgres (airflow-eos)"

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


def resolve_target(target: PostgresTarget) -> PostgresTarget:
    """The target with the URL of its Airflow connection (unless it has one)."""
    if target.url:
        return target
    return target.with_url(EosPostgresHook(postgres_conn_id=target.postgres_conn_id).ledger_url)


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
) -> WindowPlan | None:
    """The window's frozen plan, or None while the window is not closed.

    ``dag_id``, ``target_id`` and ``target_exclusive`` are the plan's claim on
    the pipeline (see core/ownership.py); None where the caller does not know
    (a trigger serialised by an older version names neither)."""
    request = PlanRequest(Window(pipeline, window_start, window_end), tuple(topics),
                          timedelta(seconds=idle_partition_grace_seconds),
                          timedelta(seconds=max_timestamp_skew_seconds), on_skewed_timestamp,
                          dag_id=dag_id, target_id=target_id, target_exclusive=target_exclusive)
    with KafkaLog(EosKafkaHook(kafka_config_id=kafka_conn_id).kafka_config) as kafka_log:
        try:
            return plan_window(ledger_for(postgres_conn_id), kafka_log, request)
        except WindowNotClosed as exc:
            log.info("%s", exc)
            return None


def prepared_or_none(*, target: dict, attempt: dict) -> str | None:
    """Prepare the attempt: its detail once prepared, None while its checkpoint is
    not written yet. Raises when waiting cannot help (fenced, aborted, incomplete)."""
    readiness = resolve_target(PostgresTarget(**target)).prepare(Attempt.from_dict(attempt))
    if not readiness.prepared:
        log.info("%s", readiness.detail)
        return None
    return readiness.detail


# Connection extras that are libpq parameters (the rest are the hook's own).
_LIBPQ_KEYS = frozenset({
    "sslmode", "sslcert", "sslkey", "sslrootcert", "sslcrl", "application_name", "connect_timeout",
    "options", "keepalives", "keepalives_idle", "target_session_attrs", "gssencmode",
})
