"""Read exactly a frozen plan's Kafka offset ranges with Spark's own Kafka source
(``spark.read.format("kafka")``, the ``spark-sql-kafka-0-10`` connector: JVM side, no
Python worker per record), and observe on the source DataFrame what was read.

The source reads ``assign`` (the plan's partitions) from per-partition
``startingOffsets`` to ``endingOffsets`` (the plan's cuts) with
``kafka.isolation.level=read_committed``, ``includeHeaders=true`` and
``failOnDataLoss=true``; ``maxRecordsPerPartition`` splits a wide range into
several Spark tasks (Spark 4.2's KafkaOffsetRangeCalculator, used by the batch
source through KafkaOffsetReaderAdmin.getOffsetRangesFromUnresolvedOffsets,
honours it; ``minPartitions`` only ever adds splits).

**What Spark's source guarantees** (spark-sql-kafka-0-10 4.2.0,
KafkaSourceRDD.compute and consumer/KafkaDataConsumer.get): a task reads its
range ``[fromOffset, untilOffset)`` record by record, asking for the next offset
after the last record it returned, and ends only when that offset reaches
``untilOffset`` or when ``get`` returns null, which with
``failOnDataLoss=true`` it does only once every offset up to ``untilOffset`` was
skipped as invisible. Invisible offsets (transaction markers, records of
aborted transactions under ``read_committed``, and offsets a compaction
removed: the fetch answers a later record while the log start is still at or
below the asked offset) are skipped. An offset below the log start (retention
deleted it: ``OffsetOutOfRangeException``) or a record missing while the log
start has passed it fails the task (``failOnDataLoss``) instead of skipping; a
fetch that brings nothing within ``kafkaConsumer.pollTimeoutMs`` fails it with a
timeout. So a task that ends normally has read its range to its end cut.

A plan's end cut is at a record read with a ``read_committed`` consumer, or,
for a partition idle past the grace, at the end of the log (core/plan.py): past
the records of a transaction still open then, so beyond the last stable offset
until that transaction ends. Spark's consumer, asked for an offset there, finds
nothing within ``kafkaConsumer.pollTimeoutMs`` and, its end offsets being the
last stable offset under ``read_committed``, fails the task as lost data; the
stage job reports that as TransactionOpen (stage_report.job_failure), and a
retry once the transaction has ended reads the range to its end cut.

**What was read, recorded.** ``observe`` on the source DataFrame counts, per
sub-range of the plan (its ranges split as the source splits them into tasks),
the records read and their first and last offset, in the same
pass as the write (no second read of Kafka). Spark hands the observed metrics
to the driver once the action has finished: the checkpoint is therefore
written by the driver after the write returns (see spark/stage.py and
spark/stage_files.py), never inside the action. :func:`observed_reads` checks
them against the plan: a record outside every sub-range, or more records than
a sub-range has offsets, fails the stage (no checkpoint).

What the counts can and cannot say: Spark merges a task's observed metrics once
per successful task of a result stage; a task of a shuffle map stage (a
transform that shuffles) that Spark runs again after losing its output (an
executor lost) is merged again, so a count may then be too high (it is never
too low: a failed task's metrics are dropped, and a finished job ran every
task to its end). The count is what the checkpoint reports as read; what is
published is what the staged chunks hold, which their own commit protocol
counts exactly, so such a count misreports and never duplicates.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from airflow_eos.core.attempt import ConsumedRange
from airflow_eos.core.errors import ConfigurationError, InvalidCheckpoint
from airflow_eos.core.windows import WindowPlan
from airflow_eos.spark.kafka_ranges import KafkaRangePartition, plan_tasks

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, Observation, SparkSession

log = logging.getLogger(__name__)

FORMAT_NAME = "kafka"
# librdkafka settings that have no meaning for the Java client, or that Spark's source sets
# itself and refuses from its options: not handed over.
_NOT_FOR_JAVA = frozenset({
    "fetch.queue.backoff.ms", "fetch.wait.max.ms", "queued.min.messages", "queued.max.messages.kbytes",
    "receive.message.max.bytes", "enable.partition.eof", "socket.timeout.ms", "topic.metadata.refresh.interval.ms",
    "group.id", "auto.offset.reset", "enable.auto.commit", "isolation.level", "key.deserializer",
    "value.deserializer", "interceptor.classes", "allow.auto.create.topics", "logger", "log_level", "error_cb",
    "stats_cb", "throttle_cb", "oauth_cb", "on_delivery",
})
_LOGIN_MODULES = {
    "PLAIN": "org.apache.kafka.common.security.plain.PlainLoginModule",
    "SCRAM-SHA-256": "org.apache.kafka.common.security.scram.ScramLoginModule",
    "SCRAM-SHA-512": "org.apache.kafka.common.security.scram.ScramLoginModule",
}
# The Java consumer's fetch sizes, as READER_KAFKA_DEFAULTS sets librdkafka's: its defaults
# (1 MiB per partition, 500 records a poll) made the broker spend ~1.3 core-seconds serving a
# 1M-record window's small fetches, 0.3 with these (2026-11-27, bench/readers.py's read ceiling:
# 4.2 -> 2.5-2.8 core-seconds in all). The Kafka connection's own settings win.
JAVA_READER_DEFAULTS = {"max.partition.fetch.bytes": 8 << 20, "fetch.max.bytes": 64 << 20,
                        "max.poll.records": 100_000}
OBSERVED_WAIT_S = 60.0  # classic PySpark: how long the driver waits for the metrics after the action


def java_kafka_config(kafka_config: Mapping[str, Any]) -> dict[str, str]:
    """The Kafka connection's librdkafka settings as the Java client's: the same
    names where both clients share them, ``sasl.username``/``sasl.password`` as a
    JAAS login, ``ssl.ca.location`` as a PEM trust store; librdkafka-only tuning dropped."""
    config = {k: v for k, v in kafka_config.items() if k not in _NOT_FOR_JAVA and not callable(v)}
    mechanism = config.pop("sasl.mechanisms", None) or config.pop("sasl.mechanism", None)
    if mechanism:
        config["sasl.mechanism"] = mechanism
    user, password = config.pop("sasl.username", None), config.pop("sasl.password", None)
    if user is not None:
        module = _LOGIN_MODULES.get(str(mechanism or "PLAIN").upper())
        if module is None:
            raise ConfigurationError(f"sasl.mechanism {mechanism!r} with sasl.username cannot be given to Spark's "
                                     "Kafka source; give kafka.sasl.jaas.config in the connection instead")
        quoted = [json.dumps(str(v)) for v in (user, password or "")]
        config["sasl.jaas.config"] = f"{module} required username={quoted[0]} password={quoted[1]};"
    ca = config.pop("ssl.ca.location", None)
    if ca is not None:
        config.update({"ssl.truststore.type": "PEM", "ssl.truststore.location": ca})
    return {k: ("true" if v is True else "false" if v is False else str(v)) for k, v in config.items()}


def native_options(plan: WindowPlan, kafka_config: Mapping[str, Any], *, max_records_per_task: int) -> dict[str, str]:
    """The options of Spark's Kafka source that read exactly ``plan``."""
    assign: dict[str, list[int]] = {}
    starting: dict[str, dict[str, int]] = {}
    ending: dict[str, dict[str, int]] = {}
    for r in plan.ranges:
        assign.setdefault(r.topic, []).append(r.partition)
        starting.setdefault(r.topic, {})[str(r.partition)] = r.start_offset
        ending.setdefault(r.topic, {})[str(r.partition)] = r.end_offset
    java = {k: str(v) for k, v in JAVA_READER_DEFAULTS.items()} | java_kafka_config(kafka_config)
    if not java.get("bootstrap.servers"):
        raise ConfigurationError("Kafka configuration has no 'bootstrap.servers'")
    return {
        **{f"kafka.{k}": v for k, v in java.items()},
        "kafka.isolation.level": "read_committed",
        "assign": json.dumps(assign), "startingOffsets": json.dumps(starting), "endingOffsets": json.dumps(ending),
        "failOnDataLoss": "true", "includeHeaders": "true", "maxRecordsPerPartition": str(max_records_per_task),
    }


@dataclass(frozen=True)
class ObservedRead:
    """The Observation on a plan's read and the sub-ranges it counts apart: the
    plan's ranges split as the source splits them for its tasks
    (``maxRecordsPerPartition``: the same number of near-equal pieces)."""

    observation: "Observation"
    plan: WindowPlan
    pieces: tuple[KafkaRangePartition, ...]


def _metric(i: int, what: str) -> str:
    return f"r{i}_{what}"


def read_plan_native(spark: "SparkSession", plan: WindowPlan, kafka_config: Mapping[str, Any], *,
                     max_records_per_task: int) -> tuple["DataFrame", ObservedRead]:
    """A DataFrame (Spark's Kafka source schema) of exactly the records of
    ``plan``, observed: after an action over it, :func:`observed_reads` says
    per sub-range how many records were read and where."""
    from pyspark.sql import Observation
    from pyspark.sql import functions as F

    from airflow_eos.spark.kafka_batches import KAFKA_SCHEMA

    pieces = tuple(plan_tasks(plan, max_records_per_task))
    log.info("plan of %s: %d ranges, %d offsets, read by Spark's Kafka source in %d task(s) (at most %d offsets "
             "each)", plan.window, len(plan.ranges), plan.max_records, len(pieces), max_records_per_task)
    if pieces:
        reading = WindowPlan(plan.window, tuple(r for r in plan.ranges if r.width > 0))
        records = spark.read.format(FORMAT_NAME).options(
            **native_options(reading, kafka_config, max_records_per_task=max_records_per_task)).load()
    else:
        records = spark.createDataFrame([], KAFKA_SCHEMA)
    metrics = [F.count(F.lit(1)).alias("records")]
    offset = F.col("offset")
    for i, t in enumerate(pieces):
        here = ((F.col("partition") == F.lit(t.partition)) & (F.col("topic") == F.lit(t.topic))
                & (offset >= F.lit(t.start_offset)) & (offset < F.lit(t.end_offset)))
        metrics += [F.count(F.when(here, 1)).alias(_metric(i, "records")),
                    F.min(F.when(here, offset)).alias(_metric(i, "first")),
                    F.max(F.when(here, offset)).alias(_metric(i, "last"))]
    observation = Observation(f"eos_read_{uuid.uuid4().hex}")
    return records.observe(observation, *metrics), ObservedRead(observation, plan, pieces)


def _metrics(observation: "Observation") -> Mapping[str, Any]:
    """The observed metrics; classic PySpark blocks until they come, so wait a
    bounded time for them (an action that never read the source has none)."""
    jo = getattr(observation, "_jo", None)
    if jo is not None:
        deadline = time.monotonic() + OBSERVED_WAIT_S
        while not jo.future().isCompleted():
            if time.monotonic() > deadline:
                return {}
            time.sleep(0.01)
    return observation.get or {}


def observed_reads(read: ObservedRead) -> list[ConsumedRange]:
    """Per sub-range of the plan, what the finished action read of it;
    InvalidCheckpoint when the metrics are missing (the transform's output never
    read the window) or count records outside every sub-range, or more records
    than a sub-range has offsets."""
    metrics = _metrics(read.observation)
    window = read.plan.window
    if "records" not in metrics:
        raise InvalidCheckpoint(f"{window}: no metrics of the read: the transform's output does not read the "
                                "window's records, so nothing says they were read; no checkpoint written")
    reads, problems = [], []
    for i, t in enumerate(read.pieces):
        records, first, last = (metrics[_metric(i, w)] for w in ("records", "first", "last"))
        if records > t.end_offset - t.start_offset:
            problems.append(f"{t}: {records} records at offsets {first}..{last}, more than it has offsets")
        reads.append(ConsumedRange(t.topic, t.partition, t.start_offset, t.end_offset, records))
        log.info("  read %s: %d records, offsets %s..%s", t, records, first, last)
    if metrics["records"] != sum(c.records for c in reads):
        problems.append(f"{metrics['records']} records read, {sum(c.records for c in reads)} of them in the plan")
    if problems:
        raise InvalidCheckpoint(f"{window}: the read does not match the plan, no checkpoint written:\n  "
                                + "\n  ".join(problems))
    return reads


__all__ = ["FORMAT_NAME", "ObservedRead", "java_kafka_config", "native_options", "observed_reads", "read_plan_native"]
