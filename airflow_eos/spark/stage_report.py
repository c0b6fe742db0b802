"""What a run of the stage job reports (StageReport, StageFailed), and the
driver's helpers both of its paths share (:mod:`~airflow_eos.spark.stage`, the
``eos_staging`` writer; :mod:`~airflow_eos.spark.stage_files`, Spark's own
Parquet writer): the plan's log lines, making the session active, aborting
after a failure, and the report read back from the checkpoint."""

from __future__ import annotations

import dataclasses
import logging
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from airflow_eos.core import attempt as attempts
from airflow_eos.core.attempt import Attempt, ConsumedRange
from airflow_eos.core.errors import ConfigurationError, EosError
from airflow_eos.core.sink import Sink
from airflow_eos.core.windows import WindowPlan
from airflow_eos.spark.stage_settings import (
    load_read_ranges,
)
from airflow_eos.spark.submit import SPARK_READER
from airflow_eos.spark.udf import MAX_ERROR_CHARS

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger("airflow_eos.spark.stage")


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


def spark_failure(exc: BaseException) -> tuple[str, str | None]:
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


def log_plan(plan: WindowPlan) -> None:
    """Log the plan's ranges, one line each, as the job starts."""
    for r in plan.ranges:
        log.info("  planned %s [%d, %d): %d offsets", r.tp, r.start_offset, r.end_offset, r.width)


def log_report(report: StageReport) -> None:
    """Log what a finished job run checkpointed, and each range it read."""
    log.info("%s", report)
    for r in report.consumed:
        log.info("  read %s [%d, %d): %d records", r.tp, r.start_offset, r.end_offset, r.records)


def make_session_active(spark: "SparkSession") -> None:
    """Spark finds a Python data source to write to through the JVM thread's
    *active* session, which only the thread that built the session has: from any
    other thread (two windows staged at once in one process) the write would fail
    with DATA_SOURCE_NOT_FOUND."""
    jvm, jsession = getattr(spark, "_jvm", None), getattr(spark, "_jsparkSession", None)
    if jvm is not None and jsession is not None:
        jvm.org.apache.spark.sql.SparkSession.setActiveSession(jsession)


def abort_after_failure(target: Sink, attempt: Attempt, reason: str) -> None:
    """Abort ``attempt`` after the job failed, keeping the job's own error the
    one raised: a failed abort is logged, and the abort task or the sweep ends it."""
    try:
        target.abort(attempt, reason[:MAX_ERROR_CHARS])
    except Exception as exc:  # noqa: BLE001 - the original failure matters more; the abort task retries
        log.warning("could not abort %s after its failure: %s", attempt, exc)


def describe_attempt_state(target: Sink, attempt: Attempt) -> str:
    """The attempt's state in words, for the message of a failed job."""
    try:
        with target.ledger.connect() as conn:
            status = attempts.load_status(conn, attempt)
    except Exception as exc:  # noqa: BLE001 - only for the message
        return f"attempt state unknown: {exc}"
    if status.state == attempts.ABORTED:
        return "attempt aborted, staging dropped"
    return f"attempt {status.state}"


def checkpointed_report(target: Sink, attempt: Attempt, run: str, seconds: dict[str, float]) -> StageReport:
    """The StageReport of a job run that finished, read back from the checkpoint
    and the read tasks' records; StageFailed if the attempt is not checkpointed."""
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


def read_transformed(spark: "SparkSession", plan: WindowPlan, kafka_config: Mapping, transform, *, url: str,
                     attempt: Attempt, run: str, max_records_per_task: int, read_options: Mapping | None,
                     reader: str):
    """The window's records as the stage job reads them (exactly the plan) with
    the transform applied: (the output DataFrame, the loaded transform or None,
    the ObservedRead of the read or None). ``reader``: ``"spark"``, Spark's own
    Kafka source, observed (the driver records what was read after the job,
    stage_settings.record_observed_reads); ``"python"``, the eos_kafka source,
    whose read tasks report what they read themselves. Shared by both writers.

    An Avro source (``read_options`` has the plan's reader schema and the
    registry): the transform receives the records that decoded; each one that
    did not joins its output as a dead letter with the decoder's reason
    (avro_columns.with_decode_failures)."""
    from airflow_eos.spark.layout import records_as_read
    from airflow_eos.spark.staging_source import register
    from airflow_eos.spark.transform import load_transform

    register(spark)
    observation = None
    if reader == SPARK_READER:
        from airflow_eos.spark.kafka_native import read_plan_native

        records, observation = read_plan_native(spark, plan, kafka_config, max_records_per_task=max_records_per_task)
    else:
        from airflow_eos.spark.kafka_source import read_plan
        from airflow_eos.spark.stage_settings import REPORT_HOOK, report_options

        records = read_plan(spark, plan, kafka_config, max_records_per_task=max_records_per_task, report=REPORT_HOOK,
                            report_options=report_options(url, attempt, run), **(read_options or {}))
    fn = load_transform(transform)
    failed = None
    if (read_options or {}).get("avro_reader_schema") is not None:
        from airflow_eos.spark.avro_columns import decoded_apart

        records, failed = decoded_apart(records)
    out = records_as_read(records) if fn is None else fn(records)
    if not hasattr(out, "write") or not hasattr(out, "columns"):
        raise ConfigurationError(f"transform {transform!r} returned {type(out).__name__}, not a DataFrame")
    if failed is not None:
        from airflow_eos.spark.avro_columns import with_decode_failures

        out = with_decode_failures(out, failed)
    return out, fn, observation


def checkpoint_after_job(target: Sink, attempt: Attempt, run: str, plan: WindowPlan, observation,
                         chunks: Callable[[], list]) -> None:
    """The checkpoint, written by the driver once the job returned: what it read
    (``observation``, a kafka_native.ObservedRead, recorded first; None: the
    eos_kafka read tasks recorded it themselves), checked to cover the plan, and ``chunks()``. Sound
    because prepare waits while an attempt has no checkpoint (core/attempt/prepare.py):
    a staging whose driver died before this line is never prepared, and the abort
    task or the sweep drops it."""
    from airflow_eos.spark.stage_settings import read_coverage, record_observed_reads

    started = time.perf_counter()
    url = target.ledger.url
    if observation is not None:
        record_observed_reads(url, attempt, run, observation)
    reported = read_coverage(url, attempt, run, plan)
    checkpoint = target.checkpoint(attempt, [r for r, _ in reported], chunks())
    log.info("%s: the driver wrote the checkpoint after the job in %.2fs: %d records read by %d read task(s), "
             "%d rows staged and %d dead letters in %d chunk(s)", attempt, time.perf_counter() - started,
             sum(r.records for r, _ in reported), len(reported), checkpoint.row_count, checkpoint.dead_letter_count,
             len(checkpoint.chunks))
