"""The stage step's Spark job: read a window's frozen plan, apply the user's
transform, stage the result into the attempt's staging, and write the attempt's
checkpoint on Spark's job commit.

One job run, in Spark's terms::

    read the plan  ──►  transform(df)  ──►  df.write.format("eos_staging").save()  ──►  checkpoint
    (Spark's Kafka        (user code,         write tasks: COPY into the staging;      (the driver, from
     source, observed;     may shuffle)       job commit: the chunks (or, after the     the observed read)
     or eos_kafka, each                       eos_kafka source, the checkpoint);
     task reporting                           job abort: the attempt is aborted,
     what it read)                            its staging dropped

**What was consumed.** ``reader="spark"``: Spark's own Kafka
source reads the plan (:mod:`airflow_eos.spark.kafka_native`, which says what
that source guarantees about reaching each end cut) and ``observe`` counts, per
sub-range, the records it yielded and their first and last offset, in the same
pass. Spark hands those metrics to the driver only after the job, so the job
commit records just the chunks it accepted, and the driver, once the job has
returned, records the observed sub-ranges in ``eos.read_ranges`` and writes the
checkpoint (stage_report.checkpoint_after_job). The attempt stays open until
then, and prepare waits while an attempt is open: a staging whose driver died
before its checkpoint is never prepared. ``reader="python"`` (the default, the
eos_kafka source): each read task, once it has read its sub-range to the end cut, records
``(topic, partition, start, end, records)`` in ``eos.read_ranges`` under this
job run (an idempotent upsert: a retried or speculative task writes the same
row), and the job commit writes the checkpoint. Either way the checkpoint's
consumed ranges come from those rows, counted without a second read of Kafka,
even when the transform shuffles and the write tasks never see a record's
lineage; a plan not read completely (a gap, an overlap, a partition short of its
end cut) fails the stage: no checkpoint.

**Transform.** ``module:function``, DataFrame -> DataFrame, called on the driver
with the window's records in the schema of Spark's Kafka source (key, value,
topic, partition, offset, timestamp, timestampType, headers). Its output must
have exactly the target's staged columns (matched by name, case-insensitively if
needed), plus optionally:

- ``eos_error`` (string): null for a good row; otherwise the row is a *dead
  letter*: it is not staged but kept, with this error, in the attempt's
  dead-letter staging and published with the window into ``eos.dead_letters``;
- ``eos_topic``, ``eos_partition``, ``eos_offset``: the row's source record
  (lineage). Dead letters need them; they are also target columns for
  record-level pipelines (``airflow-eos verify`` proves exactly-once with them);
- ``key``, ``value``: the raw record, kept with a dead letter (if not target columns).

Without a transform, the records are staged as read: the target's columns are
taken from the Kafka schema plus the lineage columns (``headers`` as JSON text).

**Dead letters, never dropped.** Three kinds of row become dead letters, each
with its source offset and error, counted in the checkpoint:

1. rows whose ``eos_error`` is set by the transform. For a transform written as a
   Python UDF, :func:`safe_udf` (or :func:`catch_errors`) turns an exception
   raised for a record into an ``eos_error`` value instead of a failed task::

       from airflow_eos.spark import safe_udf

       @safe_udf("id bigint, amount decimal(12,2)")
       def parse(value: bytes):
           order = json.loads(value)          # may raise: that record is a dead letter
           return {"id": order["id"], "amount": Decimal(order["amount"])}

       def orders(df):
           return (df.select(parse("value").alias("o"), "key", "value",
                             F.col("topic").alias("eos_topic"), F.col("partition").alias("eos_partition"),
                             F.col("offset").alias("eos_offset"))
                     .select("o.*", "key", "value", "eos_topic", "eos_partition", "eos_offset"))
                     # "o.*" is id, amount and eos_error

2. rows with a null in a column that is NOT NULL in the target;
3. rows the target refuses while staging (a value PostgreSQL cannot take: text
   in an integer column, too long for a varchar, ...). When a COPY is refused
   on a column, the write task asks the server once which of the chunk's values
   of that column its type cannot take, dead-letters those rows and stages the
   rest (then the next refused column, if any): a round trip per refused
   column, not per row. A refusal that names no column is isolated row by row.
   If the target refuses *every* non-null value of a column in a chunk (at
   least COLUMN_REFUSED_MIN_VALUES), that is a wrong type in the table or the
   transform, not bad records: the job fails with a TargetError naming the
   table, the column, both types and a sample value.

Each dead letter keeps its record's key and value: the transform's ``key`` and
``value`` columns when it has them; otherwise (and for rows the target refuses,
which carry only the staged columns) the write task reads them back from Kafka
by the row's lineage before writing its chunk, so good rows carry nothing extra.

A dead letter without lineage cannot name its record: that fails the job with a
clear error. More dead letters than ``max_bad_records`` fail the job too (a write
task fails as soon as it alone has more; the job commit checks the total), with
an error naming the count and the first offsets and errors; no checkpoint is
written. A target's CHECK or unique constraints are not checked while staging:
they fail the commit, which keeps the staging for inspection.

**Failures.** A write task stages in one PostgreSQL transaction per chunk (at
most ``rows_per_chunk`` rows); a failed task's open chunk rolls back, and chunks
it committed before failing are not listed in the checkpoint, so they are never
counted or published. When the job fails (a task failed for good, or the job
commit refused: too many dead letters, incomplete read, fenced attempt), Spark
calls the writer's abort, which aborts the attempt and drops its staging: a
rerun opens a new attempt and stages the window completely. An attempt that is
fenced by a newer one can still stage, but its job commit fails (AttemptFenced).

**Progress** is logged per phase: the plan's ranges, each read task's records
and timings (executor log), each write task's rows, dead letters and timings,
the checkpoint (records read per partition, rows staged) and the driver's phases.

The job's parts, one module each: :mod:`~airflow_eos.spark.udf` (safe_udf,
catch_errors), :mod:`~airflow_eos.spark.layout` (what the writer receives),
:mod:`~airflow_eos.spark.stage_settings` (what the tasks are handed, what the read
tasks report), :mod:`~airflow_eos.spark.stager` (one write task),
:mod:`~airflow_eos.spark.staging_source` (the eos_staging data source and its job
commit), :mod:`~airflow_eos.spark.stage_files` (the path of a sink that takes
files: Spark's own Parquet writer), :mod:`~airflow_eos.spark.stage_report`
(StageReport, StageFailed, helpers both paths share) and this driver.

Entry points: :func:`run_stage` (in-process, reusing a SparkSession) and
:func:`airflow_eos.spark.job.main` (``spark-submit airflow_eos/spark/job.py ...``, see submit.py).
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from airflow_eos.core import attempt as attempts
from airflow_eos.core.attempt import Attempt
from airflow_eos.core.database import redact
from airflow_eos.core.errors import (
    AttemptClosed,
    ConfigurationError,
    EosError,
    WindowConflict,
    WindowNotPlanned,
)
from airflow_eos.core.sink import Sink
from airflow_eos.core.windows import WindowPlan
from airflow_eos.spark.kafka_source import DEFAULT_MAX_RECORDS_PER_TASK
from airflow_eos.spark.layout import Layout, records_as_read, writer_input
from airflow_eos.spark.stage_files import stage_files
from airflow_eos.spark.stage_report import (
    StageFailed,
    StageReport,
    abort_after_failure,
    checkpoint_after_job,
    checkpointed_report,
    describe_attempt_state,
    log_plan,
    log_report,
    make_session_active,
    read_transformed,
    spark_failure,
)
from airflow_eos.spark.stage_settings import (
    DEFAULT_ROWS_PER_CHUNK,
    FORMAT_NAME,
    StageSettings,
    report_options,
    report_read,
)
from airflow_eos.spark.stager import StagedTask, TooManyBadRecords
from airflow_eos.spark.staging_source import StagingDataSource, commit_stage, register
from airflow_eos.spark.submit import DEFAULT_READER, PYTHON_READER, READERS
from airflow_eos.spark.transform import load_transform
from airflow_eos.spark.udf import ERROR_COLUMN, catch_errors, describe_error, safe_udf

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

log = logging.getLogger(__name__)


def _check_attempt(target: Sink, plan: WindowPlan, attempt: Attempt) -> None:
    """Before any Spark work: the plan is the window's frozen one and the
    attempt can still be checkpointed."""
    if attempt.window != plan.window:
        raise ConfigurationError(f"{attempt} is not an attempt of the plan's window {plan.window}")
    ledger = target.ledger
    with ledger.connect() as conn, conn.transaction():
        frozen = ledger.load_plan(conn, plan.window)
        if frozen is None:
            raise WindowNotPlanned(f"window {plan.window} has no frozen plan in {redact(ledger.url)}")
        if frozen.reader_schema != plan.reader_schema:
            raise WindowConflict(f"the plan given for {plan.window} has another reader schema than its frozen plan: "
                                 f"given {plan.reader_schema}, frozen {frozen.reader_schema}")
        if sorted(frozen.ranges) != sorted(plan.ranges):
            raise WindowConflict(f"the plan given for {plan.window} differs from its frozen plan: given "
                                 f"{[r.to_dict() for r in plan.ranges]}, frozen {[r.to_dict() for r in frozen.ranges]}")
        status = attempts.load_status(conn, attempt)
        attempts.check_current(attempt, status, "stage")
        if status.state != attempts.OPEN:
            raise AttemptClosed(f"cannot stage {attempt}: it is {status.state} already; open a new attempt")


def run_stage(
    spark: "SparkSession",
    plan: WindowPlan,
    attempt: Attempt,
    target: Sink,
    kafka_config: Mapping[str, Any],
    transform: str | Callable[["DataFrame"], "DataFrame"] | None = None,
    *,
    max_records_per_task: int = DEFAULT_MAX_RECORDS_PER_TASK,
    max_bad_records: int = 0,
    rows_per_chunk: int = DEFAULT_ROWS_PER_CHUNK,
    read_options: Mapping[str, Any] | None = None,
    reader: str = DEFAULT_READER,
    registry_config: Mapping[str, Any] | None = None,
) -> StageReport:
    """Stage one attempt of a window: read exactly ``plan``, apply ``transform``,
    stage into the attempt's staging, checkpoint on job commit. Returns what the
    checkpoint holds; raises StageFailed (or a configuration error before any
    Spark work) otherwise, having aborted the attempt.

    ``plan`` and ``attempt`` arrive parsed: whoever received them as text or
    a dict (the operator from XCom, job.py from its command line) parsed them
    once. ``attempt`` must be open (``target.begin`` made it); ``target`` is a bound
    target's Sink (a PostgresSink, a FileSink, ...). A sink with
    a :meth:`~airflow_eos.core.sink.Sink.spark_output` is written by Spark's own
    Parquet writer (:func:`~airflow_eos.spark.stage_files.stage_files`); any other through the eos_staging
    data source and its writer. ``reader``: ``"python"`` (the eos_kafka
    source, the default) or ``"spark"`` (Spark's own Kafka source, see
    :func:`~airflow_eos.spark.stage_report.read_transformed`); ``read_options``:
    further eos_kafka options (arrow_batch_rows, end_grace_s, poll_timeout_s).
    ``registry_config``: an Avro source's schema registry (SchemaRegistryClient
    settings): the plan's frozen reader schema decodes the values, never the
    registry's latest; records that do not decode are dead letters.
    """
    started = time.perf_counter()
    url = target.ledger.url
    if max_bad_records < 0 or max_records_per_task < 1 or rows_per_chunk < 1:
        raise ConfigurationError("max_bad_records must be >= 0, max_records_per_task and rows_per_chunk >= 1")
    if reader not in READERS:
        raise ConfigurationError(f"reader must be one of {list(READERS)}, got {reader!r}")
    read_options = _with_decoding(plan, reader, read_options, registry_config)
    run = uuid.uuid4().hex[:12]
    _check_attempt(target, plan, attempt)
    try:
        output = target.spark_output(attempt)
    except Exception as exc:
        abort_after_failure(target, attempt, f"stage job run {run} failed before writing: {exc}")
        raise
    if output is not None:
        return stage_files(spark, plan, attempt, target, output, kafka_config, transform, run=run,
                           started=started, max_records_per_task=max_records_per_task,
                           max_bad_records=max_bad_records, read_options=read_options, reader=reader)
    return _stage_rows(spark, plan, attempt, target, kafka_config, transform, url=url, run=run, started=started,
                       max_records_per_task=max_records_per_task, max_bad_records=max_bad_records,
                       rows_per_chunk=rows_per_chunk, read_options=read_options, reader=reader)


def _with_decoding(plan: WindowPlan, reader: str, read_options: Mapping[str, Any] | None,
                   registry_config: Mapping[str, Any] | None) -> Mapping[str, Any] | None:
    """The eos_kafka options, with the decoding of an Avro source's plan."""
    if plan.reader_schema is None and registry_config is None:
        return read_options
    if plan.reader_schema is None or not registry_config:
        raise ConfigurationError(
            f"window {plan.window} was planned with {'raw' if plan.reader_schema is None else 'Avro'} values but "
            f"the stage {'has' if registry_config else 'has no'} schema registry: a pipeline's value format "
            "cannot change under existing windows")
    if reader != PYTHON_READER:
        raise ConfigurationError(f"an Avro source is read by reader {PYTHON_READER!r} (the eos_kafka source "
                                 f"decodes it), not {reader!r}")
    return {**(read_options or {}), "avro_reader_schema": plan.reader_schema, "registry_config": dict(registry_config)}


def _stage_rows(spark: "SparkSession", plan: WindowPlan, attempt: Attempt, target: Sink,
                kafka_config: Mapping[str, Any], transform, *, url: str, run: str, started: float,
                max_records_per_task: int, max_bad_records: int, rows_per_chunk: int,
                read_options: Mapping[str, Any] | None, reader: str) -> StageReport:
    """run_stage's path for a sink that takes rows: the ``eos_staging`` data
    source's write tasks stage them; its job commit writes the checkpoint, or,
    when what was read is observed on Spark's Kafka source (known only after
    the job), records the chunks it accepted and the driver writes the
    checkpoint after the job (stage_report.checkpoint_after_job)."""
    log.info("staging %s (run %s) into %s: %d planned range(s), at most %d records, max_bad_records=%d",
             attempt, run, target.label, len(plan.ranges), plan.max_records, max_bad_records)
    log_plan(plan)
    try:
        staging = target.writer(attempt)
        not_null = target.not_null_columns(staging.columns)
        out, fn, observation = read_transformed(spark, plan, kafka_config, transform, url=url, attempt=attempt,
                                                run=run, max_records_per_task=max_records_per_task,
                                                read_options=read_options, reader=reader)
        rows, layout = writer_input(out, staging.columns, not_null, table=target.label, strict=fn is not None)
        settings = StageSettings(target, attempt, plan, run, layout, max_bad_records, rows_per_chunk,
                                 kafka_config=kafka_config, checkpoint_by_driver=observation is not None)
    except Exception as exc:
        # Nothing was staged; end the attempt rather than leave it for the abort task or the sweep.
        abort_after_failure(target, attempt, f"stage job run {run} failed before writing: {exc}")
        raise
    setup = time.perf_counter()
    log.info("%s: set up in %.2fs (transform %s); running the Spark job (read + transform + stage + checkpoint)",
             attempt, setup - started, transform if isinstance(transform, str) or transform is None
             else getattr(transform, "__qualname__", transform))
    make_session_active(spark)
    try:
        rows.write.format(FORMAT_NAME).mode("append").options(**settings.to_options()).save()
    except Exception as exc:
        message, error = spark_failure(exc)
        state = describe_attempt_state(target, attempt)
        raise StageFailed(f"the stage job of {attempt} failed ({state}): {message}", error=error) from exc
    if observation is not None:
        _checkpoint_rows(target, attempt, run, plan, observation)
    finished = time.perf_counter()
    report = checkpointed_report(target, attempt, run, {"setup": setup - started, "job": finished - setup})
    report.seconds["total"] = time.perf_counter() - started
    log_report(report)
    return report


def _checkpoint_rows(target: Sink, attempt: Attempt, run: str, plan: WindowPlan, observation) -> None:
    """The checkpoint of a job whose read was observed: written here, after the
    job, from the observed read and the chunks its job commit recorded; a
    failure aborts the attempt (as the job commit's would have) and raises StageFailed."""

    def chunks() -> list:
        with target.ledger.connect() as conn:
            return list(attempts.load_checkpoint(conn, attempt).chunks)

    try:
        checkpoint_after_job(target, attempt, run, plan, observation, chunks)
    except Exception as exc:
        message = f"{type(exc).__name__}: {exc}"
        abort_after_failure(target, attempt, f"stage job run {run} failed at its checkpoint: {message}")
        state = describe_attempt_state(target, attempt)
        raise StageFailed(f"the stage job of {attempt} failed ({state}): {message}",
                          error=type(exc).__name__ if isinstance(exc, EosError) else None) from exc


__all__ = [
    "ERROR_COLUMN",
    "FORMAT_NAME",
    "Layout",
    "StageFailed",
    "StageReport",
    "StageSettings",
    "StagedTask",
    "StagingDataSource",
    "TooManyBadRecords",
    "catch_errors",
    "commit_stage",
    "describe_error",
    "load_transform",
    "records_as_read",
    "register",
    "report_options",
    "report_read",
    "run_stage",
    "safe_udf",
    "writer_input",
]
