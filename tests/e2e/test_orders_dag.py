"""The example DAGs through real Airflow (dag.test), real Spark (spark-submit,
local[2]; the tests of commits, clears and reruns on the session's warm Spark
Connect server, tests/e2e/conftest.py), the real broker and PostgreSQL. Exactly-once is shown by lineage with
the auditor: every source record of the committed windows is published once or
is a dead letter, nothing twice, nothing else."""

from __future__ import annotations

import itertools
import json
import runpy
from datetime import datetime, timedelta, timezone
from pathlib import Path

import psycopg
import pytest

from airflow_eos import PostgresTarget
from airflow_eos.core.ledger import Ledger
from airflow_eos.verify import verify
from airflow_eos.core.windows import to_millis

from harness.dags import register_dag, run_window, states
from harness.topics import recreate_topic

pytestmark = pytest.mark.slow

DAGS = Path(__file__).resolve().parents[2] / "dags"
T0 = datetime(2026, 3, 1, tzinfo=timezone.utc)
HOUR = timedelta(hours=1)
_runs = itertools.count()


@pytest.fixture
def run_after():
    """Manual run ids derive from run_after: one fixed value per window of a test
    makes a second run of the window a clear of the same run; a new base per test
    keeps tests from clearing each other's runs in the shared Airflow DB."""
    base = datetime(2026, 4, 1, tzinfo=timezone.utc) + next(_runs) * timedelta(days=1)
    return lambda h: base + h * timedelta(minutes=1)


def load_dag(name: str):
    return runpy.run_path(str(DAGS / f"{name}.py"))["dag"]


def fresh_topic(topics, name: str, partitions: int = 4) -> None:
    """The example DAGs read fixed topic names; give this test its own copy."""
    recreate_topic(topics.bootstrap, name, partitions)
    topics.created.append(name)


def produce_orders(topics, hours: int, per_hour: int = 400) -> dict:
    """Order events over ``hours`` hours plus one record after them (so the last
    window closes); every 50th record is malformed. Returns counts per window."""
    records, good, bad = [], {}, {}
    for h in range(hours):
        for i in range(per_hour):
            ts = to_millis(T0 + h * HOUR) + i * (3_600_000 // per_hour)
            n = h * per_hour + i
            value = b"{not json" if n % 50 == 7 else json.dumps(
                {"order_id": f"o-{n}", "customer": f"c-{n % 13}", "amount": round(n * 0.37, 2)}).encode()
            records.append((n % 4, ts, value))
            counts = bad if n % 50 == 7 else good
            counts[h] = counts.get(h, 0) + 1
    for p in range(4):  # every partition passes the last window's end
        records.append((p, to_millis(T0 + hours * HOUR) + 1000, json.dumps(
            {"order_id": f"late-{p}", "customer": "x", "amount": 1}).encode()))
    topics.produce("orders", records)
    return {"good": good, "bad": bad}


def audit(pg_url, kafka_config, table="analytics.orders", pipeline="orders_hourly", **kwargs):
    report = verify(Ledger(pg_url), kafka_config, PostgresTarget(pg_url, table), pipeline, **kwargs)
    assert report.clean, str(report)
    return report


def sql(pg_url, query, *args):
    with psycopg.connect(pg_url) as conn:
        return conn.execute(query, args).fetchall()


def window_date(h: int) -> datetime:
    """The logical date whose data interval is [T0 + h, T0 + h + 1)."""
    return T0 + (h + 1) * HOUR


def test_consecutive_windows_publish_every_record_once(airflow_connections, kafka_config, topics, run_after):
    three_consecutive_windows_publish_every_record_once(airflow_connections, kafka_config, topics, run_after)


def three_consecutive_windows_publish_every_record_once(pg_url, kafka_config, topics, run_after,
                                                       dag_id="orders_hourly", table="analytics.orders") -> None:
    """Three hourly windows of an example DAG (its pipeline is its dag_id), each
    run once: audited by lineage."""
    fresh_topic(topics, "orders")
    counts = produce_orders(topics, hours=3)
    dag = load_dag(dag_id)

    for h in range(3):
        run = run_window(dag, window_date(h), run_after(h))
        assert run.state == "success", states(run)

    report = audit(pg_url, kafka_config, table=table, pipeline=dag_id)
    assert report.committed_windows == 3
    by_window = {w.window_start: w for w in report.windows}
    for h in range(3):
        w = by_window[T0 + h * HOUR]
        assert (w.published_rows, w.dead_letters) == (counts["good"][h], counts["bad"][h])
        assert (w.duplicates, w.missing, w.extra) == (0, 0, 0)
    # offsets advanced to the end of the third window on every partition
    offsets = dict(sql(pg_url, 'SELECT partition, "offset" FROM eos.partition_offsets'))
    assert offsets == {p: 300 for p in range(4)}


def test_stage_failing_on_its_first_try_is_retried_and_commits_once(
        airflow_connections, kafka_config, topics, monkeypatch, tmp_path, run_after):
    pg_url = airflow_connections
    fresh_topic(topics, "orders")
    produce_orders(topics, hours=1)
    monkeypatch.setenv("EOS_FAULTS", "stage.mid_write=raise*1")  # one Spark task fails, once
    monkeypatch.setenv("EOS_FAULTS_STATE", str(tmp_path))

    run = run_window(load_dag("orders_hourly"), window_date(0), run_after(0))
    stage_retried_once_then_committed(run, pg_url, kafka_config)


def stage_retried_once_then_committed(run, pg_url, kafka_config):
    """The run succeeded on the stage's second try: the failed try's attempt was
    fenced, then aborted by the teardown, the retry committed, no staging is
    left, and the audit is clean. Returns the audit."""
    assert run.state == "success", states(run)
    stage = next(ti for ti in run.get_task_instances() if ti.task_id == "window.stage")
    assert stage.try_number == 2
    assert sql(pg_url, "SELECT epoch, state FROM eos.attempts ORDER BY epoch") == [(1, "aborted"), (2, "committed")]
    assert sql(pg_url, "SELECT count(*) FROM pg_tables WHERE schemaname = 'eos_staging'") == [(0,)]
    return audit(pg_url, kafka_config)


def test_failure_after_staging_fails_the_run_and_a_clear_reruns_it_exactly_once(
        airflow_connections, kafka_config, topics, monkeypatch, run_after, spark_connect):
    pg_url = airflow_connections
    fresh_topic(topics, "orders")
    produce_orders(topics, hours=1)
    dag = load_dag("orders_hourly")

    monkeypatch.setenv("EOS_FAULTS", "commit.after_publish=raise")  # every commit try fails mid-transaction
    run = run_window(dag, window_date(0), run_after(0))
    assert run.state == "failed", states(run)
    assert states(run)["window.commit"] == "failed" and states(run)["window.abort"] == "success"
    assert sql(pg_url, "SELECT count(*) FROM analytics.orders") == [(0,)]  # nothing visible
    assert sql(pg_url, "SELECT state FROM eos.attempts") == [("aborted",)]  # abort cleaned up
    assert sql(pg_url, "SELECT count(*) FROM pg_tables WHERE schemaname = 'eos_staging'") == [(0,)]

    monkeypatch.delenv("EOS_FAULTS")
    rerun = run_window(dag, window_date(0), run_after(0))  # the UI's Clear of the run
    assert rerun.run_id == run.run_id and rerun.state == "success", states(rerun)
    assert sql(pg_url, "SELECT epoch, state FROM eos.attempts ORDER BY epoch") == [(1, "aborted"), (2, "committed")]
    audit(pg_url, kafka_config)


def test_clearing_a_committed_window_skips_by_default(airflow_connections, kafka_config, topics, run_after,
                                                      spark_connect):
    pg_url = airflow_connections
    fresh_topic(topics, "orders")
    produce_orders(topics, hours=1)
    dag = load_dag("orders_hourly")
    assert run_window(dag, window_date(0), run_after(0)).state == "success"
    before = sql(pg_url, "SELECT * FROM analytics.orders ORDER BY eos_partition, eos_offset")

    rerun = run_window(dag, window_date(0), run_after(0))
    assert rerun.state == "success", states(rerun)
    # No attempt, no Spark job: the stage says who committed the window; the checkpoint and the commit
    # are skipped, so no Asset event tells downstream DAGs that the table changed (it did not).
    tis = {ti.task_id: ti for ti in rerun.get_task_instances()}
    assert {t: tis[f"window.{t}"].state for t in ("stage", "await_checkpoint", "commit", "abort")} == {
        "stage": "skipped", "await_checkpoint": "skipped", "commit": "skipped", "abort": "success"}, states(rerun)
    summary = tis["window.stage"].xcom_pull(task_ids="window.stage")
    assert (summary["outcome"], summary["epoch"], summary["committed_epoch"]) == ("skipped", None, 1)
    assert sql(pg_url, "SELECT * FROM analytics.orders ORDER BY eos_partition, eos_offset") == before
    assert sql(pg_url, "SELECT epoch, state FROM eos.attempts ORDER BY epoch") == [(1, "committed")]
    audit(pg_url, kafka_config)


def test_clearing_a_committed_aggregate_window_replaces_its_counts(airflow_connections, kafka_config, topics,
                                                                  run_after, spark_connect):
    pg_url = airflow_connections
    fresh_topic(topics, "events", partitions=2)
    records = [(i % 2, to_millis(T0) + i * 9_000, b"e") for i in range(400)]  # 400 records in one hour
    records += [(p, to_millis(T0 + HOUR) + 5, b"e") for p in range(2)]
    topics.produce("events", records)
    dag = load_dag("events_per_minute")

    assert run_window(dag, window_date(0), run_after(0)).state == "success"
    counts = sql(pg_url, "SELECT minute, events FROM analytics.events_per_minute ORDER BY minute")
    assert sum(n for _, n in counts) == 400 and len(counts) == 60

    rerun = run_window(dag, window_date(0), run_after(0))
    assert rerun.state == "success", states(rerun)
    summary = next(ti for ti in rerun.get_task_instances() if ti.task_id == "window.commit").xcom_pull(
        task_ids="window.commit")
    assert (summary["outcome"], summary["committed_epoch"]) == ("replaced", 2)
    assert sql(pg_url, "SELECT minute, events FROM analytics.events_per_minute ORDER BY minute") == counts
    audit(pg_url, kafka_config, table="analytics.events_per_minute", pipeline="events_per_minute",
          count_column="events")


def test_a_zombie_stage_attempt_is_never_published(airflow_connections, kafka_config, topics, run_after,
                                                   spark_connect):
    """A stage attempt whose task Airflow lost track of (a zombie) runs its real
    spark-submit to the end and checkpoints; then the window runs in Airflow (its
    stage on the Spark Connect server): the
    new attempt fences the zombie, commits, and the teardown aborts the zombie.
    The zombie's late prepare and commit are refused; only the new attempt's rows
    are published, once."""
    import os
    import subprocess
    import sys

    from airflow_eos.core.errors import AttemptClosed, AttemptFenced
    from airflow_eos.core.plan import PlanRequest, plan_window
    from airflow_eos.core.source import KafkaLog
    from airflow_eos.core.windows import Window
    from airflow_eos.examples.transforms import ORDERS_TABLE_DDL
    from airflow_eos.spark.connector import kafka_connector_jars
    from airflow_eos.spark.submit import stage_job_environment, stage_job_path

    pg_url = airflow_connections
    fresh_topic(topics, "orders")
    counts = produce_orders(topics, hours=1)
    with psycopg.connect(pg_url) as conn:
        conn.execute(ORDERS_TABLE_DDL)
    ledger = Ledger(pg_url)
    ledger.migrate()
    with KafkaLog(kafka_config) as log:
        plan = plan_window(ledger, log, PlanRequest(Window("orders_hourly", T0, T0 + HOUR), ("orders",)))
    spec = PostgresTarget(pg_url, "analytics.orders")
    target = spec.sink()
    zombie = target.begin(plan.window)
    proc = subprocess.run(
        [os.path.join(os.path.dirname(sys.executable), "spark-submit"), "--master", "local[2]",
         "--conf", "spark.ui.enabled=false", "--jars", ",".join(kafka_connector_jars()), stage_job_path(),
         "--plan", plan.to_json(),
         "--attempt", json.dumps(zombie.to_dict()), "--max-records-per-task", "1000000",
         "--max-bad-records", "100", "--transform", "airflow_eos.examples.transforms:orders"],
        env={**os.environ, **stage_job_environment(spec, kafka_config, local=True)},
        capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    assert sql(pg_url, "SELECT state FROM eos.attempts") == [("checkpointed",)]

    run = run_window(load_dag("orders_hourly"), window_date(0), run_after(0))
    assert run.state == "success", states(run)
    assert sql(pg_url, "SELECT epoch, state FROM eos.attempts ORDER BY epoch") == [(1, "aborted"), (2, "committed")]
    with pytest.raises((AttemptFenced, AttemptClosed)):
        target.prepare(zombie)
    # the window is committed and on_committed="skip": the zombie's commit publishes nothing
    late = target.commit(zombie)
    assert (late.outcome, late.changed, late.committed_epoch) == ("skipped", False, 2)
    with pytest.raises((AttemptFenced, AttemptClosed)):
        PostgresTarget(pg_url, "analytics.orders", on_committed="replace").sink().commit(zombie)
    report = audit(pg_url, kafka_config)
    assert report.totals.published_rows == counts["good"][0]
    assert report.totals.dead_letters == counts["bad"][0]


def test_a_second_dag_sharing_the_pipeline_id_is_refused_at_its_first_plan_naming_both(
        airflow_connections, kafka_config, topics, run_after, capfd, spark_connect):
    """orders_hourly copied into a DAG for another topic without changing the
    pipeline id: its plan fails at once (no retry), naming both DAGs, for the
    window orders_hourly already committed (a Clear there) as for a new one;
    nothing of it is frozen, staged or published, and orders_hourly stays clean."""
    from airflow.sdk import DAG
    from airflow.timetables.interval import CronDataIntervalTimetable

    from airflow_eos import KafkaSource, exactly_once_window

    pg_url = airflow_connections
    fresh_topic(topics, "orders")
    fresh_topic(topics, "orders_eu")
    produce_orders(topics, hours=2)
    assert run_window(load_dag("orders_hourly"), window_date(0), run_after(0)).state == "success"
    published = sql(pg_url, "SELECT * FROM analytics.orders ORDER BY eos_partition, eos_offset")

    with DAG("orders_hourly_eu", schedule=CronDataIntervalTimetable("0 * * * *", timezone="UTC"), start_date=T0,
             catchup=False, default_args={"retries": 2, "retry_delay": timedelta(seconds=0)}) as copy:
        exactly_once_window(pipeline="orders_hourly", source=KafkaSource(topics=["orders_eu"]),
                            transform="airflow_eos.examples.transforms:orders",
                            target=PostgresTarget(table="analytics.orders"))
    register_dag(copy)
    for h in (0, 1):
        capfd.readouterr()
        run = run_window(copy, window_date(h), run_after(10 + h))
        task_log = "".join(capfd.readouterr())  # dag.test prints the task's failure
        assert run.state == "failed", states(run)
        plan_ti = next(ti for ti in run.get_task_instances() if ti.task_id == "window.plan")
        assert (str(plan_ti.state), plan_ti.try_number) == ("failed", 1)  # terminal: not retried
        assert states(run)["window.stage"] == "upstream_failed" and states(run)["window.abort"] != "success"
        assert ("two DAGs share pipeline id 'orders_hourly': DAG 'orders_hourly' (topics orders) claimed it "
                "first, and DAG 'orders_hourly_eu' (topics orders_eu) plans it now") in task_log

    assert sql(pg_url, "SELECT pipeline, dag_id, topics, target FROM eos.pipelines") == [
        ("orders_hourly", "orders_hourly", ["orders"], "postgresql:analytics.orders")]
    assert sql(pg_url, "SELECT window_start FROM eos.windows") == [(T0,)]  # window 1 not frozen by the copy
    assert sql(pg_url, "SELECT epoch, state FROM eos.attempts") == [(1, "committed")]
    assert sql(pg_url, "SELECT * FROM analytics.orders ORDER BY eos_partition, eos_offset") == published
    audit(pg_url, kafka_config)
