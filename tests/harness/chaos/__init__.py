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

A step whose window has a ``crash`` fault at its points runs in a child process
(forked from a clean fork server) with ``EOS_FAULTS`` set, so ``crash`` really
ends a process with exit code 137 with no ``finally``, no rollback and no abort,
as a SIGKILLed worker. Every other step runs in-process, its ``raise`` faults
injected in its own thread only (airflow_eos.core.faults.injected): a raise fails
the task like any error. Firings are counted in a per-window state directory
(``EOS_FAULTS_STATE`` in a child), so ``point=crash*1`` fails the first try and
lets the retry through.

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

from harness.chaos.checks import Verdict, attempt_states, check, published_lineage
from harness.chaos.driver import Harness, RunOutcome, SparkStager, StepFailed, Zombie, faults_for, run_step
from harness.chaos.pipeline import (
    ACTIONS,
    ON_COMMITTED,
    POINT_STEPS,
    PUBLICATION_POINTS,
    RECOVERIES,
    STEPS,
    STORES,
    TARGET_POINTS,
    TARGETS,
    NotReady,
    Pipeline,
    abort_step,
    await_step,
    commit_step,
    mirrored_offsets,
    plan_step,
    python_job,
    stage_attempt,
    stage_step,
    staged_and_prepared,
)
from harness.chaos.schedules import Schedule, run_schedule
from harness.chaos.source import (
    HOUR,
    T0,
    TARGET_DDL,
    AvroSource,
    avro_source_records,
    create_target_table,
    create_topic,
    delete_topic,
    kafka_records,
    produce,
    record_value,
    skewed_source_records,
    slug,
    source_records,
    spark_transform,
    transform_batch,
)
from harness.chaos.targets import LEFTOVERS, READERS

__all__ = [
    "ACTIONS", "LEFTOVERS", "ON_COMMITTED", "POINT_STEPS", "PUBLICATION_POINTS", "READERS", "RECOVERIES", "STEPS",
    "STORES", "T0", "TARGETS", "TARGET_DDL", "TARGET_POINTS", "HOUR",
    "Harness", "Pipeline", "RunOutcome", "Schedule", "SparkStager", "StepFailed", "Verdict", "Zombie",
    "NotReady", "attempt_states", "published_lineage", "kafka_records", "mirrored_offsets",
    "python_job", "skewed_source_records", "slug", "AvroSource", "avro_source_records",
    "abort_step", "await_step", "check", "commit_step", "create_target_table", "create_topic", "delete_topic",
    "faults_for", "plan_step", "produce", "record_value", "run_schedule", "run_step", "source_records",
    "spark_transform",
    "stage_attempt", "stage_step", "staged_and_prepared", "transform_batch",
]
