"""Lineage and Asset events of a real window (issue 21, parts 1 and 2): the
example DAG ``orders_hourly`` through real Airflow (dag.test), real Spark, the
real broker and PostgreSQL, with the OpenLineage provider's file transport.

- OpenLineage: the stage and the commit report the topic in (kafka://broker,
  with the records read) and the table out (postgres://host:port,
  db.schema.table, with the rows published), and the window as a run facet.
- Asset events mean "the target changed": the commit that published emits one
  (on the Postgres provider's URI of the table, the commit's summary as extra),
  and it queues the DAG scheduled on the pipeline's alias; a Clear of the
  committed window and a rerun of its commit task emit none (asset_event rows
  are counted in Airflow's database)."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone

import pytest
from psycopg.conninfo import conninfo_to_dict

from harness.dags import register_dag, run_window, states
from test_orders_dag import T0, audit, fresh_topic, load_dag, produce_orders, window_date

pytestmark = pytest.mark.slow


@pytest.fixture
def run_after():
    """The run_after of window ``h``'s manual run: the same again is a Clear of that run."""
    return lambda h: datetime(2026, 9, 1, tzinfo=timezone.utc) + h * timedelta(minutes=1)


@pytest.fixture
def lineage_events(tmp_path, monkeypatch):
    """OpenLineage events of the tasks run from now on, read from the file transport."""
    log = tmp_path / "openlineage.jsonl"
    monkeypatch.setenv("AIRFLOW__OPENLINEAGE__TRANSPORT",
                       json.dumps({"type": "file", "log_file_path": str(log), "append": True}))
    monkeypatch.setenv("AIRFLOW__OPENLINEAGE__NAMESPACE", "eos-test")
    # The provider's plugin registers its listener when plugins load, only if a transport was configured
    # then; this process loaded them before this test configured one.
    from airflow.providers.openlineage.plugins.listener import get_openlineage_listener
    from airflow.sdk.listener import get_listener_manager

    listener = get_openlineage_listener()
    get_listener_manager().add_listener(listener)

    def read(job: str, event_type: str = "COMPLETE") -> list[dict]:
        events = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
        return [e for e in events if e["job"]["name"] == job and e["eventType"] == event_type]

    yield read
    get_listener_manager().pm.unregister(listener)


def asset_events(uri: str) -> list[dict]:
    """The extras of the Asset events of ``uri`` in Airflow's database."""
    from airflow.models.asset import AssetEvent, AssetModel
    from airflow.utils.session import create_session
    from sqlalchemy import select

    with create_session() as session:
        return [e.extra for e in session.scalars(
            select(AssetEvent).join(AssetModel, AssetEvent.asset_id == AssetModel.id).where(AssetModel.uri == uri)
            .order_by(AssetEvent.id))]


def queued_runs(dag_id: str) -> int:
    """Asset-triggered runs of ``dag_id`` waiting for the scheduler."""
    from airflow.models.asset import AssetDagRunQueue
    from airflow.utils.session import create_session
    from sqlalchemy import func, select

    with create_session() as session:
        return session.scalar(select(func.count()).select_from(AssetDagRunQueue)
                              .where(AssetDagRunQueue.target_dag_id == dag_id))


def test_a_window_reports_its_lineage_and_announces_only_a_change(
        airflow_connections, kafka_config, kafka, topics, run_after, lineage_events):
    from airflow.sdk import DAG

    from airflow_eos import PostgresTarget
    from airflow_eos.operators.eos import EosCommitOperator
    from airflow_eos.window import target_alias

    pg_url = airflow_connections
    pg = conninfo_to_dict(pg_url)
    table_uri = f"postgres://{pg['host']}:{pg['port']}/{pg['dbname']}/analytics/orders"
    target = PostgresTarget(table="analytics.orders")
    fresh_topic(topics, "orders")
    counts = produce_orders(topics, hours=1)
    records, published = counts["good"][0] + counts["bad"][0], counts["good"][0]
    with DAG("orders_downstream", schedule=[target_alias("orders_hourly", target)], start_date=T0) as downstream:
        pass
    register_dag(downstream)
    dag = load_dag("orders_hourly")

    run = run_window(dag, window_date(0), run_after(0))
    assert run.state == "success", states(run)
    audit(pg_url, kafka_config)
    attempt = run.get_task_instance("window.stage").xcom_pull(task_ids="window.stage")  # before a Clear replaces it

    # OpenLineage: the topic in, the table out, as the Kafka and Postgres providers name them.
    kafka_in = {"namespace": f"kafka://{kafka.address}", "name": "orders"}
    table_out = {"namespace": f"postgres://{pg['host']}:{pg['port']}", "name": f"{pg['dbname']}.analytics.orders"}
    [stage] = lineage_events("orders_hourly.window.stage")
    [commit] = lineage_events("orders_hourly.window.commit")
    for event in (stage, commit):
        [source] = event["inputs"]
        assert {k: source[k] for k in kafka_in} == kafka_in, source
        assert source["inputFacets"]["inputStatistics"]["rowCount"] == records
        [out] = event["outputs"]
        assert {k: out[k] for k in table_out} == table_out, out
    assert "outputStatistics" not in stage["outputs"][0].get("outputFacets", {})  # staged is not published
    assert commit["outputs"][0]["outputFacets"]["outputStatistics"]["rowCount"] == published
    window = {"pipeline": "orders_hourly", "windowStart": T0.isoformat(), "windowEnd": (T0 + timedelta(hours=1))
              .isoformat(), "epoch": 1}
    assert {k: stage["run"]["facets"]["eosWindow"][k] for k in window} == window
    facet = commit["run"]["facets"]["eosWindow"]
    assert {k: facet[k] for k in window} == window
    assert (facet["outcome"], facet["publishedRows"], facet["announce"]) == ("published", published, True)
    [start] = lineage_events("orders_hourly.window.commit", "START")  # before the commit: no statistics yet
    assert start["outputs"][0]["name"] == table_out["name"] and not start["outputs"][0].get("outputFacets")
    assert not [d for e in (stage, commit) for d in e["inputs"] + e["outputs"] if "@" in d["namespace"]]  # no user

    # One Asset event, on the table's standard URI, the commit's summary as its extra; downstream is queued.
    [event] = asset_events(table_uri)
    assert (event["outcome"], event["epoch"], event["published_rows"], event["announce"]) == (
        "published", 1, published, True)
    assert queued_runs("orders_downstream") == 1

    # A Clear of the committed window: nothing staged, the commit skipped, no event.
    rerun = run_window(dag, window_date(0), run_after(0))
    assert rerun.state == "success" and states(rerun)["window.commit"] == "skipped", states(rerun)
    # The commit task run again on the committed attempt (a Clear of the commit task alone): a no-op, no event.
    with DAG("orders_commit_again", schedule=None, start_date=T0) as again:
        EosCommitOperator(task_id="commit", target=target, attempt=attempt,
                          outlets=[target_alias("orders_hourly", target)])
    register_dag(again)
    noop = again.test(logical_date=window_date(0))
    assert noop.state == "success", states(noop)
    summary = noop.get_task_instance("commit").xcom_pull(task_ids="commit")
    assert (summary["outcome"], summary["announce"]) == ("already_committed", False)
    assert len(asset_events(table_uri)) == 1 and queued_runs("orders_downstream") == 1
    [noop_lineage] = lineage_events("orders_commit_again.commit")
    assert noop_lineage["outputs"][0]["outputFacets"]["outputStatistics"]["rowCount"] == 0
    audit(pg_url, kafka_config)
