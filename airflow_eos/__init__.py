"""airflow-eos: exactly-once batch windows over Kafka for Apache Airflow.

    from airflow_eos import exactly_once_window, KafkaSource, PostgresTarget  # and every other target kind

The protocol lives in :mod:`airflow_eos.core` (no Airflow imports); the Airflow
operators, sensors and triggers are thin shells over it. The public names are
imported on first use: every Airflow process imports this package through the
provider entry point (provider_info), and Spark workers import it too, so
importing it loads neither Airflow nor psycopg, pyarrow or confluent_kafka
(tests/unit/test_imports.py checks the module sets). The spec class of every
target kind the package ships (core/registry.py's ``BUILTIN_KINDS``) is a
public name.
"""

from __future__ import annotations

import importlib

from airflow_eos.core.registry import BUILTIN_KINDS

__version__ = "0.1.0"

# public name -> the module that defines it: the source, the task group, and each target kind's spec class
_PUBLIC = {
    "KafkaSource": "airflow_eos.core.source",
    "ValueFormat": "airflow_eos.core.source",
    "exactly_once_window": "airflow_eos.window",
    **{where.partition(":")[2]: where.partition(":")[0] for where in BUILTIN_KINDS.values()},
}
# A target kind's public name comes from its registry line only: nothing outside its folder names it.
__all__ = sorted(_PUBLIC)


def __getattr__(name: str):
    if name in _PUBLIC:
        return getattr(importlib.import_module(_PUBLIC[name]), name)
    raise AttributeError(f"module 'airflow_eos' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *_PUBLIC])
