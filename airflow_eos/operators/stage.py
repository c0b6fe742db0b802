"""The stage step of a window: open a new attempt and run the Spark job for it (``steps.stage``)."""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from functools import cached_property
from typing import TYPE_CHECKING, Any

from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook
from airflow.sdk import BaseOperator, BaseXCom
from airflow.sdk.exceptions import AirflowSkipException
from airflow_eos.core.attempt import Attempt
from airflow_eos.core.source import KafkaSource
from airflow_eos.core.target import DEFAULT_CONN_IDS, SPARK, TargetSpec, as_spec
from airflow_eos.core.windows import WindowPlan
from airflow_eos.operators.base import TargetHooks
from airflow_eos.spark.submit import DEFAULT_READER, READERS
from airflow_eos.spark.transform import check_transform, parse_transform

# The hooks and the steps are imported when a task runs: they load the Kafka and
# Postgres providers' clients, which parsing a DAG must not.
if TYPE_CHECKING:
    from airflow_eos.hooks.eos import EosKafkaHook
    from airflow_eos.hooks.spark_stage import EosSparkStageHook

# The Spark provider's spark-submit arguments this operator passes through to its hook (executor_memory,
# packages, deploy_mode, ...): every SparkSubmitHook argument but those it sets itself or takes by name.
SPARK_SUBMIT_ARGUMENTS = frozenset(inspect.signature(SparkSubmitHook.__init__).parameters) - {
    "self", "conn_id", "conf", "env_vars", "application_args", "py_files", "name"}


class EosSparkStageOperator(TargetHooks, BaseOperator):
    """Open a new attempt of the window (fencing every older one) and run the
    PySpark stage job for it: read exactly the planned ranges, apply the
    transform, stage the rows, write the checkpoint (``steps.stage``).

    ``conn_id`` chooses where the job runs (``hooks/spark_stage.py``):

    - a ``spark`` connection: ``spark-submit`` of the stage job through the
      Spark provider's SparkSubmitHook (local mode or a cluster; ``conf``,
      ``executor_memory``, ... and every other argument of that hook pass
      through). Each window pays a spark-submit and a driver JVM start (~5–10 s,
      more on a busy machine);
    - a ``spark_connect`` connection: the job runs on that Spark Connect
      server's warm driver, this task being its client (no JVM in the Airflow
      worker). The server needs airflow-eos installed for its Python workers;
      ``conf`` is applied to the job's session (SQL settings only).

    Returns the attempt with the job's report (XCom: ``steps.Staged``) for the
    checkpoint sensor and the commit.

    :param plan: the plan task's XCom (templated); parsed once, into ``window_plan``
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
    :param reader: how the job reads the plan: ``"python"`` (the eos_kafka Python data source
        over confluent-kafka, the default) or ``"spark"`` (Spark's own Kafka source)
    :param conn_id: a ``spark`` or a ``spark_connect`` connection
    :param conf: Spark settings (templated)
    :param name: the Spark application's name (templated)
    :param py_files: files spark-submit ships to the job (templated)
    :param env_vars: more environment of spark-submit (templated)
    :param kwargs: BaseOperator's arguments, and SparkSubmitHook's (``SPARK_SUBMIT_ARGUMENTS``, templated)
    """

    template_fields: Sequence[str] = ("plan", "transform", "conf", "name", "py_files", "env_vars",
                                      "spark_submit_args")
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
        reader: str = DEFAULT_READER,
        conn_id: str = DEFAULT_CONN_IDS[SPARK],
        conf: dict[str, Any] | None = None,
        name: str = "airflow-eos-stage",
        py_files: str | None = None,
        env_vars: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        spark_submit_args = {key: kwargs.pop(key) for key in list(kwargs) if key in SPARK_SUBMIT_ARGUMENTS}
        super().__init__(**kwargs)
        if not isinstance(source, KafkaSource):
            raise TypeError(f"source must be a KafkaSource, not {type(source).__name__}")
        if transform is not None and "{{" not in transform:  # a template is checked once rendered
            parse_transform(transform)
        if max_records_per_task < 1 or max_bad_records < 0:
            raise ValueError("max_records_per_task must be >= 1 and max_bad_records >= 0")
        if reader not in READERS:
            raise ValueError(f"reader must be one of {list(READERS)}, got {reader!r}")
        self.plan = plan
        self.source = source
        self.target = as_spec(target)
        self.transform = transform
        self.max_records_per_task = max_records_per_task
        self.max_bad_records = max_bad_records
        self.reader = reader
        self.conn_id = conn_id
        self.conf = conf
        self.name = name
        self.py_files = py_files
        self.env_vars = env_vars
        self.spark_submit_args = spark_submit_args

    @cached_property
    def window_plan(self) -> WindowPlan:
        """The plan task's XCom, parsed once: everything below takes a WindowPlan."""
        return WindowPlan.from_dict(self.plan)

    @cached_property
    def spark_hook(self) -> "EosSparkStageHook":
        from airflow_eos.hooks.spark_stage import EosSparkStageHook

        return EosSparkStageHook(self.conn_id, conf=self.conf, env_vars=self.env_vars,
                                 spark_submit_args={"name": self.name, "py_files": self.py_files,
                                                    **self.spark_submit_args})

    @cached_property
    def kafka_hook(self) -> "EosKafkaHook":
        from airflow_eos.hooks.eos import EosKafkaHook

        return EosKafkaHook(kafka_config_id=self.source.kafka_conn_id)

    @cached_property
    def kafka_config(self) -> dict[str, Any]:
        return {**self.kafka_hook.kafka_config, **self.source.reader_config}

    @cached_property
    def registry_config(self) -> dict[str, Any] | None:
        """An Avro source's schema registry settings (None: raw values)."""
        if not self.source.is_avro:
            return None
        from airflow_eos.hooks.schema_registry import EosSchemaRegistryHook

        return EosSchemaRegistryHook(self.source.schema_registry_conn_id).registry_config

    def execute(self, context) -> dict:
        from airflow_eos import steps
        from airflow_eos.hooks.eos import failing_terminally

        # Before an attempt is opened and ~20 s of spark-submit are spent on a job that cannot load it.
        check_transform(self.transform, shipped=bool(self.py_files))
        plan = self.window_plan
        self.log.info("staging %s: the job runs %s", plan.window, self.spark_hook.runs_on)  # before an attempt opens
        with failing_terminally():
            staged = steps.stage(self.sink, plan, lambda attempt: self._run_job(plan, attempt))
        self._staged = staged.to_dict()
        if staged.attempt is None:
            # Committed already and the target skips reruns: the checkpoint, the commit and whatever follows
            # them are skipped (no Asset event: the target did not change); the XCom says who committed it.
            context["ti"].xcom_push(key=BaseXCom.XCOM_RETURN_KEY, value=staged.to_dict())
            raise AirflowSkipException(staged.committed.describe())
        return staged.to_dict()

    def _run_job(self, plan: WindowPlan, attempt: Attempt) -> dict | None:
        return self.spark_hook.run(plan, attempt, target=self.target_hook.bound, sink=self.sink,
                                   kafka_config=self.kafka_config, transform=self.transform,
                                   max_records_per_task=self.max_records_per_task,
                                   max_bad_records=self.max_bad_records, reader=self.reader,
                                   registry_config=self.registry_config)

    def on_kill(self) -> None:
        self.spark_hook.on_kill()

    def get_openlineage_facets_on_start(self):
        from airflow_eos.operators.lineage import stage_lineage

        return stage_lineage(self)

    def get_openlineage_facets_on_complete(self, task_instance):
        from airflow_eos.operators.lineage import stage_lineage

        return stage_lineage(self, getattr(self, "_staged", None))
