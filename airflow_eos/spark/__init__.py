"""The Spark side of a window: a Python data source that reads exactly a frozen
plan's Kafka offset ranges, the stage job that transforms and stages them
(run_stage; job.py for spark-submit), helpers for transforms whose records may
fail (safe_udf, catch_errors), and a helper that builds a correctly configured session.

The names below load pyspark when first used, not when the package is imported:
the operators import its pyspark-free modules (submit, transform) while a DAG
file is parsed. The core never imports this package.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from airflow_eos.spark.kafka_source import (
        FORMAT_NAME,
        KAFKA_SCHEMA,
        KafkaRangeSource,
        plan_options,
        read_plan,
        register,
    )
    from airflow_eos.spark.session import spark_session, stop_session
    from airflow_eos.spark.stage import StageFailed, StageReport, run_stage
    from airflow_eos.spark.stager import TooManyBadRecords
    from airflow_eos.spark.udf import ERROR_COLUMN, catch_errors, safe_udf

# public name -> the module that defines it
_PUBLIC = {
    **dict.fromkeys(["FORMAT_NAME", "KAFKA_SCHEMA", "KafkaRangeSource", "plan_options", "read_plan", "register"],
                    "airflow_eos.spark.kafka_source"),
    **dict.fromkeys(["spark_session", "stop_session"], "airflow_eos.spark.session"),
    **dict.fromkeys(["StageFailed", "StageReport", "run_stage"], "airflow_eos.spark.stage"),
    "TooManyBadRecords": "airflow_eos.spark.stager",
    # pyspark-free until a transform calls the UDF
    **dict.fromkeys(["ERROR_COLUMN", "catch_errors", "safe_udf"], "airflow_eos.spark.udf"),
}
__all__ = ["ERROR_COLUMN", "FORMAT_NAME", "KAFKA_SCHEMA", "KafkaRangeSource", "StageFailed", "StageReport",
           "TooManyBadRecords", "catch_errors", "plan_options", "read_plan", "register", "run_stage", "safe_udf",
           "spark_session", "stop_session"]


def __getattr__(name: str):
    if name in _PUBLIC:
        return getattr(importlib.import_module(_PUBLIC[name]), name)
    raise AttributeError(f"module 'airflow_eos.spark' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *_PUBLIC])
