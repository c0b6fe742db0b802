"""A target's identity is the physical thing (issue 33, item 1): two pipelines
reading one source topic and publishing into one Kafka topic are refused also
when the second names the cluster through another connection id. The identity
is resolved at plan time (``plan_or_none`` with the target's spec), the
transactional ids keep their old seed (``target_id``), and a claim recorded
before places were (migration 11) is still recognised and filled in."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone

import psycopg
import pytest

from airflow_eos.core.errors import OwnershipConflict
from airflow_eos.core.windows import Window, to_millis
from airflow_eos.targets.kafka import KafkaTarget

T0 = datetime(2026, 1, 1, tzinfo=timezone.utc)
HOUR = timedelta(hours=1)


@pytest.fixture
def connections(monkeypatch, pg_url, kafka_config):
    """Two Airflow ``kafka`` connections of one cluster, and the ledger's."""
    for conn_id in ("kafka_out_a", "kafka_out_b", "kafka_src"):
        monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", json.dumps(
            {"conn_type": "kafka", "extra": {**kafka_config, "fetch.wait.max.ms": 10}}))
    monkeypatch.setenv("AIRFLOW_CONN_LEDGER_ID", pg_url)


@pytest.fixture
def source(topics):
    topic = topics.create(prefix="src")
    topics.produce(topic, [(0, to_millis(T0) + i * 60_000, b"x") for i in range(150)])
    return topic


def plan(pipeline, source, target: KafkaTarget, start=T0, dag_id=None):
    from airflow_eos.hooks.eos import plan_or_none

    return plan_or_none(pipeline=pipeline, topics=[source], window_start=str(start),
                        window_end=str(start + HOUR), idle_partition_grace_seconds=0, kafka_conn_id="kafka_src",
                        postgres_conn_id="ledger_id", dag_id=dag_id or f"dag_{pipeline}",
                        target_id=target.target_id, target_exclusive=target.exclusive, target=target.to_dict())


def claims(pg_url):
    with psycopg.connect(pg_url) as conn:
        return conn.execute("SELECT pipeline, target, target_place FROM eos.pipelines ORDER BY 1").fetchall()


def test_one_cluster_through_two_connection_ids_is_one_target(connections, source, topics, pg_url):
    out = topics.create(prefix="out")
    first = KafkaTarget(topic=out, kafka_conn_id="kafka_out_a", postgres_conn_id="ledger_id")
    second = KafkaTarget(topic=out, kafka_conn_id="kafka_out_b", postgres_conn_id="ledger_id")
    assert first.target_id != second.target_id  # the old identity told them apart

    assert plan("copy_a", source, first) is not None
    with pytest.raises(OwnershipConflict) as refused:
        plan("copy_b", source, second)
    text = str(refused.value)
    assert "'copy_a'" in text and "'copy_b'" in text and source in text and "published twice" in text
    assert f"kafka:kafka_out_a/{out}" in text and f"kafka:kafka_out_b/{out}" in text
    place = claims(pg_url)[0][2]
    assert place is not None and place.startswith("kafka-cluster:") and place.endswith(f"/{out}")
    assert claims(pg_url) == [("copy_a", f"kafka:kafka_out_a/{out}", place)]  # nothing of copy_b recorded

    # another topic of the same cluster is another target
    other = KafkaTarget(topic=topics.create(prefix="out"), kafka_conn_id="kafka_out_b", postgres_conn_id="ledger_id")
    assert plan("copy_c", source, other) is not None


def test_transactional_ids_keep_their_seed(connections, topics, kafka_config, pg_url):
    """Windows in flight across the upgrade keep being fenced by the same
    transactional.id: it is still derived from target_id (the connection id)."""
    from airflow_eos.targets.kafka import client as kclient

    out = topics.create(prefix="out")
    sink = KafkaTarget(topic=out, kafka_config=kafka_config, ledger_url=pg_url, kafka_conn_id="kafka_out_a").sink()
    window = Window("p", T0, T0 + HOUR)
    assert sink.transactional_id(window) == kclient.transactional_id("airflow-eos", f"kafka:kafka_out_a/{out}", window)
    assert sink.claim_identity().startswith("kafka-cluster:")


def test_a_claim_recorded_before_places_is_recognised_and_filled_in(connections, source, topics, pg_url):
    out = topics.create(prefix="out")
    first = KafkaTarget(topic=out, kafka_conn_id="kafka_out_a", postgres_conn_id="ledger_id")
    assert plan("old", source, first) is not None
    with psycopg.connect(pg_url) as conn:  # as a version before migration 11 recorded it
        conn.execute("UPDATE eos.pipelines SET target_place = NULL")
    # the same connection id: recognised by the old comparison of target ids
    with pytest.raises(OwnershipConflict, match="published twice"):
        plan("new_same_id", source, first)
    # the old pipeline's next plan fills its place in; then another id of the cluster is refused too
    assert plan("old", source, first, start=T0 + HOUR) is not None
    assert claims(pg_url)[0][2] is not None
    with pytest.raises(OwnershipConflict, match="published twice"):
        plan("new_other_id", source, KafkaTarget(topic=out, kafka_conn_id="kafka_out_b", postgres_conn_id="ledger_id"))


def test_a_table_named_through_another_search_path_is_the_same_table(connections, source, pg_url, monkeypatch):
    """``orders`` through a connection whose search_path is ``analytics`` is the
    table ``analytics.orders``: the claim resolves the name in the database."""
    from psycopg.conninfo import conninfo_to_dict

    from airflow_eos.targets.postgres import PostgresTarget

    info = conninfo_to_dict(pg_url)
    monkeypatch.setenv("AIRFLOW_CONN_LEDGER_SP", json.dumps({
        "conn_type": "postgres", "host": info.get("host"), "port": int(info.get("port", 5432)),
        "login": info.get("user"), "password": info.get("password"), "schema": info.get("dbname"),
        "extra": {"options": "-csearch_path=analytics"}}))
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("CREATE SCHEMA analytics; CREATE TABLE analytics.orders (value text, eos_topic text,"
                     " eos_partition integer, eos_offset bigint, eos_pipeline text, eos_window_start timestamptz)")
    qualified = PostgresTarget(table="analytics.orders", postgres_conn_id="ledger_id")
    unqualified = PostgresTarget(table="orders", postgres_conn_id="ledger_sp")
    assert qualified.target_id != unqualified.target_id  # postgresql:public.orders, as the old identity said

    assert plan("orders_a", source, qualified) is not None
    with pytest.raises(OwnershipConflict, match="published twice"):
        plan("orders_b", source, unqualified)
    assert claims(pg_url) == [("orders_a", "postgresql:analytics.orders", "postgresql:analytics.orders")]
