"""The contract between the stage operator (Airflow side) and the stage job
(``spark-submit`` side): where the job file is, and what it is handed.

Plain values only, no pyspark import: the Airflow worker that submits the job
need not load Spark.

- command line: ``--plan JSON --attempt JSON --max-records-per-task N
  --max-bad-records N [--transform module:function]``
- environment (secrets never go on a command line, which ``ps`` shows):
  ``EOS_TARGET_JSON`` (the bound target spec, ``TargetSpec.to_dict()``, with
  its resolved connections) and
  ``EOS_KAFKA_CONFIG_JSON`` (the librdkafka settings of the source cluster).
- output: on success, one line ``EOS_STAGE_REPORT {...}`` (the StageReport,
  which becomes part of the stage task's XCom); on failure, one line
  ``EOS_STAGE_ERROR {"error": ..., "message": ..., "cause": ...}`` (redacted),
  which the operator makes its exception's headline (``cause``: the class of the
  error inside a StageFailed, which says whether a retry can help).
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from airflow_eos.core.attempt import Attempt
from airflow_eos.core.database import redact
from airflow_eos.core.errors import error_class
from airflow_eos.core.sink import Sink
from airflow_eos.core.target import TargetSpec, target_from_dict, with_kind
from airflow_eos.core.windows import WindowPlan

TARGET_ENV = "EOS_TARGET_JSON"
KAFKA_CONFIG_ENV = "EOS_KAFKA_CONFIG_JSON"
REGISTRY_CONFIG_ENV = "EOS_REGISTRY_CONFIG"  # an Avro source's schema registry (may hold a password)
ERROR_LINE = "EOS_STAGE_ERROR "
REPORT_LINE = "EOS_STAGE_REPORT "
# Every Spark that runs the stage job (spark-submit's, a local session's, the Spark Connect server's):
# its Python task workers fork from a daemon with the job's imports done (spark/daemon.py), instead of
# each importing pyarrow, pandas and this package again. A user's own setting wins.
WORKER_DAEMON_CONF = {"spark.python.daemon.module": "airflow_eos.spark.daemon"}


# How the stage job reads a window's plan (run_stage's ``reader``): Spark's own Kafka source
# (spark/kafka_native.py) or the eos_kafka Python data source (spark/kafka_source.py).
SPARK_READER = "spark"
PYTHON_READER = "python"
READERS = (SPARK_READER, PYTHON_READER)
# The default is the one that cost fewer core-seconds in bench/readers.py (2026-11-27, a loaded
# machine: read ceiling 2.88 vs 3.60, a 1M-record window into PostgreSQL 7.1 vs 10.3, into files
# 8.6 vs 8.5); an idle bench decides again.
DEFAULT_READER = PYTHON_READER


def stage_job_path() -> str:
    """The file ``spark-submit`` runs; it ships inside this package."""
    return str(Path(__file__).with_name("job.py"))


def stage_job_arguments(plan: WindowPlan, attempt: Attempt, *, max_records_per_task: int, max_bad_records: int,
                        transform: str | None, reader: str = DEFAULT_READER) -> list[str]:
    """The command line of the stage job for one attempt (after the job's path)."""
    return [
        "--plan", plan.to_json(),
        "--attempt", json.dumps(attempt.to_dict()),
        "--max-records-per-task", str(max_records_per_task),
        "--max-bad-records", str(max_bad_records),
        *(["--transform", transform] if transform else []),
        *(["--reader", reader] if reader != DEFAULT_READER else []),
    ]


def stage_job_environment(target: TargetSpec, kafka_config: dict, *, local: bool,
                          registry_config: dict | None = None) -> dict[str, str]:
    """``target`` bound (its connections resolved): the job has no Airflow."""
    env = {
        TARGET_ENV: target_json(target),
        KAFKA_CONFIG_ENV: json.dumps(kafka_config),
    }
    if registry_config:
        env[REGISTRY_CONFIG_ENV] = json.dumps(registry_config)
    if local:
        # Python workers must run this interpreter (it has the package and its
        # dependencies), spark-submit is beside it, and nothing may listen on a
        # public interface.
        env["PYSPARK_PYTHON"] = os.environ.get("PYSPARK_PYTHON", sys.executable)
        env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
        env["SPARK_LOCAL_IP"] = os.environ.get("SPARK_LOCAL_IP", "127.0.0.1")
    return env


def target_json(target: TargetSpec) -> str:
    """The one serialised form of a target (spark-submit environment, Spark
    Connect options): its spec's dict."""
    return json.dumps(target.to_dict())


def target_from_environment(environ: Mapping[str, str] = os.environ) -> Sink:
    # with_kind: an environment written by a version before specs carried their kind has none
    return target_from_dict(with_kind(json.loads(environ[TARGET_ENV]))).sink()


def kafka_config_from_environment(environ=os.environ) -> dict:
    return json.loads(environ[KAFKA_CONFIG_ENV])


def registry_config_from_environment(environ=os.environ) -> dict | None:
    """An Avro source's schema registry settings; None for raw values."""
    text = environ.get(REGISTRY_CONFIG_ENV)
    return json.loads(text) if text else None


def error_line(exc: BaseException) -> str:
    """The line the stage job prints when it fails: why, in one line of JSON."""
    return ERROR_LINE + json.dumps({"error": type(exc).__name__, "message": redact(str(exc)),
                                    "cause": getattr(exc, "error", None)})


def report_line(report: Mapping[str, Any]) -> str:
    """The line the stage job prints when it succeeded: its report."""
    return REPORT_LINE + json.dumps(report)


@dataclass(frozen=True)
class JobError:
    headline: str  # "Error: message", as a person needs it first
    terminal: bool  # the error (or the one inside a StageFailed) cannot be cured by a retry


def _payload(line: str, marker: str) -> dict | None:
    """The JSON object after ``marker`` in ``line``, also when other output
    follows it on the same line (the JVM's log, merged into the job's output,
    can write there before the line's newline comes)."""
    _, found, payload = line.partition(marker.strip())
    if not found:
        return None
    try:
        data, _ = json.JSONDecoder().raw_decode(payload.lstrip())
    except ValueError:
        return None
    return data if isinstance(data, dict) else None


def job_error(line: str) -> JobError | None:
    """The job's error, if ``line`` of its output is its error line."""
    data = _payload(line, ERROR_LINE)
    if data is None:
        return None
    message = data.get("message", "")
    # StageFailed's message already starts with its own cause ("the stage job of ... failed: ...").
    headline = message if data.get("error") == "StageFailed" else f"{data.get('error')}: {message}"
    cls = error_class(data.get("cause") or data.get("error") or "")
    return JobError(headline, bool(cls is not None and cls.terminal))


def job_report(line: str) -> dict | None:
    """The job's report, if ``line`` of its output is its report line."""
    return _payload(line, REPORT_LINE)


class StageJobOutput:
    """What the stage job said, from its output read line by line as it runs
    (``read``, e.g. a spark-submit hook's output callback): its error and its
    report, each None until its line came."""

    def __init__(self) -> None:
        self.error: JobError | None = None
        self.report: dict | None = None

    def read(self, line: str) -> None:
        self.error = job_error(line) or self.error
        self.report = job_report(line) or self.report
