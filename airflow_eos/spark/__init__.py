"""The Spark side of a window: a Python data source that reads exactly a frozen
plan's Kafka offset ranges, the stage job that transforms and stages them
(run_stage; job.py for spark-submit), helpers for transforms whose records may
fail (safe_udf, catch_errors), and a helper that builds a correctly configured session.

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
from airflow_eos.spark.stage import (
    ERROR_COLUMN,
    StageFailed,
    StageReport,
    TooManyBadRecords,
    catch_errors,
    run_stage,
    safe_udf,
)

__all__ = ["ERROR_COLUMN", "FORMAT_NAME", "KAFKA_SCHEMA", "KafkaRangeSource", "StageFailed", "StageReport",
           "TooManyBadRecords", "catch_errors", "plan_options", "read_plan", "register", "run_stage", "safe_udf",
           "spark_session", "stop_session"]
