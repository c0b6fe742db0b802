"""A DAG passes client settings to KafkaSource(reader_config=…) and
KafkaTarget(producer_config=…): a secret there is refused (it belongs in the
Airflow connection), and no repr or error shows its value (issue 33, item 3)."""

import pytest

from airflow_eos import KafkaSource
from airflow_eos.core.errors import ConfigurationError
from airflow_eos.targets.kafka import KafkaTarget

SECRET = "hunter2-do-not-print"
SECRET_SETTINGS = ["sasl.password", "ssl.key.password", "ssl.keystore.password", "sasl.oauthbearer.client.secret",
                   "ssl.key.pem", "sasl.oauthbearer.config"]


@pytest.mark.parametrize("key", SECRET_SETTINGS)
def test_reader_config_refuses_a_secret(key):
    with pytest.raises(ConfigurationError) as err:
        KafkaSource(topics=["orders"], reader_config={"fetch.max.bytes": 1 << 20, key: SECRET})
    text = str(err.value)
    assert key in text and "KafkaSource(reader_config=...)" in text and "connection" in text
    assert SECRET not in text


@pytest.mark.parametrize("key", SECRET_SETTINGS)
def test_producer_config_refuses_a_secret(key):
    with pytest.raises(ConfigurationError) as err:
        KafkaTarget(topic="out", producer_config={"compression.type": "lz4", key: SECRET})
    text = str(err.value)
    assert key in text and "producer_config" in text and "kafka_conn_id" in text
    assert SECRET not in text


def test_settings_without_secrets_are_kept_and_shown():
    source = KafkaSource(topics=["orders"], reader_config={"fetch.max.bytes": 1 << 20, "sasl.username": "eos"})
    assert source.reader_config == {"fetch.max.bytes": 1 << 20, "sasl.username": "eos"}
    assert "fetch.max.bytes" in repr(source) and "orders" in repr(source)
    target = KafkaTarget(topic="out", producer_config={"compression.type": "lz4"})
    assert target.producer_config == {"compression.type": "lz4"}


def test_repr_of_a_source_never_shows_a_secret():
    # a source built around the check (object.__setattr__ on the frozen dataclass) still masks it
    source = KafkaSource(topics=["orders"])
    object.__setattr__(source, "reader_config", {"sasl.password": SECRET})
    assert SECRET not in repr(source) and "***" in repr(source)
