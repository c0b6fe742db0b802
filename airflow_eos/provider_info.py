"""What ``airflow providers list`` shows for this package.

``package-name`` must equal the normalised distribution name exactly, or every
airflow command fails while loading providers.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version


def _version() -> str:
    try:
        return version("airflow-eos")
    except PackageNotFoundError:  # running from a source tree that is not installed
        return "0.0.0"


def get_provider_info() -> dict:
    return {
        "package-name": "airflow-eos",
        "name": "Exactly-once Kafka windows (airflow-eos)",
        "description": "Exactly-once batch windows over Kafka, computed with PySpark and published "
        "atomically into PostgreSQL.",
        "versions": [_version()],
        "integrations": [
            {
                "integration-name": "airflow-eos",
                "external-doc-url": "https://github.com/airflow-eos/airflow-eos",
                "tags": ["apache"],
            }
        ],
        "operators": [{"integration-name": "airflow-eos", "python-modules": ["airflow_eos.operators.eos"]}],
        "sensors": [{"integration-name": "airflow-eos", "python-modules": ["airflow_eos.sensors.eos"]}],
        "triggers": [{"integration-name": "airflow-eos", "python-modules": ["airflow_eos.triggers.eos"]}],
        # The Kafka, Postgres and Spark connections are those providers' own types
        # (kafka, postgres, spark); the schema registry of an Avro source is ours.
        "hooks": [{"integration-name": "airflow-eos",
                   "python-modules": ["airflow_eos.hooks.eos", "airflow_eos.hooks.spark_stage",
                                      "airflow_eos.hooks.schema_registry"]}],
        "connection-types": [{"connection-type": "eos_schema_registry",
                              "hook-class-name": "airflow_eos.hooks.schema_registry.EosSchemaRegistryHook"}],
    }
