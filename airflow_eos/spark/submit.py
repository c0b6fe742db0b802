"""The contract between the stage operator (Airflow side) and the stage job
(``spark-submit`` side): where the job file is, and what it is handed.

Plain values only, no pyspark import: the Airflow worker that submits the job
need not load Spark.

- command line: ``--plan JSON --attempt JSON --max-records-per-task N
  --max-bad-records N [--transform module:function]``
- environment (secrets never go on a command line, which ``ps`` shows):
  ``EOS_TARGET_JSON`` (the PostgresTarget's fields, with its URL) and
  ``EOS_KAFKA_CONFIG_JSON`` (the librdkafka settings of the source cluster).
- output: on failure, one line ``EOS_STAGE_ERROR {"error": ..., "message": ...}``
  (redacted), which the operator makes its exception's headline.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from pathlib import Path

from airflow_eos.core.database import redact
from airflow_eos.targets.postgres.target import PostgresTarget

TARGET_ENV = "EOS_TARGET_JSON"
KAFKA_CONFIG_ENV = "EOS_KAFKA_CONFIG_JSON"
ERROR_LINE = "EOS_STAGE_ERROR "


def stage_job_path() -> str:
    """The file ``spark-submit`` runs; it ships inside this package."""
    return str(Path(__file__).with_name("job.py"))


def stage_job_environment(target: PostgresTarget, kafka_config: dict, *, local: bool) -> dict[str, str]:
    env = {
        TARGET_ENV: json.dumps(dataclasses.asdict(target)),
        KAFKA_CONFIG_ENV: json.dumps(kafka_config),
    }
    if local:
        # Python workers must run this interpreter (it has the package and its
        # dependencies), spark-submit is beside it, and nothing may listen on a
        # public interface.
        env["PYSPARK_PYTHON"] = os.environ.get("PYSPARK_PYTHON", sys.executable)
        env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
        env["SPARK_LOCAL_IP"] = os.environ.get("SPARK_LOCAL_IP", "127.0.0.1")
    return env


def target_from_environment(environ=os.environ) -> PostgresTarget:
    data = json.loads(environ[TARGET_ENV])
    return PostgresTarget(**{**data, "key": tuple(data.get("key") or ()),
                             "columns": tuple(data["columns"]) if data.get("columns") is not None else None})


def kafka_config_from_environment(environ=os.environ) -> dict:
    return json.loads(environ[KAFKA_CONFIG_ENV])


def error_line(exc: BaseException) -> str:
    """The line the stage job prints when it fails: why, in one line of JSON."""
    return ERROR_LINE + json.dumps({"error": type(exc).__name__, "message": redact(str(exc))})


def job_error(line: str) -> str | None:
    """``"Error: message"`` from a line of the job's output, if it is its error line."""
    _, marker, payload = line.partition(ERROR_LINE.strip())
    if not marker:
        return None
    try:
        data = json.loads(payload)
    except ValueError:
        return None
    message = data.get("message", "")
    # StageFailed's message already starts with its own cause ("the stage job of ... failed: ...").
    return message if data.get("error") == "StageFailed" else f"{data.get('error')}: {message}"
