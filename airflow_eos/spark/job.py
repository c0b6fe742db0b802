"""The stage job, as ``spark-submit`` runs it (see airflow_eos.spark.submit for
the contract: arguments, and the target and Kafka settings in the environment)::

    spark-submit --master local[2] airflow_eos/spark/job.py --plan PLAN_JSON --attempt ATTEMPT_JSON \\
        --max-records-per-task N --max-bad-records N [--transform module:function] [--reader spark]

Master and conf come from spark-submit, so it runs unchanged on a cluster (whose
executors need airflow-eos installed, or shipped with ``--py-files``). The work is
in :mod:`airflow_eos.spark.stage`; in-process callers use :func:`run_stage`.
"""

from __future__ import annotations

import os
import sys

if __name__ == "__main__" and sys.path and os.path.abspath(sys.path[0]) == os.path.dirname(os.path.abspath(__file__)):
    # Run as a script, Python puts this file's directory first on the path, where
    # session.py, stage.py & co. would shadow any top-level module of those names.
    del sys.path[0]

import argparse  # noqa: E402
import json  # noqa: E402
import logging  # noqa: E402
from collections.abc import Sequence  # noqa: E402

from airflow_eos.core.attempt import Attempt  # noqa: E402
from airflow_eos.core.errors import EosError  # noqa: E402
from airflow_eos.core.windows import WindowPlan  # noqa: E402
from airflow_eos.spark.kafka_source import DEFAULT_MAX_RECORDS_PER_TASK  # noqa: E402
from airflow_eos.spark.stage import StageReport, run_stage  # noqa: E402
from airflow_eos.spark.stage_settings import DEFAULT_ROWS_PER_CHUNK  # noqa: E402
from airflow_eos.spark.submit import DEFAULT_READER, READERS  # noqa: E402

log = logging.getLogger("airflow_eos.spark.job")  # not __main__, as a script


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="job.py", description="airflow-eos stage job: stage one attempt of a window (run by spark-submit). "
        "The target (EOS_TARGET_JSON) and the Kafka settings (EOS_KAFKA_CONFIG_JSON) come from the environment.")
    parser.add_argument("--plan", required=True, help="the window's frozen plan, JSON")
    parser.add_argument("--attempt", required=True, help="the attempt opened by the sink's begin, JSON")
    parser.add_argument("--transform", help="module:function, DataFrame -> DataFrame (default: records as read)")
    parser.add_argument("--max-records-per-task", type=int, default=DEFAULT_MAX_RECORDS_PER_TASK)
    parser.add_argument("--max-bad-records", type=int, default=0)
    parser.add_argument("--rows-per-chunk", type=int, default=DEFAULT_ROWS_PER_CHUNK)
    parser.add_argument("--reader", choices=READERS, default=DEFAULT_READER,
                        help="the eos_kafka Python source (python, the default) or Spark's own Kafka source")
    return parser


def _say(line: str) -> None:
    """Print one line of the job's output protocol (spark/submit.py) in one
    write: spark-submit runs this driver unbuffered (PYTHONUNBUFFERED), where
    print's line and newline are two writes, and the JVM's own log, merged into
    the same output, can land between them."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def main(argv: Sequence[str] | None = None) -> int:
    """spark-submit entry: 0 once the checkpoint is written, 1 when the job
    failed (the message says why), 2 for unusable arguments or environment."""
    from airflow_eos.spark.session import spark_session, stop_session
    from airflow_eos.spark.submit import (
        error_line,
        kafka_config_from_environment,
        registry_config_from_environment,
        report_line,
        target_from_environment,
    )

    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    args = _parser().parse_args(argv)
    try:
        plan = WindowPlan.from_json(args.plan)
        attempt = Attempt.from_dict(json.loads(args.attempt))
        target = target_from_environment()
        kafka_config = kafka_config_from_environment()
        registry_config = registry_config_from_environment()
    except (KeyError, ValueError, TypeError) as exc:
        log.error("stage job: unusable arguments or environment: %s: %s", type(exc).__name__, exc)
        _say(error_line(exc))
        return 2
    spark = spark_session(f"airflow-eos stage {attempt.pipeline} e{attempt.epoch}")
    try:
        report = run_stage(spark, plan, attempt, target, kafka_config, args.transform,
                           max_records_per_task=args.max_records_per_task, max_bad_records=args.max_bad_records,
                           rows_per_chunk=args.rows_per_chunk, reader=args.reader, registry_config=registry_config)
    except EosError as exc:
        log.error("stage job failed: %s", exc)
        _say(error_line(exc))
        return 1
    except Exception as exc:
        log.exception("stage job of %s failed", attempt)
        _say(error_line(exc))
        return 1
    finally:
        stop_session(spark)
    _say(report_line(report.to_dict()))
    return 0


__all__ = ["StageReport", "main", "run_stage"]

if __name__ == "__main__":
    sys.exit(main())
