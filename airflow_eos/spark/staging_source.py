"""The ``eos_staging`` Python data source: ``df.write.format("eos_staging")``
stages the rows of an attempt (each write task: :mod:`airflow_eos.spark.stager`),
writes the attempt's checkpoint on Spark's job commit, and aborts the attempt on
Spark's job abort. Its options are a StageSettings (spark.stage_settings); the
driver that builds them is :func:`airflow_eos.spark.stage.run_stage`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

from pyspark.sql.datasource import DataSource, DataSourceArrowWriter

from airflow_eos.core import attempt as attempts
from airflow_eos.core.attempt import Checkpoint
from airflow_eos.core.errors import ConfigurationError, EosError, InvalidCheckpoint
from airflow_eos.core.faults import fault_point
from airflow_eos.spark.kafka_source import register as register_kafka_source
from airflow_eos.spark.kafka_source import worker_logging
from airflow_eos.spark.stage_settings import FORMAT_NAME, StageSettings, read_coverage
from airflow_eos.spark.stager import StagedTask, TaskStager, TooManyBadRecords, too_many_message

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)


class StagingDataSource(DataSource):
    """``df.write.format("eos_staging")``: stage rows into an attempt's staging,
    checkpoint on job commit, abort the attempt on job abort. Options: see
    StageSettings.to_options; build them with run_stage."""

    @classmethod
    def name(cls) -> str:
        return FORMAT_NAME

    def writer(self, schema, overwrite: bool) -> "StagingArrowWriter":
        settings = StageSettings.from_options(self.options)
        layout = settings.layout
        wanted = [*layout.kept, *([layout.error] if layout.error else []), *(layout.raw or ())]
        missing = [c for c in wanted if c not in schema.names]
        if missing:
            raise ConfigurationError(f"the rows to stage lack columns {missing}; build them with run_stage")
        return StagingArrowWriter(settings)


class StagingArrowWriter(DataSourceArrowWriter):
    def __init__(self, settings: StageSettings):
        self.settings = settings

    def write(self, iterator: Iterator["pa.RecordBatch"]) -> StagedTask:
        worker_logging()
        task = _task_name()
        try:
            result = TaskStager(self.settings, iterator).run()
        except EosError as exc:
            log.error("%s of %s failed: %s", task, self.settings.attempt, exc)
            raise
        log.info("%s of %s: staged %d rows and %d dead letters (%d refused by the target) in %d chunk(s); "
                 "waited %.2fs for input (read + transform), wrote for %.2fs", task, self.settings.attempt,
                 result.rows, result.dead_letters, result.refused, len(result.chunks), result.wait_s, result.write_s)
        return result

    def commit(self, messages: list[StagedTask | None]) -> None:
        worker_logging()
        commit_stage(self.settings, messages)

    def abort(self, messages: list[StagedTask | None]) -> None:
        worker_logging()
        failed = sum(m is None for m in messages)
        reason = (f"stage job run {self.settings.run} failed: {failed} of {len(messages)} write task(s) failed"
                  if failed else f"stage job run {self.settings.run} failed at its job commit")
        aborted = self.settings.target.abort(self.settings.attempt, reason)
        log.info("%s: %s; %s", self.settings.attempt, reason,
                 "attempt aborted, staging dropped" if aborted else "attempt had ended already, staging dropped")


def _task_name() -> str:
    from pyspark import TaskContext

    context = TaskContext.get()
    if context is None:
        return "write task"
    return f"write task {context.partitionId()} (attempt {context.attemptNumber()})"


def commit_stage(settings: StageSettings, messages: Sequence[StagedTask | None]) -> Checkpoint:
    """Spark's job commit: check what was read and staged, write the checkpoint."""
    started = time.perf_counter()
    attempt = settings.attempt
    if any(m is None for m in messages):
        raise InvalidCheckpoint(f"{attempt}: job commit with a failed write task's message missing")
    chunks = [c for m in messages for c in m.chunks]
    dead = sum(m.dead_letters for m in messages)
    if dead > settings.max_bad_records:
        samples = [s for m in messages for s in m.samples]
        raise TooManyBadRecords(too_many_message(attempt, settings.max_bad_records, dead, samples, "the job"))
    if settings.checkpoint_by_driver:
        # What the job read is known to its driver only after the job (observed metrics):
        # keep the accepted chunks for the checkpoint it writes then (stage.py). The job
        # commit's part of the checkpoint, so the checkpoint's fault point is here too.
        fault_point("stage.before_checkpoint")
        with settings.target.ledger.connect() as conn, conn.transaction():
            attempts.record_staged_chunks(conn, attempt, tuple(chunks))
        log.info("%s: job commit recorded %d chunk(s) (%d rows, %d dead letters) for the driver's checkpoint in "
                 "%.2fs", attempt, len(chunks), sum(m.rows for m in messages), dead, time.perf_counter() - started)
        return attempts.make_checkpoint([], chunks)
    reported = read_coverage(settings.target.ledger.url, attempt, settings.run, settings.plan)
    consumed = [r for r, _ in reported]
    checkpoint = attempts.make_checkpoint(consumed, chunks)
    settings.target.checkpoint(attempt, consumed, chunks)
    rows = sum(m.rows for m in messages)
    log.info("%s: job commit wrote the checkpoint in %.2fs: %d records read by %d read task(s) "
             "(%.1fs reading in all), %d rows staged and %d dead letters (%d refused by the target) by %d write "
             "task(s) in %d chunk(s) after %d COPY(s) and %d refused column check(s) (%.1fs waiting for input, "
             "%.1fs writing, in all)", attempt,
             time.perf_counter() - started, sum(r.records for r in consumed), len(reported),
             sum(s for _, s in reported), rows, dead, sum(m.refused for m in messages), len(messages), len(chunks),
             sum(m.copies for m in messages), sum(m.column_checks for m in messages),
             sum(m.wait_s for m in messages), sum(m.write_s for m in messages))
    for r in checkpoint.ranges:
        log.info("  consumed %s [%d, %d): %d records", r.tp, r.start_offset, r.end_offset, r.records)
    return checkpoint


def register(spark: "SparkSession") -> None:
    """Make the eos_kafka and eos_staging data sources available in this session."""
    register_kafka_source(spark)
    spark.dataSource.register(StagingDataSource)


__all__ = ["FORMAT_NAME", "StagingArrowWriter", "StagingDataSource", "commit_stage", "register"]
