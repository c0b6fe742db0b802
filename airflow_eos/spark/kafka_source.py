"""A PySpark 4 Python data source that reads exactly a frozen plan's Kafka offset ranges.

The stage step's Spark job reads a window through this source; it never decides
what to read, it only reads what the plan froze: one Spark task per planned range,
or per piece of a wide one, each read exactly by :mod:`airflow_eos.spark.kafka_ranges`
(which says when a range is complete, and what it is when it cannot be) into
Arrow batches of Spark's Kafka source schema (:mod:`airflow_eos.spark.kafka_batches`).

Usage::

    df = read_plan(spark, plan, {"bootstrap.servers": "broker:9092"})

or, with the source registered (``register(spark)``)::

    spark.read.format("eos_kafka").option("plan", plan.to_json())
        .option("kafka.bootstrap.servers", "broker:9092").load()

``partitions()`` and ``read()`` run in Python workers, not in the process that
built the DataFrame: everything they need travels in the options.

Option ``avro.reader_schema`` (an Avro record schema's JSON) makes an Avro
source: each value, in Confluent's wire format, is decoded against it, its writer
schema resolved by id from the schema registry of the ``registry.*`` options
(``registry.url``, ...); the rows get the record's fields as columns after the
Kafka ones, and ``eos_decode_error``, the reason a value did not decode
(:mod:`airflow_eos.spark.avro_columns`). An unreachable registry fails the task.

Option ``report`` (``"module:function"``) names a hook that a task calls after it
has read its sub-range *completely*, as ``function(options, task, stats)`` with the
``report.*`` options (prefix stripped), the KafkaRangePartition and its ReadStats.
The stage job uses it to record exactly what was consumed (see
:mod:`airflow_eos.spark.stage_settings`); a task that fails or is not read to its end
never calls it.
"""

from __future__ import annotations

import importlib
import logging
import sys
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pyspark.sql.datasource import DataSource, DataSourceReader
from pyspark.sql.types import StructType

from airflow_eos.core.errors import ConfigurationError, EosError
from airflow_eos.core.windows import WindowPlan
from airflow_eos.spark.avro_columns import registry_decoder, source_schema, with_decoded
from airflow_eos.spark.kafka_batches import KAFKA_SCHEMA, ReadStats
from airflow_eos.spark.kafka_ranges import (
    DEFAULT_BATCH_ROWS,
    DEFAULT_END_GRACE_S,
    DEFAULT_POLL_TIMEOUT_S,
    READER_KAFKA_DEFAULTS,
    KafkaRangePartition,
    plan_tasks,
    read_range,
    split_range,
)

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame, SparkSession

log = logging.getLogger(__name__)

FORMAT_NAME = "eos_kafka"

# Option names. Every option starting with "kafka." is a librdkafka setting
# (as in Spark's Kafka source); one option per setting lets Spark's redaction
# hide e.g. kafka.sasl.password in plans and logs.
OPT_PLAN = "plan"
OPT_MAX_RECORDS_PER_TASK = "max_records_per_task"
OPT_BATCH_ROWS = "arrow_batch_rows"
OPT_END_GRACE_S = "end_grace_s"
OPT_POLL_TIMEOUT_S = "poll_timeout_s"
OPT_REPORT = "report"
OPT_AVRO_READER_SCHEMA = "avro.reader_schema"
REGISTRY_PREFIX = "registry."
BASIC_AUTH_USER_INFO = "basic.auth.user.info"  # SchemaRegistryClient's "user:password"
BASIC_AUTH_USER = "basic.auth.username"
BASIC_AUTH_PASSWORD = "basic.auth.password"
REPORT_PREFIX = "report."
KAFKA_PREFIX = "kafka."

DEFAULT_MAX_RECORDS_PER_TASK = 500_000


# --------------------------------------------------------------------------- options


def plan_options(
    plan: WindowPlan,
    kafka_config: Mapping[str, Any],
    *,
    max_records_per_task: int | None = None,
    arrow_batch_rows: int | None = None,
    end_grace_s: float | None = None,
    poll_timeout_s: float | None = None,
    report: str | None = None,
    report_options: Mapping[str, str] | None = None,
    avro_reader_schema: str | None = None,
    registry_config: Mapping[str, Any] | None = None,
) -> dict[str, str]:
    """The string options that make this source read ``plan``; ``report`` and
    ``report_options``: the completed-range hook; ``avro_reader_schema`` and
    ``registry_config``: an Avro source (see the module docstring)."""
    options = {OPT_PLAN: plan.to_json()}
    if avro_reader_schema is not None:
        options[OPT_AVRO_READER_SCHEMA] = avro_reader_schema
        options.update(registry_options(registry_config or {}))
    if report is not None:
        options[OPT_REPORT] = report
        for key, value in (report_options or {}).items():
            options[REPORT_PREFIX + key] = str(value)
    for key, value in kafka_config.items():
        options[KAFKA_PREFIX + key] = option_string(value)
    for name, value in ((OPT_MAX_RECORDS_PER_TASK, max_records_per_task), (OPT_BATCH_ROWS, arrow_batch_rows),
                        (OPT_END_GRACE_S, end_grace_s), (OPT_POLL_TIMEOUT_S, poll_timeout_s)):
        if value is not None:
            options[name] = str(value)
    return options


def registry_options(registry_config: Mapping[str, Any]) -> dict[str, str]:
    """The ``registry.*`` options of SchemaRegistryClient settings. Basic auth's
    ``user:password`` travels as two options, the password's name matching
    Spark's ``spark.redaction.regex`` (``(?i)secret|password|token``), so Spark's
    UI and logs show it redacted; the read task joins them again."""
    options = {}
    for key, value in registry_config.items():
        if key == BASIC_AUTH_USER_INFO:
            user, _, password = str(value).partition(":")
            options[REGISTRY_PREFIX + BASIC_AUTH_USER] = user
            options[REGISTRY_PREFIX + BASIC_AUTH_PASSWORD] = password
        else:
            options[REGISTRY_PREFIX + key] = option_string(value)
    return options


def registry_settings(options: Mapping[str, str]) -> dict[str, str]:
    """The SchemaRegistryClient settings of the ``registry.*`` options (registry_options reversed)."""
    config = {k[len(REGISTRY_PREFIX):]: v for k, v in options.items() if k.startswith(REGISTRY_PREFIX)}
    if BASIC_AUTH_USER in config:
        config[BASIC_AUTH_USER_INFO] = f"{config.pop(BASIC_AUTH_USER)}:{config.pop(BASIC_AUTH_PASSWORD, '')}"
    return config


def option_string(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


@dataclass(frozen=True)
class ReadSettings:
    """The source's options, parsed and checked once."""

    plan: WindowPlan
    kafka_config: dict[str, str]
    max_records_per_task: int
    batch_rows: int
    end_grace_s: float
    poll_timeout_s: float
    report: str | None = None
    report_options: tuple[tuple[str, str], ...] = ()
    avro_reader_schema: str | None = None
    registry_config: tuple[tuple[str, str], ...] = field(default=(), repr=False)  # may hold a password

    @classmethod
    def from_options(cls, options: Mapping[str, str]) -> "ReadSettings":
        text = options.get(OPT_PLAN)
        if not text:
            raise ConfigurationError(f"the {FORMAT_NAME} source needs option {OPT_PLAN!r}: a WindowPlan as JSON")
        try:
            plan = WindowPlan.from_json(text)
        except (ValueError, KeyError, TypeError) as exc:
            raise ConfigurationError(f"option {OPT_PLAN!r} is not a WindowPlan in JSON: {exc}") from exc
        kafka_config = {k[len(KAFKA_PREFIX):]: v for k, v in options.items() if k.startswith(KAFKA_PREFIX)}
        if not kafka_config.get("bootstrap.servers"):
            raise ConfigurationError(f"the {FORMAT_NAME} source needs option 'kafka.bootstrap.servers'")
        return cls(
            plan=plan,
            kafka_config=kafka_config,
            max_records_per_task=_positive(options, OPT_MAX_RECORDS_PER_TASK, DEFAULT_MAX_RECORDS_PER_TASK, int),
            batch_rows=_positive(options, OPT_BATCH_ROWS, DEFAULT_BATCH_ROWS, int),
            end_grace_s=_positive(options, OPT_END_GRACE_S, DEFAULT_END_GRACE_S, float),
            poll_timeout_s=_positive(options, OPT_POLL_TIMEOUT_S, DEFAULT_POLL_TIMEOUT_S, float),
            report=_report_hook_name(options.get(OPT_REPORT)),
            report_options=tuple(sorted((k[len(REPORT_PREFIX):], v) for k, v in options.items()
                                        if k.startswith(REPORT_PREFIX))),
            **_avro_settings(options),
        )


def _avro_settings(options: Mapping[str, str]) -> dict[str, Any]:
    reader_schema = options.get(OPT_AVRO_READER_SCHEMA)
    if reader_schema is None:
        return {}
    registry = tuple(sorted(registry_settings(options).items()))
    if not dict(registry).get("url"):
        raise ConfigurationError(f"an Avro {FORMAT_NAME} source needs option '{REGISTRY_PREFIX}url'")
    return {"avro_reader_schema": reader_schema, "registry_config": registry}


def _report_hook_name(value: str | None) -> str | None:
    if value is not None and (value.count(":") != 1 or not all(value.split(":"))):
        raise ConfigurationError(f"option {OPT_REPORT!r} must be 'module:function', got {value!r}")
    return value


def _call_report_hook(settings: ReadSettings, task: "KafkaRangePartition", stats: "ReadStats") -> None:
    module, _, name = settings.report.partition(":")
    hook = getattr(importlib.import_module(module), name)
    hook(dict(settings.report_options), task, stats)


def _positive(options: Mapping[str, str], name: str, default, kind):
    raw = options.get(name)
    if raw is None:
        return default
    try:
        value = kind(raw)
    except ValueError:
        raise ConfigurationError(f"option {name!r} must be a number, got {raw!r}") from None
    if value <= 0:
        raise ConfigurationError(f"option {name!r} must be positive, got {raw!r}")
    return value


# --------------------------------------------------------------------------- the data source


def warm_up() -> float:
    """Pay a fresh Python worker's one-time costs up front; returns the seconds spent.
    pyarrow imports pandas on its first conversion from Python objects (~1 s, more
    while the JVM and other workers compete for the cores)."""
    began = time.perf_counter()
    import pyarrow as pa

    pa.array([b""], pa.binary())
    return time.perf_counter() - began


def worker_logging() -> None:
    """Python workers have no logging set up: send the package's INFO lines to
    stderr, which Spark copies into the executor (in local mode, the driver) log."""
    package = logging.getLogger("airflow_eos")
    if package.handlers or logging.getLogger().handlers:
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    package.addHandler(handler)
    package.setLevel(logging.INFO)
    package.propagate = False


class KafkaRangeSource(DataSource):
    """``spark.read.format("eos_kafka")``: the records of a frozen WindowPlan.

    Options: ``plan`` (WindowPlan JSON, required), ``kafka.<librdkafka setting>``
    (``kafka.bootstrap.servers`` required), ``max_records_per_task`` (offsets per
    task, default 500000), ``arrow_batch_rows`` (default 20000),
    ``end_grace_s`` (default 2), ``poll_timeout_s`` (default 60).
    """

    @classmethod
    def name(cls) -> str:
        return FORMAT_NAME

    def schema(self) -> StructType:
        return source_schema(KAFKA_SCHEMA, self.options.get(OPT_AVRO_READER_SCHEMA))

    def reader(self, schema: StructType) -> "KafkaRangeReader":
        if schema != self.schema():
            raise ConfigurationError(
                f"the {FORMAT_NAME} source has a fixed schema (Spark's Kafka source schema with headers, then an "
                f"Avro source's decoded columns); do not pass .schema(...). Got {schema.simpleString()}"
            )
        return KafkaRangeReader(ReadSettings.from_options(self.options))


class KafkaRangeReader(DataSourceReader):
    def __init__(self, settings: ReadSettings):
        self.settings = settings

    def partitions(self) -> list[KafkaRangePartition]:
        worker_logging()
        plan = self.settings.plan
        tasks = plan_tasks(plan, self.settings.max_records_per_task)
        log.info("reading plan of %s: %d ranges, %d tasks (max %d offsets per task)", plan.window,
                 len(plan.ranges), len(tasks), self.settings.max_records_per_task)
        for rng in plan.ranges:
            pieces = len(split_range(rng, self.settings.max_records_per_task))
            log.info("  %s[%d] [%d, %d): %d offsets, %d task(s)", rng.topic, rng.partition, rng.start_offset,
                     rng.end_offset, rng.width, pieces)
        return tasks

    def read(self, partition: KafkaRangePartition) -> Iterator["pa.RecordBatch"]:
        worker_logging()
        if not isinstance(partition, KafkaRangePartition):
            return  # an empty plan: Spark runs one task with InputPartition(None)
        if partition.start_offset >= partition.end_offset:
            return
        settings = self.settings
        log.info("%s: reading", partition)
        stats = ReadStats(warm_up_s=warm_up())
        batches = read_range(settings.kafka_config, partition, batch_rows=settings.batch_rows,
                             end_grace_s=settings.end_grace_s, poll_timeout_s=settings.poll_timeout_s, stats=stats)
        if settings.avro_reader_schema is not None:
            batches = _decoded(batches, settings)
        try:
            yield from batches
        except EosError as exc:
            log.error("%s: failed after %s: %s", partition, stats.summary(), exc)
            raise
        log.info("%s: done, %s", partition, stats.summary())
        if settings.report:
            # Only here, after the generator ran to its end: the range was read completely.
            _call_report_hook(settings, partition, stats)


def _decoded(batches: Iterator["pa.RecordBatch"], settings: ReadSettings) -> Iterator["pa.RecordBatch"]:
    """The batches with their values decoded (an Avro source)."""
    decoder = registry_decoder(settings.avro_reader_schema, dict(settings.registry_config))
    schema = source_schema(KAFKA_SCHEMA, settings.avro_reader_schema)
    for batch in batches:
        yield with_decoded(batch, decoder, schema)


# --------------------------------------------------------------------------- driver side


def register(spark: "SparkSession") -> None:
    """Make ``spark.read.format("eos_kafka")`` available in this session."""
    spark.dataSource.register(KafkaRangeSource)


def read_plan(
    spark: "SparkSession",
    plan: WindowPlan,
    kafka_config: Mapping[str, Any],
    **options: Any,
) -> "DataFrame":
    """A DataFrame (Spark Kafka source schema) of exactly the records of ``plan``.

    ``options``: max_records_per_task, arrow_batch_rows, end_grace_s, poll_timeout_s,
    report, report_options, avro_reader_schema, registry_config.
    """
    log.info("plan of %s: %d ranges, %d offsets", plan.window, len(plan.ranges), plan.max_records)
    register(spark)
    return spark.read.format(FORMAT_NAME).options(**plan_options(plan, kafka_config, **options)).load()


__all__ = [
    "DEFAULT_MAX_RECORDS_PER_TASK",
    "FORMAT_NAME",
    "KAFKA_SCHEMA",
    "READER_KAFKA_DEFAULTS",
    "KafkaRangePartition",
    "KafkaRangeReader",
    "KafkaRangeSource",
    "ReadStats",
    "option_string",
    "plan_options",
    "plan_tasks",
    "read_plan",
    "read_range",
    "register",
    "split_range",
    "worker_logging",
]
