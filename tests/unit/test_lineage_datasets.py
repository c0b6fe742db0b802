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


# Names an asset URI must carry whole (issue 33): a space, a non-ASCII letter, and
# the characters that end a URI's path (#, ?) or start an escape (%).
AWKWARD = ["a b", "ü", "a#b", "a?b", "a%20b", "a%b", "ü #?%"]


def _file_uri(name):
    return FileTarget(path=f"/data/lake/{name}").asset_uri


def _table_uri(name):
    return PostgresTarget(table=f'analytics."{name}"').with_url("postgresql://eos:pw@db.example:6543/shop").asset_uri


def _topic_uri(name):
    """A KafkaTarget's topic is letters, digits, '.', '_', '-' (the spec refuses others); a
    source topic's URI is built by the same function without that check."""
    return kafka_asset_uri(KAFKA, name)


@pytest.mark.parametrize("name", AWKWARD)
@pytest.mark.parametrize("uri_of", [_file_uri, _table_uri, _topic_uri], ids=["files", "postgres", "kafka"])
def test_an_awkward_name_is_a_whole_ascii_asset_uri_that_airflow_accepts(uri_of, name):
    from urllib.parse import unquote, urlsplit

    from airflow.sdk import Asset

    uri = uri_of(name)
    assert uri.isascii() and not {"#", "?", " "} & set(uri), uri
    assert Asset(uri).uri == uri  # accepted, nothing cut off as a fragment or a query
    assert unquote(urlsplit(uri).path).endswith("/" + name), uri  # the round trip names the same thing
    namespace, dataset_name = dataset(uri)
    assert dataset_name.endswith(name) and namespace.isascii()


@pytest.mark.parametrize("uri_of", [_file_uri, _table_uri, _topic_uri], ids=["files", "postgres", "kafka"])
def test_distinct_names_give_distinct_asset_uris(uri_of):
    names = [*AWKWARD, "a", "a%23b", "a%3Fb"]  # "a#b" cut short would be "a"; "%23" must not equal "#"
    uris = [uri_of(name) for name in names]
    assert len(set(uris)) == len(names), uris
    assert len({_kept_uri(u) for u in uris}) == len(names)


def _kept_uri(uri):
    """The URI Airflow keeps for an Asset."""
    from airflow.sdk import Asset

    return Asset(uri).uri


def test_a_plain_ascii_asset_uri_is_unchanged():
    """Assets users already schedule on keep their names."""
    assert FileTarget(path="/data/lake/orders-v2_x.y~z:1@h+a,b=c").asset_uri == \
        "file:///data/lake/orders-v2_x.y~z:1@h+a,b=c"
    assert _table_uri("orders_2") == "postgres://db.example:6543/shop/analytics/orders_2"
    assert KafkaTarget(topic="orders.v2-x_y").bind({"kafka": KAFKA, "ledger": "postgresql://u:pw@h/db"}).asset_uri \
        == "kafka://b1.example:9093/orders.v2-x_y"
    assert kafka_asset_uri({"bootstrap.servers": "[::1]:9092"}, "t") == "kafka://[::1]:9092/t"
