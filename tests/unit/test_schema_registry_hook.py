"""The eos_schema_registry connection as SchemaRegistryClient settings: host
and port or a URL, basic auth, TLS extras; the password in no repr, message or
Spark option shown unredacted."""

from __future__ import annotations

import json
import re

import pytest

from airflow_eos.core.avro import registry_address
from airflow_eos.core.errors import ConfigurationError
from airflow_eos.hooks.schema_registry import EosSchemaRegistryHook
from airflow_eos.provider_info import get_provider_info
from airflow_eos.spark.kafka_source import ReadSettings, plan_options, registry_settings
from airflow_eos.core.windows import Window, WindowPlan

SECRET = "s3cr3t-Pa55"


def _connection(monkeypatch, conn_id: str, **fields) -> EosSchemaRegistryHook:
    monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", json.dumps({"conn_type": "eos_schema_registry", **fields}))
    return EosSchemaRegistryHook(conn_id)


def test_host_port_and_path_make_the_url(monkeypatch):
    hook = _connection(monkeypatch, "sr_parts", host="registry", port=8085, schema="apis/ccompat/v7")
    assert hook.registry_config == {"url": "http://registry:8085/apis/ccompat/v7"}


def test_tls_and_its_files(monkeypatch):
    hook = _connection(monkeypatch, "sr_tls", host="registry", extra={"tls": True, "ssl.ca.location": "/ca.pem",
                                                                       "timeout": 5})
    assert hook.registry_config == {"url": "https://registry:8081", "ssl.ca.location": "/ca.pem", "timeout": 5}


def test_a_url_as_host_and_basic_auth(monkeypatch):
    hook = _connection(monkeypatch, "sr_url", host="https://registry.example:443/ccompat/", login="eos",
                       password=SECRET)
    assert hook.registry_config == {"url": "https://registry.example:443/ccompat",
                                    "basic.auth.user.info": f"eos:{SECRET}"}
    assert hook.address == "https://registry.example:443/ccompat"
    assert SECRET not in repr(hook)


def test_unknown_extras_and_no_host_are_refused(monkeypatch):
    with pytest.raises(ConfigurationError, match="does not know"):
        _ = _connection(monkeypatch, "sr_odd", host="r", extra={"schema.registry.url": "x"}).registry_config
    with pytest.raises(ConfigurationError, match="has no host"):
        _ = _connection(monkeypatch, "sr_nohost").registry_config


def test_credentials_in_a_url_are_not_named():
    assert registry_address({"url": f"http://eos:{SECRET}@registry:8081/x"}) == "http://registry:8081/x"


def test_the_connection_type_is_registered():
    [kind] = get_provider_info()["connection-types"]
    assert kind["connection-type"] == "eos_schema_registry"
    assert kind["hook-class-name"].endswith("EosSchemaRegistryHook")


def test_the_password_travels_as_an_option_spark_redacts():
    """Spark's default spark.redaction.regex: its UI and logs show the value of a matching key redacted."""
    plan = WindowPlan(Window("p", "2024-01-01T00:00:00+00:00", "2024-01-01T01:00:00+00:00"))
    config = {"url": "http://registry:8081", "basic.auth.user.info": f"eos:{SECRET}"}
    options = plan_options(plan, {"bootstrap.servers": "k:9092"}, avro_reader_schema='{"type":"record"}',
                           registry_config=config)
    redaction = re.compile(r"(?i)secret|password|token|access[.]?key")
    holding = [key for key, value in options.items() if SECRET in value]
    assert holding and all(redaction.search(key) for key in holding)
    assert registry_settings(options) == config
    settings = ReadSettings.from_options(options)
    assert dict(settings.registry_config) == config and SECRET not in repr(settings)
