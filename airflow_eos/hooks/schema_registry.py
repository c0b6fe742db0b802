"""The schema registry of an Avro source: an ``eos_schema_registry`` connection
as the settings of confluent-kafka's SchemaRegistryClient.

The connection: ``host`` a hostname (with ``port``, default 8081, and
``schema`` the URL's path, e.g. ``apis/ccompat/v7``) or a whole URL;
``login``/``password`` HTTP basic auth; extra ``tls`` (true: https), and the
client's TLS and timeout settings (``ssl.ca.location``,
``ssl.certificate.location``, ``ssl.key.location``, ``ssl.key.password``,
``timeout``, ``max.retries``, ``retries.wait.ms``). The password is in ``registry_config`` only, never in a repr,
a log line or an error (``registry_address`` is what messages name).
"""

from __future__ import annotations

from functools import cached_property
from typing import Any

from airflow.sdk import BaseHook
from airflow_eos.core.avro import registry_address
from airflow_eos.core.errors import ConfigurationError

CONN_TYPE = "eos_schema_registry"
DEFAULT_CONN_ID = "schema_registry_default"
DEFAULT_PORT = 8081
EXTRA_SETTINGS = ("ssl.ca.location", "ssl.certificate.location", "ssl.key.location", "ssl.key.password", "timeout",
                  "max.retries", "retries.wait.ms")


class EosSchemaRegistryHook(BaseHook):
    """An ``eos_schema_registry`` connection (see the module docstring)."""

    conn_name_attr = "schema_registry_conn_id"
    default_conn_name = DEFAULT_CONN_ID
    conn_type = CONN_TYPE
    hook_name = "Schema registry (airflow-eos)"

    def __init__(self, schema_registry_conn_id: str = DEFAULT_CONN_ID, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.schema_registry_conn_id = schema_registry_conn_id

    def __repr__(self) -> str:
        return f"EosSchemaRegistryHook(schema_registry_conn_id={self.schema_registry_conn_id!r})"

    @classmethod
    def get_ui_field_behaviour(cls) -> dict[str, Any]:
        return {"hidden_fields": [],
                "relabeling": {"host": "Host or URL", "schema": "Path (e.g. apis/ccompat/v7)"},
                "placeholders": {"extra": '{"tls": true, "ssl.ca.location": "/etc/ssl/registry-ca.pem"}'}}

    @cached_property
    def registry_config(self) -> dict[str, Any]:
        """The SchemaRegistryClient settings: ``url``, basic auth, TLS, timeout."""
        conn = self.get_connection(self.schema_registry_conn_id)
        extra = conn.extra_dejson
        unknown = sorted(set(extra) - {"tls", *EXTRA_SETTINGS})
        if unknown:
            raise ConfigurationError(f"connection {self.schema_registry_conn_id!r} has extra settings {unknown} "
                                     f"an {CONN_TYPE} connection does not know (it knows tls, "
                                     f"{', '.join(EXTRA_SETTINGS)})")
        config: dict[str, Any] = {"url": registry_url(conn.host, conn.port, conn.schema, bool(extra.get("tls")),
                                                      self.schema_registry_conn_id)}
        if conn.login:
            config["basic.auth.user.info"] = f"{conn.login}:{conn.password or ''}"
        config.update({key: extra[key] for key in EXTRA_SETTINGS if key in extra})
        return config

    @property
    def address(self) -> str:
        """The registry's URL without credentials: what messages name."""
        return registry_address(self.registry_config)

    def get_conn(self) -> dict[str, Any]:
        return self.registry_config


def registry_url(host: str | None, port: int | None, path: str | None, tls: bool, conn_id: str) -> str:
    """A connection's registry URL: ``host`` when it is a URL, else built from its parts."""
    if not host:
        raise ConfigurationError(f"the {CONN_TYPE} connection {conn_id!r} has no host: set the registry's host "
                                 "(and port) or its URL")
    if "://" in host:
        return host.rstrip("/")
    suffix = "/" + path.strip("/") if path and path.strip("/") else ""
    return f"{'https' if tls else 'http'}://{host}:{port or DEFAULT_PORT}{suffix}"
