"""airflow-eos: exactly-once batch windows over Kafka for Apache Airflow.

The protocol lives in :mod:`airflow_eos.core` (no Airflow imports); the Airflow
operators, sensors and triggers are thin shells over it.
"""

from __future__ import annotations

__version__ = "0.1.0"
