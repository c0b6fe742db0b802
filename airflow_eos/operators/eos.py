"""Operators of a window's life: thin shells over airflow_eos.steps.

plan → stage → (await_checkpoint, in sensors/) → commit, and abort as the
window's teardown. Each turns Airflow connections into plain values with its
hooks (``@cached_property``) and calls one step; the protocol lives in the steps,
the core and the target. An error that a retry cannot cure (``terminal`` in
core/errors.py) fails the task without using its retries.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta
from functools import cached_property
from typing import TYPE_CHECKING, Any

from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator
from airflow.sdk import Asset, AssetAlias, BaseOperator, BaseSensorOperator, BaseXCom, PokeReturnValue
from airflow.sdk.exceptions import AirflowException, AirflowFailException, AirflowSkipException
from airflow_eos.core.attempt import Attempt
from airflow_eos.core.plan import DEFAULT_MAX_TIMESTAMP_SKEW, ON_SKEWED_FAIL, check_skew_rule
from airflow_eos.core.source import KafkaSource
from airflow_eos.core.target import DEFAULT_CONN_IDS, KAFKA, POSTGRES, SPARK, TargetSpec, as_spec
from airflow_eos.core.windows import Window, WindowPlan
from airflow_eos.spark.submit import job_error, job_report, stage_job_environment, stage_job_path
from airflow_eos.spark.transform import check_transform, parse_transform

# The hooks, the steps and the triggers are imported when a task runs: they load
# the Kafka and Postgres providers' clients, which parsing a DAG must not.
if TYPE_CHECKING:
    from airflow_eos.core.sink import Sink
    from airflow_eos.hooks.eos import EosKafkaHook, EosTargetHook

DATA_INTERVAL_START = "{{ data_interval_start }}"
DATA_INTERVAL_END = "{{ data_interval_end }}"


class EosPlanWindowOperator(BaseSensorOperator):
    """Resolve and freeze the window's cuts; push the plan to XCom.

    Waits while the window is not closed (a partition has not passed the window's
    end): by deferring to a trigger (``deferrable=True``, no worker slot held),
    or by poking/rescheduling like any sensor. Re-running returns the frozen plan.

    :param pipeline: stable id of the pipeline; owns its cuts, windows and offsets
    :param topics: source topics
    :param window_start: start of the window (templated; default the data interval start)
    :param window_end: end of the window (templated; default the data interval end)
    :param idle_partition_grace: how long after the window's end a partition with
        no newer record may stay silent before its cut is frozen at its end of log
    :param max_timestamp_skew: how far beyond a window boundary a record may be
        stamped before it counts as skewed when older records follow it (a cut
        there would hold the partition window after window)
    :param on_skewed_timestamp: ``"fail"`` (default): planning fails naming the
        skewed record, nothing is frozen; ``"position"``: the record does not
        close the window, it is published in the window of its offset (logged
        as a warning, the cut's ``how`` is ``skewed``)
    :param target: the window's target spec (e.g. PostgresTarget). The plan
        claims the pipeline for this DAG, its topics and this target in the
        ledger (the first plan claims; a plan from another DAG, for other topics
        or into another target fails without retries, naming both). Without it
        the claim names no target until a plan that has one. The ledger is in
        the target's ledger database: ``postgres_conn_id`` defaults to it.
    """

    template_fields: Sequence[str] = ("pipeline", "topics", "window_start", "window_end")
    ui_color = "#e8f4ff"

    def __init__(
        self,
        *,
        pipeline: str,
        topics: Sequence[str],
        kafka_conn_id: str = DEFAULT_CONN_IDS[KAFKA],
        postgres_conn_id: str | None = None,
        window_start: str = DATA_INTERVAL_START,
        window_end: str = DATA_INTERVAL_END,
        idle_partition_grace: timedelta = timedelta(minutes=5),
        max_timestamp_skew: timedelta = DEFAULT_MAX_TIMESTAMP_SKEW,
        on_skewed_timestamp: str = ON_SKEWED_FAIL,
        deferrable: bool = False,
        poke_interval: float = 60,
        target: TargetSpec | None = None,
        **kwargs: Any,
    ) -> None:
        # Before the base class adds the task to the DAG: a refused task leaves no trace there.
        check_skew_rule(max_timestamp_skew, on_skewed_timestamp, f"task {kwargs.get('task_id')!r}")
        if target is not None:
            target = as_spec(target)
        super().__init__(poke_interval=poke_interval, **kwargs)
        if isinstance(topics, str):
            raise ValueError(f"topics must be a list of topic names, not the string {topics!r}")
        if not topics:
            raise ValueError("topics must not be empty")
        if target is not None and postgres_conn_id not in (None, target.ledger_conn_id):
            raise ValueError(f"postgres_conn_id {postgres_conn_id!r} is not the ledger connection of the target "
                             f"{target.label} ({target.ledger_conn_id!r}): the ledger lives in the target's database; "
                             "leave postgres_conn_id out")
        self.pipeline = pipeline
        self.topics = list(topics)
        self.kafka_conn_id = kafka_conn_id
        self.target = target
        self.postgres_conn_id = postgres_conn_id or (target.ledger_conn_id if target else DEFAULT_CONN_IDS[POSTGRES])
        self.window_start = window_start
        self.window_end = window_end
        self.idle_partition_grace = idle_partition_grace
        self.max_timestamp_skew = max_timestamp_skew
        self.on_skewed_timestamp = on_skewed_timestamp
        self.deferrable = deferrable

    @cached_property
    def _plan_kwargs(self) -> dict[str, Any]:
        return {
            "pipeline": self.pipeline,
            "topics": list(self.topics),
            "window_start": str(self.window_start),
            "window_end": str(self.window_end),
            "idle_partition_grace_seconds": self.idle_partition_grace.total_seconds(),
            "kafka_conn_id": self.kafka_conn_id,
            "postgres_conn_id": self.postgres_conn_id,
            "max_timestamp_skew_seconds": self.max_timestamp_skew.total_seconds(),
            "on_skewed_timestamp": self.on_skewed_timestamp,
            # the plan's claim on the pipeline (plain values: the trigger serialises them)
            "dag_id": self.dag_id if self.has_dag() else None,
            "target_id": self.target.target_id if self.target else None,
            "target_aliases": list(self.target.target_aliases) if self.target else [],
            "target_exclusive": self.target.exclusive if self.target else False,
            # resolved at run time into the target's physical place (Sink.claim_identity)
            "target": self.target.to_dict() if self.target else None,
        }

    def _plan_or_none(self) -> WindowPlan | None:
        from airflow_eos.hooks.eos import failing_terminally, plan_or_none

        with failing_terminally():  # the same plan fails the same way on every retry
            return plan_or_none(**self._plan_kwargs)

    def poke(self, context) -> PokeReturnValue:
        plan = self._plan_or_none()
        if plan is None:
            return PokeReturnValue(is_done=False)
        return PokeReturnValue(is_done=True, xcom_value=plan.to_dict())

    def execute(self, context) -> Any:
        if not self.deferrable:
            return super().execute(context)
        plan = self._plan_or_none()
        if plan is not None:
            return plan.to_dict()
        from airflow_eos.triggers.eos import WindowClosedTrigger

        self.defer(
            trigger=WindowClosedTrigger(poll_interval=self.poke_interval, **self._plan_kwargs),
            method_name="execute_complete",
            timeout=timedelta(seconds=self.timeout) if self.timeout else None,
        )

    def execute_complete(self, context, event: dict[str, Any]) -> dict:
        from airflow_eos.hooks.eos import reraise_event_error

        if event.get("status") != "done":
            reraise_event_error(event, f"planning window {self.window_start} .. {self.window_end} of {self.pipeline}")
        plan = WindowPlan.from_dict(event["plan"])
        self.log.info("window %s planned (in the triggerer): %d partition range(s), at most %d records",
                      plan.window, len(plan.ranges), plan.max_records)
        for r in plan.ranges:
            self.log.info("  %s [%d, %d)", r.tp, r.start_offset, r.end_offset)
        return plan.to_dict()


class _TargetHooks:
    """The hooks of an operator that works on a target (``self.target``)."""

    target: TargetSpec

    @cached_property
    def target_hook(self) -> "EosTargetHook":
        from airflow_eos.hooks.eos import EosTargetHook

        return EosTargetHook(self.target)

    @property
    def sink(self) -> "Sink":
        return self.target_hook.sink


class EosSparkStageOperator(_TargetHooks, SparkSubmitOperator):
    """Open a new attempt of the window (fencing every older one) and run the
    PySpark stage job for it: read exactly the planned ranges, apply the
    transform, stage the rows, write the checkpoint (``steps.stage``).

    ``conn_id`` chooses where the job runs:

    - a ``spark`` connection: ``spark-submit`` of the stage job, as the Spark
      provider's SparkSubmitOperator does (local mode or a cluster; ``conf``,
      ``executor_memory``, ... pass through). Each window pays a spark-submit and
      a driver JVM start (~5–10 s, more on a busy machine);
    - a ``spark_connect`` connection: the job runs on that Spark Connect
      server's warm driver, this task being its client (no JVM in the Airflow
      worker). The server needs airflow-eos installed for its Python workers;
      ``conf`` is applied to the job's session (SQL settings only).

    Returns the attempt with the job's report (XCom: ``steps.Staged``) for the
    checkpoint sensor and the commit.

    :param plan: the plan task's XCom (templated)
    :param source: the window's KafkaSource
    :param target: the window's target spec (e.g. PostgresTarget)
    :param transform: ``"module:function"``, DataFrame -> DataFrame, run in Spark
        (None: the records as read, for targets shaped like the Kafka schema).
        Its syntax is checked when the DAG is parsed; before an attempt is
        opened, the task imports the module and checks the function exists and
        is callable, so a transform that cannot load fails at once with the
        import error as its headline. When the module is not installed on the
        Airflow worker and ``py_files`` ships it, only the syntax is checked
        here; the stage job loads it and reports its error as the headline.
    :param max_records_per_task: Kafka ranges wider than this are split over tasks
    :param max_bad_records: records the transform may reject into the dead-letter
        table before the window fails
    """

    template_fields: Sequence[str] = (*SparkSubmitOperator.template_fields, "plan", "transform")
    ui_color = "#fde9e4"

    def __init__(
        self,
        *,
        plan: Any,
        source: KafkaSource,
        target: TargetSpec,
        transform: str | None = None,
        max_records_per_task: int = 1_000_000,
        max_bad_records: int = 0,
        conn_id: str = DEFAULT_CONN_IDS[SPARK],
        name: str = "airflow-eos-stage",
        **kwargs: Any,
    ) -> None:
        super().__init__(application=stage_job_path(), conn_id=conn_id, name=name, **kwargs)
        if not isinstance(source, KafkaSource):
            raise TypeError(f"source must be a KafkaSource, not {type(source).__name__}")
        if transform is not None and "{{" not in transform:  # a template is checked once rendered
            parse_transform(transform)
        if max_records_per_task < 1 or max_bad_records < 0:
            raise ValueError("max_records_per_task must be >= 1 and max_bad_records >= 0")
        self.plan = plan
        self.source = source
        self.target = as_spec(target)
        self.transform = transform
        self.max_records_per_task = max_records_per_task
        self.max_bad_records = max_bad_records

    @cached_property
    def kafka_hook(self) -> "EosKafkaHook":
        from airflow_eos.hooks.eos import EosKafkaHook

        return EosKafkaHook(kafka_config_id=self.source.kafka_conn_id)

    @cached_property
    def kafka_config(self) -> dict[str, Any]:
        return {**self.kafka_hook.kafka_config, **self.source.reader_config}

    def execute(self, context) -> dict:
        from airflow_eos import steps
        from airflow_eos.hooks.eos import failing_terminally

        # Before an attempt is opened and ~20 s of spark-submit are spent on a job that cannot load it.
        check_transform(self.transform, shipped=bool(self.py_files))
        plan = WindowPlan.from_dict(self.plan)
        job = self._on_spark_connect if self._spark_connect_url is not None else self._spark_submit
        with failing_terminally():
            staged = steps.stage(self.sink, plan, lambda attempt: job(context, plan, attempt))
        self._staged = staged.to_dict()
        if staged.attempt is None:
            # Committed already and the target skips reruns: the checkpoint, the commit and whatever follows
            # them are skipped (no Asset event: the target did not change); the XCom says who committed it.
            context["ti"].xcom_push(key=BaseXCom.XCOM_RETURN_KEY, value=staged.to_dict())
            raise AirflowSkipException(staged.committed.describe())
        return staged.to_dict()

    def get_openlineage_facets_on_start(self):
        from airflow_eos.operators.lineage import stage_lineage

        return stage_lineage(self)

    def get_openlineage_facets_on_complete(self, task_instance):
        from airflow_eos.operators.lineage import stage_lineage

        return stage_lineage(self, getattr(self, "_staged", None))

    def _spark_submit(self, context, plan: WindowPlan, attempt: Attempt) -> dict | None:
        """The stage job by spark-submit; its report is the line it prints."""
        import json

        self.application_args = [
            "--plan", plan.to_json(),
            "--attempt", json.dumps(attempt.to_dict()),
            "--max-records-per-task", str(self.max_records_per_task),
            "--max-bad-records", str(self.max_bad_records),
            *(["--transform", self.transform] if self.transform else []),
        ]
        # Secrets travel in the environment of spark-submit, never on its command line.
        hook = self._get_hook()
        local = str(hook._connection["master"]).startswith("local")
        if local:  # a batch job in local mode needs no web UI (and no listener)
            self.conf = {"spark.ui.enabled": "false", **(self.conf or {})}
        self.env_vars = {**(self.env_vars or {}),
                         **stage_job_environment(self.target_hook.bound, self.kafka_config, local=local)}
        self._job_error = None
        self._job_report = None
        try:
            super().execute(context)
        except AirflowException as exc:
            if self._job_error is None:
                raise
            # The job's own error is the headline; spark-submit's (the command line and exit code) follows.
            failure = AirflowFailException if self._job_error.terminal else AirflowException
            raise failure(f"{self._job_error.headline}\n(spark-submit of the stage job of {attempt} failed: "
                          f"{exc})") from None
        return self._job_report

    def _get_hook(self):
        """The Spark provider's hook, reading the job's output as it streams it
        to the log, to find the job's error or report line (spark/submit.py)."""
        hook = super()._get_hook()
        stream_to_log = hook._process_spark_submit_log

        def watch(lines):
            def seen():
                for line in lines:
                    self._job_error = job_error(line) or getattr(self, "_job_error", None)
                    self._job_report = job_report(line) or getattr(self, "_job_report", None)
                    yield line
            stream_to_log(seen())

        hook._process_spark_submit_log = watch
        return hook

    @cached_property
    def _spark_connect_url(self) -> str | None:
        """The Spark Connect URL when ``conn_id`` is a ``spark_connect`` connection."""
        from airflow.providers.apache.spark.hooks.spark_connect import SparkConnectHook

        if SparkConnectHook.get_connection(self._conn_id).conn_type != SparkConnectHook.conn_type:
            return None
        return SparkConnectHook(conn_id=self._conn_id).get_connection_url()

    def _on_spark_connect(self, context, plan: WindowPlan, attempt: Attempt) -> dict:
        """The stage job on the Spark Connect server's driver, this task its client."""
        # pyspark only here: a spark-submit stage never loads it in the Airflow worker.
        from airflow_eos.spark.session import spark_session, stop_session
        from airflow_eos.spark.stage import run_stage

        self._remote_session = spark_session(f"airflow-eos stage {attempt.pipeline} e{attempt.epoch}",
                                             remote=self._spark_connect_url, conf=self.conf)
        try:
            report = run_stage(self._remote_session, plan, attempt, self.sink, self.kafka_config, self.transform,
                               max_records_per_task=self.max_records_per_task,
                               max_bad_records=self.max_bad_records)
        finally:
            stop_session(self._remote_session)
            self._remote_session = None
        return report.to_dict()

    def on_kill(self) -> None:
        session = getattr(self, "_remote_session", None)
        if session is None:
            super().on_kill()
            return
        # The job runs on the server, not in this process: stop it there. Had it
        # gone on, its checkpoint would be refused anyway (a newer attempt fences it).
        self.log.info("interrupting the stage job on the Spark Connect server")
        session.interruptAll()


class EosCommitOperator(_TargetHooks, BaseOperator):
    """Publish the prepared attempt and advance the pipeline's offsets
    atomically (``steps.commit``). Idempotent: a retry after success does
    nothing and says so. A window committed before is skipped or replaced, as
    the target's ``on_committed`` says. Returns the commit's summary
    (``steps.Committed``), which is also the extra of the target's Asset event.

    The Asset event (``target.asset_uri``) is emitted through each AssetAlias
    among ``outlets`` (``window.target_alias``), and only when the target changed
    and no commit step had announced it (``Committed.announce``): a retried or
    rerun commit that does nothing emits none. Reports OpenLineage (see
    ``operators/lineage.py``).

    :param target: the window's target spec (e.g. PostgresTarget)
    :param attempt: the stage task's attempt (its XCom; templated)
    :param mirror_group_id: if set, also commit the pipeline's offsets to this
        Kafka consumer group after the transaction, for lag tools; the ledger
        stays the source of truth
    :param kafka_conn_id: the connection of the group to mirror to
    """

    template_fields: Sequence[str] = ("attempt",)
    ui_color = "#e6f5e6"

    def __init__(
        self,
        *,
        target: TargetSpec,
        attempt: Any,
        mirror_group_id: str | None = None,
        kafka_conn_id: str = DEFAULT_CONN_IDS[KAFKA],
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.target = as_spec(target)
        self.attempt = attempt
        self.mirror_group_id = mirror_group_id
        self.kafka_conn_id = kafka_conn_id

    @cached_property
    def kafka_hook(self) -> "EosKafkaHook":
        from airflow_eos.hooks.eos import EosKafkaHook

        return EosKafkaHook(kafka_config_id=self.kafka_conn_id)

    def execute(self, context) -> dict:
        from airflow_eos import steps
        from airflow_eos.hooks.eos import failing_terminally

        mirror = (steps.OffsetMirror(self.kafka_hook.kafka_config, self.mirror_group_id)
                  if self.mirror_group_id else None)
        with failing_terminally():
            summary = steps.commit(self.sink, Attempt.from_dict(self.attempt), mirror=mirror).to_dict()
        self._summary = summary
        if summary["announce"]:  # the target changed and Airflow was not told: one Asset event, via the alias
            for alias in (o for o in self.outlets if isinstance(o, AssetAlias)):
                context["outlet_events"][alias].add(Asset(self.target_hook.bound.asset_uri), extra=summary)
        return summary

    def get_openlineage_facets_on_start(self):
        from airflow_eos.operators.lineage import commit_lineage

        return commit_lineage(self)

    def get_openlineage_facets_on_complete(self, task_instance):
        from airflow_eos.operators.lineage import commit_lineage

        return commit_lineage(self, getattr(self, "_summary", None))


class EosAbortOperator(_TargetHooks, BaseOperator):
    """Abort the window's live attempts: mark them aborted and drop their
    staging (``steps.abort``). The window stays planned and can be run again.

    Used as the teardown of the window's task group: it runs whether the window
    failed or not (after a successful commit it finds nothing live, or only a
    zombie attempt, which it aborts), and being a teardown it does not hide a
    failure: the DAG run still ends failed.
    """

    template_fields: Sequence[str] = ("pipeline", "window_start", "window_end")
    ui_color = "#f4e6e6"

    def __init__(
        self,
        *,
        pipeline: str,
        target: TargetSpec,
        window_start: str = DATA_INTERVAL_START,
        window_end: str = DATA_INTERVAL_END,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.pipeline = pipeline
        self.target = as_spec(target)
        self.window_start = window_start
        self.window_end = window_end

    def execute(self, context) -> list[int]:
        from airflow_eos import steps

        window = Window(self.pipeline, str(self.window_start), str(self.window_end))
        return steps.abort(self.sink, window, f"aborted by {self.task_id} of run {context['run_id']}")
