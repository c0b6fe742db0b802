"""A deterministic window driver for fault-injection tests (tests/chaos).

It runs a window's steps as the Airflow tasks of ``exactly_once_window`` do,
calling the same functions they call (airflow_eos.steps), without Airflow or
spark-submit, so that hundreds of fault schedules fit in minutes. Only the
Spark job is replaced, by its Python stand-in (:func:`python_job`):

    plan      steps.plan (KafkaLog)                             [plan.after_freeze]
    stage     steps.stage: begin, then the job's stand-in: the  [stage.mid_write,
              job's own reader (read_range over plan_tasks), a   stage.before_checkpoint,
              Python transform, the target's writer (one writer  abort.inside: the step's
              transaction per read task, as a Spark write task), abort after a failure]
              the job commit's coverage check and
              target.checkpoint; on failure steps.stage aborts
              the attempt
    await     steps.prepare                                     [checkpoint.before_prepare]
    commit    steps.commit: commit, mirror offsets to a         [commit.before_publish,
              consumer group, the summary (the Asset event's     commit.after_publish,
              extra, recorded here)                              commit.after_commit; files:
                                                                 commit.after_decision,
                                                                 commit.after_rename; kafka:
                                                                 commit.mid_produce,
                                                                 commit.after_kafka_commit]
    abort     steps.abort (teardown, setup = plan)              [abort.inside]

A step whose window has faults at its points runs in a child process (forked
from a clean fork server) with ``EOS_FAULTS`` set, so ``crash`` really ends a
process with exit code 137 with no ``finally``, no rollback and no abort, as a
SIGKILLed worker; ``raise`` fails the task like any error. Other steps run
in-process. Firings are counted in a per-window ``EOS_FAULTS_STATE`` directory,
so ``point=crash*1`` fails the first try and lets the retry through.

Airflow's semantics, as modelled:

- a task is retried ``retries`` times; a retried stage opens a new attempt;
- the teardown ``abort`` runs when ``plan`` succeeded, whatever happened after;
  its failure does not fail the run (``on_failure_fail_dagrun=False``);
- *clear* = the whole task group runs again from ``plan`` (the frozen plan
  comes back, a new attempt fences every older one);
- *rerun later* = other windows run first, then this one is cleared;
- *backfill* = many windows' runs at once (threads), in random order.

Nothing here imports Airflow. Spark starts only with :class:`SparkStager`,
which runs the stage step through the real Spark job (run_stage) instead, with
the same pipelines and rows (:func:`spark_transform`); tests/chaos/
test_spark_faults.py uses it, and SIGKILLs a spark-submit of the job.

docs/guarantees.md says what is guaranteed, under which assumptions, and how
this suite tests it.
"""

from __future__ import annotations

import json
import logging
import multiprocessing
import os
import random
import re
import threading
import time
import traceback
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from decimal import Decimal
from pathlib import Path
from typing import Any

import psycopg
import pyarrow as pa

from airflow_eos import steps
from airflow_eos.core import attempt as attempts
from airflow_eos.core.attempt import Attempt, ConsumedRange
from airflow_eos.core.errors import InvalidCheckpoint
from airflow_eos.core.faults import ENV as FAULTS_ENV
from airflow_eos.core.faults import POINTS
from airflow_eos.core.faults import STATE_ENV as FAULTS_STATE_ENV
from airflow_eos.core.ledger import Ledger
from airflow_eos.core.plan import PlanRequest
from airflow_eos.core.sink import Sink
from airflow_eos.core.source import KafkaLog
from airflow_eos.core.target import TargetSpec
from airflow_eos.targets.files import FileTarget
from airflow_eos.targets.files.writer import COMMIT_FILE, STAGING_DIR, TRASH_DIR
from airflow_eos.targets.kafka import KafkaTarget
from airflow_eos.targets.postgres.target import PARTITION_PER_WINDOW, STAGING_SCHEMA, PostgresTarget
from airflow_eos.verify import VerifyReport, verify
from airflow_eos.core.windows import TopicPartition, Window, WindowPlan, to_millis, to_utc

log = logging.getLogger(__name__)

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
    "commit.mid_produce": ("commit",),
    "commit.after_kafka_commit": ("commit",),
    "abort.inside": ("stage", "abort"),  # the stage job's own abort after a failure, and the teardown
}
assert set(POINT_STEPS) == POINTS, "a fault point was added: say where it fires"
# The targets the driver builds, and the fault points each one's code reaches
# (the points of a two-phase commit without transactions are the file
# target's; a commit inside one transaction is PostgreSQL's; the Kafka target
# runs a Kafka transaction inside its ledger transaction: it has PostgreSQL's
# points and two of its own).
TARGETS = ("postgres", "files", "kafka")
_FILE_POINTS = frozenset({"commit.after_decision", "commit.after_rename"})
_KAFKA_POINTS = frozenset({"commit.mid_produce", "commit.after_kafka_commit"})
TARGET_POINTS: dict[str, frozenset[str]] = {
    "postgres": POINTS - _FILE_POINTS - _KAFKA_POINTS,
    "files": POINTS - {"commit.after_publish"} - _KAFKA_POINTS,
    "kafka": POINTS - _FILE_POINTS,
}
# What clearing a committed window can do on each target: a topic is
# append-only, so the Kafka target only skips (it refuses "replace").
ON_COMMITTED: dict[str, tuple[str, ...]] = {"postgres": ("skip", "replace"), "files": ("skip", "replace"),
                                           "kafka": ("skip",)}
assert set().union(*TARGET_POINTS.values()) == POINTS, "a fault point was added: say which targets reach it"
ACTIONS = ("raise", "crash")
RECOVERIES = ("retry", "clear", "rerun_later", "backfill")
T0 = datetime(2025, 1, 6, tzinfo=timezone.utc)
HOUR = timedelta(hours=1)
STEP_TIMEOUT_S = 120.0
# The embedded broker (Tansu), unless EOS_KAFKA_BOOTSTRAP names a real Kafka.
# When an init_transactions fences a dead producer's open transaction while
# another transactional id has a transaction open on the same partition, it
# leaves that partition's last stable offset stuck after both end (probed:
# A and B open, A's process dies, A's successor initializes and commits, B
# commits: read_committed readers end at A's successor's first record for
# good). A real Kafka does not. The Kafka target's schedules therefore run
# one window at a time there (see Schedule.draw).
EMBEDDED_BROKER = not os.environ.get("EOS_KAFKA_BOOTSTRAP")


# --------------------------------------------------------------------------- the source data


def record_value(n: int) -> bytes:
    """Order ``n`` of the chaos topic; every 13th is malformed (a dead letter)."""
    if n % 13 == 5:
        return b"{malformed order %d" % n
    return json.dumps({"n": n, "amount": f"{n % 997}.{n % 100:02d}"}).encode()


def source_records(hours: int, per_hour: int, partitions: int, *, start: datetime = T0) -> list[tuple[int, int, bytes]]:
    """(partition, timestamp_ms, value) of ``hours`` hours of orders, then one
    record per partition after the last hour, so that every window closes.
    Deterministic: producing it again into an empty topic gives the same log."""
    out = []
    n = 0
    for h in range(hours):
        for i in range(per_hour):
            for p in range(partitions):
                ts = to_millis(start + h * HOUR) + (i * 3_600_000) // per_hour + p * 7
                out.append((p, ts, record_value(n)))
                n += 1
    for p in range(partitions):
        out.append((p, to_millis(start + hours * HOUR) + 1_000 + p, record_value(n)))
        n += 1
    return out


def produce(bootstrap: str, topic: str, records: Iterable[tuple[int, int, bytes]]) -> None:
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 5})
    for partition, ts, value in records:
        while True:
            try:
                producer.produce(topic, value=value, partition=partition, timestamp=ts)
                break
            except BufferError:
                producer.poll(0.05)
    left = producer.flush(30)
    if left:
        raise RuntimeError(f"{left} records not delivered to {topic}")


def create_topic(bootstrap: str, name: str, partitions: int) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    for f in admin.create_topics([NewTopic(name, partitions, 1)]).values():
        f.result(15)


TARGET_DDL = """
CREATE SCHEMA IF NOT EXISTS chaos;
CREATE TABLE {table} (
    id               bigint        NOT NULL,
    amount           numeric(12,2) NOT NULL,
    eos_topic        text          NOT NULL,
    eos_partition    integer       NOT NULL,
    eos_offset       bigint        NOT NULL,
    eos_pipeline     text          NOT NULL,
    eos_window_start timestamptz   NOT NULL
){partitioned}
"""
# No unique index on lineage, on purpose: a duplicate must reach the table,
# where verify finds it, rather than be refused by the database.


def create_target_table(url: str, table: str, mode: str = "replace_window") -> None:
    partitioned = " PARTITION BY RANGE (eos_window_start)" if mode == PARTITION_PER_WINDOW else ""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("SELECT pg_advisory_lock(4242)")  # CREATE SCHEMA IF NOT EXISTS races
        try:
            conn.execute(TARGET_DDL.format(table=table, partitioned=partitioned))
        finally:
            conn.execute("SELECT pg_advisory_unlock(4242)")


# --------------------------------------------------------------------------- the transform


_OUT_SCHEMA = pa.schema([
    ("id", pa.int64()), ("amount", pa.decimal128(12, 2)), ("eos_topic", pa.string()),
    ("eos_partition", pa.int32()), ("eos_offset", pa.int64()),
])


def transform_batch(batch: pa.RecordBatch) -> tuple[pa.RecordBatch, list[dict]]:
    """Records (Kafka schema) -> (rows, dead letters): the Python twin of
    :func:`spark_transform`, deterministic, so a replace rerun reproduces the rows."""
    rows: dict[str, list] = {name: [] for name in _OUT_SCHEMA.names}
    dead = []
    cols = {name: batch.column(name).to_pylist() for name in ("key", "value", "topic", "partition", "offset")}
    for key, value, topic, partition, offset in zip(*cols.values()):
        try:
            order = json.loads(value)
            n, amount = int(order["n"]), Decimal(order["amount"])
        except (ValueError, TypeError, KeyError) as exc:
            dead.append({"topic": topic, "partition": partition, "offset": offset,
                         "error": f"malformed order: {type(exc).__name__}", "key": key, "value": value})
            continue
        rows["id"].append(n)
        rows["amount"].append(amount)
        rows["eos_topic"].append(topic)
        rows["eos_partition"].append(partition)
        rows["eos_offset"].append(offset)
    return pa.record_batch([pa.array(rows[f.name], f.type) for f in _OUT_SCHEMA], schema=_OUT_SCHEMA), dead


def spark_transform(df):
    """The same rows in Spark (for run_stage and spark-submit): ``--transform
    harness.chaos:spark_transform``."""
    from pyspark.sql import functions as F

    order = F.from_json(F.col("value").cast("string"), "n bigint, amount string")
    rows = df.select(order.alias("o"), "topic", "partition", "offset", "key", "value")
    amount = F.col("o.amount").try_cast("decimal(12,2)")
    return rows.select(
        F.col("o.n").alias("id"), amount.alias("amount"),
        F.col("topic").alias("eos_topic"), F.col("partition").alias("eos_partition"),
        F.col("offset").alias("eos_offset"),
        F.when(F.col("o").isNull() | F.col("o.n").isNull() | amount.isNull(),
               F.lit("malformed order")).alias("eos_error"),
        "key", "value",
    )


# --------------------------------------------------------------------------- a pipeline


@dataclass(frozen=True)
class Pipeline:
    """Everything a step needs; plain data, so a child process gets it pickled.

    The target is a PostgreSQL table (``target_kind="postgres"``: ``table`` in
    the ledger's database, in ``mode``) or a directory of Parquet partitions
    (``"files"``: ``root``, with the ledger at ``url``) or a Kafka topic
    (``"kafka"``: ``target_topic`` on the source's cluster, its staging and
    ledger at ``url``). The steps, the stage
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
    target_kind: str = "postgres"  # one of TARGETS
    root: str | None = None  # the file target's root directory
    target_topic: str | None = None  # the Kafka target's topic (on the source's cluster)

    @property
    def spec(self) -> TargetSpec:
        """The bound target spec, as a DAG's target after its hook resolved the connections."""
        if self.target_kind == "files":
            return FileTarget(path=self.root or "", ledger_url=self.url, on_committed=self.on_committed)
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
        plan = steps.plan(p.ledger, kafka_log, PlanRequest(window, p.topics, timedelta(minutes=5),
                                                           target_id=p.claimed_target))
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
    for task in plan_tasks(plan, p.max_records_per_task):
        stats = ReadStats()
        dead: list[dict] = []

        def rows(task=task, stats=stats, dead=dead):
            nonlocal seen
            for raw in read_range(p.kafka_config, task, batch_rows=p.batch_rows, end_grace_s=0.5,
                                  poll_timeout_s=20, stats=stats):
                if seen and between_batches is not None:
                    between_batches(seen)
                seen += 1
                good, bad = transform_batch(raw)
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


# --------------------------------------------------------------------------- running a step with faults


class StepFailed(Exception):
    """A step failed: raised (``crashed`` False) or its process died (True)."""

    def __init__(self, message: str, *, crashed: bool = False, error: str | None = None):
        super().__init__(message)
        self.crashed = crashed
        self.error = error  # the exception's class name, when it raised


_ctx_lock = threading.Lock()
_ctx: Any = None


def _context():
    """A fork server that imported this module before any thread existed: fork
    is cheap and safe (no librdkafka thread or lock is copied mid-use)."""
    global _ctx
    with _ctx_lock:
        if _ctx is None:
            ctx = multiprocessing.get_context("forkserver")
            # pandas: pyarrow imports it on its first conversion (~3 s), in every child otherwise.
            ctx.set_forkserver_preload([__name__, "airflow_eos.spark.kafka_source", "pandas", "pyarrow.pandas_compat"])
            _ctx = ctx
        return _ctx


def _child(conn, faults: str, state_dir: str, fn: Callable, args: tuple) -> None:
    os.environ[FAULTS_ENV] = faults
    os.environ[FAULTS_STATE_ENV] = state_dir
    try:
        value = fn(*args)
    except BaseException as exc:  # noqa: BLE001 - everything goes to the parent
        conn.send(("error", type(exc).__name__, f"{type(exc).__name__}: {exc}", traceback.format_exc()))
    else:
        conn.send(("ok", value))
    conn.close()


def run_step(fn: Callable, *args, faults: str = "", state_dir: str | os.PathLike | None = None) -> Any:
    """``fn(*args)``, in-process when ``faults`` is empty, else in a child with
    EOS_FAULTS=faults. Raises StepFailed when it fails or its process dies."""
    if not faults:
        try:
            return fn(*args)
        except Exception as exc:
            raise StepFailed(f"{type(exc).__name__}: {exc}", error=type(exc).__name__) from exc
    ctx = _context()
    receiver, sender = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_child, args=(sender, faults, str(state_dir), fn, args), daemon=True)
    proc.start()
    sender.close()
    try:
        message = receiver.recv() if receiver.poll(STEP_TIMEOUT_S) else ("timeout",)
    except EOFError:  # the child died before answering
        message = None
    finally:
        receiver.close()
    proc.join(10)
    if proc.is_alive():
        proc.kill()
        proc.join(10)
    if message is None:
        raise StepFailed(f"process died with exit code {proc.exitcode}", crashed=True)
    if message[0] == "ok":
        return message[1]
    if message[0] == "timeout":
        raise StepFailed(f"step did not finish within {STEP_TIMEOUT_S}s")
    raise StepFailed(message[2], error=message[1])


def faults_for(spec: str, step: str) -> str:
    """The part of a fault spec that can fire in ``step``."""
    items = [item.strip() for item in spec.split(",") if item.strip()]
    return ",".join(i for i in items if step in POINT_STEPS[i.partition("=")[0]])


class SparkStager:
    """The stage step through the real Spark job (run_stage) in a shared
    SparkSession. Faults reach Spark's Python workers (where the write tasks,
    the job commit and the job abort run) through the SparkContext's
    environment, which run_stage's registration of the data sources captures;
    a ``crash`` kills a Python worker, as an executor lost mid-task. One stage
    at a time: the environment is the session's."""

    def __init__(self, spark):
        self.spark = spark
        self.lock = threading.Lock()

    def __call__(self, p: Pipeline, plan_dict: dict, faults: str, state_dir: Path) -> dict:
        from airflow_eos.spark.stage import register, run_stage

        plan = WindowPlan.from_dict(plan_dict)
        env = self.spark.sparkContext.environment

        def job(attempt: Attempt) -> dict:
            return run_stage(self.spark, plan, attempt, p.target, dict(p.kafka_config), spark_transform,
                             max_records_per_task=p.max_records_per_task, max_bad_records=1_000_000).to_dict()

        with self.lock:
            if faults:
                env[FAULTS_ENV], env[FAULTS_STATE_ENV] = faults, str(state_dir)
            try:
                return steps.stage(p.target, plan, job).to_dict()
            finally:
                env.pop(FAULTS_ENV, None)
                env.pop(FAULTS_STATE_ENV, None)
                register(self.spark)  # drop the faults from the registered data sources


# --------------------------------------------------------------------------- DAG runs of windows


@dataclass
class RunOutcome:
    window: int
    state: str  # success | failed
    failed_step: str | None
    tries: list[tuple[str, str]]  # (step, ok | raised: ... | crashed)
    summary: dict | None = None  # the commit's XCom, the Asset event's extra


@dataclass
class Harness:
    """Runs windows of one pipeline as DAG runs, with faults per window, and
    records what happened for the failure message."""

    pipeline: Pipeline
    state_root: Path
    faults: dict[int, str] = field(default_factory=dict)  # window -> EOS_FAULTS spec
    retries: int = 0
    events: list[str] = field(default_factory=list)
    asset_events: dict[int, list[dict]] = field(default_factory=dict)
    runs: int = 0
    # The stage step: None for the Python stage job (in a child when faulted),
    # or a callable (pipeline, plan dict, faults, state dir) -> attempt dict,
    # e.g. SparkStager.
    stager: Callable[[Pipeline, dict, str, Path], dict] | None = None

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        self._started = time.monotonic()

    def note(self, text: str) -> None:
        with self._lock:
            self.events.append(f"{time.monotonic() - self._started:7.2f}s {text}")

    def _step(self, i: int, step: str, fn: Callable, *args) -> Any:
        faults = faults_for(self.faults.get(i, ""), step)
        state_dir = self.state_root / f"w{i}"
        return run_step(fn, self.pipeline, *args, faults=faults, state_dir=state_dir)

    def _stage(self, i: int, plan: dict) -> dict:
        if self.stager is None:
            return self._step(i, "stage", stage_step, plan)
        try:
            return self.stager(self.pipeline, plan, faults_for(self.faults.get(i, ""), "stage"),
                               self.state_root / f"w{i}")
        except Exception as exc:
            raise StepFailed(f"{type(exc).__name__}: {exc}", error=getattr(exc, "error", None)
                             or type(exc).__name__) from exc

    def run(self, i: int, *, retries: int | None = None) -> RunOutcome:
        """One DAG run of window ``i`` (a first run or a clear of the task group)."""
        retries = self.retries if retries is None else retries
        window = self.pipeline.window(i)
        outcome = RunOutcome(i, "success", None, [])
        with self._lock:
            self.runs += 1
        xcom: dict[str, Any] = {}
        calls = {
            "plan": lambda: self._step(i, "plan", plan_step, window),
            "stage": lambda: self._stage(i, xcom["plan"]),
            "await_checkpoint": lambda: self._step(i, "await_checkpoint", await_step, xcom["stage"]),
            "commit": lambda: self._step(i, "commit", commit_step, xcom["stage"]),
        }
        for step in STEPS:
            if step in ("await_checkpoint", "commit") and xcom["stage"]["epoch"] is None:
                outcome.tries.append((step, "skipped"))  # committed already, the target skips reruns
                continue
            if not self._try(i, step, calls[step], retries, outcome, xcom):
                outcome.state, outcome.failed_step = "failed", step
                break
        if "plan" in xcom:  # the teardown runs when its setup succeeded
            self._try(i, TEARDOWN, lambda: self._step(i, "abort", abort_step, window), retries, outcome, xcom)
        if outcome.state == "success" and "commit" in xcom:
            outcome.summary = xcom["commit"]
            if xcom["commit"]["announce"]:  # as the commit task: an Asset event only for an unannounced change
                with self._lock:
                    self.asset_events.setdefault(i, []).append(xcom["commit"])
        elif outcome.state == "success":  # a skipped commit: its summary is the stage's, and no Asset event
            outcome.summary = xcom["stage"]
        self.note(f"w{i} run {outcome.state}: " + ", ".join(f"{s} {r}" for s, r in outcome.tries))
        return outcome

    def _try(self, i, step, call, retries, outcome, xcom) -> bool:
        for _ in range(retries + 1):
            try:
                xcom[step] = call()
            except StepFailed as exc:
                outcome.tries.append((step, "crashed" if exc.crashed else f"raised {exc.error}"))
                continue
            outcome.tries.append((step, "ok"))
            return True
        return False

    def emitted(self, i: int, outcome: str) -> None:
        """A commit made by the test itself (as a commit task would): its Asset event."""
        with self._lock:
            self.asset_events.setdefault(i, []).append({"outcome": outcome})

    # ---------------------------------------------------------------- recoveries

    def run_until_committed(self, order: Sequence[int], *, max_rounds: int = 20,
                            parallel: int = 1, rng: random.Random | None = None) -> int:
        """Run the windows (in ``order``), then clear the failed ones, round after
        round, until all are committed. Returns the rounds it took."""
        pending = list(order)
        for round_ in range(1, max_rounds + 1):
            outcomes = self.run_many(pending, parallel=parallel)
            pending = [o.window for o in outcomes if o.state != "success"]
            if not pending:
                return round_
            if rng is not None:
                rng.shuffle(pending)
        raise AssertionError(f"windows {pending} still not committed after {max_rounds} rounds")

    def run_many(self, order: Sequence[int], *, parallel: int = 1) -> list[RunOutcome]:
        if parallel <= 1 or len(order) <= 1:
            return [self.run(i) for i in order]
        with ThreadPoolExecutor(max_workers=parallel) as pool:
            return list(pool.map(self.run, order))

    def sweep(self) -> list[int]:
        swept = self.pipeline.target.sweep(timedelta(0))
        mine = [a.epoch for a in swept if a.pipeline == self.pipeline.name]
        self.note(f"sweep aborted {len(swept)} attempt(s)")
        return mine

    def history(self) -> str:
        return "\n".join(self.events)


# --------------------------------------------------------------------------- zombies


class Zombie:
    """A stage attempt left running: it opens its attempt and stages part of the
    window now, and finishes (stages the rest, checkpoints, prepares, commits)
    whenever told, typically after newer attempts committed the window. It must
    never make a row visible twice; being fenced or closed is its expected fate."""

    EXPECTED = ("AttemptFenced", "AttemptClosed", "TargetError", "NotPrepared", "WindowNotPlanned")

    def __init__(self, p: Pipeline, i: int):
        self.p, self.i = p, i
        plan = WindowPlan.from_dict(plan_step(p, p.window(i)))
        self.plan = plan
        self.attempt = p.target.begin(plan.window)
        writer = p.target.writer(self.attempt)
        # Half the records, as one write task that committed its chunk.
        batches = []
        from airflow_eos.spark.kafka_source import plan_tasks, read_range

        task = plan_tasks(plan, p.max_records_per_task)[0]
        for raw in read_range(p.kafka_config, task, batch_rows=p.batch_rows, end_grace_s=0.5, poll_timeout_s=20):
            batches.append(transform_batch(raw)[0])
        self.first_chunk = writer.write(batches)

    def finish(self) -> str:
        """Run the rest of the attempt's life; returns how it ended."""
        target = self.p.target
        try:
            stage_attempt(self.p, self.plan, self.attempt)
            if not target.prepare(self.attempt).prepared:
                return "not prepared"
            return f"committed: {target.commit(self.attempt).outcome}"
        except Exception as exc:  # noqa: BLE001 - classified by the caller
            name = type(exc).__name__
            if name not in self.EXPECTED:
                raise
            return f"refused: {name}"


# --------------------------------------------------------------------------- randomized schedules


@dataclass(frozen=True)
class Schedule:
    """A random fault schedule, drawn from a seed alone: the same seed gives the
    same windows, faults, orders and events (thread interleavings of parallel
    runs aside)."""

    seed: int
    windows: int
    on_committed: str  # skip | replace: what clearing a committed window does
    retries: int  # of every task
    parallel: int  # DAG runs at once (max_active_runs)
    mirror: bool
    max_records_per_task: int
    faults: dict[int, str]  # window -> EOS_FAULTS
    order: tuple[int, ...]  # first runs, in this order; a window twice is two runs at once
    zombies: tuple[int, ...]  # windows that get a zombie attempt after the first runs
    reruns: tuple[int, ...]  # committed windows cleared again (skip or replace)
    sweep_between: bool  # sweep (older_than=0) between the recovery rounds and the reruns
    # A sweeper with a timeout of 0 running during the first runs: far too short
    # (it aborts live runs' attempts), so runs fail, but nothing may publish twice.
    sweep_during: bool = False
    target_mode: str = "replace_window"  # how the PostgreSQL target publishes (replace_window or partition_per_window)
    target: str = "postgres"  # one of TARGETS: chosen by the caller, not drawn (a seed replays on its target)

    @classmethod
    def draw(cls, seed: int, *, max_windows: int = 5, target: str = "postgres") -> "Schedule":
        """The schedule of ``seed`` on ``target``: faults at the points the
        target's code reaches (for PostgreSQL the same draws as before the file
        target's points existed)."""
        rng = random.Random(seed)
        points = sorted(TARGET_POINTS[target])
        n = rng.randint(2, max_windows)
        faults = {}
        for i in range(n):
            items = {}
            for _ in range(rng.choice((0, 1, 1, 2, 3))):
                point = rng.choice(points)
                items[point] = f"{point}={rng.choice(ACTIONS)}*{rng.choice((1, 1, 2, 3))}"
            if items:
                faults[i] = ",".join(items.values())
        order = list(range(n))
        rng.shuffle(order)
        for i in rng.sample(range(n), k=rng.choice((0, 0, 1))):  # a duplicate run: a clear while running
            order.insert(rng.randrange(len(order) + 1), i)
        on_committed = rng.choice(("skip", "replace"))
        return cls(
            seed=seed, windows=n, on_committed=on_committed if on_committed in ON_COMMITTED[target] else "skip",
            retries=rng.choice((0, 0, 1, 2)),
            parallel=_parallel(rng.choice((1, 2, 4)), target), mirror=rng.random() < 0.3,
            max_records_per_task=rng.choice((5, 40)),
            faults=faults, order=tuple(order),
            zombies=tuple(rng.sample(range(n), k=rng.choice((0, 0, 1, 2)))),
            reruns=tuple(rng.choices(range(n), k=rng.choice((0, 1, 2)))),
            sweep_between=rng.random() < 0.5,
            sweep_during=rng.random() < 0.25,
            target_mode=rng.choice(("replace_window", PARTITION_PER_WINDOW)),  # drawn last: older seeds replay
            target=target,
        )

    def __str__(self) -> str:
        faults = "; ".join(f"w{i}: {spec}" for i, spec in sorted(self.faults.items())) or "none"
        target = f"target mode={self.target_mode}" if self.target == "postgres" else f"target={self.target}"
        return (f"schedule seed={self.seed}: {self.windows} windows, {target}, "
                f"on_committed={self.on_committed}, "
                f"retries={self.retries}, parallel={self.parallel}, mirror={self.mirror}, "
                f"max_records_per_task={self.max_records_per_task}, first runs {list(self.order)}, "
                f"zombies {list(self.zombies)}, reruns {list(self.reruns)}, sweep={self.sweep_between}, "
                f"sweep_during={self.sweep_during}; "
                f"faults: {faults}")


def _parallel(drawn: int, target: str) -> int:
    """DAG runs at once: as drawn, but one at a time for the Kafka target on
    the embedded broker (:data:`EMBEDDED_BROKER`: windows committing at once
    there can leave a partition's last stable offset stuck; drawn all the
    same, so the seed's later draws do not change)."""
    return 1 if target == "kafka" and EMBEDDED_BROKER else drawn


def _sweep_until(h: Harness, stop: threading.Event, rng: random.Random) -> None:
    while not stop.wait(rng.uniform(0.02, 0.4)):
        h.sweep()


def run_schedule(s: Schedule, p: Pipeline, state_root: Path) -> "Verdict":
    """Play a schedule on a fresh pipeline (in a database of its own: the sweep
    is database-wide) and check the result. Raises AssertionError naming the seed."""
    rng = random.Random(s.seed * 7919 + 1)
    h = Harness(p, state_root, faults=dict(s.faults), retries=s.retries)
    h.note(str(s))
    stop = threading.Event()
    sweeper = threading.Thread(target=_sweep_until, args=(h, stop, random.Random(s.seed * 31 + 7)), daemon=True)
    try:
        if s.sweep_during:
            sweeper.start()
        try:
            first = h.run_many(s.order, parallel=s.parallel)
        finally:
            stop.set()
            if sweeper.is_alive():
                sweeper.join(60)
        committed = {o.window for o in first if o.state == "success"}
        zombies = []
        for i in s.zombies:
            zombies.append(Zombie(p, i))
            h.note(f"w{i} zombie attempt {zombies[-1].attempt.epoch} opened, half staged")
        pending = sorted(set(range(s.windows)) - committed)
        rng.shuffle(pending)
        if pending:
            h.run_until_committed(pending, parallel=s.parallel, rng=rng)
        finish_now = rng.sample(zombies, k=len(zombies) // 2 + rng.randint(0, len(zombies) % 2))
        for z in finish_now:
            h.note(f"w{z.i} zombie attempt {z.attempt.epoch} finished: {z.finish()}")
        if s.sweep_between:
            h.sweep()
        for i in s.reruns:  # a clear of a committed window; it may meet faults left over
            for _ in range(20):
                if h.run(i).state == "success":
                    break
            else:
                raise AssertionError(f"rerun of committed window {i} never succeeded")
        for z in zombies:
            if z not in finish_now:
                h.note(f"w{z.i} zombie attempt {z.attempt.epoch} finished: {z.finish()}")
        # Zombies nobody aborted are the sweeper's job.
        return check(h, range(s.windows), sweep_first=True)
    except BaseException as exc:
        reproduce = (f"reproduce: EOS_CHAOS_SEED={s.seed} EOS_CHAOS_N=1 pytest tests/chaos/test_randomized.py "
                     f"-k '{s.target}-'")
        if isinstance(exc, AssertionError) and "what happened" in str(exc):
            raise AssertionError(f"{s}\n{reproduce}\n{exc}") from None
        raise AssertionError(f"{s}\n{reproduce}\n{type(exc).__name__}: {exc}\n"
                             f"what happened:\n{h.history()}") from exc


# --------------------------------------------------------------------------- the verdict


@dataclass
class Verdict:
    report: VerifyReport
    windows: int
    attempts: int
    runs: int

    def line(self) -> str:
        t = self.report.totals
        return (f"{self.windows} windows committed, {t.kafka_records} records = {t.published_rows} rows + "
                f"{t.dead_letters} dead letters, {self.attempts} attempts in {self.runs} runs")


def check(h: Harness, windows: Sequence[int], *, sweep_first: bool = False) -> Verdict:
    """Everything exactly-once promises, for the pipeline's windows:

    - every window committed; verify (against Kafka) clean: each record of each
      committed window published once or a dead letter, nothing else; row
      counts, checkpoints and eos.partition_offsets as the ledger says;
    - published rows + dead letters == the records Kafka holds in the windows;
    - no attempt left live and no staging left behind (after the sweep, if
      ``sweep_first``: zombies are the sweeper's job), as the target keeps it
      (:data:`LEFTOVERS`);
    - what a reader of the target sees, read directly where the target is not
      a table of the ledger's database (:data:`READERS`: the file target's
      Parquet, read with PyArrow), is the Kafka records of the committed
      windows by lineage, once each, and nothing else;
    - every window emitted its Asset event; the mirrored consumer group (if
      any) holds the ledger's offsets.
    """
    p = h.pipeline
    if sweep_first:
        h.sweep()
    problems = []
    with psycopg.connect(p.url) as conn:
        states = dict(conn.execute("SELECT window_start, state FROM eos.windows WHERE pipeline = %s",
                                   (p.name,)).fetchall())
        live = conn.execute("SELECT window_start, epoch, state FROM eos.attempts WHERE pipeline = %s"
                            " AND state IN ('open', 'checkpointed', 'prepared')", (p.name,)).fetchall()
        left = LEFTOVERS[p.spec.kind](p, conn)
        read_problems = READERS[p.spec.kind](p, conn, windows) if p.spec.kind in READERS else []
        n_attempts = conn.execute("SELECT count(*) FROM eos.attempts WHERE pipeline = %s", (p.name,)).fetchone()[0]
        ledger_offsets = attempts.load_offsets(conn, p.name)
    for i in windows:
        state = states.get(p.window(i).start)
        if state != "committed":
            problems.append(f"window {i} is {state or 'not planned'}, not committed")
        if not h.asset_events.get(i):
            problems.append(f"window {i} emitted no Asset event")
    if live:
        problems.append(f"live attempts left: {live}")
    if left:
        problems.append(f"staging left behind: {left}")
    problems += read_problems
    report = verify(p.ledger, dict(p.kafka_config), p.target, p.name)
    if not report.clean:
        problems.append(str(report))
    t = report.totals
    if report.committed_windows != len(windows):
        problems.append(f"verify saw {report.committed_windows} committed windows, expected {len(windows)}")
    if (t.duplicates, t.missing, t.extra) != (0, 0, 0):
        problems.append(f"duplicates {t.duplicates}, missing {t.missing}, extra {t.extra}")
    if t.kafka_records is None or t.kafka_records != t.published_rows + t.dead_letters:
        problems.append(f"{t.kafka_records} records in Kafka != {t.published_rows} rows + "
                        f"{t.dead_letters} dead letters")
    if p.mirror_group:
        mirrored = mirrored_offsets(p.kafka_config, p.mirror_group, sorted(ledger_offsets))
        if mirrored != ledger_offsets:
            problems.append(f"consumer group {p.mirror_group} holds {mirrored}, the ledger {ledger_offsets}")
    if problems:
        raise AssertionError("exactly-once violated:\n  " + "\n  ".join(problems)
                             + "\nwhat happened:\n" + h.history())
    return Verdict(report, len(windows), n_attempts, h.runs)


def attempt_states(p: Pipeline, i: int) -> list[tuple[int, str]]:
    """(epoch, state) of window ``i``'s attempts, oldest first."""
    with psycopg.connect(p.url) as conn:
        return conn.execute("SELECT epoch, state FROM eos.attempts WHERE pipeline = %s AND window_start = %s"
                            " ORDER BY epoch", (p.name, p.window(i).start)).fetchall()


# --------------------------------------------------------------------------- per target: leftovers, readers


def _postgres_leftovers(p: Pipeline, conn: psycopg.Connection) -> list[str]:
    """Staging tables of the pipeline's attempts still in the staging schema."""
    stagings = [r[0] for r in conn.execute("SELECT staging_table FROM eos.attempts WHERE pipeline = %s", (p.name,))]
    return [f"{STAGING_SCHEMA}.{r[0]}" for r in conn.execute(
        "SELECT tablename FROM pg_tables WHERE schemaname = %s AND tablename = ANY(%s)", (STAGING_SCHEMA, stagings))]


def _file_leftovers(p: Pipeline, conn: psycopg.Connection) -> list[str]:
    """Anything in the root's staging (the root is the pipeline's alone), a
    temporary file anywhere, a publication decided but never finished, and in
    the trash anything but a replaced window's whole old version (kept for its
    retention, for readers still listing it: an older epoch than the window's
    committed one, every file of its commit file there)."""
    root = Path(p.root or "")
    left = []
    if (root / STAGING_DIR).is_dir():
        left += [f"{STAGING_DIR}/{name}" for name in sorted(os.listdir(root / STAGING_DIR))]
    committed = {ws: epoch for ws, epoch in conn.execute(
        "SELECT window_start, committed_epoch FROM eos.windows WHERE pipeline = %s AND state = 'committed'",
        (p.name,))}
    for kept in sorted(os.listdir(root / TRASH_DIR)) if (root / TRASH_DIR).is_dir() else ():
        doc = root / TRASH_DIR / kept / COMMIT_FILE
        old = json.loads(doc.read_text()) if doc.is_file() else {}
        whole = {f["name"] for f in old.get("files", ())} | {COMMIT_FILE} == set(os.listdir(doc.parent))
        window = datetime.fromisoformat(old["window_start"]) if "window_start" in old else None
        if not (old.get("pipeline") == p.name and old.get("epoch", 1 << 62) < committed.get(window, 0) and whole):
            left.append(f"{TRASH_DIR}/{kept} (not a whole old version of a replaced window)")
    for directory, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if d not in (STAGING_DIR, TRASH_DIR)]
        left += [os.path.relpath(os.path.join(directory, f), root) for f in files
                 if f.startswith(".") or (f.startswith("_") and f != COMMIT_FILE)]
    left += [f"publication of attempt {epoch} of window {ws.isoformat()} decided, never finished"
             for ws, epoch in conn.execute("SELECT window_start, epoch FROM eos.publications WHERE pipeline = %s"
                                           " AND state = 'decided'", (p.name,))]
    return left


def _partition_ends(kafka_config: Mapping[str, Any], topic: str, isolation: str) -> dict[int, int]:
    """partition -> the offset where a reader with ``isolation`` reaches the
    partition's end (read from the start: never the reported high watermark)."""
    from confluent_kafka import Consumer, KafkaError
    from confluent_kafka import TopicPartition as KafkaTopicPartition

    consumer = Consumer({**kafka_config, "group.id": "eos-chaos-ends", "enable.auto.commit": False,
                         "enable.partition.eof": True, "isolation.level": isolation})
    try:
        partitions = consumer.list_topics(topic, timeout=15).topics[topic].partitions
        consumer.assign([KafkaTopicPartition(topic, n, 0) for n in partitions])
        ends: dict[int, int] = {}
        deadline = time.monotonic() + 30
        while len(ends) < len(partitions):
            if time.monotonic() > deadline:
                raise RuntimeError(f"reading {topic} to its end ({isolation}) took more than 30 s")
            msg = consumer.poll(0.5)
            if msg is not None and msg.error():
                if msg.error().code() != KafkaError._PARTITION_EOF:
                    raise RuntimeError(f"reading {topic}: {msg.error()}")
                ends[msg.partition()] = msg.offset()
    finally:
        consumer.close()
    return ends


def _kafka_leftovers(p: Pipeline, conn: psycopg.Connection) -> list[str]:
    """The staging tables (the PostgreSQL target's), and a transaction left
    open in the target topic: where one is, a read_committed reader reaches
    the partition's end at it (the last stable offset), before the log's end
    (the embedded broker, which never times one out, ends it there too)."""
    topic = p.target_topic or ""
    committed = _partition_ends(p.kafka_config, topic, "read_committed")
    written = _partition_ends(p.kafka_config, topic, "read_uncommitted")
    return _postgres_leftovers(p, conn) + [
        f"a transaction left open in {topic}[{n}]: read_committed readers end at {committed.get(n)}, its log at "
        f"{end}; there: {_record_headers(p.kafka_config, topic, n, committed.get(n) or 0)}"
        for n, end in sorted(written.items()) if committed.get(n) != end]


def _record_headers(kafka_config: Mapping[str, Any], topic: str, partition: int, offset: int) -> dict | None:
    """The lineage headers of the first record at or after ``offset`` (read_uncommitted)."""
    from confluent_kafka import Consumer
    from confluent_kafka import TopicPartition as KafkaTopicPartition

    consumer = Consumer({**kafka_config, "group.id": "eos-chaos-ends", "enable.auto.commit": False,
                         "isolation.level": "read_uncommitted"})
    try:
        consumer.assign([KafkaTopicPartition(topic, partition, offset)])
        msg = consumer.poll(10)
        if msg is None or msg.error():
            return None
        return {"offset": msg.offset(), **{k: v.decode() for k, v in msg.headers() or []
                                            if k in ("eos-window-start", "eos-epoch", "eos-commit")}}
    finally:
        consumer.close()


# How each target keeps staging: what is left of the pipeline's attempts.
LEFTOVERS: dict[str, Callable[[Pipeline, psycopg.Connection], list[str]]] = {
    "postgres": _postgres_leftovers,
    "files": _file_leftovers,
    "kafka": _kafka_leftovers,
}


def kafka_records(kafka_config: Mapping[str, Any], topic: str, partition: int, start: int,
                  end: int) -> dict[int, bytes]:
    """offset -> value of the records in ``[start, end)``, read with a plain
    consumer (not the stage job's reader: this is what the job is checked against)."""
    return dict(_kafka_range(tuple(sorted((k, str(v)) for k, v in kafka_config.items())), topic, partition,
                             start, end))


_kafka_cache: dict[tuple, tuple[tuple[int, bytes], ...]] = {}
_kafka_cache_lock = threading.Lock()


def _kafka_range(config: tuple, topic: str, partition: int, start: int, end: int) -> tuple[tuple[int, bytes], ...]:
    # The chaos topic never changes once produced: a range read once is the same range forever.
    key = (config, topic, partition, start, end)
    with _kafka_cache_lock:
        if key in _kafka_cache:
            return _kafka_cache[key]
    from confluent_kafka import Consumer
    from confluent_kafka import TopicPartition as KafkaTopicPartition

    out: list[tuple[int, bytes]] = []
    if end > start:
        consumer = Consumer({**dict(config), "group.id": "eos-chaos-check", "enable.auto.commit": False,
                             "enable.partition.eof": True})
        try:
            consumer.assign([KafkaTopicPartition(topic, partition, start)])
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                msg = consumer.poll(1.0)
                if msg is None:
                    continue
                if msg.error():
                    if msg.error().code() == -191:  # _PARTITION_EOF
                        break
                    raise RuntimeError(f"reading {topic}/{partition}: {msg.error()}")
                if msg.offset() >= end:
                    break
                out.append((msg.offset(), msg.value()))
                if msg.offset() == end - 1:
                    break
            else:
                raise RuntimeError(f"reading {topic}/{partition} [{start}, {end}) took more than 30 s")
        finally:
            consumer.close()
    with _kafka_cache_lock:
        _kafka_cache[key] = tuple(out)
    return tuple(out)


def _read_parquet_root(root: str):
    """What a reader of the root sees: every visible Parquet file under it,
    Hive-partitioned (PyArrow skips names starting with "_" or ".", as Spark does)."""
    import pyarrow.parquet as pq

    if not any(not name.startswith(("_", ".")) for name in os.listdir(root)):
        return []
    return pq.read_table(root, partitioning="hive").to_pylist()


def _file_reader_problems(p: Pipeline, conn: psycopg.Connection, windows: Sequence[int]) -> list[str]:
    """The file target read back as a reader does (PyArrow over the root), by
    lineage, against the Kafka records of the committed windows' frozen
    ranges: each well-formed record once, in its window's partition, with the
    transform's values; each malformed one a dead letter of the ledger, once;
    nothing else. Every partition directory is the window's committed attempt."""
    problems: list[str] = []
    expected: dict[tuple[str, int, int], tuple[str, int]] = {}  # lineage -> (window start, n)
    malformed: set[tuple[str, int, int]] = set()
    committed = dict(conn.execute("SELECT window_start, committed_epoch FROM eos.windows WHERE pipeline = %s"
                                  " AND state = 'committed'", (p.name,)).fetchall())
    for i in windows:
        window = p.window(i)
        plan = p.ledger.load_plan(conn, window)
        if plan is None or window.start not in committed:
            continue  # reported as not committed
        for r in plan.ranges:
            for offset, value in kafka_records(p.kafka_config, r.topic, r.partition, r.start_offset,
                                               r.end_offset).items():
                try:
                    n = int(json.loads(value)["n"])
                except (ValueError, TypeError, KeyError):
                    malformed.add((r.topic, r.partition, offset))
                    continue
                expected[r.topic, r.partition, offset] = (window.start.isoformat(), n)
    rows = _read_parquet_root(p.root or "")
    seen = Counter((r["eos_topic"], r["eos_partition"], r["eos_offset"]) for r in rows)
    duplicates = sorted(k for k, c in seen.items() if c > 1)
    missing = sorted(set(expected) - set(seen))
    extra = sorted(set(seen) - set(expected))
    if duplicates or missing or extra:
        problems.append(f"the root read with PyArrow: {len(duplicates)} duplicate(s) {duplicates[:5]}, "
                        f"{len(missing)} missing {missing[:5]}, {len(extra)} extra {extra[:5]}")
    wrong = []
    for r in rows:
        lineage = (r["eos_topic"], r["eos_partition"], r["eos_offset"])
        if lineage in expected:
            window_start, n = expected[lineage]
            if (r["id"], _utc_text(r.get("eos_window_start"))) != (n, window_start):
                wrong.append((lineage, r["id"], r.get("eos_window_start")))
    if wrong:
        problems.append(f"{len(wrong)} row(s) with another id or window than their record's: {wrong[:5]}")
    dead = Counter(conn.execute('SELECT topic, partition, "offset" FROM eos.dead_letters WHERE pipeline = %s',
                                (p.name,)).fetchall())
    if set(dead) != malformed or any(c > 1 for c in dead.values()):
        problems.append(f"dead letters in the ledger {sorted(dead.elements())[:10]} are not the malformed records "
                        f"{sorted(malformed)[:10]}, once each")
    sink = p.target
    for directory, doc in sink.published_partitions(p.name):  # type: ignore[attr-defined]
        start = datetime.fromisoformat(doc["window_start"])
        if committed.get(start) != doc["epoch"]:
            problems.append(f"{directory} holds attempt {doc['epoch']}, the ledger committed "
                            f"{committed.get(start)}")
    return problems


def _utc_text(value: Any) -> str | None:
    """A Hive partition value of a window start, as the ISO text of its instant."""
    if value is None:
        return None
    if isinstance(value, datetime):
        return value.astimezone(timezone.utc).isoformat()
    return datetime.fromisoformat(str(value).replace("Z", "+00:00")).astimezone(timezone.utc).isoformat()


def _kafka_reader_problems(p: Pipeline, conn: psycopg.Connection, windows: Sequence[int]) -> list[str]:
    """The target topic read as a read_committed consumer reads it, to its
    end (a transaction left open is a leftover: :func:`_kafka_leftovers`),
    keeping the records of the transactions the ledger names as committed (the
    embedded broker shows aborted records too; a real Kafka hides them).
    Verify checks their lineage against Kafka;
    here each record's content: key = the order's id, value = its amount, the
    window and epoch headers those of its source record's committed window."""
    problems: list[str] = []
    committed = {to_utc(ws).isoformat(): (epoch, int(token)) for ws, epoch, token in conn.execute(
        "SELECT window_start, epoch, token FROM eos.kafka_commits WHERE pipeline = %s", (p.name,))}
    expected: dict[tuple[str, int, int], tuple[str, bytes, bytes]] = {}  # lineage -> (window start, key, value)
    for i in windows:
        window = p.window(i)
        plan = p.ledger.load_plan(conn, window)
        if plan is None:
            continue  # reported as not committed
        for r in plan.ranges:
            for offset, value in kafka_records(p.kafka_config, r.topic, r.partition, r.start_offset,
                                               r.end_offset).items():
                try:
                    order = json.loads(value)
                    n, amount = int(order["n"]), Decimal(order["amount"])
                except (ValueError, TypeError, KeyError):
                    continue  # a dead letter: verify checks it
                expected[r.topic, r.partition, offset] = (window.start.isoformat(), str(n).encode(),
                                                          str(amount).encode())
    sink = p.target
    records = sink.published_records(p.name, committed_only={(ws, token) for ws, (_, token) in committed.items()})
    wrong = []
    for r in records:
        h = r["headers"]
        lineage = (h.get("eos-topic"), int(h.get("eos-partition", -1)), int(h.get("eos-offset", -1)))
        want = expected.get(lineage)
        if want is None:
            continue  # extra: verify reports it
        window_start, key, value = want
        if (h["eos-window-start"], r["key"], r["value"]) != (window_start, key, value) \
                or int(h["eos-epoch"]) != committed[window_start][0]:
            wrong.append((lineage, r["key"], r["value"], h["eos-window-start"], h["eos-epoch"]))
    if wrong:
        problems.append(f"{len(wrong)} record(s) of topic {sink.topic} with another key, value, window or epoch "
                        f"than their source record's committed window: {wrong[:5]}")
    return problems


# How to read each target as its readers do, where the ledger's database is not
# where they read it (a PostgreSQL target is read by verify itself).
READERS: dict[str, Callable[[Pipeline, psycopg.Connection, Sequence[int]], list[str]]] = {
    "files": _file_reader_problems,
    "kafka": _kafka_reader_problems,
}


def slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "_", text.lower()).strip("_")


__all__ = [
    "ACTIONS", "LEFTOVERS", "ON_COMMITTED", "POINT_STEPS", "READERS", "RECOVERIES", "STEPS", "T0", "TARGETS",
    "TARGET_POINTS", "HOUR",
    "Harness", "Pipeline", "RunOutcome", "Schedule", "SparkStager", "StepFailed", "Verdict", "Zombie",
    "abort_step", "await_step", "check", "commit_step", "create_target_table", "create_topic",
    "faults_for", "plan_step", "produce", "record_value", "run_schedule", "run_step", "source_records",
    "spark_transform",
    "stage_attempt", "stage_step", "transform_batch",
]
