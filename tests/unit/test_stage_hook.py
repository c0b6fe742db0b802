"""The stage task's Spark hook without Spark: a stand-in ``spark-submit`` on the
PATH prints what the stage job prints. The job's report and error reach the
task through the hook's public output callback, the provider's hook still runs
the command and fails it; the local-mode reading of a connection."""

from __future__ import annotations

import json
import os
import stat
from datetime import datetime, timezone

import pytest

from airflow_eos import PostgresTarget
from airflow_eos.core.attempt import Attempt
from airflow_eos.core.windows import PartitionRange, Window, WindowPlan

T0 = datetime(2026, 1, 1, tzinfo=timezone.utc)
WINDOW = Window("p", T0, datetime(2026, 1, 1, 1, tzinfo=timezone.utc))
PLAN = WindowPlan(WINDOW, (PartitionRange("orders", 0, 0, 10),))
ERROR = {"error": "StageFailed", "message": "the stage job of p e3 failed: AttemptFenced: a newer attempt",
         "cause": "AttemptFenced"}


@pytest.fixture
def spark_submit(tmp_path, monkeypatch):
    """A ``spark-submit`` first on the PATH that echoes its arguments, then
    prints ``EOS_OUTPUT`` and exits with ``EOS_EXIT``; a cluster connection
    (not local mode, so the job's environment keeps this PATH)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    script = bin_dir / "spark-submit"
    script.write_text('#!/bin/sh\necho "ARGS $*"\nprintf "%s\\n" "$EOS_OUTPUT"\nexit "$EOS_EXIT"\n')
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_CLUSTER", json.dumps(
        {"conn_type": "spark", "host": "spark://127.0.0.1", "port": 7077, "extra": {"deploy-mode": "client"}}))

    def run(output: str, exit_code: int):
        from airflow_eos.hooks.spark_stage import EosSparkStageHook

        hook = EosSparkStageHook("spark_cluster", env_vars={"EOS_OUTPUT": output, "EOS_EXIT": str(exit_code)})
        attempt = Attempt("p", WINDOW.start, WINDOW.end, 3, "s3")
        return hook.run(PLAN, attempt, target=PostgresTarget("postgresql://u@127.0.0.1/db", "t"), sink=None,
                        kafka_config={"bootstrap.servers": "127.0.0.1:1"}, transform=None,
                        max_records_per_task=10, max_bad_records=0)

    return run


def test_the_jobs_report_line_is_the_hooks_result(spark_submit):
    assert spark_submit('EOS_STAGE_REPORT {"rows_staged": 7}', 0) == {"rows_staged": 7}
    assert spark_submit("no report here", 0) is None  # e.g. cluster deploy mode: the checkpoint still holds it


def test_the_jobs_error_line_is_the_headline_and_spark_submits_failure_follows(spark_submit):
    from airflow.sdk.exceptions import AirflowException, AirflowFailException

    with pytest.raises(AirflowFailException) as caught:  # AttemptFenced: no retry can cure it
        spark_submit("EOS_STAGE_ERROR " + json.dumps(ERROR), 1)
    headline, *rest = str(caught.value).splitlines()
    assert headline == ERROR["message"]
    assert rest[0].startswith("(spark-submit of the stage job of") and "Cannot execute: spark-submit" in rest[0]
    with pytest.raises(AirflowException, match="^Cannot execute: spark-submit") as plain:  # no job error: as it was
        spark_submit("something else went wrong", 1)
    assert not isinstance(plain.value, AirflowFailException)


def test_the_hook_hands_every_output_line_to_its_callback(spark_submit, monkeypatch):
    from airflow_eos.hooks.spark_stage import EosSparkSubmitHook

    lines: list[str] = []
    hook = EosSparkSubmitHook(conn_id="spark_cluster", application_args=["--plan", "x"],
                              env_vars={"EOS_OUTPUT": "hello", "EOS_EXIT": "0"}, on_output_line=lines.append)
    hook.submit("job.py")
    args, said = (line.strip() for line in lines)
    assert args.startswith("ARGS --master spark://127.0.0.1:7077 ") and args.endswith(" job.py --plan x"), args
    assert said == "hello"


def test_spark_submit_puts_the_kafka_connector_beside_the_users_jars(spark_submit, monkeypatch):
    from airflow_eos.hooks.spark_stage import EosSparkStageHook
    from airflow_eos.spark.connector import connector_jars, kafka_connector_jars

    hook = EosSparkStageHook("spark_cluster", spark_submit_args={"jars": "/opt/mine.jar"})
    jars = hook._submit_args()["jars"].split(",")
    assert jars == ["/opt/mine.jar", *connector_jars()]
    assert EosSparkStageHook("spark_cluster")._submit_args()["jars"].split(",") == connector_jars()
    assert set(kafka_connector_jars()) <= set(connector_jars())


@pytest.mark.parametrize("connection, local", [
    ({"conn_type": "spark", "host": "local[2]"}, True),
    ({"conn_type": "spark", "host": "local"}, True),
    ({"conn_type": "spark", "host": "spark://127.0.0.1", "port": 7077}, False),
    ({"conn_type": "spark", "host": "yarn"}, False),
    (None, False),  # no such connection: the provider submits to YARN
])
def test_local_mode_is_read_from_the_connection_as_the_provider_reads_its_master(connection, local, monkeypatch):
    from airflow_eos.hooks.spark_stage import runs_in_local_mode

    if connection is not None:
        monkeypatch.setenv("AIRFLOW_CONN_SPARK_T", json.dumps(connection))
    assert runs_in_local_mode("spark_t") is local
