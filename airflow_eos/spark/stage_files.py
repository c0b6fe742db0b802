"""The stage job's path for a sink that takes files (``Sink.spark_output``):
the window's rows written by Spark's own Parquet writer (JVM side, no Python
hop per row), the dead letters counted and written beside them, then the
checkpoint written by the driver. :func:`~airflow_eos.spark.stage.run_stage`
calls :func:`stage_files` when the sink names an output."""

from __future__ import annotations

import logging
import os
import shutil
import time
from collections.abc import Mapping
from contextlib import ExitStack
from typing import TYPE_CHECKING, Any

from airflow_eos.core.attempt import Attempt
from airflow_eos.core.errors import (
    ConfigurationError,
    EosError,
    TargetError,
)
from airflow_eos.core.faults import fault_point
from airflow_eos.core.sink import DEAD_LETTER_SCHEMA, Sink, SparkOutput
from airflow_eos.core.windows import WindowPlan
from airflow_eos.spark.layout import RAW_COLUMNS, Layout, writer_input
from airflow_eos.spark.stage_report import (
    StageFailed,
    StageReport,
    abort_after_failure,
    checkpoint_after_job,
    checkpointed_report,
    describe_attempt_state,
    job_failure,
    log_plan,
    log_report,
    make_session_active,
    read_transformed,
)
from airflow_eos.spark.stager import DEAD_LETTER_SAMPLES, TooManyBadRecords, too_many_message
from airflow_eos.spark.udf import ERROR_COLUMN

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

log = logging.getLogger("airflow_eos.spark.stage")


# --------------------------------------------------------------------------- Spark's own writer


def stage_files(spark: "SparkSession", plan: WindowPlan, attempt: Attempt, target: Sink, output: SparkOutput,
                kafka_config: Mapping[str, Any], transform, *, run: str, started: float,
                max_records_per_task: int, max_bad_records: int,
                read_options: Mapping[str, Any] | None, reader: str, cleanup: ExitStack) -> StageReport:
    """Stage into a sink that takes files (``output``, see Sink.spark_output)
    with Spark's own Parquet writer: the rows never pass through Python.

    The window's records are read from Kafka once: when the transform can
    mark dead letters (``eos_error``), its output is persisted, the dead
    letters are counted (more than ``max_bad_records``: TooManyBadRecords, as
    for the other sinks), then the good rows and the dead letters are written
    from the persisted output. The checkpoint is written by the driver, after
    both writes, with what the read tasks reported (read_coverage) and the
    files the writes left (Sink.staged_chunks)."""
    log.info("staging %s (run %s) into %s with Spark's Parquet writer: %d planned range(s), at most %d records, "
             "max_bad_records=%d", attempt, run, output.data, len(plan.ranges), plan.max_records, max_bad_records)
    log_plan(plan)
    rows, layout, observation = _transformed_rows(spark, plan, attempt, target, output, kafka_config, transform,
                                                  run=run, max_records_per_task=max_records_per_task,
                                                  read_options=read_options, reader=reader, cleanup=cleanup)
    setup = time.perf_counter()
    log.info("%s: set up in %.2fs; writing %d column(s) %s (read + transform + write, then the checkpoint)",
             attempt, setup - started, len(layout.staged), list(layout.staged))
    make_session_active(spark)
    written = _write_and_checkpoint(spark, rows, layout, plan, attempt, target, output, kafka_config, run=run,
                                    max_bad_records=max_bad_records, observation=observation)
    finished = time.perf_counter()
    report = checkpointed_report(target, attempt, run, {"setup": setup - started, "job": written - setup,
                                                        "checkpoint": finished - written})
    report.seconds["total"] = time.perf_counter() - started
    log_report(report)
    return report


def _transformed_rows(spark: "SparkSession", plan: WindowPlan, attempt: Attempt, target: Sink, output: SparkOutput,
                      kafka_config: Mapping[str, Any], transform, *, run: str, max_records_per_task: int,
                      read_options: Mapping[str, Any] | None, reader: str,
                      cleanup: ExitStack) -> tuple["DataFrame", Layout, Any]:
    """The transform's output over the planned ranges, shaped for the files, its
    Layout and the ObservedRead of the read (None: the eos_kafka source's), once
    the files an earlier run of the job left are deleted; a failure here aborts
    the attempt before anything is written."""
    try:
        cleared = target.clear_writes(attempt)
        if cleared:
            log.info("%s: deleted %d file(s) an earlier run of the stage job left in its staging", attempt, cleared)
        out, fn, observation = read_transformed(spark, plan, kafka_config, transform, url=target.ledger.url,
                                                attempt=attempt, run=run, max_records_per_task=max_records_per_task,
                                                read_options=read_options, reader=reader, cleanup=cleanup)
        return (*_file_rows(out, output, target, strict=fn is not None), observation)
    except Exception as exc:
        abort_after_failure(target, attempt, f"stage job run {run} failed before writing: {exc}")
        raise


def _write_and_checkpoint(spark: "SparkSession", rows: "DataFrame", layout: Layout, plan: WindowPlan,
                          attempt: Attempt, target: Sink, output: SparkOutput, kafka_config: Mapping[str, Any], *,
                          run: str, max_bad_records: int, observation=None) -> float:
    """Write the good rows and the dead letters (at most ``max_bad_records``)
    into the output, then the checkpoint; returns when (``perf_counter``) the
    writes ended and the checkpoint began. A failure aborts the attempt and
    raises StageFailed (see _write_failed)."""
    persisted = None
    try:
        persisted, dead_count = _write_rows(rows, layout, attempt, target, output, max_bad_records)
        # The rows are in the staging, the dead letters and the checkpoint not yet
        # (the same point as a write task's half-staged rows for the other sinks).
        fault_point("stage.mid_write")
        if dead_count:
            _write_dead_letters(spark, persisted, layout, output, kafka_config)
        written = time.perf_counter()
        checkpoint_after_job(target, attempt, run, plan, observation, lambda: target.staged_chunks(attempt))
    except Exception as exc:
        cause = None if isinstance(exc, EosError) else job_failure(exc, plan, kafka_config, observation)
        raise _write_failed(spark, exc, target, attempt, run, output.data, cause=cause) from exc
    finally:
        if persisted is not None:
            persisted.unpersist()
    return written


def _write_rows(rows: "DataFrame", layout: Layout, attempt: Attempt, target: Sink, output: SparkOutput,
                max_bad_records: int) -> tuple["DataFrame | None", int]:
    """Write the good rows into ``output.data``; returns the persisted output
    (to unpersist, None if not persisted) and its dead letters' count.

    A transform that marks no dead letter in this window (the common case)
    costs one Spark job: the rows are written while the dead letters are
    counted beside the write (an Observation), as Spark's own write of the
    rows would. If it marked any, what that job wrote is deleted and the
    output is persisted, so that the dead letters counted (TooManyBadRecords
    before anything is written), the good rows and the dead letters all come
    from one read of Kafka and one run of the transform. Persisting every
    window instead doubled the JVM's work for the write: 3.4-3.6 core-seconds
    against 1.6 for 1M rows."""
    from pyspark.sql import functions as F

    if layout.error is None:
        _append(rows.select(*[_column(c) for c in layout.staged]), output.data, output)
        return None, 0
    if _written_without_dead_letters(rows, layout, output):
        return None, 0
    cleared = target.clear_writes(attempt)
    log.info("%s: the transform marked dead letters: deleted the %d file(s) just written; writing again from its "
             "persisted output", attempt, cleared)
    persisted = rows.persist()  # read Kafka and transform once, for the count and both writes
    try:
        dead_count = _count_dead_letters(persisted, layout, attempt, max_bad_records)
        _append(persisted.filter(F.col(layout.error).isNull()).select(*[_column(c) for c in layout.staged]),
                output.data, output)
    except BaseException:
        persisted.unpersist()
        raise
    return persisted, dead_count


def _written_without_dead_letters(rows: "DataFrame", layout: Layout, output: SparkOutput) -> bool:
    """Write the good rows in one job, counting the rows marked as dead
    letters meanwhile; True if there were none (the write is then final)."""
    from pyspark.sql import functions as F

    observation = _observation(rows, "eos_dead_letters")
    marked = F.count(F.when(F.col(layout.error).isNotNull(), 1)).alias("dead")
    _append(rows.observe(observation, marked).filter(F.col(layout.error).isNull())
            .select(*[_column(c) for c in layout.staged]), output.data, output)
    return observation.get["dead"] == 0


def _observation(rows: "DataFrame", name: str):
    """An Observation of the kind ``rows`` takes: Spark Connect's for a Connect
    DataFrame, the classic one otherwise (whichever session this process made
    first, pyspark.sql.Observation picks by the process's mode)."""
    if type(rows).__module__.startswith("pyspark.sql.connect"):
        from pyspark.sql.connect.observation import Observation
        return Observation(name)
    from pyspark.sql.observation import Observation
    observation = object.__new__(Observation)
    observation.__init__(name)
    return observation


def _write_failed(spark: "SparkSession", exc: Exception, target: Sink, attempt: Attempt, run: str,
                  where: str, *, cause: tuple[str, str | None] | None) -> StageFailed:
    """The error a failed write or checkpoint ends the job with, the attempt
    aborted first (and, when the disk is full, Spark's half-written files
    closed); ``cause``: the failed job's (message, error class) by
    job_failure, None when ``exc`` is one of ours."""
    message, error = (f"{type(exc).__name__}: {exc}", type(exc).__name__) if isinstance(exc, EosError) else cause
    full = _disk_full(exc, where)
    if full is not None:
        message = full
    abort_after_failure(target, attempt, f"stage job run {run} failed: {message}")
    if full is not None:
        _close_failed_writes(spark)
    state = describe_attempt_state(target, attempt)
    return StageFailed(f"the stage job of {attempt} failed ({state}): {message}", error=error)


# strerror of ENOSPC and EDQUOT, as the JVM's IOException and Python's OSError say them
DISK_FULL = ("No space left on device", "Disk quota exceeded")


def _disk_full(exc: BaseException, where: str) -> str | None:
    """The message for a write that failed because the disk is full, or None.
    Spark reports it as a task that "failed while writing rows", with the
    cause deep in a Java stack trace (truncated before it in the ledger): the
    person needs the cause, the place and what to do first."""
    text = str(exc)
    reason = next((r for r in DISK_FULL if r in text), None)
    if reason is None:
        return None
    path = where.removeprefix("file://")
    mount = os.path.abspath(path)
    while not os.path.ismount(mount):
        mount = os.path.dirname(mount)
    try:
        usage = shutil.disk_usage(mount)
        space = f"{usage.free / 2**20:,.1f} MiB free of {usage.total / 2**20:,.1f} MiB"
    except OSError as err:
        space = f"its space unknown: {err.strerror}"
    return (f"the disk is full ({reason}): Spark's Parquet writer could not write the window's files into {path}, "
            f"on the file system mounted at {mount} ({space} when the job failed). Nothing was published and the "
            "attempt's staging is deleted; free space on that file system (or give the target a root with room), "
            "then rerun the window: a retry of the stage task or a Clear")


def _close_failed_writes(spark: "SparkSession") -> None:
    """When the disk fills, Parquet's writer fails in its close before Hadoop's
    local file system closes the file: the JVM keeps the (now deleted) files
    open and their space taken until a garbage collection closes them. With a
    local master (in-process, or a Spark Connect server) the tasks ran in the
    driver's JVM: collect there now (a query, so that it reaches a Connect
    server too), so that the space the abort freed is free for the rerun.
    Executors on a cluster collect on their own schedule."""
    try:
        if spark.conf.get("spark.master", "").startswith("local"):
            spark.sql("SELECT reflect('java.lang.System', 'gc')").collect()
    except Exception as exc:  # noqa: BLE001 - only space reclaimed sooner
        log.warning("could not run the JVM's garbage collection after a full disk: %s", exc)


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
    _append(dead.select(*[_column(name) for name, _ in DEAD_LETTER_SCHEMA]).coalesce(1), output.dead_letters, output)


def _append(rows: "DataFrame", url: str, output: SparkOutput) -> None:
    """Spark's own Parquet writer appends ``rows`` under ``url``, with the output's Hadoop settings."""
    rows.write.mode("append").options(**output.hadoop).parquet(url)
