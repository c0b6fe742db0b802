"""airflow-eos: exactly-once batch windows over Kafka for Apache Airflow.

    from airflow_eos import exactly_once_window, KafkaSource, PostgresTarget, FileTarget, KafkaTarget

The protocol lives in :mod:`airflow_eos.core` (no Airflow imports); the Airflow
operators, sensors and triggers are thin shells over it. The public names are
imported on first use: every Airflow process imports this package through the
provider entry point (provider_info), and Spark workers import it too, so
importing it loads neither Airflow nor psycopg, pyarrow or confluent_kafka
(tests/unit/test_imports.py checks the module sets).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from airflow_eos.targets.files import FileTarget
    from airflow_eos.targets.kafka import KafkaTarget
    from airflow_eos.targets.postgres.target import PostgresTarget
    from airflow_eos.core.source import KafkaSource
    from airflow_eos.window import exactly_once_window

__version__ = "0.1.0"
__all__ = ["FileTarget", "KafkaSource", "KafkaTarget", "PostgresTarget", "exactly_once_window"]

# public name -> the module that defines it
_PUBLIC = {
    "FileTarget": "airflow_eos.targets.files",
    "KafkaSource": "airflow_eos.core.source",
    "KafkaTarget": "airflow_eos.targets.kafka",
    "PostgresTarget": "airflow_eos.targets.postgres.target",
    "exactly_once_window": "airflow_eos.window",
}


def __getattr__(name: str):
    if name in _PUBLIC:
        return getattr(importlib.import_module(_PUBLIC[name]), name)
    raise AttributeError(f"module 'airflow_eos' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *_PUBLIC])
