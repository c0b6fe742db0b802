"""A target is a serialisable spec that builds its Sink (core/target.py); the
stage job's error and report lines (spark/submit.py); terminal errors (issue 17)."""

from __future__ import annotations

import json

import pytest

from airflow_eos.core.errors import AttemptFenced, ConfigurationError, EosError, SourceUnavailable, error_class
from airflow_eos.core.target import ConnectionRef, TargetSpec, as_spec, target_from_dict
from airflow_eos.targets.postgres import PostgresTarget


def test_a_spec_travels_as_one_dict_and_comes_back_equal():
    spec = PostgresTarget(table="analytics.orders", mode="upsert", key=("id",), columns=("id", "amount"),
                          on_committed="replace", postgres_conn_id="pg")
    data = spec.to_dict()
    assert data["kind"] == "postgres" and data["url"] is None  # unbound: names its connection, holds no secret
    json.dumps(data)
    assert target_from_dict(json.loads(json.dumps(data))) == spec
    assert as_spec(data) == spec and as_spec(spec) is spec


def test_a_spec_names_its_connections_and_binds_to_their_values():
    spec = PostgresTarget(table="t", postgres_conn_id="pg")
    assert spec.connections() == (ConnectionRef("ledger", "postgres", "pg"),)
    assert not spec.bound
    with pytest.raises(ConfigurationError, match="no database URL"):
        spec.sink()
    bound = spec.bind({"ledger": "postgresql://u:pw@h/db"})
    assert bound.bound and bound.connections() == () and bound.sink().url == "postgresql://u:pw@h/db"
    assert target_from_dict(bound.to_dict()).sink().url == "postgresql://u:pw@h/db"  # the stage job's environment


def test_unknown_kinds_and_non_specs_are_refused_with_what_to_do():
    with pytest.raises(ConfigurationError, match=r"unknown target kind 'lake'.*'postgres'.*entry point group"):
        target_from_dict({"kind": "lake", "path": "/x"})
    with pytest.raises(ConfigurationError, match="needs its 'kind'"):
        target_from_dict({"table": "t"})
    with pytest.raises(ConfigurationError, match="must be a target spec such as PostgresTarget.*not str"):
        as_spec("analytics.orders")


def test_a_url_in_a_dag_is_refused_by_the_spec_itself():
    PostgresTarget(table="t", postgres_conn_id="pg").check_for_dag()
    with pytest.raises(ConfigurationError, match="not a URL"):
        PostgresTarget("postgresql://u:pw@h/db", "t").check_for_dag()


def test_every_spec_is_a_target_spec_with_identity_and_asset():
    spec = PostgresTarget(table='"My Schema".Orders', postgres_conn_id="pg")
    assert isinstance(spec, TargetSpec)
    assert spec.target_id == 'postgresql:"My Schema".orders'
    assert spec.label == '"My Schema".Orders'
    assert spec.ledger_conn_id == "pg"
    with pytest.raises(ConfigurationError, match="no database URL"):
        spec.asset_uri  # the host is the connection's: known once it is resolved


def test_the_asset_uri_is_the_postgres_providers_and_holds_no_secret():
    bound = PostgresTarget(table='"My Schema".Orders').with_url("postgresql://eos:s3cret@db.example:6543/shop")
    assert bound.asset_uri == "postgres://db.example:6543/shop/My%20Schema/orders"
    assert PostgresTarget(table="orders").with_url("postgresql://u:pw@h/db").asset_uri == "postgres://h:5432/db/public/orders"
    assert PostgresTarget(table="a.b").with_url("host=h port=7 dbname=d password=pw").asset_uri == "postgres://h:7/d/a/b"


def test_errors_say_whether_a_retry_can_help():
    assert AttemptFenced.terminal and ConfigurationError.terminal
    assert not SourceUnavailable.terminal and not EosError.terminal
    assert error_class("AttemptFenced") is AttemptFenced and error_class("NoSuchError") is None


def test_the_stage_jobs_lines_carry_its_error_with_terminality_and_its_report():
    from airflow_eos.spark.stage import StageFailed
    from airflow_eos.spark.submit import error_line, job_error, job_report, report_line

    fenced = job_error("noise " + error_line(StageFailed("the stage job of w attempt 1 failed: fenced",
                                                         error="AttemptFenced")))
    assert fenced.headline == "the stage job of w attempt 1 failed: fenced" and fenced.terminal
    lost = job_error(error_line(SourceUnavailable("broker down")))
    assert lost.headline == "SourceUnavailable: broker down" and not lost.terminal
    assert job_error("an ordinary line") is None
    assert job_report(report_line({"rows_staged": 3})) == {"rows_staged": 3}
    assert job_report("EOS_STAGE_REPORT not json") is None


def test_a_stage_jobs_error_line_is_read_when_the_jvms_log_continues_it_before_its_newline():
    """spark-submit merges the JVM's log into the driver's output: a log line can follow the error's
    JSON on the same line (seen in CI: the headline became spark-submit's 'Cannot execute')."""
    from airflow_eos.spark.submit import StageJobOutput, error_line, report_line

    output = StageJobOutput()
    output.read(error_line(TypeError("Object of type DataFrame is not JSON serializable"))
                + "26/11/29 09:14:43 INFO SparkContext: SparkContext is stopping with exitCode 0.")
    assert output.error.headline == "TypeError: Object of type DataFrame is not JSON serializable"
    output.read(report_line({"rows_staged": 3}) + "26/11/29 INFO ShutdownHookManager: Shutdown hook called")
    assert output.report == {"rows_staged": 3}


def test_the_stage_job_writes_each_protocol_line_with_its_newline_in_one_write(monkeypatch):
    """Two writes (print's line, then its newline) let the JVM's log in between when Spark runs the
    driver unbuffered."""
    import io

    from airflow_eos.spark import job

    writes = []

    class Unbuffered(io.TextIOBase):
        def write(self, text):
            writes.append(text)
            return len(text)

    monkeypatch.setattr(job.sys, "stdout", Unbuffered())
    job._say("EOS_STAGE_ERROR {}")
    assert writes == ["EOS_STAGE_ERROR {}\n"]
