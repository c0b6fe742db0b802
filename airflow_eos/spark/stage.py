"""The stage step's Spark job: read a window's frozen plan, apply the user's
transform, stage the result into the attempt's staging, and write the attempt's
checkpoint on Spark's job commit.

One job run, in Spark's terms::

    read_plan(plan)  ──►  transform(df)  ──►  df.write.format("eos_staging").save()
    (eos_kafka source:     (user code,          write tasks: COPY into the staging;
     one task per range,    may shuffle)        job commit: the checkpoint;
     reports each range                         job abort: the attempt is aborted,
     it read completely)                        its staging dropped)

**What was consumed.** Each read task, once it has read its sub-range to the end
cut, records ``(topic, partition, start, end, records)`` in ``eos.read_ranges``
under this job run (an idempotent upsert: a retried or speculative task writes
the same row). The job commit assembles the checkpoint's consumed ranges from
those rows, so they are what was actually read, counted exactly, without a
second read of Kafka, even when the transform shuffles and the write tasks never
see a record's lineage. A plan not read completely (a gap, an overlap, a
partition short of its end cut) fails the job commit: no checkpoint.

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
commit) and this driver.

Entry points: :func:`run_stage` (in-process, reusing a SparkSession) and
:func:`airflow_eos.spark.job.main` (``spark-submit airflow_eos/spark/job.py ...``, see submit.py).
"""

from __future__ import annotations

import dataclasses
import logging
import re
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from psycopg import sql

from airflow_eos.core import attempt as attempts
from airflow_eos.core.attempt import Attempt, ConsumedRange
from airflow_eos.core.database import connect, redact
from airflow_eos.core.errors import (
    AttemptClosed,
    ConfigurationError,
    EosError,
    WindowConflict,
    WindowNotPlanned,
)
from airflow_eos.core.windows import WindowPlan
from airflow_eos.spark.kafka_source import DEFAULT_MAX_RECORDS_PER_TASK, read_plan
from airflow_eos.spark.layout import Layout, records_as_read, writer_input
from airflow_eos.spark.stage_settings import (
    DEFAULT_ROWS_PER_CHUNK,
    FORMAT_NAME,
    REPORT_HOOK,
    StageSettings,
    load_read_ranges,
    report_options,
    report_read,
)
from airflow_eos.spark.stager import StagedTask, TooManyBadRecords
from airflow_eos.spark.staging_source import StagingDataSource, commit_stage, register
from airflow_eos.spark.transform import load_transform
from airflow_eos.spark.udf import ERROR_COLUMN, MAX_ERROR_CHARS, catch_errors, describe_error, safe_udf
from airflow_eos.targets.postgres.target import PostgresTarget, parse_table_name

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

log = logging.getLogger(__name__)


class StageFailed(EosError):
    """The Spark stage job failed. ``error`` names the underlying error's class
    (e.g. ``AttemptFenced``, ``TooManyBadRecords``) when it is one of ours."""

    def __init__(self, message: str, *, error: str | None = None):
        super().__init__(message)
        self.error = error


# --------------------------------------------------------------------------- driver


@dataclass(frozen=True)
class StageReport:
    """What one run of the stage job did, as checkpointed."""

    attempt: Attempt
    run: str
    consumed: tuple[ConsumedRange, ...]  # per planned partition: offsets read and records in them
    records_read: int
    rows_staged: int
    dead_letters: int
    chunks: int
    checksum: str
    read_tasks: int
    read_seconds: float  # summed over read tasks, which run in parallel
    seconds: Mapping[str, float] = field(default_factory=dict)  # phase -> wall seconds on the driver

    def to_dict(self) -> dict:
        return {
            "attempt": self.attempt.to_dict(), "run": self.run,
            "consumed": [dataclasses.asdict(r) for r in self.consumed],
            "records_read": self.records_read, "rows_staged": self.rows_staged, "dead_letters": self.dead_letters,
            "chunks": self.chunks, "checksum": self.checksum, "read_tasks": self.read_tasks,
            "read_seconds": round(self.read_seconds, 3),
            "seconds": {k: round(v, 3) for k, v in self.seconds.items()},
        }

    def __str__(self) -> str:
        job = self.seconds.get("job", 0.0)
        rate = f" ({self.records_read / job:,.0f} records/s)" if job > 0 else ""
        phases = ", ".join(f"{k} {v:.2f}s" for k, v in self.seconds.items())
        return (f"{self.attempt} checkpointed: {self.records_read} records read from {len(self.consumed)} "
                f"partition(s) by {self.read_tasks} read task(s), {self.rows_staged} rows staged, "
                f"{self.dead_letters} dead letters, {self.chunks} chunk(s){rate}; {phases}")


def _check_attempt(target: PostgresTarget, plan: WindowPlan, attempt: Attempt) -> None:
    """Before any Spark work: the plan is the window's frozen one and the
    attempt can still be checkpointed."""
    if attempt.window != plan.window:
        raise ConfigurationError(f"{attempt} is not an attempt of the plan's window {plan.window}")
    ledger = target.ledger
    with ledger.connect() as conn, conn.transaction():
        frozen = ledger.load_plan(conn, plan.window)
        if frozen is None:
            raise WindowNotPlanned(f"window {plan.window} has no frozen plan in {redact(target.url)}")
        if sorted(frozen.ranges) != sorted(plan.ranges):
            raise WindowConflict(f"the plan given for {plan.window} differs from its frozen plan: given "
                                 f"{[r.to_dict() for r in plan.ranges]}, frozen {[r.to_dict() for r in frozen.ranges]}")
        status = attempts.load_status(conn, attempt)
        attempts.check_current(attempt, status, "stage")
        if status.state != attempts.OPEN:
            raise AttemptClosed(f"cannot stage {attempt}: it is {status.state} already; open a new attempt")


def _not_null_columns(target: PostgresTarget, columns: Sequence[str]) -> list[str]:
    schema, table = parse_table_name(target.table)
    ident = sql.Identifier(table) if schema is None else sql.Identifier(schema, table)
    with connect(target.url, f"describe {target.table}") as conn:
        rows = conn.execute(
            "SELECT attname FROM pg_attribute WHERE attrelid = to_regclass(%s) AND attnum > 0"
            " AND NOT attisdropped AND attnotnull", (ident.as_string(conn),),
        ).fetchall()
    return [c for (c,) in rows if c in columns]


def _failure(exc: BaseException) -> tuple[str, str | None]:
    """The cause of a failed Spark job as a person needs it: our error's class
    and message, found in the Python traceback Spark wraps it in."""
    names: set[str] = set()
    todo = [EosError]
    while todo:
        cls = todo.pop()
        names.add(cls.__name__)
        todo.extend(cls.__subclasses__())
    text = str(exc)
    pattern = re.compile(r"^(?:[\w.]+\.)?(" + "|".join(sorted(names)) + r"): (.*)$", re.M)
    match = pattern.search(text)
    if match is None:
        python = re.findall(r"^(?:[\w.]+\.)?(\w+(?:Error|Exception)): (.*)$", text, re.M)
        if python:
            return f"{python[-1][0]}: {python[-1][1]}", None
        return text[:MAX_ERROR_CHARS], None
    lines = [match.group(2)]
    for line in text[match.end():].splitlines()[1:]:
        if not line.startswith("  ") or line.startswith("  File "):
            break
        lines.append(line)
    return f"{match.group(1)}: " + "\n".join(lines), match.group(1)


def run_stage(
    spark: "SparkSession",
    plan: WindowPlan | str | Mapping,
    attempt: Attempt | Mapping,
    target: PostgresTarget,
    kafka_config: Mapping[str, Any],
    transform: str | Callable[["DataFrame"], "DataFrame"] | None = None,
    *,
    max_records_per_task: int = DEFAULT_MAX_RECORDS_PER_TASK,
    max_bad_records: int = 0,
    rows_per_chunk: int = DEFAULT_ROWS_PER_CHUNK,
    read_options: Mapping[str, Any] | None = None,
) -> StageReport:
    """Stage one attempt of a window: read exactly ``plan``, apply ``transform``,
    stage into the attempt's staging, checkpoint on job commit. Returns what the
    checkpoint holds; raises StageFailed (or a configuration error before any
    Spark work) otherwise, having aborted the attempt.

    ``attempt`` must be open (PostgresTarget.begin made it); ``target`` must have
    its URL. ``read_options``: further eos_kafka options (arrow_batch_rows,
    end_grace_s, poll_timeout_s).
    """
    started = time.perf_counter()
    if isinstance(plan, str):
        plan = WindowPlan.from_json(plan)
    elif isinstance(plan, Mapping):
        plan = WindowPlan.from_dict(plan)
    if isinstance(attempt, Mapping):
        attempt = Attempt.from_dict(attempt)
    if not target.url:
        raise ConfigurationError(f"{target!r} has no database URL")
    if max_bad_records < 0 or max_records_per_task < 1 or rows_per_chunk < 1:
        raise ConfigurationError("max_bad_records must be >= 0, max_records_per_task and rows_per_chunk >= 1")
    run = uuid.uuid4().hex[:12]
    log.info("staging %s (run %s) into %s: %d planned range(s), at most %d records, max_bad_records=%d",
             attempt, run, target.table, len(plan.ranges), plan.max_records, max_bad_records)
    for r in plan.ranges:
        log.info("  planned %s [%d, %d): %d offsets", r.tp, r.start_offset, r.end_offset, r.width)
    _check_attempt(target, plan, attempt)
    try:
        staging = target.writer(attempt)
        not_null = _not_null_columns(target, staging.columns)
        register(spark)
        records = read_plan(spark, plan, kafka_config, max_records_per_task=max_records_per_task,
                            report=REPORT_HOOK, report_options=report_options(target.url, attempt, run),
                            **(read_options or {}))
        fn = load_transform(transform)
        out = records_as_read(records) if fn is None else fn(records)
        if not hasattr(out, "write") or not hasattr(out, "columns"):
            raise ConfigurationError(f"transform {transform!r} returned {type(out).__name__}, not a DataFrame")
        rows, layout = writer_input(out, staging.columns, not_null, table=target.table, strict=fn is not None)
        settings = StageSettings(target, attempt, plan, run, layout, max_bad_records, rows_per_chunk,
                                 kafka_config=kafka_config)
    except Exception as exc:
        # Nothing was staged; end the attempt rather than leave it for the abort task or the sweep.
        _abort_quietly(target, attempt, f"stage job run {run} failed before writing: {exc}")
        raise
    setup = time.perf_counter()
    log.info("%s: set up in %.2fs (transform %s); running the Spark job (read + transform + stage + checkpoint)",
             attempt, setup - started, transform if isinstance(transform, str) or transform is None
             else getattr(transform, "__qualname__", transform))
    _make_active(spark)
    try:
        rows.write.format(FORMAT_NAME).mode("append").options(**settings.to_options()).save()
    except Exception as exc:
        message, error = _failure(exc)
        state = _attempt_state(target, attempt)
        raise StageFailed(f"the stage job of {attempt} failed ({state}): {message}", error=error) from exc
    finished = time.perf_counter()
    report = _report(target, attempt, run, {"setup": setup - started, "job": finished - setup})
    report.seconds["total"] = time.perf_counter() - started
    log.info("%s", report)
    for r in report.consumed:
        log.info("  read %s [%d, %d): %d records", r.tp, r.start_offset, r.end_offset, r.records)
    return report


def _make_active(spark: "SparkSession") -> None:
    """Spark finds a Python data source to write to through the JVM thread's
    *active* session, which only the thread that built the session has: from any
    other thread (two windows staged at once in one process) the write would fail
    with DATA_SOURCE_NOT_FOUND."""
    jvm, jsession = getattr(spark, "_jvm", None), getattr(spark, "_jsparkSession", None)
    if jvm is not None and jsession is not None:
        jvm.org.apache.spark.sql.SparkSession.setActiveSession(jsession)


def _abort_quietly(target: PostgresTarget, attempt: Attempt, reason: str) -> None:
    try:
        target.abort(attempt, reason[:MAX_ERROR_CHARS])
    except Exception as exc:  # noqa: BLE001 - the original failure matters more; the abort task retries
        log.warning("could not abort %s after its failure: %s", attempt, exc)


def _attempt_state(target: PostgresTarget, attempt: Attempt) -> str:
    try:
        with target.ledger.connect() as conn:
            status = attempts.load_status(conn, attempt)
    except Exception as exc:  # noqa: BLE001 - only for the message
        return f"attempt state unknown: {exc}"
    if status.state == attempts.ABORTED:
        return "attempt aborted, staging dropped"
    return f"attempt {status.state}"


def _report(target: PostgresTarget, attempt: Attempt, run: str, seconds: dict[str, float]) -> StageReport:
    with target.ledger.connect() as conn:
        status = attempts.load_status(conn, attempt)
        checkpoint = attempts.load_checkpoint(conn, attempt)
    if status.state not in (attempts.CHECKPOINTED, attempts.PREPARED, attempts.COMMITTED):
        raise StageFailed(f"the stage job of {attempt} finished but the attempt is {status.state}, "
                          "not checkpointed", error=None)
    reads = load_read_ranges(target.url, attempt, run)
    return StageReport(
        attempt=attempt, run=run, consumed=checkpoint.ranges,
        records_read=sum(r.records for r in checkpoint.ranges), rows_staged=checkpoint.row_count,
        dead_letters=checkpoint.dead_letter_count, chunks=len(checkpoint.chunks), checksum=checkpoint.checksum,
        read_tasks=len(reads), read_seconds=sum(s for _, s in reads), seconds=seconds,
    )



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
