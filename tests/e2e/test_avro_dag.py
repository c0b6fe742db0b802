"""The example DAG orders_hourly_avro through real Airflow (dag.test), the
session's warm Spark Connect server, the broker, PostgreSQL and the schema
registry (Apicurio Registry, started by the harness): a topic of Avro orders of
two writer schemas with poisoned records of each kind (harness.avro), audited by
lineage: every good record published once as decoded under the reader schema,
every poisoned one a dead letter with its reason, ``airflow-eos verify`` clean."""

from __future__ import annotations

import io
import itertools
import json
from datetime import datetime, timedelta, timezone

import pytest

from airflow_eos.cli import main as cli
from airflow_eos.core.windows import to_millis

from harness.avro import NOT_WIRE_FORMAT, UNKNOWN_SCHEMA, UNRESOLVABLE, avro_orders
from harness.dags import run_window, states
from test_orders_dag import HOUR, T0, audit, fresh_topic, load_dag, sql, window_date

pytestmark = pytest.mark.slow

PIPELINE = "orders_hourly_avro"
TOPIC = "orders_avro"
TABLE = "analytics.orders_avro"
PARTITIONS = 3
_runs = itertools.count()


@pytest.fixture
def run_after():
    """One fixed run_after per window of a test (a second run is a Clear of the
    same run); a base of its own per test, apart from the other DAG tests'."""
    base = datetime(2026, 11, 1, tzinfo=timezone.utc) + next(_runs) * timedelta(days=1)
    return lambda h: base + h * timedelta(minutes=1)


@pytest.fixture
def registry_connection(airflow_connections, schema_registry, monkeypatch):
    """schema_registry_default: the session's registry, by its whole URL."""
    monkeypatch.setenv("AIRFLOW_CONN_SCHEMA_REGISTRY_DEFAULT", json.dumps(
        {"conn_type": "eos_schema_registry", "host": schema_registry.address}))
    return schema_registry.address


def produce_avro_orders(topics, registry_url: str, hours: int, per_hour: int = 130):
    """``hours`` hours of Avro orders round-robin over the partitions, then one
    record per partition after them (so the last window closes)."""
    stamps = [(n % PARTITIONS, to_millis(T0 + h * HOUR) + i * (3_600_000 // per_hour))
              for h in range(hours) for i in range(per_hour) for n in [h * per_hour + i]]
    stamps += [(p, to_millis(T0 + hours * HOUR) + 1_000) for p in range(PARTITIONS)]
    orders = avro_orders(registry_url, TOPIC, stamps)
    topics.produce(TOPIC, orders.records)
    return orders


def window_offsets(pg_url) -> set[tuple[int, int]]:
    """(partition, offset) of every record in the committed windows' frozen ranges."""
    return {(partition, offset) for partition, start, end in sql(
        pg_url, "SELECT r.partition, r.start_offset, r.end_offset FROM eos.window_ranges r JOIN eos.windows w"
                " USING (pipeline, window_start) WHERE r.pipeline = %s AND w.state = 'committed'", PIPELINE)
        for offset in range(start, end)}


def verify_cli(pg_url, kafka_config, monkeypatch) -> str:
    monkeypatch.setenv("EOS_POSTGRES_URL", pg_url)
    monkeypatch.setenv("EOS_KAFKA_BOOTSTRAP", kafka_config["bootstrap.servers"])
    out, err = io.StringIO(), io.StringIO()
    code = cli(["verify", "--pipeline", PIPELINE, "--table", TABLE], out=out, err=err)
    assert (code, err.getvalue()) == (0, ""), out.getvalue()
    return out.getvalue()


def test_avro_windows_publish_every_good_record_once_and_dead_letter_each_poisoned_one(
        airflow_connections, registry_connection, kafka_config, topics, run_after, spark_connect, monkeypatch):
    pg_url = airflow_connections
    fresh_topic(topics, TOPIC, partitions=PARTITIONS)
    orders = produce_avro_orders(topics, registry_connection, hours=2)
    dag = load_dag(PIPELINE)
    for h in range(2):
        run = run_window(dag, window_date(h), run_after(h))
        assert run.state == "success", states(run)

    report = audit(pg_url, kafka_config, table=TABLE, pipeline=PIPELINE)
    assert report.committed_windows == 2
    decoded, poisoned = orders.lineage(window_offsets(pg_url))
    assert len(decoded) + len(poisoned) == 2 * 130
    assert set(poisoned.values()) == {NOT_WIRE_FORMAT, UNKNOWN_SCHEMA, UNRESOLVABLE}
    published = {(p, o): {"id": i, "amount": a, "note": n} for p, o, i, a, n in sql(
        pg_url, f"SELECT eos_partition, eos_offset, id, amount, note FROM {TABLE}")}
    assert published == decoded  # each good record once, as the reader schema (V2) decodes it
    dead = {(p, o): error for p, o, error in sql(
        pg_url, 'SELECT partition, "offset", error FROM eos.dead_letters WHERE pipeline = %s', PIPELINE)}
    assert dead.keys() == poisoned.keys()
    assert all(reason in dead[key] for key, reason in poisoned.items()), dead
    assert (report.totals.published_rows, report.totals.dead_letters) == (len(decoded), len(poisoned))

    out = verify_cli(pg_url, kafka_config, monkeypatch)
    assert "CLEAN: every record of 2 committed window(s) is published exactly once or is a dead letter" in out
