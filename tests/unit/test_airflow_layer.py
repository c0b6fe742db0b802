"""The Airflow shell: task group shape, validation at construction, templating,
trigger serialisation, hooks. Pure construction; the e2e tests run it for real."""

from __future__ import annotations

import importlib
import json
import os
import re
import subprocess
import sys
from datetime import datetime, timedelta, timezone

import pytest

from airflow.sdk import DAG, AssetAlias
from airflow.timetables.interval import CronDataIntervalTimetable
from airflow_eos import KafkaSource, PostgresTarget, exactly_once_window
from airflow_eos.core.errors import ConfigurationError
from airflow_eos.operators.eos import EosPlanWindowOperator, EosSparkStageOperator
from airflow_eos.triggers.eos import CheckpointTrigger, WindowClosedTrigger

T0 = datetime(2026, 1, 1, tzinfo=timezone.utc)
SOURCE = KafkaSource(topics=["orders"])
TARGET = PostgresTarget(table="analytics.orders")


def make_dag(**kwargs):
    with DAG("d", schedule=CronDataIntervalTimetable("0 * * * *", timezone="UTC"), start_date=T0) as dag:
        group = exactly_once_window(pipeline="orders_hourly", source=SOURCE, target=TARGET,
                                    transform="pkg.mod:fn", **kwargs)
    return dag, group


def test_task_group_has_the_five_steps_in_order_with_abort_as_teardown():
    dag, group = make_dag()
    ids = {t.task_id.split(".")[-1]: t for t in dag.tasks}
    assert set(ids) == {"plan", "stage", "await_checkpoint", "commit", "abort"}
    assert ids["stage"].upstream_task_ids == {"window.plan"}
    assert ids["await_checkpoint"].upstream_task_ids == {"window.stage"}
    assert ids["commit"].upstream_task_ids == {"window.await_checkpoint", "window.stage"}
    abort = ids["abort"]
    assert abort.is_teardown and ids["plan"].is_setup
    assert "window.commit" in abort.upstream_task_ids
    [alias] = ids["commit"].outlets  # the event goes through an alias: emitted only when the table changed
    assert isinstance(alias, AssetAlias) and alias.name == "eos:orders_hourly:analytics.orders"
    # Concurrent first events of a new Asset collide in Airflow's API server, which fails one committed task
    assert ids["commit"].max_active_tis_per_dag == 1


def test_window_comes_from_the_data_interval_and_fields_are_templated():
    dag, _ = make_dag()
    plan = dag.get_task("window.plan")
    assert plan.window_start == "{{ data_interval_start }}" and plan.window_end == "{{ data_interval_end }}"
    assert {"pipeline", "topics", "window_start", "window_end"} <= set(plan.template_fields)
    stage = dag.get_task("window.stage")
    assert {"plan", "transform", "conf", "env_vars", "py_files", "spark_submit_args"} <= set(stage.template_fields)
    assert stage.spark_hook.application.endswith("airflow_eos/spark/job.py")


def test_the_skew_rule_reaches_the_planner_and_its_trigger():
    dag, _ = make_dag(max_timestamp_skew=timedelta(minutes=30), on_skewed_timestamp="position", deferrable=True)
    plan = dag.get_task("window.plan")
    assert (plan.max_timestamp_skew, plan.on_skewed_timestamp) == (timedelta(minutes=30), "position")
    kwargs = WindowClosedTrigger(poll_interval=5, **plan._plan_kwargs).serialize()[1]
    assert (kwargs["max_timestamp_skew_seconds"], kwargs["on_skewed_timestamp"]) == (1800.0, "position")
    dag, _ = make_dag()  # the defaults: an hour, and fail
    plan = dag.get_task("window.plan")
    assert (plan.max_timestamp_skew, plan.on_skewed_timestamp) == (timedelta(hours=1), "fail")


def test_waiting_steps_defer_or_reschedule():
    dag, _ = make_dag(deferrable=True)
    assert dag.get_task("window.plan").deferrable and dag.get_task("window.await_checkpoint").deferrable
    dag, _ = make_dag()
    assert dag.get_task("window.plan").mode == "reschedule"


def test_the_waits_default_to_airflows_default_deferrable():
    """``[operators] default_deferrable`` (read when the operators' module is
    imported, as every provider's operators read it) makes plan and
    await_checkpoint defer, in the task group and built by hand."""
    code = """if True:
        from airflow.sdk import DAG
        from airflow_eos import KafkaSource, PostgresTarget, exactly_once_window
        from airflow_eos.operators.eos import EosPlanWindowOperator
        from airflow_eos.sensors.eos import EosCheckpointSensor
        target = PostgresTarget(table="t")
        with DAG("d", schedule=None) as dag:
            exactly_once_window(pipeline="p", source=KafkaSource(topics=["a"]), target=target)
            plan = EosPlanWindowOperator(task_id="plan", pipeline="p", topics=["a"])
            sensor = EosCheckpointSensor(task_id="wait", target=target, attempt={})
        print([dag.get_task(t).deferrable for t in ("window.plan", "window.await_checkpoint", "plan", "wait")])
    """
    for configured, expected in (("True", "[True, True, True, True]"), ("False", "[False, False, False, False]")):
        env = {**os.environ, "AIRFLOW__OPERATORS__DEFAULT_DEFERRABLE": configured}
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
        assert out.returncode == 0, out.stderr[-3000:]
        assert out.stdout.strip().splitlines()[-1] == expected


@pytest.mark.parametrize("kwargs, error", [
    ({"target": PostgresTarget("postgresql://u:pw@h/db", "t")}, "postgres_conn_id, not a URL"),
    ({"pipeline": "bad pipeline; drop"}, "pipeline id"),
    ({"source": "orders"}, "KafkaSource"),
    ({"max_timestamp_skew": 3600}, r"max_timestamp_skew of pipeline 'p' must be a positive timedelta, got 3600"),
    ({"on_skewed_timestamp": "ignore"}, r"on_skewed_timestamp of pipeline 'p' must be 'fail' or 'position'"),
])
def test_bad_arguments_fail_when_the_dag_is_parsed(kwargs, error):
    args = {"pipeline": "p", "source": SOURCE, "target": TARGET, **kwargs}
    with DAG("d2", schedule=None, start_date=T0):
        with pytest.raises(ConfigurationError, match=error):
            exactly_once_window(**args)


def test_operators_validate_their_arguments():
    with DAG("d3", schedule=None, start_date=T0):
        with pytest.raises(ValueError, match="not the string"):
            EosPlanWindowOperator(task_id="p", pipeline="p", topics="orders")
        with pytest.raises(ConfigurationError, match=r"max_timestamp_skew of task 'p' must be a positive"):
            EosPlanWindowOperator(task_id="p", pipeline="p", topics=["orders"], max_timestamp_skew=timedelta(0))
        with pytest.raises(ValueError, match="module:function"):
            EosSparkStageOperator(task_id="s", plan={}, source=SOURCE, target=TARGET, transform="nocolon")
    with pytest.raises(ConfigurationError, match="empty"):
        KafkaSource(topics=[])
    with pytest.raises(ConfigurationError, match="table"):
        PostgresTarget(table="")


def test_the_plan_claims_the_pipeline_for_its_dag_topics_and_target():
    dag, _ = make_dag()
    kwargs = dag.get_task("window.plan")._plan_kwargs
    assert {k: kwargs[k] for k in ("pipeline", "topics", "dag_id", "target_id", "target_exclusive",
                                   "postgres_conn_id")} == {
        "pipeline": "orders_hourly", "topics": ["orders"], "dag_id": "d", "target_id": "postgresql:analytics.orders",
        "target_exclusive": False, "postgres_conn_id": "postgres_default"}
    # a trigger deferred with them carries them as plain values
    classpath, serialised = WindowClosedTrigger(poll_interval=5, **kwargs).serialize()
    assert json.loads(json.dumps(serialised)) == {"poll_interval": 5, **kwargs}

    partitioned = PostgresTarget(table="analytics.orders_p", mode="partition_per_window", postgres_conn_id="pg")
    with DAG("hand_built", schedule=None, start_date=T0):
        with_target = EosPlanWindowOperator(task_id="p1", pipeline="p", topics=["a"], target=partitioned)
        without = EosPlanWindowOperator(task_id="p2", pipeline="p", topics=["a"])  # as before: no target
        with pytest.raises(ValueError, match="ledger lives in the target's database"):
            EosPlanWindowOperator(task_id="p3", pipeline="p", topics=["a"], target=partitioned,
                                  postgres_conn_id="other")
    assert {k: with_target._plan_kwargs[k] for k in ("dag_id", "target_id", "target_exclusive", "postgres_conn_id")} \
        == {"dag_id": "hand_built", "target_id": "postgresql:analytics.orders_p", "target_exclusive": True,
            "postgres_conn_id": "pg"}
    assert {k: without._plan_kwargs[k] for k in ("dag_id", "target_id", "target_exclusive", "postgres_conn_id")} \
        == {"dag_id": "hand_built", "target_id": None, "target_exclusive": False,
            "postgres_conn_id": "postgres_default"}


@pytest.mark.parametrize("error, message", [("OwnershipConflict", "two DAGs share"),
                                            ("SkewedTimestamp", "orders[1] offset 10 is stamped 2030")])
def test_a_terminal_plan_error_from_the_trigger_fails_the_plan_without_retries(error, message):
    from airflow.sdk.exceptions import AirflowException, AirflowFailException
    from airflow_eos.core.errors import SourceUnavailable

    dag, _ = make_dag(deferrable=True)
    plan = dag.get_task("window.plan")
    with pytest.raises(AirflowFailException, match=re.escape(f"{error}: {message}")):
        plan.execute_complete({}, {"status": "error", "error": error, "message": message})
    # Other errors keep the task's retries, and reach the task with their own type and message.
    with pytest.raises(SourceUnavailable, match="^no broker$") as other:
        plan.execute_complete({}, {"status": "error", "error": "SourceUnavailable", "message": "no broker"})
    assert not isinstance(other.value, AirflowFailException)
    # The terminal one carries the original error too: its type and message are in the chain.
    with pytest.raises(AirflowFailException) as terminal:
        plan.execute_complete({}, {"status": "error", "error": error, "message": message})
    assert type(terminal.value.__cause__).__name__ == error and str(terminal.value.__cause__) == message
    with pytest.raises(AirflowException, match="Boom: odd"):  # not one of ours: said as it was
        plan.execute_complete({}, {"status": "error", "error": "Boom", "message": "odd"})


@pytest.mark.parametrize("trigger", [
    WindowClosedTrigger(poll_interval=5, pipeline="p", topics=["a"], window_start="2026-01-01T00:00:00+00:00",
                        window_end="2026-01-01T01:00:00+00:00", idle_partition_grace_seconds=300,
                        kafka_conn_id="kafka_default", postgres_conn_id="postgres_default"),
    WindowClosedTrigger(poll_interval=5, pipeline="p", topics=["a"], window_start="2026-01-01T00:00:00+00:00",
                        window_end="2026-01-01T01:00:00+00:00", idle_partition_grace_seconds=300,
                        kafka_conn_id="kafka_default", postgres_conn_id="postgres_default", dag_id="d",
                        target_id="postgresql:analytics.orders", target_exclusive=False),
    CheckpointTrigger(poll_interval=5, target={"url": None, "table": "t", "postgres_conn_id": "pg"},
                      attempt={"pipeline": "p", "epoch": 1}),
])
def test_triggers_serialise_to_plain_values_and_back(trigger):
    classpath, kwargs = trigger.serialize()
    json.dumps(kwargs)  # stored in the metadata DB as JSON
    module, _, name = classpath.rpartition(".")
    again = getattr(importlib.import_module(module), name)(**kwargs)
    assert again.serialize() == (classpath, kwargs)


def test_postgres_hook_turns_a_connection_into_a_libpq_url(monkeypatch):
    from airflow_eos.hooks.eos import EosKafkaHook, EosPostgresHook

    monkeypatch.setenv("AIRFLOW_CONN_PG_T", json.dumps({
        "conn_type": "postgres", "host": "127.0.0.1", "port": 5499, "login": "u", "password": "p w'x",
        "schema": "db", "extra": {"sslmode": "disable", "cursor": "dictcursor"}}))
    import psycopg.conninfo as ci

    parsed = ci.conninfo_to_dict(EosPostgresHook(postgres_conn_id="pg_t").ledger_url)
    assert parsed == {"host": "127.0.0.1", "port": "5499", "user": "u", "password": "p w'x", "dbname": "db",
                      "sslmode": "disable"}
    monkeypatch.setenv("AIRFLOW_CONN_KAFKA_T", json.dumps({"conn_type": "kafka",
                                                           "extra": {"bootstrap.servers": "127.0.0.1:1"}}))
    assert EosKafkaHook(kafka_config_id="kafka_t").kafka_config == {"bootstrap.servers": "127.0.0.1:1"}


def test_importing_the_package_does_not_import_airflow():
    """Spark workers import airflow_eos; they must not pay for (or need) Airflow."""
    import subprocess

    code = "import sys, airflow_eos, airflow_eos.core.plan; print('airflow' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_the_stage_runs_on_spark_connect_when_its_connection_is_a_spark_connect_one(monkeypatch):
    monkeypatch.setenv("AIRFLOW_CONN_SC_T", json.dumps(
        {"conn_type": "spark_connect", "host": "127.0.0.1", "port": 15002, "password": "s3cret"}))
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_T", json.dumps({"conn_type": "spark", "host": "local[2]"}))

    def stage(conn_id):
        return EosSparkStageOperator(task_id=f"s_{conn_id}", plan={}, source=SOURCE, target=TARGET, conn_id=conn_id)

    assert stage("sc_t").spark_hook.spark_connect_url == "sc://127.0.0.1:15002/;token=s3cret"
    assert stage("spark_t").spark_hook.spark_connect_url is None  # spark-submit, as before


@pytest.mark.parametrize("transform, headline", [
    ("nope.module:fn", "ModuleNotFoundError: No module named 'nope' (transform 'nope.module:fn': cannot import"),
    ("airflow_eos.examples.transforms:nope", "transform 'airflow_eos.examples.transforms:nope': module "
                                             "'airflow_eos.examples.transforms' has no 'nope'"),
    ("airflow_eos.examples.transforms:ORDERS_TABLE_DDL",
     "transform 'airflow_eos.examples.transforms:ORDERS_TABLE_DDL' is a str, not a function"),
])
def test_a_transform_that_cannot_load_fails_the_stage_before_anything_is_opened(transform, headline, monkeypatch):
    """Accepted at parse time (the syntax is right); the task fails at once,
    the cause first, before it reads a connection or opens an attempt."""
    import airflow_eos.hooks.eos as hooks

    monkeypatch.setattr(hooks, "resolve_target", lambda target: pytest.fail("an attempt would be opened"))
    with DAG("d4", schedule=None, start_date=T0):
        stage = EosSparkStageOperator(task_id="s", plan={}, source=SOURCE, target=TARGET, transform=transform)
    with pytest.raises(ConfigurationError) as caught:
        stage.execute(context={})
    assert str(caught.value).startswith(headline), caught.value


@pytest.mark.parametrize("transform", ["nocolon", "pkg.mod:", ":fn", "pkg mod:fn", "pkg.mod:fn()"])
def test_a_transform_name_that_is_not_module_colon_function_fails_at_parse(transform):
    with DAG("d5", schedule=None, start_date=T0):
        with pytest.raises(ConfigurationError, match="transform must be 'module:function'"):
            EosSparkStageOperator(task_id="s", plan={}, source=SOURCE, target=TARGET, transform=transform)


def test_a_transform_shipped_with_py_files_is_only_checked_where_it_can_be(caplog):
    from airflow_eos.spark.transform import check_transform

    caplog.set_level("INFO")
    check_transform("shipped_pkg.transforms:orders", shipped=True)  # not installed here: the job checks it
    assert "it ships with py_files, so the stage job loads and checks it" in caplog.text
    with pytest.raises(ConfigurationError, match="has no 'nope'"):  # installed here: checked here
        check_transform("airflow_eos.examples.transforms:nope", shipped=True)
    with pytest.raises(ConfigurationError, match="No module named 'shipped_pkg'"):
        check_transform("shipped_pkg.transforms:orders")
