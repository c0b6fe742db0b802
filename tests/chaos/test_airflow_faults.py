"""The one fault point only the Airflow layer reaches: ``commit.after_commit``
sits in EosCommitOperator, between the commit transaction and the offsets
mirror / Asset event. Through real Airflow (dag.test) and spark-submit: the
commit task fails right after committing, its retry finds the window
committed, and still mirrors the offsets and emits the Asset event; the data
is published once. (The rest of the real Airflow path, retries, fail + clear,
skip and replace reruns, is tests/e2e.)
"""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta, timezone

import psycopg
import pytest

from airflow_eos.core.attempt import load_offsets
from airflow_eos.core.ledger import Ledger
from airflow_eos.verify import verify
from harness import chaos
from harness.chaos import HOUR, T0, Verdict
from harness.dags import register_dag, set_airflow_connections

pytestmark = pytest.mark.slow


@pytest.fixture
def connections(airflow_db, pg_url, kafka, monkeypatch):
    set_airflow_connections(monkeypatch, pg_url, kafka.address)
    return pg_url


def asset_events(uri: str) -> list[dict]:
    from airflow.models.asset import AssetEvent, AssetModel
    from airflow.utils.session import create_session
    from sqlalchemy import select

    with create_session() as session:
        return [e.extra for e in session.scalars(
            select(AssetEvent).join(AssetModel, AssetEvent.asset_id == AssetModel.id).where(AssetModel.uri == uri))]


def test_commit_task_failing_after_its_commit_retries_mirrors_and_emits_once(
        connections, kafka, tmp_path, monkeypatch, tally):
    from airflow.sdk import DAG
    from airflow.timetables.interval import CronDataIntervalTimetable

    from airflow_eos import KafkaSource, PostgresTarget, exactly_once_window

    pg_url = connections
    name = f"chaos_after_commit_{uuid.uuid4().hex[:6]}"
    topic = f"chaos-af-{uuid.uuid4().hex[:6]}"
    group = f"eos-mirror-{name}"
    chaos.create_topic(kafka.address, topic, 2)
    chaos.produce(kafka.address, topic, chaos.source_records(1, 12, 2))
    Ledger(pg_url).migrate()
    chaos.create_target_table(pg_url, f"chaos.{name}")
    target = PostgresTarget(table=f"chaos.{name}")
    with DAG(name, schedule=CronDataIntervalTimetable("0 * * * *", timezone="UTC"), start_date=T0, catchup=False,
             default_args={"retries": 1, "retry_delay": timedelta(seconds=0)}) as dag:
        exactly_once_window(pipeline=name, source=KafkaSource(topics=[topic]), target=target,
                            transform="harness.chaos:spark_transform", max_bad_records=1_000,
                            mirror_group_id=group)
    register_dag(dag)

    monkeypatch.setenv("EOS_FAULTS", "commit.after_commit=raise*1")
    monkeypatch.setenv("EOS_FAULTS_STATE", str(tmp_path))
    run = dag.test(logical_date=T0 + HOUR, run_after=datetime(2026, 6, 1, tzinfo=timezone.utc))
    monkeypatch.delenv("EOS_FAULTS")
    tis = {ti.task_id: ti for ti in run.get_task_instances()}
    assert run.state == "success", {k: str(ti.state) for k, ti in tis.items()}
    assert (tmp_path / "commit.after_commit.0").exists()
    commit = tis["window.commit"]
    assert commit.try_number == 2
    assert commit.xcom_pull(task_ids="window.commit")["outcome"] == "already_committed"

    with psycopg.connect(pg_url) as conn:
        ledger_offsets = load_offsets(conn, name)
        assert conn.execute("SELECT epoch, state FROM eos.attempts WHERE pipeline = %s", (name,)).fetchall() == [
            (1, "committed")]
    assert ledger_offsets and chaos.mirrored_offsets(
        {"bootstrap.servers": kafka.address}, group, sorted(ledger_offsets)) == ledger_offsets
    # The first try committed and died before announcing it: its retry is the one Asset event, on the
    # Postgres provider's URI of the table.
    events = asset_events(target.with_url(pg_url).asset_uri)
    assert [(e["outcome"], e["announce"]) for e in events] == [("already_committed", True)]

    report = verify(Ledger(pg_url), {"bootstrap.servers": kafka.address}, target.with_url(pg_url), name)
    assert report.clean and report.committed_windows == 1, str(report)
    t = report.totals
    assert t.kafka_records == t.published_rows + t.dead_letters and (t.duplicates, t.missing, t.extra) == (0, 0, 0)
    tally.add(Verdict(report, 1, 1, 1))
