"""airflow-eos: exactly-once batch windows over Kafka for Apache Airflow.

    from airflow_eos import exactly_once_window, KafkaSource, PostgresTarget

The protocol lives in :mod:`airflow_eos.core` (no Airflow imports); the Airflow
operators, sensors and triggers are thin shells over it. Spark workers import
this package too, so Airflow is imported only when ``exactly_once_window`` is
first used.
"""

from __future__ import annotations

from airflow_eos.core.postgres_target import PostgresTarget
from airflow_eos.core.source import KafkaSource

__version__ = "0.1.0"
__all__ = ["KafkaSource", "PostgresTarget", "exactly_once_window"]


def __getattr__(name: str):
    if name == "exactly_once_window":
        from airflow_eos.window import exactly_once_window

        return exactly_once_window
    raise AttributeError(f"module 'airflow_eos' has no attribute {name!r}")
