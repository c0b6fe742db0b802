"""A pipeline under test and its steps: each is the function an Airflow task of
``exactly_once_window`` calls (airflow_eos.steps), with the Spark job replaced by
its Python stand-in (:func:`python_job`); the fault points each step and target reaches.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from airflow_eos import steps
from airflow_eos.core import attempt as attempts
from airflow_eos.core.attempt import Attempt, ConsumedRange
from airflow_eos.core.errors import InvalidCheckpoint
from airflow_eos.core.faults import POINTS
from airflow_eos.core.ledger import Ledger
from airflow_eos.core.plan import PlanRequest
from airflow_eos.core.sink import Sink
from airflow_eos.core.source import KafkaLog
from airflow_eos.core.target import TargetSpec
from airflow_eos.core.windows import TopicPartition, Window, WindowPlan
from airflow_eos.spark import kafka_ranges
from airflow_eos.targets.files import FileTarget
from airflow_eos.targets.iceberg import IcebergTarget
from airflow_eos.targets.kafka import KafkaTarget
from airflow_eos.targets.postgres.target import PostgresTarget
from harness.chaos.source import HOUR, T0, AvroSource, batch_transform

log = logging.getLogger(__name__)

# The job's reader asks consume() for a batch of 10,000 records and waits up to
# 50 ms for it: every read task of these windows (5-40 records) waits the 50 ms
# in full, 0.3 s of a 0.45 s stage step. Only a wait: the reader reads until its
# range's end whatever it is, and its end-of-log checks go by wall-clock time.
# Loaded with harness.chaos, so the fork server's children read the same way.
kafka_ranges._CONSUME_WAIT_S = 0.005

STEPS = ("plan", "stage", "await_checkpoint", "commit")
TEARDOWN = "abort"
# Where each fault point can fire: the steps whose process must carry it.
POINT_STEPS: dict[str, tuple[str, ...]] = {
    "plan.after_freeze": ("plan",),
    "stage.mid_write": ("stage",),
    "stage.before_checkpoint": ("stage",),
    "checkpoint.before_prepare": ("await_checkpoint",),
    "commit.before_publish": ("commit",),
    "commit.after_publish": ("commit",),
    "commit.after_commit": ("commit",),
    "commit.after_decision": ("commit",),
    "commit.after_rename": ("commit",),
    "commit.before_cleanup": ("commit",),
    "commit.mid_produce": ("commit",),
    "commit.after_kafka_commit": ("commit",),
    "abort.inside": ("stage", "abort"),  # the stage job's own abort after a failure, and the teardown
}
assert set(POINT_STEPS) == POINTS, "a fault point was added: say where it fires"
# The targets the driver builds, and the fault points each one's code reaches
# (the points of a two-phase commit without transactions are the file
# target's; a commit inside one transaction is PostgreSQL's; the Kafka target
# runs a Kafka transaction inside its ledger transaction: it has PostgreSQL's
# points and two of its own; the Iceberg target's commit is a two-phase commit
# too: the ledger decides, then the table's commit, ``commit.after_publish``
# firing once the snapshot landed and before the ledger marks it published).
# Both two-phase targets clean up after the ledger marked the publication
# (``commit.before_cleanup``).
TARGETS = ("postgres", "files", "kafka", "iceberg")
_FILE_POINTS = frozenset({"commit.after_decision", "commit.after_rename"})
_KAFKA_POINTS = frozenset({"commit.mid_produce", "commit.after_kafka_commit"})
_TWO_PHASE_POINTS = frozenset({"commit.before_cleanup"})
TARGET_POINTS: dict[str, frozenset[str]] = {
    "postgres": POINTS - _FILE_POINTS - _KAFKA_POINTS - _TWO_PHASE_POINTS,
    "files": POINTS - {"commit.after_publish"} - _KAFKA_POINTS,
    "kafka": POINTS - _FILE_POINTS - _TWO_PHASE_POINTS,
    "iceberg": POINTS - {"commit.after_rename"} - _KAFKA_POINTS,
}
# What clearing a committed window can do on each target: a topic is
# append-only, so the Kafka target only skips (it refuses "replace").
ON_COMMITTED: dict[str, tuple[str, ...]] = {"postgres": ("skip", "replace"), "files": ("skip", "replace"),
                                           "kafka": ("skip",), "iceberg": ("skip", "replace")}
assert set().union(*TARGET_POINTS.values()) == POINTS, "a fault point was added: say which targets reach it"
# Per target, its points inside a decided window's publication, after the decision committed
# (FileCommit's and IcebergCommit's publish_decided): any later commit of the pipeline finishes
# that publication (core/publication.py), so the process a fault there fires in depends on order.
PUBLICATION_POINTS: dict[str, frozenset[str]] = {"files": frozenset({"commit.after_rename"}),
                                                 "iceberg": frozenset({"commit.after_publish"})}
assert all(points <= TARGET_POINTS[t] for t, points in PUBLICATION_POINTS.items())
# Where each target's data can live, where it can live in more than one
# place: the file target's root is a local directory or a directory on HDFS
# (one Files protocol, airflow_eos/targets/files/storage.py).
STORES: dict[str, tuple[str, ...]] = {"files": ("local", "hdfs")}
ACTIONS = ("raise", "crash")
RECOVERIES = ("retry", "clear", "rerun_later", "backfill")



# --------------------------------------------------------------------------- a pipeline


@dataclass(frozen=True)
class Pipeline:
    """Everything a step needs; plain data, so a child process gets it pickled.

    The target is a PostgreSQL table (``target_kind="postgres"``: ``table`` in
    the ledger's database, in ``mode``) or a directory of Parquet partitions
    (``"files"``: ``root``, with the ledger at ``url``) or a Kafka topic
    (``"kafka"``: ``target_topic`` on the source's cluster, its staging and
    ledger at ``url``) or an Iceberg table (``"iceberg"``: ``table`` in the SQL
    catalog in the ledger's database, located under ``root``). The steps, the stage
    job's stand-in and the checks see only its Sink (:attr:`target`)."""

    name: str
    url: str
    table: str
    kafka_config: Mapping[str, Any]
    topics: tuple[str, ...]
    on_committed: str = "skip"
    mode: str = "replace_window"  # the PostgreSQL target's
    mirror_group: str | None = None
    max_records_per_task: int = 40  # lower it for several read/write tasks (chunks) per partition
    batch_rows: int = 8  # stage.mid_write fires after a batch is written, before its task's chunk is committed
    # How long a read waits for Kafka to answer before it fails; while it waits,
    # the stage's COPY into its staging stays open.
    poll_timeout_s: float = 20.0
    target_kind: str = "postgres"  # one of TARGETS
    root: str | None = None  # the file target's root directory
    target_topic: str | None = None  # the Kafka target's topic (on the source's cluster)
    # The plan's: a partition with no record at/after a window's end holds the window this long after the end
    # (the suite's windows end long ago: a longer grace keeps one waiting, as a window that has just ended).
    idle_partition_grace: timedelta = timedelta(minutes=5)
    # The source topic's values are Avro (the plan freezes the reader schema, the stage job's stand-in
    # decodes with it as the eos_kafka reader does); None: JSON.
    avro: AvroSource | None = None

    @property
    def spec(self) -> TargetSpec:
        """The bound target spec, as a DAG's target after its hook resolved the connections."""
        if self.target_kind == "files":
            return FileTarget(path=self.root or "", ledger_url=self.url, on_committed=self.on_committed)
        if self.target_kind == "iceberg":
            return IcebergTarget(table=self.table, ledger_url=self.url, on_committed=self.on_committed)
        if self.target_kind == "kafka":
            # A record per order: the order's id as key, its amount as value.
            return KafkaTarget(topic=self.target_topic or "", key_column="id", value_column="amount",
                               kafka_config=dict(self.kafka_config), ledger_url=self.url,
                               on_committed=self.on_committed)
        return PostgresTarget(self.url, self.table, mode=self.mode, on_committed=self.on_committed)

    @property
    def claimed_target(self) -> str | None:
        """The target id the plan claims the pipeline for: the Kafka target's
        (its sink sweeps only the pipelines claimed for it); None for the
        others, planned as before claims named targets (their sinks sweep
        unclaimed pipelines they can tell are theirs)."""
        return self.spec.target_id if self.target_kind == "kafka" else None

    @property
    def target(self) -> Sink:
        """The target's runtime Sink (what the steps are given)."""
        return self.spec.sink()

    @property
    def ledger(self) -> Ledger:
        return Ledger(self.url)

    def window(self, i: int) -> Window:
        return Window(self.name, T0 + i * HOUR, T0 + (i + 1) * HOUR)


# --------------------------------------------------------------------------- the steps


def plan_step(p: Pipeline, window: Window) -> dict:
    """EosPlanWindowOperator: steps.plan (the window is closed in these tests)."""
    with KafkaLog(dict(p.kafka_config)) as kafka_log:
        plan = steps.plan(p.ledger, kafka_log, PlanRequest(
            window, p.topics, p.idle_partition_grace, target_id=p.claimed_target,
            reader_schema=p.avro.reader_schema(p.topics) if p.avro is not None else None))
    if plan is None:
        raise NotReady(f"window {window} is not closed")
    return plan.to_dict()


def stage_attempt(p: Pipeline, plan: WindowPlan, attempt: Attempt, *,
                  between_batches: Callable[[int], None] | None = None) -> attempts.Checkpoint:
    """The stage job without Spark (its Python stand-in): the job's reader, the
    target's writer, the job commit. ``between_batches(n)`` is called before the
    n-th batch (n >= 1) of the whole job is handed to a writer (for tests that
    break things mid-stage)."""
    from airflow_eos.spark.kafka_source import ReadStats, plan_tasks, read_range

    target = p.target
    writer = target.writer(attempt)
    consumed: list[ConsumedRange] = []
    chunks = []
    seen = 0
    transform = batch_transform(p.avro, plan.reader_schema)
    for task in plan_tasks(plan, p.max_records_per_task):
        stats = ReadStats()
        dead: list[dict] = []

        def rows(task=task, stats=stats, dead=dead):
            nonlocal seen
            for raw in read_range(p.kafka_config, task, batch_rows=p.batch_rows, end_grace_s=0.5,
                                  poll_timeout_s=p.poll_timeout_s, stats=stats):
                if seen and between_batches is not None:
                    between_batches(seen)
                seen += 1
                good, bad = transform(raw)
                dead.extend(bad)
                yield good

        chunks.append(writer.write(rows(), dead_letters=dead))
        consumed.append(ConsumedRange(task.topic, task.partition, task.start_offset, task.end_offset,
                                      stats.records))
    # The job commit's check (stage.commit_stage), then the checkpoint.
    problems = attempts.coverage_problems(plan.ranges, attempts.make_checkpoint(consumed, chunks).ranges)
    if problems:
        raise InvalidCheckpoint(f"{attempt}: the job did not read its plan completely: {problems}")
    return target.checkpoint(attempt, consumed, chunks)


def python_job(p: Pipeline, plan: WindowPlan) -> Callable[[Attempt], dict]:
    """The stage job's Python stand-in, as steps.stage runs a job."""
    def job(attempt: Attempt) -> dict:
        checkpoint = stage_attempt(p, plan, attempt)
        return {"rows_staged": checkpoint.row_count, "dead_letters": checkpoint.dead_letter_count}
    return job


def stage_step(p: Pipeline, plan_dict: dict) -> dict:
    """EosSparkStageOperator: steps.stage with the job's Python stand-in (the
    step opens a new attempt; the job's failure aborts it; a crash leaves it open)."""
    plan = WindowPlan.from_dict(plan_dict)
    return steps.stage(p.target, plan, python_job(p, plan)).to_dict()


class NotReady(Exception):
    """The sensor would keep poking: the checkpoint is not written (or the plan
    task would: the window is not closed)."""


def await_step(p: Pipeline, attempt_dict: dict) -> str:
    """EosCheckpointSensor: steps.prepare. The stage step ran to its end
    synchronously, so a checkpoint that is not written will never be: fail."""
    readiness = steps.prepare(p.target, Attempt.from_dict(attempt_dict))
    if not readiness.prepared:
        raise NotReady(readiness.detail)
    return readiness.detail


def commit_step(p: Pipeline, attempt_dict: dict) -> dict:
    """EosCommitOperator: steps.commit (commit, mirror offsets, the summary that
    becomes the Asset event's extra)."""
    mirror = steps.OffsetMirror(dict(p.kafka_config), p.mirror_group) if p.mirror_group else None
    return steps.commit(p.target, Attempt.from_dict(attempt_dict), mirror=mirror).to_dict()


def abort_step(p: Pipeline, window: Window, reason: str = "aborted by the teardown") -> list[int]:
    """EosAbortOperator: steps.abort."""
    return steps.abort(p.target, window, reason)


def staged_and_prepared(p: Pipeline, i: int) -> Attempt:
    """Window ``i`` planned, staged by a new attempt and prepared (not committed)."""
    plan = WindowPlan.from_dict(plan_step(p, p.window(i)))
    attempt = p.target.begin(plan.window)
    stage_attempt(p, plan, attempt)
    assert p.target.prepare(attempt).prepared
    return attempt


def mirrored_offsets(kafka_config: Mapping[str, Any], group_id: str,
                     tps: Sequence[TopicPartition]) -> dict[TopicPartition, int]:
    from confluent_kafka import Consumer
    from confluent_kafka import TopicPartition as KafkaTopicPartition

    consumer = Consumer({**kafka_config, "group.id": group_id, "enable.auto.commit": False})
    try:
        got = consumer.committed([KafkaTopicPartition(tp.topic, tp.partition) for tp in tps], timeout=15)
    finally:
        consumer.close()
    return {TopicPartition(k.topic, k.partition): k.offset for k in got if k.offset >= 0}


