"""OpenLineage datasets and Asset URIs of a window (pure logic: no server).

The names must be the ones the Kafka, Postgres and common.io providers give the
same data, so each URI goes through the converter its provider registers."""

from __future__ import annotations

import pytest

from airflow_eos import FileTarget, KafkaTarget, PostgresTarget
from airflow_eos.core.errors import ConfigurationError
from airflow_eos.core.target import kafka_asset_uri
from airflow_eos.operators.lineage import EosWindowRunFacet, dataset, records_per_topic, rows_written, window_lineage

KAFKA = {"bootstrap.servers": "SASL_SSL://b1.example:9093,b2.example:9093", "sasl.password": "s3cret"}


def test_a_topic_is_the_kafka_providers_asset_and_dataset():
    uri = kafka_asset_uri(KAFKA, "orders")
    assert uri == "kafka://b1.example:9093/orders"
    assert dataset(uri) == ("kafka://b1.example:9093", "orders")
    with pytest.raises(ConfigurationError, match="bootstrap.servers"):
        kafka_asset_uri({}, "orders")


def test_each_target_is_its_providers_dataset_without_secrets():
    pg = PostgresTarget(table="analytics.orders").with_url("postgresql://eos:s3cret@db.example:6543/shop")
    assert dataset(pg.asset_uri) == ("postgres://db.example:6543", "shop.analytics.orders")
    topic = KafkaTarget(topic="enriched").bind({"kafka": KAFKA, "ledger": "postgresql://u:pw@h/db"})
    assert topic.asset_uri == "kafka://b1.example:9093/enriched"
    files = FileTarget(path="/data/lake/orders")
    assert files.asset_uri == "file:///data/lake/orders"
    assert dataset(files.asset_uri) == ("file", "/data/lake/orders")
    assert not any("s3cret" in t.asset_uri for t in (pg, topic, files))


def test_a_window_lineage_has_topics_in_target_out_and_the_window_facet():
    pg = PostgresTarget(table="analytics.orders").with_url("postgresql://eos:s3cret@db.example/shop")
    report = {"consumed": [{"topic": "orders", "partition": 0, "start_offset": 0, "end_offset": 5, "records": 5},
                           {"topic": "orders", "partition": 1, "start_offset": 3, "end_offset": 6, "records": 3},
                           {"topic": "refunds", "partition": 0, "start_offset": 0, "end_offset": 0, "records": 0}]}
    facet = EosWindowRunFacet(pipeline="p", windowStart="2026-01-01T00:00:00+00:00",
                              windowEnd="2026-01-01T01:00:00+00:00", epoch=2, outcome="published", publishedRows=7)
    rows = records_per_topic(report)
    assert rows == {"orders": 8, "refunds": 0}
    lineage = window_lineage(kafka_config=KAFKA, topics=["orders", "refunds"], target=pg, facet=facet,
                             topic_rows=rows, output_rows=7)
    assert [(d.namespace, d.name, d.inputFacets["inputStatistics"].rowCount) for d in lineage.inputs] == [
        ("kafka://b1.example:9093", "orders", 8), ("kafka://b1.example:9093", "refunds", 0)]
    [out] = lineage.outputs
    assert (out.namespace, out.name, out.outputFacets["outputStatistics"].rowCount) == (
        "postgres://db.example:5432", "shop.analytics.orders", 7)
    assert lineage.run_facets == {"eosWindow": facet}


@pytest.mark.parametrize(("outcome", "written"), [("published", 7), ("replaced", 7), ("already_committed", 0),
                                                  ("skipped", 0)])
def test_only_a_publishing_commit_counts_rows_written(outcome, written):
    assert rows_written({"outcome": outcome, "published_rows": 7}) == written
