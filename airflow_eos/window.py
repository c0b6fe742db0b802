"""``exactly_once_window``: one window of a pipeline as an Airflow task group.

    plan ──► stage ──► await_checkpoint ──► commit
      └──────────── abort (teardown) ◄────────┘

The window is the run's data interval. ``abort`` is the group's teardown with
``plan`` as its setup: it runs after the others whatever their outcome, aborts
whatever attempt is still live (after a failure: the failed one; after success:
only zombies), and, being a teardown, leaves the DAG run failed when the window
failed. Clearing the group (the UI's rerun) re-plans (the frozen plan comes
back), stages a new attempt that fences any zombie, and commits exactly once.
"""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Any

from airflow.sdk import AssetAlias, TaskGroup, conf
from airflow_eos.core.errors import ConfigurationError
from airflow_eos.core.plan import DEFAULT_MAX_TIMESTAMP_SKEW, ON_SKEWED_FAIL, check_skew_rule
from airflow_eos.core.source import KafkaSource
from airflow_eos.core.target import DEFAULT_CONN_IDS, SPARK, TargetSpec, as_spec
from airflow_eos.operators.eos import (
    EosAbortOperator,
    EosCommitOperator,
    EosPlanWindowOperator,
    EosSparkStageOperator,
)
from airflow_eos.sensors.eos import EosCheckpointSensor


def target_alias(pipeline: str, target: TargetSpec) -> AssetAlias:
    """The commit task's outlet: an alias through which it emits the target's Asset
    event (``target.asset_uri``, e.g. ``postgres://host:5432/db/schema/table``, known
    once the connection is read) only when the window changed the target, with the
    commit's summary as the event's extra. A declared Asset outlet would emit an event
    for every successful commit task, no-ops included. Schedule a downstream DAG on
    this alias, or on the target's Asset by its URI."""
    return AssetAlias(name=f"eos:{pipeline}:{target.label}")


def exactly_once_window(
    *,
    pipeline: str,
    source: KafkaSource,
    target: TargetSpec,
    transform: str | None = None,
    spark_conn_id: str = DEFAULT_CONN_IDS[SPARK],
    idle_partition_grace: timedelta = timedelta(minutes=5),
    max_timestamp_skew: timedelta = DEFAULT_MAX_TIMESTAMP_SKEW,
    on_skewed_timestamp: str = ON_SKEWED_FAIL,
    max_records_per_task: int = 1_000_000,
    max_bad_records: int = 0,
    deferrable: bool = conf.getboolean("operators", "default_deferrable", fallback=False),
    mirror_group_id: str | None = None,
    group_id: str = "window",
    spark_conf: dict[str, Any] | None = None,
    stage_kwargs: dict[str, Any] | None = None,
    plan_timeout: timedelta = timedelta(hours=6),
    checkpoint_timeout: timedelta = timedelta(hours=1),
) -> TaskGroup:
    """The five tasks of one exactly-once window, for the run's data interval.

    :param pipeline: stable id; owns the cuts, windows and offsets in the ledger. The
        first plan claims it for this DAG, its topics and target: a second DAG with the
        same id, or another pipeline sending the same topics into the target, is refused
    :param source: KafkaSource(topics=[...], kafka_conn_id=...)
    :param target: a target spec, e.g. PostgresTarget(table=..., postgres_conn_id=..., mode=..., on_committed=...)
    :param transform: ``"module:function"`` (DataFrame -> DataFrame) run in Spark
    :param spark_conn_id: a ``spark`` connection (spark-submit: local mode or a cluster) or a
        ``spark_connect`` connection (the stage runs on that Spark Connect server)
    :param idle_partition_grace: how long a silent partition may hold the window open
    :param max_timestamp_skew: how far beyond a window boundary a record may be stamped before,
        followed by older records, it counts as skewed (a cut there would stall the partition)
    :param on_skewed_timestamp: ``"fail"`` (default: plan fails naming the record, nothing is
        frozen) or ``"position"`` (the record is published in the window of its offset)
    :param max_records_per_task: Kafka ranges wider than this are split over Spark tasks
    :param max_bad_records: records rejected into the dead-letter table before the window fails
    :param deferrable: plan and await_checkpoint wait in the triggerer, not a worker slot (default:
        Airflow's ``[operators] default_deferrable``, as for every provider's operators)
    :param mirror_group_id: also commit offsets to this Kafka consumer group (for lag tools)
    :param stage_kwargs: more arguments of the stage task: BaseOperator's, and the Spark provider's
        SparkSubmitHook's (executor_memory, py_files, ...)
    """
    target = _checked_arguments(pipeline, source, target, max_timestamp_skew, on_skewed_timestamp)
    wait = _waiting(deferrable)

    with TaskGroup(group_id=group_id, tooltip=f"exactly-once window of {pipeline}") as group:
        plan = EosPlanWindowOperator(
            task_id="plan", pipeline=pipeline, topics=list(source.topics),
            kafka_conn_id=source.kafka_conn_id, target=target,
            schema_registry_conn_id=source.schema_registry_conn_id, reader_schema=source.reader_schema,
            idle_partition_grace=idle_partition_grace, max_timestamp_skew=max_timestamp_skew,
            on_skewed_timestamp=on_skewed_timestamp, timeout=plan_timeout.total_seconds(), **wait,
        )
        stage = EosSparkStageOperator(
            task_id="stage", plan=plan.output, source=source, target=target, transform=transform,
            max_records_per_task=max_records_per_task, max_bad_records=max_bad_records,
            conn_id=spark_conn_id, conf=spark_conf, **(stage_kwargs or {}),
        )
        _finish_tasks(pipeline, source, target, plan, stage, wait, checkpoint_timeout, mirror_group_id)
    return group


def _checked_arguments(pipeline: str, source: KafkaSource, target: TargetSpec, max_timestamp_skew: timedelta,
                       on_skewed_timestamp: str) -> TargetSpec:
    """The target as a spec, once the window's arguments are checked: refuses,
    when the DAG is parsed, a source that is not a KafkaSource, a target that
    cannot be used from a DAG, a pipeline id that is not safe everywhere it is
    named, and a skew rule that is not one."""
    if not isinstance(source, KafkaSource):
        raise ConfigurationError(f"source must be a KafkaSource, not {type(source).__name__}")
    target = as_spec(target)
    target.check_for_dag()
    if not re.fullmatch(r"[A-Za-z0-9_.\-]+", pipeline or ""):
        raise ConfigurationError(f"pipeline id {pipeline!r} must be letters, digits, '_', '.' or '-'")
    check_skew_rule(max_timestamp_skew, on_skewed_timestamp, f"pipeline {pipeline!r}")
    return target


def _waiting(deferrable: bool) -> dict[str, Any]:
    """How plan and await_checkpoint wait: deferred in the triggerer, or
    rescheduled so that a waiting task holds no worker slot."""
    wait: dict[str, Any] = {"deferrable": deferrable}
    if not deferrable:
        wait["mode"] = "reschedule"
    return wait


def _finish_tasks(pipeline: str, source: KafkaSource, target: TargetSpec, plan: EosPlanWindowOperator,
                  stage: EosSparkStageOperator, wait: dict[str, Any], checkpoint_timeout: timedelta,
                  mirror_group_id: str | None) -> None:
    """The tasks after stage: await_checkpoint, commit and the abort teardown
    (set up by ``plan``), chained in that order."""
    await_checkpoint = EosCheckpointSensor(
        task_id="await_checkpoint", target=target, attempt=stage.output,
        timeout=checkpoint_timeout.total_seconds(), poke_interval=5, **wait,
    )
    commit = EosCommitOperator(
        task_id="commit", target=target, attempt=stage.output, mirror_group_id=mirror_group_id,
        kafka_conn_id=source.kafka_conn_id, outlets=[target_alias(pipeline, target)],
    )
    abort = EosAbortOperator(task_id="abort", pipeline=pipeline, target=target)
    plan >> stage >> await_checkpoint >> commit >> abort.as_teardown(setups=plan)
