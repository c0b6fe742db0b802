"""Client settings a DAG may give (``KafkaSource(reader_config=…)``,
``KafkaTarget(producer_config=…)``) and the secrets they must not hold.

A DAG file names Airflow connections; a password, key or token in it would sit
in the DAG's source, the serialized DAG and the task logs. So every place a DAG
passes client settings refuses a secret setting with the same error
(:func:`refuse_inline_secrets`), and whatever shows settings masks them
(:func:`masked`, :func:`without_secrets`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from airflow_eos.core.errors import ConfigurationError

# librdkafka (and Java-client style) settings whose values are secrets.
SECRET_SETTING = re.compile(r"(?i)password|secret|sasl\.oauthbearer\.config|ssl\.key\.pem|ssl_key")


def is_secret_setting(key: Any) -> bool:
    return bool(SECRET_SETTING.search(str(key)))


def refuse_inline_secrets(settings: Mapping[str, Any], where: str) -> None:
    """ConfigurationError naming (never showing) every secret setting of
    ``settings``, given as ``where`` (e.g. ``KafkaSource(reader_config=…)``)."""
    secret = sorted(str(k) for k in settings if is_secret_setting(k))
    if secret:
        raise ConfigurationError(
            f"{where} sets {secret}: a secret does not belong in a DAG file (it would be stored with the DAG and "
            "shown in task logs). Put it in the extra of the Airflow connection the DAG names (kafka_conn_id; "
            "see docs/connections.md) and remove it here")


def masked(settings: Mapping[str, Any]) -> dict[str, Any]:
    """``settings`` with the value of every secret setting replaced by ``***``."""
    return {k: ("***" if is_secret_setting(k) else v) for k, v in settings.items()}


def without_secrets(text: str, settings: Mapping[str, Any]) -> str:
    """``text`` with the value of every secret setting of ``settings`` masked."""
    for key, value in settings.items():
        if is_secret_setting(key) and isinstance(value, str) and value:
            text = text.replace(value, "***")
    return text
