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
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from airflow_eos.core import attempt as attempts
from airflow_eos.core.attempt import Attempt, ConsumedRange
from airflow_eos.core.database import redact
from airflow_eos.core.errors import (
    AttemptClosed,
    ConfigurationError,
    EosError,
    TargetError,
    WindowConflict,
    WindowNotPlanned,
)
from airflow_eos.core.faults import fault_point
from airflow_eos.core.sink import DEAD_LETTER_SCHEMA, Sink, SparkOutput
from airflow_eos.core.windows import WindowPlan
from airflow_eos.spark.kafka_source import DEFAULT_MAX_RECORDS_PER_TASK, read_plan
from airflow_eos.spark.layout import RAW_COLUMNS, Layout, records_as_read, writer_input
from airflow_eos.spark.stage_settings import (
    DEFAULT_ROWS_PER_CHUNK,
    FORMAT_NAME,
    REPORT_HOOK,
    StageSettings,
    load_read_ranges,
    read_coverage,
    report_options,
    report_read,
)
from airflow_eos.spark.stager import DEAD_LETTER_SAMPLES, StagedTask, TooManyBadRecords, too_many_message
from airflow_eos.spark.staging_source import StagingDataSource, commit_stage, register
from airflow_eos.spark.transform import load_transform
from airflow_eos.spark.udf import ERROR_COLUMN, MAX_ERROR_CHARS, catch_errors, describe_error, safe_udf

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
        if sorted(frozen.ranges) != sorted(plan.ranges):
            raise WindowConflict(f"the plan given for {plan.window} differs from its frozen plan: given "
                                 f"{[r.to_dict() for r in plan.ranges]}, frozen {[r.to_dict() for r in frozen.ranges]}")
        status = attempts.load_status(conn, attempt)
        attempts.check_current(attempt, status, "stage")
        if status.state != attempts.OPEN:
            raise AttemptClosed(f"cannot stage {attempt}: it is {status.state} already; open a new attempt")


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
    target: Sink,
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

    ``attempt`` must be open (``target.begin`` made it); ``target`` is a bound
    target's Sink (a PostgresTarget with its URL, a FileSink, ...). A sink with
    a :meth:`~airflow_eos.core.sink.Sink.spark_output` is written by Spark's own
    Parquet writer (:func:`_stage_native`); any other through the eos_staging
    data source and its writer. ``read_options``: further eos_kafka options
    (arrow_batch_rows, end_grace_s, poll_timeout_s).
    """
    started = time.perf_counter()
    if isinstance(plan, str):
        plan = WindowPlan.from_json(plan)
    elif isinstance(plan, Mapping):
        plan = WindowPlan.from_dict(plan)
    if isinstance(attempt, Mapping):
        attempt = Attempt.from_dict(attempt)
    url = target.ledger.url  # a PostgresTarget without its URL: ConfigurationError
    if max_bad_records < 0 or max_records_per_task < 1 or rows_per_chunk < 1:
        raise ConfigurationError("max_bad_records must be >= 0, max_records_per_task and rows_per_chunk >= 1")
    run = uuid.uuid4().hex[:12]
    _check_attempt(target, plan, attempt)
    try:
        output = target.spark_output(attempt)
    except Exception as exc:
        _abort_quietly(target, attempt, f"stage job run {run} failed before writing: {exc}")
        raise
    if output is not None:
        return _stage_native(spark, plan, attempt, target, output, kafka_config, transform, run=run,
                             started=started, max_records_per_task=max_records_per_task,
                             max_bad_records=max_bad_records, read_options=read_options)
    log.info("staging %s (run %s) into %s: %d planned range(s), at most %d records, max_bad_records=%d",
             attempt, run, target.table, len(plan.ranges), plan.max_records, max_bad_records)
    _log_plan(plan)
    try:
        staging = target.writer(attempt)
        not_null = target.not_null_columns(staging.columns)
        register(spark)
        records = read_plan(spark, plan, kafka_config, max_records_per_task=max_records_per_task,
                            report=REPORT_HOOK, report_options=report_options(url, attempt, run),
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


# --------------------------------------------------------------------------- Spark's own writer


def _stage_native(spark: "SparkSession", plan: WindowPlan, attempt: Attempt, target: Sink, output: SparkOutput,
                  kafka_config: Mapping[str, Any], transform, *, run: str, started: float,
                  max_records_per_task: int, max_bad_records: int,
                  read_options: Mapping[str, Any] | None) -> StageReport:
    """Stage into a sink that takes files (``output``, see Sink.spark_output)
    with Spark's own Parquet writer: the rows never pass through Python.

    The window's records are read from Kafka once: when the transform can
    mark dead letters (``eos_error``), its output is persisted, the dead
    letters are counted (more than ``max_bad_records``: TooManyBadRecords, as
    for the other sinks), then the good rows and the dead letters are written
    from the persisted output. The checkpoint is written by the driver, after
    both writes, with what the read tasks reported (read_coverage) and the
    files the writes left (Sink.staged_chunks)."""
    from pyspark.sql import functions as F

    url = target.ledger.url
    where = output.data
    log.info("staging %s (run %s) into %s with Spark's Parquet writer: %d planned range(s), at most %d records, "
             "max_bad_records=%d", attempt, run, where, len(plan.ranges), plan.max_records, max_bad_records)
    _log_plan(plan)
    try:
        cleared = target.clear_writes(attempt)
        if cleared:
            log.info("%s: deleted %d file(s) an earlier run of the stage job left in its staging", attempt, cleared)
        register(spark)
        records = read_plan(spark, plan, kafka_config, max_records_per_task=max_records_per_task,
                            report=REPORT_HOOK, report_options=report_options(url, attempt, run),
                            **(read_options or {}))
        fn = load_transform(transform)
        out = records_as_read(records) if fn is None else fn(records)
        if not hasattr(out, "write") or not hasattr(out, "columns"):
            raise ConfigurationError(f"transform {transform!r} returned {type(out).__name__}, not a DataFrame")
        rows, layout = _file_rows(out, output, target, strict=fn is not None)
    except Exception as exc:
        _abort_quietly(target, attempt, f"stage job run {run} failed before writing: {exc}")
        raise
    setup = time.perf_counter()
    log.info("%s: set up in %.2fs; writing %d column(s) %s (read + transform + write, then the checkpoint)",
             attempt, setup - started, len(layout.staged), list(layout.staged))
    _make_active(spark)
    persisted = None
    try:
        data, dead_count = rows, 0
        if layout.error is not None:
            persisted = rows.persist()  # read Kafka and transform once, for the count and both writes
            dead_count = _count_dead_letters(persisted, layout, attempt, max_bad_records)
            data = persisted.filter(F.col(layout.error).isNull())
        data = data.select(*[_column(c) for c in layout.staged])
        data.write.mode("append").parquet(output.data)
        # The rows are in the staging, the dead letters and the checkpoint not yet
        # (the same point as a write task's half-staged rows for the other sinks).
        fault_point("stage.mid_write")
        if dead_count:
            _write_dead_letters(spark, persisted, layout, output, kafka_config)
        written = time.perf_counter()
        reported = read_coverage(url, attempt, run, plan)
        chunks = target.staged_chunks(attempt)
        target.checkpoint(attempt, [r for r, _ in reported], chunks)
    except Exception as exc:
        message, error = (f"{type(exc).__name__}: {exc}", type(exc).__name__) if isinstance(exc, EosError) \
            else _failure(exc)
        _abort_quietly(target, attempt, f"stage job run {run} failed: {message}")
        state = _attempt_state(target, attempt)
        raise StageFailed(f"the stage job of {attempt} failed ({state}): {message}", error=error) from exc
    finally:
        if persisted is not None:
            persisted.unpersist()
    finished = time.perf_counter()
    report = _report(target, attempt, run, {"setup": setup - started, "job": written - setup,
                                            "checkpoint": finished - written})
    report.seconds["total"] = time.perf_counter() - started
    log.info("%s", report)
    for r in report.consumed:
        log.info("  read %s [%d, %d): %d records", r.tp, r.start_offset, r.end_offset, r.records)
    return report


def _log_plan(plan: WindowPlan) -> None:
    for r in plan.ranges:
        log.info("  planned %s [%d, %d): %d offsets", r.tp, r.start_offset, r.end_offset, r.width)


def _column(name: str):
    from pyspark.sql import functions as F

    return F.col("`" + name.replace("`", "``") + "`")


def _file_rows(out: "DataFrame", output: SparkOutput, target: Sink, *, strict: bool) -> tuple["DataFrame", Layout]:
    """The transform's output shaped for a sink that takes files: every column
    is written, except ``eos_error``, the columns the sink gives readers itself
    (``output.reserved``: dropped, with a warning) and, after a transform that
    has both, ``key`` and ``value`` (the raw record, kept with a dead letter
    only). Without a transform, the records as read are written whole."""
    reserved = {c.lower() for c in output.reserved}
    dropped = [c for c in out.columns if c.lower() in reserved]
    if dropped:
        log.warning("the transform's output has column(s) %s, which the target's partition directories give to "
                    "readers: dropped from the rows", dropped)
        out = out.drop(*dropped)
    names = list(out.columns)
    raw = [c for c in names if c.lower() in RAW_COLUMNS]
    raw = set(raw) if strict and len(raw) == len(RAW_COLUMNS) else set()
    staged = [c for c in names if c.lower() != ERROR_COLUMN and c not in raw]
    if not staged:
        raise ConfigurationError(f"the transform's output has no column to write (it has {names})")
    return writer_input(out, staged, target.not_null_columns(staged), table=output.data, strict=strict)


def _count_dead_letters(rows: "DataFrame", layout: Layout, attempt: Attempt, max_bad_records: int) -> int:
    """The dead letters among ``rows`` (one Spark job over the persisted
    output); TooManyBadRecords over ``max_bad_records``, a TargetError for a
    dead letter that cannot name its record."""
    from pyspark.sql import functions as F

    topic, partition, offset = layout.lineage
    bad = rows.filter(F.col(layout.error).isNotNull())
    no_lineage = F.when(F.col(topic).isNull() | F.col(partition).isNull() | F.col(offset).isNull(), 1)
    count, unnamed = bad.agg(F.count(F.lit(1)), F.count(no_lineage)).first()
    if unnamed:
        raise TargetError(f"{attempt}: {unnamed} dead letter(s) have null lineage ({topic}, {partition}, {offset}): "
                          "a dead letter must name its source record")
    if count > max_bad_records:
        samples = [tuple(r) for r in bad.select(
            F.col(topic).cast("string"), F.col(partition).cast("int"), F.col(offset).cast("long"),
            F.col(layout.error)).orderBy(topic, partition, offset).limit(DEAD_LETTER_SAMPLES).collect()]
        raise TooManyBadRecords(too_many_message(attempt, max_bad_records, count, samples, "the job"))
    if count:
        log.info("%s: %d dead letter(s) (max_bad_records=%d)", attempt, count, max_bad_records)
    return count


def _write_dead_letters(spark: "SparkSession", rows: "DataFrame", layout: Layout, output: SparkOutput,
                        kafka_config: Mapping[str, Any]) -> None:
    """The dead letters of ``rows`` as Parquet into ``output.dead_letters``
    (DEAD_LETTER_SCHEMA), in one file. Their raw key and value come from the
    transform's ``key`` and ``value``; without those, they are read back from
    Kafka by lineage on the driver (at most max_bad_records records)."""
    from pyspark.sql import functions as F

    topic, partition, offset = layout.lineage
    lineage = [F.col(topic).cast("string").alias("topic"), F.col(partition).cast("int").alias("partition"),
               F.col(offset).cast("long").alias("offset"), F.col(layout.error).alias("error")]
    bad = rows.filter(F.col(layout.error).isNotNull())
    schema = ", ".join(f"`{name}` {kind}" for name, kind in DEAD_LETTER_SCHEMA)
    if layout.raw is not None:
        dead = bad.select(*lineage, F.col(layout.raw[0]).alias("key"), F.col(layout.raw[1]).alias("value"))
    else:
        from airflow_eos.spark.kafka_ranges import read_records

        letters = [tuple(r) for r in bad.select(*lineage).collect()]
        by_partition: dict[tuple[str, int], list[int]] = {}
        for t, p, o, _ in letters:
            by_partition.setdefault((t, p), []).append(o)
        raw = {(t, p): read_records(kafka_config, t, p, offsets) for (t, p), offsets in by_partition.items()}
        dead = spark.createDataFrame([(t, p, o, e, *raw[(t, p)][o]) for t, p, o, e in letters], schema)
    dead.select(*[_column(name) for name, _ in DEAD_LETTER_SCHEMA]).coalesce(1).write.mode("append").parquet(
        output.dead_letters)


def _make_active(spark: "SparkSession") -> None:
    """Spark finds a Python data source to write to through the JVM thread's
    *active* session, which only the thread that built the session has: from any
    other thread (two windows staged at once in one process) the write would fail
    with DATA_SOURCE_NOT_FOUND."""
    jvm, jsession = getattr(spark, "_jvm", None), getattr(spark, "_jsparkSession", None)
    if jvm is not None and jsession is not None:
        jvm.org.apache.spark.sql.SparkSession.setActiveSession(jsession)


def _abort_quietly(target: Sink, attempt: Attempt, reason: str) -> None:
    try:
        target.abort(attempt, reason[:MAX_ERROR_CHARS])
    except Exception as exc:  # noqa: BLE001 - the original failure matters more; the abort task retries
        log.warning("could not abort %s after its failure: %s", attempt, exc)


def _attempt_state(target: Sink, attempt: Attempt) -> str:
    try:
        with target.ledger.connect() as conn:
            status = attempts.load_status(conn, attempt)
    except Exception as exc:  # noqa: BLE001 - only for the message
        return f"attempt state unknown: {exc}"
    if status.state == attempts.ABORTED:
        return "attempt aborted, staging dropped"
    return f"attempt {status.state}"


def _report(target: Sink, attempt: Attempt, run: str, seconds: dict[str, float]) -> StageReport:
    with target.ledger.connect() as conn:
        status = attempts.load_status(conn, attempt)
        checkpoint = attempts.load_checkpoint(conn, attempt)
    if status.state not in (attempts.CHECKPOINTED, attempts.PREPARED, attempts.COMMITTED):
        raise StageFailed(f"the stage job of {attempt} finished but the attempt is {status.state}, "
                          "not checkpointed", error=None)
    reads = load_read_ranges(target.ledger.url, attempt, run)
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
