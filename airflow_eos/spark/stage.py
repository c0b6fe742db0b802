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

Entry points: :func:`run_stage` (in-process, reusing a SparkSession) and
:func:`main` (``spark-submit airflow_eos/spark/job.py ...``, see submit.py).
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import logging
import re
import sys
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg import sql
from pyspark.sql.datasource import DataSource, DataSourceArrowWriter, WriterCommitMessage

from airflow_eos.core import attempt as attempts
from airflow_eos.core.attempt import Attempt, Checkpoint, ConsumedRange, StagedChunk
from airflow_eos.core.errors import (
    AttemptClosed,
    ConfigurationError,
    EosError,
    InvalidCheckpoint,
    TargetError,
    WindowConflict,
    WindowNotPlanned,
)
from airflow_eos.core.database import connect, redact
from airflow_eos.targets.postgres.target import LINEAGE_COLUMNS, PostgresTarget, StagingWriter, parse_table_name
from airflow_eos.core.windows import WindowPlan
from airflow_eos.spark.kafka_ranges import read_records
from airflow_eos.spark.kafka_source import (
    DEFAULT_MAX_RECORDS_PER_TASK,
    KAFKA_PREFIX,
    option_string,
    read_plan,
    worker_logging,
)
from airflow_eos.spark.kafka_source import register as register_kafka_source
from airflow_eos.spark.transform import load_transform

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import Column, DataFrame, SparkSession
    from pyspark.sql.types import DataType

    from airflow_eos.spark.kafka_source import KafkaRangePartition, ReadStats

log = logging.getLogger(__name__)

FORMAT_NAME = "eos_staging"
ERROR_COLUMN = "eos_error"
RAW_COLUMNS = ("key", "value")  # the raw record kept with a dead letter
REPORT_HOOK = f"{__name__}:report_read"

# Columns the job adds to the writer's input beside the staged ones; the prefix
# keeps them apart from any target column.
_ERROR = "__eos_error"
_LINEAGE = ("__eos_topic", "__eos_partition", "__eos_offset")
_RAW = ("__eos_key", "__eos_value")

# A chunk is one transaction; bounding it bounds what a write task holds in
# memory to isolate a refused row, and what a failure re-does.
DEFAULT_ROWS_PER_CHUNK = 1_000_000
DEFAULT_CHUNK_BYTES = 256 << 20
DEAD_LETTER_SAMPLES = 5
# The target refusing every non-null value of a column in a chunk of at least
# this many is a configuration error (wrong type in the table or the transform),
# not bad records; fewer (a one-record window, say) are dead letters.
COLUMN_REFUSED_MIN_VALUES = 10
MAX_ERROR_CHARS = 2_000


class TooManyBadRecords(EosError):
    """More records were dead-lettered than ``max_bad_records`` allows."""


class StageFailed(EosError):
    """The Spark stage job failed. ``error`` names the underlying error's class
    (e.g. ``AttemptFenced``, ``TooManyBadRecords``) when it is one of ours."""

    def __init__(self, message: str, *, error: str | None = None):
        super().__init__(message)
        self.error = error


# --------------------------------------------------------------------------- helpers for transform authors


def describe_error(exc: BaseException) -> str:
    """An exception as a dead letter's error text: its type and message, bounded."""
    text = f"{type(exc).__name__}: {exc}"
    return text if len(text) <= MAX_ERROR_CHARS else text[: MAX_ERROR_CHARS - 3] + "..."


def catch_errors(fn: Callable) -> Callable:
    """Wrap a per-record function so that it returns ``(result, None)``, or
    ``(None, error)`` when it raises, instead of failing the Spark task. Use the
    error as the row's ``eos_error``; :func:`safe_udf` does that for a UDF."""

    @functools.wraps(fn)
    def caught(*args, **kwargs):
        try:
            return fn(*args, **kwargs), None
        except Exception as exc:  # noqa: BLE001 - any failure of one record makes it a dead letter
            return None, describe_error(exc)

    return caught


def safe_udf(returnType: "DataType | str") -> Callable[[Callable], Callable[..., "Column"]]:
    """Decorator: a Python UDF whose exceptions become dead letters.

    The UDF returns a struct: the fields of ``returnType`` (a struct type, the
    function returning a dict, tuple or Row), or for any other type one field
    ``value``, plus the field ``eos_error`` (null unless the function raised, or
    returned a struct of the wrong shape). Select ``"alias.*"`` to get the fields
    and ``eos_error`` as columns; see the module docstring.
    """

    def decorate(fn: Callable) -> Callable[..., "Column"]:
        def build():
            # Built at each call, not at decoration: parsing a DDL string needs a
            # session, which exists once a transform calls the UDF (not always when
            # its module is imported), and a UDF object keeps the JVM it was first
            # used in, which a later session may have replaced.
            from pyspark.sql import functions as F
            from pyspark.sql.types import DataType, StringType, StructField, StructType

            rtype = returnType if isinstance(returnType, DataType) else DataType.fromDDL(returnType)
            error_field = StructField(ERROR_COLUMN, StringType())
            if isinstance(rtype, StructType):
                names = tuple(rtype.names)
                if ERROR_COLUMN in names:
                    raise ConfigurationError(f"safe_udf {fn.__name__}: {ERROR_COLUMN!r} is added by safe_udf")
                out_type = StructType([*rtype.fields, error_field])
                nulls = (None,) * len(names)

                def row(*args):
                    try:
                        result = fn(*args)
                        if result is None:
                            return (*nulls, None)
                        if isinstance(result, Mapping):
                            values = tuple(result[n] for n in names)
                        else:
                            values = tuple(result)
                            if len(values) != len(names):
                                raise ValueError(f"returned {len(values)} values for the {len(names)} fields {names}")
                        return (*values, None)
                    except Exception as exc:  # noqa: BLE001 - see catch_errors
                        return (*nulls, describe_error(exc))
            else:
                out_type = StructType([StructField("value", rtype), error_field])
                caught = catch_errors(fn)

                def row(*args):
                    return caught(*args)

            return F.udf(row, out_type)

        @functools.wraps(fn)
        def column(*cols) -> "Column":
            return build()(*cols)

        return column

    return decorate


# --------------------------------------------------------------------------- what the writer receives


@dataclass(frozen=True)
class Layout:
    """The columns of the writer's input: the staged ones (the target's, in the
    staging's order) and those that make a row a dead letter and describe it."""

    staged: tuple[str, ...]
    error: str | None = None  # null: stage the row; else a dead letter with this error
    lineage: tuple[str, str, str] | None = None  # the source record of each row
    raw: tuple[str, str] | None = None  # a dead letter's raw key and value (null for good rows)
    types: tuple[str, ...] | None = None  # the transform's type of each staged column (Spark's name), for messages

    @property
    def kept(self) -> tuple[str, ...]:
        """What a write task keeps of a good row: the staged columns, and lineage
        kept apart from them (to dead-letter a row the target refuses)."""
        extra = tuple(c for c in (self.lineage or ()) if c not in self.staged)
        return self.staged + extra

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def from_json(cls, text: str) -> "Layout":
        data = json.loads(text)
        return cls(tuple(data["staged"]), data["error"], tuple(data["lineage"]) if data["lineage"] else None,
                   tuple(data["raw"]) if data["raw"] else None,
                   tuple(data["types"]) if data.get("types") else None)


def _col(name: str) -> "Column":
    from pyspark.sql import functions as F

    return F.col("`" + name.replace("`", "``") + "`")


def _find(columns: Sequence[str], name: str) -> str | None:
    """The column called ``name``: exactly, else the one case-insensitive match
    (PostgreSQL folds unquoted names to lower case, Spark keeps ``timestampType``)."""
    if name in columns:
        return name
    matches = [c for c in columns if c.lower() == name.lower()]
    return matches[0] if len(matches) == 1 else None


def records_as_read(df: "DataFrame") -> "DataFrame":
    """The window's records with lineage: what is staged without a transform."""
    from pyspark.sql import functions as F

    return df.select(
        "*",
        F.col("topic").alias("eos_topic"),
        F.col("partition").alias("eos_partition"),
        F.col("offset").alias("eos_offset"),
    ).withColumn("headers", F.to_json("headers"))


def writer_input(out: "DataFrame", staged: Sequence[str], not_null: Iterable[str], *, table: str,
                 strict: bool = True) -> tuple["DataFrame", Layout]:
    """Shape a transform's output for the staging writer (see the module
    docstring); refuse, before any work, an output that cannot be staged."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import BinaryType, StringType

    names = list(out.columns)
    found = {c: _find(names, c) for c in staged}
    missing = [c for c, f in found.items() if f is None]
    if missing:
        raise ConfigurationError(f"the transform's output lacks columns {missing} of target {table} "
                                 f"(it has {names}); target columns to stage: {list(staged)}")
    error = _find(names, ERROR_COLUMN)
    lineage = [_find(names, c) for c in LINEAGE_COLUMNS]
    raw = [_find(names, c) for c in RAW_COLUMNS]
    if strict:
        known = {*found.values(), error, *lineage, *raw} - {None}
        extra = [n for n in names if n not in known]
        if extra:
            raise ConfigurationError(
                f"the transform's output has columns {extra} that target {table} does not stage; "
                f"drop them (target columns: {list(staged)}; also allowed: {ERROR_COLUMN}, "
                f"{', '.join(LINEAGE_COLUMNS)}, {', '.join(RAW_COLUMNS)})")
    if error is not None and not isinstance(out.schema[error].dataType, StringType):
        raise ConfigurationError(f"column {error!r} must be a string (the dead letter's error), "
                                 f"not {out.schema[error].dataType.simpleString()}")
    has_lineage = all(lineage)
    if error is not None and not has_lineage:
        raise ConfigurationError(
            f"the transform's output has {ERROR_COLUMN} but not the lineage columns {list(LINEAGE_COLUMNS)}: "
            "a dead letter must name its source record")

    checks = [F.when(_col(found[c]).isNull(), F.lit(f"null in column {c}, which is NOT NULL in {table}"))
              for c in staged if c in set(not_null)]
    reasons = ([_col(error)] if error is not None else []) + checks
    columns = [_col(found[c]).alias(c) for c in staged]
    types = tuple(out.schema[found[c]].dataType.simpleString() for c in staged)
    layout_lineage = None
    if all(c in staged for c in LINEAGE_COLUMNS):
        layout_lineage = tuple(LINEAGE_COLUMNS)
    elif has_lineage:
        layout_lineage = _LINEAGE
        columns += [_col(lineage[0]).cast("string").alias(_LINEAGE[0]), _col(lineage[1]).cast("int").alias(_LINEAGE[1]),
                    _col(lineage[2]).cast("long").alias(_LINEAGE[2])]
    if not reasons:
        return out.select(*columns), Layout(tuple(staged), None, layout_lineage, None, types)
    # The error first, in a projection of its own, so the rest refers to it
    # rather than repeating it (a UDF's result, for instance).
    with_error = out.withColumn(_ERROR, F.coalesce(*reasons) if len(reasons) > 1 else reasons[0])
    columns.append(F.col(_ERROR))
    layout_raw = None
    if all(raw):
        layout_raw = _RAW
        for name, alias in zip(raw, _RAW, strict=True):
            kind = out.schema[name].dataType
            value = (_col(name) if isinstance(kind, BinaryType) else
                     _col(name).cast("binary") if isinstance(kind, StringType) else
                     _col(name).cast("string").cast("binary"))
            # Only dead letters carry their raw record; good rows carry nulls, which cost nothing.
            columns.append(F.when(F.col(_ERROR).isNotNull(), value).alias(alias))
    return with_error.select(*columns), Layout(tuple(staged), _ERROR, layout_lineage, layout_raw, types)


# --------------------------------------------------------------------------- settings shipped to the workers


@dataclass(frozen=True)
class StageSettings:
    """Everything the writer's tasks and its commit need; travels as options."""

    target: PostgresTarget
    attempt: Attempt
    plan: WindowPlan
    run: str
    layout: Layout
    max_bad_records: int
    rows_per_chunk: int = DEFAULT_ROWS_PER_CHUNK
    chunk_bytes: int = DEFAULT_CHUNK_BYTES
    # The source's Kafka settings: write tasks read the records of dead letters
    # that lack their key and value back by lineage (_TaskStager._read_back_raw).
    # run_stage always sets them; empty only where a test stages without Kafka.
    kafka_config: Mapping[str, Any] = field(default_factory=dict, repr=False)

    def to_options(self) -> dict[str, str]:
        # One option per Kafka setting, as the eos_kafka source has them, so that
        # Spark's redaction hides e.g. kafka.sasl.password.
        kafka = {KAFKA_PREFIX + k: option_string(v) for k, v in self.kafka_config.items()}
        return {**kafka,
            # "secret" in the key: Spark redacts options whose key matches
            # spark.redaction.regex, and the target's URL may hold a password.
            "target.secret": json.dumps(dataclasses.asdict(self.target)),
            "attempt": json.dumps(self.attempt.to_dict()),
            "plan": self.plan.to_json(),
            "run": self.run,
            "layout": self.layout.to_json(),
            "max_bad_records": str(self.max_bad_records),
            "rows_per_chunk": str(self.rows_per_chunk),
            "chunk_bytes": str(self.chunk_bytes),
        }

    @classmethod
    def from_options(cls, options: Mapping[str, str]) -> "StageSettings":
        from airflow_eos.spark.submit import TARGET_ENV, target_from_environment

        try:
            return cls(
                target=target_from_environment({TARGET_ENV: options["target.secret"]}),
                attempt=Attempt.from_dict(json.loads(options["attempt"])),
                plan=WindowPlan.from_json(options["plan"]),
                run=options["run"],
                layout=Layout.from_json(options["layout"]),
                max_bad_records=int(options["max_bad_records"]),
                rows_per_chunk=int(options["rows_per_chunk"]),
                chunk_bytes=int(options["chunk_bytes"]),
                kafka_config={k[len(KAFKA_PREFIX):]: v for k, v in options.items() if k.startswith(KAFKA_PREFIX)},
            )
        except KeyError as exc:
            raise ConfigurationError(f"the {FORMAT_NAME} data source needs option {exc}; use run_stage") from None


# --------------------------------------------------------------------------- read side: what was consumed


def report_options(settings_url: str, attempt: Attempt, run: str) -> dict[str, str]:
    """The ``report.*`` options of the eos_kafka source for :func:`report_read`."""
    # "secret" in the key, for Spark's redaction of options (see StageSettings).
    return {"ledger.secret": settings_url, "attempt": json.dumps(attempt.to_dict()), "run": run}


def report_read(options: Mapping[str, str], task: "KafkaRangePartition", stats: "ReadStats") -> None:
    """The eos_kafka source's hook: record that ``task``'s sub-range was read
    completely, holding ``stats.records`` records. Idempotent: a retried or
    speculative read of the same sub-range must find the same count."""
    attempt = Attempt.from_dict(json.loads(options["attempt"]))
    key = (attempt.pipeline, attempt.window_start, attempt.epoch, options["run"], task.topic, task.partition,
           task.start_offset)
    with connect(options["ledger.secret"], f"read report {attempt}") as conn:
        end, records = conn.execute(
            "INSERT INTO eos.read_ranges (pipeline, window_start, epoch, run, topic, partition, start_offset,"
            " end_offset, records, seconds) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s)"
            " ON CONFLICT (pipeline, window_start, epoch, run, topic, partition, start_offset)"
            " DO UPDATE SET read_at = eos.read_ranges.read_at"  # keep the first report; return it
            " RETURNING end_offset, records",
            (*key, task.end_offset, stats.records, stats.total_s),
        ).fetchone()
    if (end, records) != (task.end_offset, stats.records):
        raise InvalidCheckpoint(
            f"{task}: read {stats.records} records up to offset {task.end_offset}, but an earlier read of the "
            f"same range in this job found {records} up to {end}: the log changed under a frozen plan")


def load_read_ranges(url: str, attempt: Attempt, run: str) -> list[tuple[ConsumedRange, float]]:
    """The sub-ranges the run's read tasks reported, with their read seconds."""
    with connect(url, f"load read ranges {attempt}") as conn:
        rows = conn.execute(
            "SELECT topic, partition, start_offset, end_offset, records, seconds FROM eos.read_ranges"
            " WHERE pipeline = %s AND window_start = %s AND epoch = %s AND run = %s"
            " ORDER BY topic, partition, start_offset",
            (attempt.pipeline, attempt.window_start, attempt.epoch, run),
        ).fetchall()
    return [(ConsumedRange(*r[:5]), r[5]) for r in rows]


# --------------------------------------------------------------------------- write side: one task


@dataclass(frozen=True)
class StagedTask(WriterCommitMessage):
    """One write task's commit message: its chunks and what they hold."""

    chunks: tuple[StagedChunk, ...]
    rows: int
    dead_letters: int
    refused: int  # rows the target refused, among the dead letters
    samples: tuple[tuple[str, int, int, str], ...]  # first dead letters: topic, partition, offset, error
    wait_s: float  # waiting for input: reading and transforming upstream
    write_s: float  # encoding, COPY, isolating refused rows
    copies: int = 0  # COPY transactions tried (chunks staged, and those the target refused)
    column_checks: int = 0  # refused columns whose values the server checked at once


@dataclass(frozen=True)
class _Refusal:
    """The target refused the row at ``line`` of a COPY into the staging, for
    a value of ``column`` when the server names one."""

    line: int
    message: str
    column: str | None = None


def _refusal(exc: TargetError, staging: str, columns: Sequence[str] = ()) -> _Refusal | None:
    """The refused row of a failed staging write, if the failure was a value
    the staging's column type cannot take (a data exception in the rows' COPY);
    with its column if it is one of ``columns``."""
    cause = exc.__cause__
    if not isinstance(cause, psycopg.Error) or not (cause.sqlstate or "").startswith("22"):
        return None
    match = re.search(r"COPY (\S+), line (\d+)(?:, (.*))?", cause.diag.context or "")
    if match is None or match.group(1) != staging:
        return None
    where = match.group(3) or ""
    # "column NAME: VALUE"; a name may itself hold ": ", so match the known names, longest first.
    column = next((c for c in sorted(columns, key=len, reverse=True)
                   if where == f"column {c}" or where.startswith(f"column {c}: ")), None)
    return _Refusal(int(match.group(2)), (cause.diag.message_primary or str(cause)) + (f" ({where})" if where else ""),
                    column)


def _row_of_line(table: "pa.Table", line: int) -> int | None:
    """The row (0-based) that PostgreSQL numbers ``line`` in a CSV COPY of ``table``.

    COPY counts physical lines, newlines inside quoted values included, except
    inside the first row (it learns the line ending at the first row's end).
    None when no row starts a count that matches.
    """
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    n = table.num_rows
    newlines = np.zeros(n, dtype=np.int64)
    for column in table.columns:
        t = column.type
        if pa.types.is_dictionary(t):
            column, t = column.cast(t.value_type), t.value_type
        if pa.types.is_string(t) or pa.types.is_large_string(t):
            newlines += pc.fill_null(pc.count_substring(column, "\n"), 0).to_numpy(zero_copy_only=False)
    newlines[0] = 0
    lines = np.arange(1, n + 1) + np.cumsum(newlines)
    row = int(np.searchsorted(lines, line))
    return row if row < n and lines[row] == line else None


class _TaskStager:
    """Stages one write task's input: good rows in chunks, dead letters with them."""

    def __init__(self, settings: StageSettings, batches: Iterator["pa.RecordBatch"]):
        self.settings = settings
        self.layout = settings.layout
        target, attempt = settings.target, settings.attempt
        self.writer = StagingWriter(target.url, attempt.staging, self.layout.staged, target.table)
        self.input = batches
        self.exhausted = False
        self.pending: list[pa.RecordBatch] = []  # good rows taken from the input, in no committed chunk yet
        self.dead: list[dict] = []  # dead letters in no committed chunk yet
        self.chunks: list[StagedChunk] = []
        self.rows = self.dead_total = self.refused = 0
        self.copies = self.column_checks = 0
        self.samples: list[tuple[str, int, int, str]] = []
        self.wait_s = 0.0

    def run(self) -> StagedTask:
        started = time.perf_counter()
        while True:
            while not self.pending and not self.exhausted:
                self._pull()
            if not self.pending:
                break
            self._write_streaming()
        if self.dead:
            self._write([])  # the last dead letters, in a chunk of their own
        total = time.perf_counter() - started
        return StagedTask(tuple(self.chunks), self.rows, self.dead_total, self.refused, tuple(self.samples),
                          self.wait_s, total - self.wait_s, self.copies, self.column_checks)

    # ---------------------------------------------------------------- input

    def _pull(self) -> bool:
        """Take the next input batch: its good rows into pending, its dead
        letters into dead. False once the input is exhausted."""
        t0 = time.perf_counter()
        batch = next(self.input, None)
        self.wait_s += time.perf_counter() - t0
        if batch is None:
            self.exhausted = True
            return False
        good, dead = self._split(batch)
        if good.num_rows:
            self.pending.append(good)
        if dead:
            self._dead_letters(dead)
        return True

    def _split(self, batch: "pa.RecordBatch") -> tuple["pa.RecordBatch", list[dict]]:
        layout = self.layout
        if layout.error is None:
            return batch.select(list(layout.kept)), []
        errors = batch.column(layout.error)
        if errors.null_count == batch.num_rows:
            return batch.select(list(layout.kept)), []
        import pyarrow.compute as pc

        good_mask = errors.is_null()
        bad = batch.filter(pc.invert(good_mask))
        if layout.lineage is None:
            raise TargetError(f"{bad.num_rows} row(s) for {self.settings.target.table} are dead letters (first: "
                              f"{bad.column(layout.error)[0].as_py()}) but have no lineage columns "
                              f"{list(LINEAGE_COLUMNS)} to name their source records")
        columns = {name: bad.column(name).to_pylist() for name in (*layout.lineage, layout.error)}
        raw = {name: bad.column(name).to_pylist() for name in layout.raw} if layout.raw else {}
        topic, partition, offset = layout.lineage
        dead = [{"topic": columns[topic][i], "partition": columns[partition][i], "offset": columns[offset][i],
                 "error": columns[layout.error][i]} for i in range(bad.num_rows)]
        if raw:  # else _read_back_raw gives them their record's key and value
            for i, d in enumerate(dead):
                d["key"], d["value"] = raw[layout.raw[0]][i], raw[layout.raw[1]][i]
        return batch.filter(good_mask).select(list(layout.kept)), dead

    def _dead_letters(self, dead: list[dict]) -> None:
        for d in dead:
            if any(d[k] is None for k in ("topic", "partition", "offset")):
                raise TargetError(f"a dead letter for {self.settings.target.table} has null lineage "
                                  f"({d['topic']!r}, {d['partition']!r}, {d['offset']!r}); its error: {d['error']}")
        self.dead.extend(dead)
        self.dead_total += len(dead)
        for d in dead[: max(0, DEAD_LETTER_SAMPLES - len(self.samples))]:
            self.samples.append((d["topic"], d["partition"], d["offset"], d["error"]))
        if self.dead_total > self.settings.max_bad_records:
            raise TooManyBadRecords(too_many_message(self.settings, self.dead_total, self.samples, "this write task"))

    # ---------------------------------------------------------------- output

    def _staged(self, data: "pa.RecordBatch | pa.Table"):
        return data if len(self.layout.kept) == len(self.layout.staged) else data.select(list(self.layout.staged))

    def _write(self, data: Iterable["pa.RecordBatch | pa.Table"]) -> None:
        """One chunk: ``data`` and the pending dead letters, in one transaction."""
        self._read_back_raw()
        self.copies += 1
        chunk = self.writer.write((self._staged(d) for d in data), dead_letters=self.dead)
        self.chunks.append(chunk)
        self.rows += chunk.rows
        self.dead.clear()

    def _write_streaming(self) -> None:
        """Stream pending and further input into one chunk, up to the chunk's
        bounds, keeping what was sent until it commits: if the target refuses
        rows, the chunk is staged again without them (_write_isolating)."""
        fed = 0

        def feed() -> Iterator["pa.RecordBatch"]:
            nonlocal fed
            rows = nbytes = 0
            while True:
                if fed == len(self.pending):
                    full = rows >= self.settings.rows_per_chunk or nbytes >= self.settings.chunk_bytes
                    if full or self.exhausted or not self._pull():
                        return
                    continue
                batch = self.pending[fed]
                fed += 1
                rows += batch.num_rows
                nbytes += batch.nbytes
                yield batch

        chunk = feed()
        try:
            self._write(chunk)
        except TargetError as exc:
            refusal = _refusal(exc, self.settings.attempt.staging, self.layout.staged)
            if refusal is None:
                raise
            import pyarrow as pa

            # Take the rest of the chunk too: a refused column is judged on the
            # whole chunk (_refuse_column), not on however much of it the COPY
            # had sent when the server answered.
            for _ in chunk:
                pass
            sent, self.pending = self.pending[:fed], self.pending[fed:]
            self._write_isolating(pa.Table.from_batches(sent), refusal)
        else:
            del self.pending[:fed]

    def _try_write(self, table: "pa.Table") -> _Refusal | None:
        """Stage ``table`` as one chunk: None when it was staged, else why the
        target refused a row of it (any other failure raises)."""
        try:
            self._write([table])
        except TargetError as exc:
            refusal = _refusal(exc, self.settings.attempt.staging, self.layout.staged)
            if refusal is None:
                raise
            return refusal
        return None

    def _write_isolating(self, table: "pa.Table", refusal: _Refusal | None = None) -> None:
        """Stage ``table``; each row the target refuses becomes a dead letter.
        ``refusal``: why a write of exactly ``table`` failed, if one was tried.

        A refusal naming a column costs one question to the server, whatever
        the number of rows refused: which of the table's values of that column
        can its type not take (_refuse_column). Those rows become dead letters
        together and the rest is written again; the next refused column, if
        any, likewise. A refusal naming no column (or a column already checked)
        is isolated row by row (_isolate_rows)."""
        checked: set[str] = set()
        while table.num_rows:
            if refusal is None and (refusal := self._try_write(table)) is None:
                return
            if refusal.column is None or refusal.column in checked:
                self._isolate_rows(table, refusal)
                return
            checked.add(refusal.column)
            table, refusal = self._refuse_column(table, refusal), None

    def _isolate_rows(self, table: "pa.Table", refusal: _Refusal | None = None) -> None:
        """``_write_isolating`` for a refusal that names no column: the refused
        row is found from the COPY's line number; if that cannot be mapped to a
        row, halving finds it. Rows before it are staged as a chunk, the row
        alone is tried (refused: a dead letter), then the rest. A failed COPY
        per refused row."""
        while table.num_rows:
            if refusal is None and (refusal := self._try_write(table)) is None:
                return
            n = table.num_rows
            if n == 1:
                self._refuse(table, refusal)
                return
            row = _row_of_line(self._staged(table), refusal.line)
            if row is None:
                self._isolate_rows(table.slice(0, n // 2))
                table, refusal = table.slice(n // 2), None
                continue
            if row:
                self._isolate_rows(table.slice(0, row))
            self._isolate_rows(table.slice(row, 1))
            table, refusal = table.slice(row + 1), None

    def _refuse(self, row: "pa.Table", refusal: _Refusal) -> None:
        values = row.to_pylist()[0]
        error = f"{self.settings.target.table} refused the row: {refusal.message}"
        lineage = self.layout.lineage
        if lineage is None or any(values.get(c) is None for c in lineage):
            raise TargetError(f"{error}; the row has no lineage columns {list(LINEAGE_COLUMNS)} to dead-letter "
                              f"it with: {_short(values)}")
        self.refused += 1
        self._dead_letters([{"topic": values[lineage[0]], "partition": values[lineage[1]],
                             "offset": values[lineage[2]], "error": error}])

    def _refuse_column(self, table: "pa.Table", refusal: _Refusal) -> "pa.Table":
        """Dead-letter the rows of ``table`` whose value of the refused column
        the target's type cannot take, found by one question to the server;
        return the others. If it takes none of the column's values
        (COLUMN_REFUSED_MIN_VALUES or more of them), the table or the transform
        is wrong, not the records: fail with a TargetError that says which
        column and what to do."""
        import numpy as np
        import pyarrow as pa

        column = refusal.column
        # COPY took every row before the one it refused: ask only about the rest.
        first = _row_of_line(self._staged(table), refusal.line) or 0
        values = table.column(column)
        pg_type, refused = self.writer.refused_values(column, values.slice(first))
        refused = [(first + row, text, error) for row, text, error in refused]
        self.column_checks += 1
        given = len(values) - values.null_count
        if refused and len(refused) == given >= COLUMN_REFUSED_MIN_VALUES:
            raise TargetError(self._column_refused(column, pg_type, given, table.num_rows, refused[0]))
        lineage = self.layout.lineage
        target = self.settings.target.table
        if refused and lineage is None:
            _, text, error = refused[0]
            raise TargetError(f"{target} refused {len(refused)} row(s) (first: {error}, column {column}: "
                              f"{_short_text(text)}); the rows have no lineage columns {list(LINEAGE_COLUMNS)} to "
                              "dead-letter them with")
        if not refused:
            return table
        rows = [row for row, _, _ in refused]
        where = table.select(list(lineage)).take(pa.array(rows, pa.int64())).to_pylist()
        for (_, text, error), source in zip(refused, where, strict=True):
            if any(source[c] is None for c in lineage):
                raise TargetError(f"{target} refused a row ({error}, column {column}: {_short_text(text)}); it has "
                                  f"null lineage {tuple(source.values())} to dead-letter it with")
        self.refused += len(refused)
        self._dead_letters([{"topic": source[lineage[0]], "partition": source[lineage[1]],
                             "offset": source[lineage[2]],
                             "error": f"{target} refused the row: {error} (column {column}: {_short_text(text)})"}
                            for (_, text, error), source in zip(refused, where, strict=True)])
        mask = np.ones(table.num_rows, dtype=bool)
        mask[rows] = False
        return table.filter(pa.array(mask))

    def _column_refused(self, column: str, pg_type: str, given: int, rows: int, first: tuple[int, str, str]) -> str:
        _, text, error = first
        layout = self.layout
        given_type = layout.types[layout.staged.index(column)] if layout.types else "?"
        return (f"target table {self.settings.target.table} refuses column {column!r} for every row: it is "
                f"{pg_type} there, and the transform's output gives {given_type} values the type cannot take "
                f"(e.g. {_short_text(text)}: {error}); all {given} non-null values of the column in a chunk of "
                f"{rows} rows were refused. That is a configuration error, not bad records: fix the transform "
                f"(make {column} {pg_type}) or the table's column, then clear the window's run. Nothing of "
                f"{self.settings.attempt} is checkpointed or published.")

    def _read_back_raw(self) -> None:
        """Give each pending dead letter that lacks its raw record (a row the
        target refused; a transform output without key and value) the key and
        value of its source record, read back from Kafka by its lineage, before
        its chunk is written. Good rows carry nothing for this."""
        lacking = [d for d in self.dead if "key" not in d]
        if not lacking or not self.settings.kafka_config:
            return
        by_partition: dict[tuple[str, int], list[dict]] = {}
        for d in lacking:
            by_partition.setdefault((d["topic"], d["partition"]), []).append(d)
        for (topic, partition), letters in by_partition.items():
            records = read_records(self.settings.kafka_config, topic, partition, [d["offset"] for d in letters])
            for d in letters:
                d["key"], d["value"] = records[d["offset"]]


def _short(value: Any, limit: int = 500) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _short_text(text: str, limit: int = 40) -> str:
    """A refused value as PostgreSQL quotes one in a COPY error, shortened."""
    return '"' + (text if len(text) <= limit else text[: limit - 3] + "...") + '"'


def too_many_message(settings: StageSettings, count: int, samples: Sequence[tuple], where: str) -> str:
    first = "; ".join(f"{t}[{p}] offset {o}: {e}" for t, p, o, e in sorted(samples)[:DEAD_LETTER_SAMPLES])
    return (f"{settings.attempt}: {where} dead-lettered {count} records, more than max_bad_records="
            f"{settings.max_bad_records}; no checkpoint is written and the attempt is aborted. First: {first}")


# --------------------------------------------------------------------------- the data source


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
            result = _TaskStager(self.settings, iterator).run()
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
        raise TooManyBadRecords(too_many_message(settings, dead, samples, "the job"))
    reported = load_read_ranges(settings.target.url, attempt, settings.run)
    consumed = [r for r, _ in reported]
    checkpoint = attempts.make_checkpoint(consumed, chunks)
    problems = attempts.coverage_problems(settings.plan.ranges, checkpoint.ranges)
    if problems:
        raise InvalidCheckpoint(f"{attempt}: the job did not read its plan completely, no checkpoint written:\n  "
                                + "\n  ".join(problems))
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


# --------------------------------------------------------------------------- spark-submit entry


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="job.py", description="airflow-eos stage job: stage one attempt of a window (run by spark-submit). "
        "The target (EOS_TARGET_JSON) and the Kafka settings (EOS_KAFKA_CONFIG_JSON) come from the environment.")
    parser.add_argument("--plan", required=True, help="the window's frozen plan, JSON")
    parser.add_argument("--attempt", required=True, help="the attempt opened by PostgresTarget.begin, JSON")
    parser.add_argument("--transform", help="module:function, DataFrame -> DataFrame (default: records as read)")
    parser.add_argument("--max-records-per-task", type=int, default=DEFAULT_MAX_RECORDS_PER_TASK)
    parser.add_argument("--max-bad-records", type=int, default=0)
    parser.add_argument("--rows-per-chunk", type=int, default=DEFAULT_ROWS_PER_CHUNK)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """spark-submit entry: 0 once the checkpoint is written, 1 when the job
    failed (the message says why), 2 for unusable arguments or environment."""
    from airflow_eos.spark.session import spark_session, stop_session
    from airflow_eos.spark.submit import error_line, kafka_config_from_environment, target_from_environment

    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    args = _parser().parse_args(argv)
    try:
        plan = WindowPlan.from_json(args.plan)
        attempt = Attempt.from_dict(json.loads(args.attempt))
        target = target_from_environment()
        kafka_config = kafka_config_from_environment()
    except (KeyError, ValueError, TypeError) as exc:
        log.error("stage job: unusable arguments or environment: %s: %s", type(exc).__name__, exc)
        print(error_line(exc), flush=True)
        return 2
    spark = spark_session(f"airflow-eos stage {attempt.pipeline} e{attempt.epoch}")
    try:
        report = run_stage(spark, plan, attempt, target, kafka_config, args.transform,
                           max_records_per_task=args.max_records_per_task, max_bad_records=args.max_bad_records,
                           rows_per_chunk=args.rows_per_chunk)
    except EosError as exc:
        log.error("stage job failed: %s", exc)
        print(error_line(exc), flush=True)
        return 1
    except Exception as exc:
        log.exception("stage job of %s failed", attempt)
        print(error_line(exc), flush=True)
        return 1
    finally:
        stop_session(spark)
    print("EOS_STAGE_REPORT " + json.dumps(report.to_dict()), flush=True)
    return 0


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
    "main",
    "records_as_read",
    "register",
    "report_read",
    "run_stage",
    "safe_udf",
    "writer_input",
]
