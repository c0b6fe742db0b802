"""The example DAG orders_hourly_iceberg through real Airflow (dag.test), real
Spark (spark-submit for the first case; the session's warm Spark Connect
server for the others, tests/e2e/conftest.py), the real broker and PostgreSQL
(the ledger and the table's SQL catalog, or the session's Iceberg REST
catalog; the table's files in a directory, or on the session's S3 endpoint,
written by Spark through s3a): each window one snapshot of an Apache Iceberg
table. Every case
ends audited by ``verify`` and by the table read back as its readers read it
(pyiceberg's scan of the current snapshot): every record of the committed
windows' frozen ranges once, except the dead letters, nothing else."""

from __future__ import annotations

import itertools
import json
import uuid
from collections import Counter
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone

import pytest

from airflow_eos import IcebergTarget
from airflow_eos.core.ledger import Ledger
from airflow_eos.verify import verify
from harness.dags import register_dag, run_window, states
from harness.iceberg import catalog as load_catalog
from harness.iceberg import rest_catalog_properties
from harness.iceberg import rows as table_rows
from test_files_dag import commit_summary, expected_lineage, skipped_rerun_summary
from test_orders_dag import HOUR, T0, fresh_topic, load_dag, produce_orders, sql, window_date

pytestmark = pytest.mark.slow

PIPELINE = "orders_hourly_iceberg"
TABLE = "analytics.orders"
_runs = itertools.count()


@pytest.fixture
def run_after():
    base = datetime(2026, 8, 1, tzinfo=timezone.utc) + next(_runs) * timedelta(days=1)
    return lambda h: base + h * timedelta(minutes=1)


@pytest.fixture
def warehouse(tmp_path, monkeypatch):
    """The example DAG's warehouse, this test's own (read when the DAG file is parsed)."""
    monkeypatch.setenv("EOS_ORDERS_ICEBERG_WAREHOUSE", str(tmp_path / "warehouse"))
    return tmp_path / "warehouse"


@dataclass(frozen=True)
class Catalog:
    """The example DAG's catalog in this test: its table, the catalog
    connection the DAG names (None: the SQL catalog in the ledger's database)
    and that connection's properties."""

    table: str = TABLE
    conn_id: str | None = None
    properties: dict | None = None

    def target(self) -> IcebergTarget:
        return IcebergTarget(table=self.table, catalog_conn_id=self.conn_id, catalog_properties=self.properties)


@pytest.fixture
def catalog(request, monkeypatch, pg_url, warehouse) -> Catalog:
    """The ledger's SQL catalog; or (``indirect`` parameter "rest") the
    session's REST catalog through an Airflow connection, with a table of
    this test's own (the REST catalog outlives the test); or ("s3") the
    ledger's SQL catalog through a connection that gives the session's S3
    endpoint, the table's location on it. Read when the DAG file is parsed."""
    kind = getattr(request, "param", "sql")
    if kind == "sql":
        return Catalog()
    if kind == "rest":
        extras = properties = rest_catalog_properties(request.getfixturevalue("iceberg_rest").address)
        table = f"analytics_{uuid.uuid4().hex[:12]}.orders"
    else:
        from airflow_eos.targets.iceberg.table import ledger_catalog_properties
        s3 = request.getfixturevalue("s3")
        extras = {"type": "sql", **s3.io_properties()}  # the keys: in the connection, never in the DAG
        properties = {**ledger_catalog_properties(pg_url), **extras}
        monkeypatch.setenv("EOS_ORDERS_ICEBERG_WAREHOUSE", f"{s3.create_bucket('lake')}/{uuid.uuid4().hex}")
        table = TABLE
    conn_id = f"iceberg_{kind}"
    monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", json.dumps({"conn_type": "generic", "extra": extras}))
    monkeypatch.setenv("EOS_ORDERS_ICEBERG_CATALOG", conn_id)
    monkeypatch.setenv("EOS_ORDERS_ICEBERG_TABLE", table)
    return Catalog(table, conn_id, properties)


def audit(pg_url, kafka_config, pipeline=PIPELINE, catalog: Catalog = Catalog()):
    report = verify(Ledger(pg_url), kafka_config, catalog.target(), pipeline)
    assert report.clean, str(report)
    return report


def assert_read_back_exactly(pg_url, pipeline=PIPELINE, catalog: Catalog = Catalog()) -> list[dict]:
    """The table as pyiceberg reads it: each good record of the committed windows once."""
    rows = table_rows(pg_url, catalog.table, catalog.properties)
    seen = [(r["eos_topic"], r["eos_partition"], r["eos_offset"]) for r in rows]
    assert max(Counter(seen).values(), default=1) == 1, "a record published twice"
    assert sorted(seen) == expected_lineage(pg_url, pipeline)
    return rows


def snapshots(pg_url, catalog: Catalog = Catalog()) -> list[dict]:
    table = load_catalog(pg_url, catalog.properties).load_table(catalog.table)
    return [{"operation": s.summary.operation.value, **s.summary.additional_properties}
            for s in table.metadata.snapshots]


@pytest.mark.parametrize("catalog", ["sql", "rest", "s3"], indirect=True)
def test_windows_are_committed_once_each_in_one_snapshot(airflow_connections, kafka_config, topics, run_after,
                                                        warehouse, catalog):
    pg_url = airflow_connections
    fresh_topic(topics, "orders")
    counts = produce_orders(topics, hours=2)
    dag = load_dag(PIPELINE)
    for h in range(2):
        run = run_window(dag, window_date(h), run_after(h))
        assert run.state == "success", states(run)

    report = audit(pg_url, kafka_config, catalog=catalog)
    assert report.committed_windows == 2 and report.lineage
    by_window = {w.window_start: w for w in report.windows}
    for h in range(2):
        assert (by_window[T0 + h * HOUR].published_rows, by_window[T0 + h * HOUR].dead_letters) == (
            counts["good"][h], counts["bad"][h])
    rows = assert_read_back_exactly(pg_url, catalog=catalog)
    assert len(rows) == counts["good"][0] + counts["good"][1]
    assert sorted(rows[0]) == sorted(["order_id", "customer", "amount", "eos_topic", "eos_partition", "eos_offset"])
    appends = [s for s in snapshots(pg_url, catalog) if s["operation"] == "append"]
    assert [(s["eos.pipeline"], s["eos.window-start"], s["eos.epoch"]) for s in appends] == [
        (PIPELINE, (T0 + h * HOUR).isoformat(), "1") for h in range(2)]
    assert dict(sql(pg_url, 'SELECT partition, "offset" FROM eos.partition_offsets')) == {p: 200 for p in range(4)}


def test_a_stage_failing_on_its_first_try_is_retried_and_commits_once(
        airflow_connections, kafka_config, topics, monkeypatch, tmp_path, run_after, warehouse, spark_connect):
    pg_url = airflow_connections
    fresh_topic(topics, "orders")
    produce_orders(topics, hours=1)
    monkeypatch.setenv("EOS_FAULTS", "stage.mid_write=raise*1")  # the first job fails after writing its rows
    monkeypatch.setenv("EOS_FAULTS_STATE", str(tmp_path / "faults"))
    (tmp_path / "faults").mkdir()

    run = run_window(load_dag(PIPELINE), window_date(0), run_after(0))
    assert run.state == "success", states(run)
    stage = next(ti for ti in run.get_task_instances() if ti.task_id == "window.stage")
    assert stage.try_number == 2
    assert sql(pg_url, "SELECT epoch, state FROM eos.attempts ORDER BY epoch") == [(1, "aborted"), (2, "committed")]
    audit(pg_url, kafka_config)
    assert_read_back_exactly(pg_url)
    eos_dir = warehouse / "analytics" / "orders" / "data" / "eos"
    assert sorted(p.name for p in eos_dir.iterdir()) == [
        sql(pg_url, "SELECT staging_table FROM eos.attempts WHERE epoch = 2")[0][0]]  # the aborted one's deleted


@pytest.mark.parametrize("catalog", ["sql", "rest"], indirect=True)
def test_a_failed_window_publishes_nothing_and_a_clear_reruns_it_exactly_once(
        airflow_connections, kafka_config, topics, monkeypatch, run_after, warehouse, spark_connect, catalog):
    pg_url = airflow_connections
    fresh_topic(topics, "orders")
    produce_orders(topics, hours=1)
    dag = load_dag(PIPELINE)

    monkeypatch.setenv("EOS_FAULTS", "commit.before_publish=raise")  # every commit try fails before its decision
    run = run_window(dag, window_date(0), run_after(0))
    assert run.state == "failed", states(run)
    assert states(run)["window.commit"] == "failed" and states(run)["window.abort"] == "success"
    assert table_rows(pg_url, catalog.table, catalog.properties) == [] and snapshots(pg_url, catalog) == []  # nothing visible, no snapshot
    assert sql(pg_url, "SELECT state FROM eos.attempts") == [("aborted",)]

    monkeypatch.delenv("EOS_FAULTS")
    rerun = run_window(dag, window_date(0), run_after(0))  # the UI's Clear of the run
    assert rerun.run_id == run.run_id and rerun.state == "success", states(rerun)
    assert sql(pg_url, "SELECT epoch, state FROM eos.attempts ORDER BY epoch") == [(1, "aborted"), (2, "committed")]
    audit(pg_url, kafka_config, catalog=catalog)
    assert_read_back_exactly(pg_url, catalog=catalog)


def test_clearing_a_committed_window_skips_by_default(airflow_connections, kafka_config, topics, run_after,
                                                      warehouse, spark_connect):
    pg_url = airflow_connections
    fresh_topic(topics, "orders")
    produce_orders(topics, hours=1)
    dag = load_dag(PIPELINE)
    assert run_window(dag, window_date(0), run_after(0)).state == "success"
    before = snapshots(pg_url)

    rerun = run_window(dag, window_date(0), run_after(0))
    assert rerun.state == "success", states(rerun)
    assert skipped_rerun_summary(rerun)["committed_epoch"] == 1
    assert snapshots(pg_url) == before  # no snapshot
    audit(pg_url, kafka_config)
    assert_read_back_exactly(pg_url)


def test_clearing_a_committed_window_with_replace_overwrites_it_in_one_snapshot(
        airflow_connections, kafka_config, topics, run_after, warehouse, spark_connect):
    """The same pipeline in a DAG whose IcebergTarget has on_committed='replace':
    a Clear of the committed window takes the old attempt's files out and puts
    the new one's in, in one overwrite snapshot; the window's rows are there once."""
    from airflow.sdk import DAG
    from airflow.timetables.interval import CronDataIntervalTimetable

    from airflow_eos import KafkaSource, exactly_once_window

    pg_url = airflow_connections
    fresh_topic(topics, "orders")
    produce_orders(topics, hours=1)
    load_dag(PIPELINE)  # its create_table task is not run here: make the table as it does
    from harness.iceberg import create_table
    import pyarrow as pa
    create_table(pg_url, TABLE, warehouse, pa.schema([
        ("order_id", pa.string()), ("customer", pa.string()), ("amount", pa.decimal128(12, 2)),
        ("eos_topic", pa.string()), ("eos_partition", pa.int32()), ("eos_offset", pa.int64())]))
    with DAG("orders_hourly_iceberg_replace", schedule=CronDataIntervalTimetable("0 * * * *", timezone="UTC"),
             start_date=T0, catchup=False, default_args={"retries": 1, "retry_delay": timedelta(seconds=0)}) as dag:
        exactly_once_window(pipeline="orders_iceberg_replace", source=KafkaSource(topics=["orders"]),
                            transform="airflow_eos.examples.transforms:orders",
                            target=IcebergTarget(table=TABLE, on_committed="replace"), max_bad_records=1_000)
    register_dag(dag)

    assert run_window(dag, window_date(0), run_after(0)).state == "success"
    rerun = run_window(dag, window_date(0), run_after(0))
    assert rerun.state == "success", states(rerun)
    summary = commit_summary(rerun)
    assert (summary["outcome"], summary["committed_epoch"]) == ("replaced", 2)
    assert [(s["operation"], s["eos.epoch"]) for s in snapshots(pg_url)] == [("append", "1"), ("overwrite", "2")]
    audit(pg_url, kafka_config, pipeline="orders_iceberg_replace")
    assert_read_back_exactly(pg_url, pipeline="orders_iceberg_replace")
