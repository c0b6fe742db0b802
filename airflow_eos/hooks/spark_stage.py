"""The stage job's Spark: where a Spark connection says one attempt's job runs.

- a ``spark`` connection: ``spark-submit`` of the job file (spark/job.py, its
  contract in spark/submit.py) through the Spark provider's SparkSubmitHook, as
  :class:`EosSparkSubmitHook`, whose public output callback is how the job's
  report and error reach the task;
- a ``spark_connect`` connection: the job on that Spark Connect server's warm
  driver, this task being its client (no JVM in the Airflow worker).

Imported when the stage task runs, never while a DAG file is parsed; pyspark is
imported on the Spark Connect path only.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from functools import cached_property
from typing import TYPE_CHECKING, Any

from airflow.providers.apache.spark.hooks.spark_connect import SparkConnectHook
from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook
from airflow.sdk import BaseHook
from airflow.sdk.exceptions import AirflowException, AirflowFailException
from airflow_eos.core.attempt import Attempt
from airflow_eos.core.sink import Sink
from airflow_eos.core.target import DEFAULT_CONN_IDS, SPARK, TargetSpec
from airflow_eos.core.windows import WindowPlan
from airflow_eos.spark.connector import connector_jars
from airflow_eos.spark.submit import (
    DEFAULT_READER,
    WORKER_DAEMON_CONF,
    StageJobOutput,
    stage_job_arguments,
    stage_job_environment,
    stage_job_path,
)

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


class EosSparkSubmitHook(SparkSubmitHook):
    """The Spark provider's SparkSubmitHook, handing each line spark-submit
    writes (in client and local mode: the job driver's own output) to
    ``on_output_line`` before the provider reads and logs it.

    :param on_output_line: called with every line of spark-submit's output
    :param kwargs: the SparkSubmitHook's arguments
    """

    def __init__(self, *, on_output_line: Callable[[str], None] | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.on_output_line = on_output_line

    def _process_spark_submit_log(self, itr: Iterator[Any]) -> None:
        # The provider's one reader of spark-submit's output (driver ids, the
        # failure's tail, the log lines), kept whole: it reads the same lines.
        super()._process_spark_submit_log(self._handed_over(itr))

    def _handed_over(self, lines: Iterator[Any]) -> Iterator[Any]:
        for line in lines:
            if self.on_output_line is not None:
                self.on_output_line(line)
            yield line


def runs_in_local_mode(conn_id: str) -> bool:
    """Whether a Spark connection names Spark's local mode (``local``,
    ``local[2]``, ...), read as the Spark provider reads its master: a ``spark``
    connection's host is the master when it has no port. A connection that
    cannot be read is not local (the provider then submits to YARN)."""
    try:
        conn = BaseHook.get_connection(conn_id)
    except AirflowException:
        return False
    return conn.conn_type == "spark" and str(conn.host or "").startswith("local") and not conn.port


class EosSparkStageHook(BaseHook):
    """Runs the stage job of one attempt on the Spark that ``conn_id`` names
    (see the module docstring), and stops it when the task is killed.

    :param conn_id: a ``spark`` or a ``spark_connect`` connection
    :param conf: Spark settings: spark-submit's ``--conf``; on Spark Connect,
        set on the job's session (SQL settings only)
    :param env_vars: more environment of spark-submit (the job's own wins)
    :param spark_submit_args: more SparkSubmitHook arguments (``py_files``,
        ``executor_memory``, ...)
    """

    hook_name = "Spark stage job (airflow-eos)"
    default_conn_name = DEFAULT_CONN_IDS[SPARK]
    application = stage_job_path()

    def __init__(self, conn_id: str = DEFAULT_CONN_IDS[SPARK], *, conf: Mapping[str, Any] | None = None,
                 env_vars: Mapping[str, Any] | None = None, spark_submit_args: Mapping[str, Any] | None = None,
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.conn_id = conn_id
        self.conf = dict(conf or {})
        self.env_vars = dict(env_vars or {})
        self.spark_submit_args = dict(spark_submit_args or {})
        self._running: EosSparkSubmitHook | SparkSession | None = None

    @cached_property
    def spark_connect_url(self) -> str | None:
        """The Spark Connect URL when ``conn_id`` is a ``spark_connect`` connection, else None."""
        if SparkConnectHook.get_connection(self.conn_id).conn_type != SparkConnectHook.conn_type:
            return None
        return SparkConnectHook(conn_id=self.conn_id).get_connection_url()

    def get_conn(self) -> str | None:
        return self.spark_connect_url

    @property
    def runs_on(self) -> str:
        """Where the job runs, in words (reads the connection: a missing one fails here)."""
        if self.spark_connect_url is not None:
            return f"on the Spark Connect server {self.spark_connect_url.split(';', 1)[0]}"  # params may hold a token
        return f"by spark-submit ({self.conn_id})"

    def run(self, plan: WindowPlan, attempt: Attempt, *, target: TargetSpec, sink: Sink,
            kafka_config: Mapping[str, Any], transform: str | None, max_records_per_task: int,
            max_bad_records: int, reader: str = DEFAULT_READER,
            registry_config: Mapping[str, Any] | None = None) -> dict | None:
        """Run the stage job of ``attempt`` (open, of ``plan``'s window) into
        ``sink`` (``target``: its bound spec); return the job's report (None when
        spark-submit's output did not carry it, e.g. in cluster deploy mode).
        ``registry_config``: an Avro source's schema registry settings."""
        limits = {"max_records_per_task": max_records_per_task, "max_bad_records": max_bad_records, "reader": reader}
        if self.spark_connect_url is not None:
            return self._on_spark_connect(plan, attempt, sink, kafka_config, transform, registry_config=registry_config,
                                          **limits)
        arguments = stage_job_arguments(plan, attempt, transform=transform, **limits)
        return self._spark_submit(attempt, arguments, target, kafka_config, registry_config)

    def on_kill(self) -> None:
        """Stop the running job: spark-submit's process, or the job on the
        Spark Connect server (had it gone on, a newer attempt fences it anyway)."""
        running = self._running
        if isinstance(running, EosSparkSubmitHook):
            running.on_kill()
        elif running is not None:
            self.log.info("interrupting the stage job on the Spark Connect server")
            running.interruptAll()

    def _spark_submit(self, attempt: Attempt, arguments: list[str], target: TargetSpec,
                      kafka_config: Mapping[str, Any], registry_config: Mapping[str, Any] | None) -> dict | None:
        """The stage job by spark-submit; its report is the line it prints.
        Secrets travel in spark-submit's environment, never on its command line."""
        local = runs_in_local_mode(self.conn_id)
        conf = {**WORKER_DAEMON_CONF, **({"spark.ui.enabled": "false"} if local else {}),  # local: no web UI
                **self.conf}
        env = {**self.env_vars, **stage_job_environment(target, dict(kafka_config), local=local,
                                                        registry_config=dict(registry_config or {}))}
        output = StageJobOutput()
        self._running = EosSparkSubmitHook(conn_id=self.conn_id, conf=conf, env_vars=env, application_args=arguments,
                                           on_output_line=output.read, **self._submit_args())
        try:
            self._running.submit(self.application)
        except AirflowException as exc:
            if output.error is None:
                raise
            # The job's own error is the headline; spark-submit's (the command line and exit code) follows.
            failure = AirflowFailException if output.error.terminal else AirflowException
            raise failure(f"{output.error.headline}\n(spark-submit of the stage job of {attempt} failed: "
                          f"{exc})") from None
        finally:
            self._running = None
        return output.report

    def _submit_args(self) -> dict[str, Any]:
        """The SparkSubmitHook arguments: ``spark_submit_args`` with Spark's Kafka
        connector (and S3A) added to its ``jars`` (spark-submit ships them to a cluster's
        executors too)."""
        args = dict(self.spark_submit_args)
        args["jars"] = ",".join([*filter(None, str(args.get("jars") or "").split(",")), *connector_jars()])
        return args

    def _on_spark_connect(self, plan: WindowPlan, attempt: Attempt, sink: Sink, kafka_config: Mapping[str, Any],
                          transform: str | None, **limits: Any) -> dict:
        """The stage job on the Spark Connect server's driver, this task its client."""
        # pyspark only here: a spark-submit stage never loads it in the Airflow worker.
        from airflow_eos.spark.session import spark_session, stop_session
        from airflow_eos.spark.stage import run_stage

        self._running = session = spark_session(f"airflow-eos stage {attempt.pipeline} e{attempt.epoch}",
                                                remote=self.spark_connect_url, conf=self.conf)
        try:
            report = run_stage(session, plan, attempt, sink, kafka_config, transform, **limits)
        finally:
            stop_session(session)
            self._running = None
        return report.to_dict()
