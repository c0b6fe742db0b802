"""Hooks: each owns one Airflow connection and hands the core what it needs of it.

The core takes plain values (a libpq URL, a confluent-kafka config dict) so it
runs without Airflow in Spark executors; these hooks turn connections into them.
"""

from __future__ import annotations

from typing import Any

from psycopg.conninfo import make_conninfo

from airflow.providers.apache.kafka.hooks.base import KafkaBaseHook
from airflow.providers.postgres.hooks.postgres import PostgresHook
from airflow_eos.core.postgres_target import PostgresTarget


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


# Connection extras that are libpq parameters (the rest are the hook's own).
_LIBPQ_KEYS = frozenset({
    "sslmode", "sslcert", "sslkey", "sslrootcert", "sslcrl", "application_name", "connect_timeout",
    "options", "keepalives", "keepalives_idle", "target_session_attrs", "gssencmode",
})
