"""The Spark side of a window: a Python data source that reads exactly a frozen
plan's Kafka offset ranges, and a helper that builds a correctly configured session.

Importing this package imports pyspark; the core never does.
"""

from airflow_eos.spark.kafka_source import (
    FORMAT_NAME,
    KAFKA_SCHEMA,
    KafkaRangeSource,
    plan_options,
    read_plan,
    register,
)
from airflow_eos.spark.session import spark_session, stop_session

__all__ = ["FORMAT_NAME", "KAFKA_SCHEMA", "KafkaRangeSource", "plan_options", "read_plan", "register",
           "spark_session", "stop_session"]
