"""IcebergTarget's spec: what it refuses when a DAG is parsed, how it travels,
the connections it names and how a catalog connection becomes pyiceberg's
catalog properties."""

from __future__ import annotations

import pytest

import airflow_eos
from airflow_eos.core.errors import ConfigurationError
from airflow_eos.core.registry import BUILTIN_KINDS
from airflow_eos.core.target import CONNECTION, POSTGRES, ConnectionRef, spec_of_target_id, target_from_dict
from airflow_eos.targets.iceberg import IcebergTarget
from airflow_eos.targets.iceberg.table import catalog_properties_of, ledger_catalog_properties


@pytest.mark.parametrize("table", ["", "orders", "analytics.", ".orders", "analytics.or-ders", 7])
def test_a_table_must_be_namespace_dot_name(table):
    with pytest.raises(ConfigurationError, match="namespace.table"):
        IcebergTarget(table=table)


def test_refuses_an_unknown_on_committed_and_a_bad_connection_id():
    with pytest.raises(ConfigurationError, match="on_committed"):
        IcebergTarget(table="a.b", on_committed="append")
    with pytest.raises(ConfigurationError, match="catalog_conn_id"):
        IcebergTarget(table="a.b", catalog_conn_id="no spaces")


def test_the_spec_travels_as_its_dict_and_is_named_by_its_id():
    spec = IcebergTarget(table="a.b.orders", catalog_conn_id="rest", on_committed="replace")
    assert target_from_dict(spec.to_dict()) == spec
    assert spec.target_id == "iceberg:rest/a.b.orders"
    assert spec_of_target_id(spec.target_id) == IcebergTarget(table="a.b.orders", catalog_conn_id="rest")
    assert spec_of_target_id("iceberg:ledger/x.y") == IcebergTarget(table="x.y")
    assert spec.asset_uri == "iceberg://rest/a/b/orders"


def test_connections_the_ledger_and_a_catalog_resolved_into_properties():
    spec = IcebergTarget(table="a.b", catalog_conn_id="rest")
    assert spec.connections() == (ConnectionRef("ledger", POSTGRES, "postgres_default"),
                                  ConnectionRef("catalog", CONNECTION, "rest"))
    bound = spec.bind({"ledger": "postgresql://u@h/db", "catalog": {
        "host": "polaris", "port": 8181, "login": "id", "password": "secret", "extra": {"warehouse": "lake"}}})
    assert bound.bound and bound.catalog_properties == {"type": "rest", "uri": "http://polaris:8181",
                                                        "credential": "id:secret", "warehouse": "lake"}
    assert IcebergTarget(table="a.b").connections() == (ConnectionRef("ledger", POSTGRES, "postgres_default"),)


def test_a_token_connection_and_a_uri_in_the_extras():
    props = catalog_properties_of({"host": "ignored", "password": "t0k", "extra": {
        "auth": "token", "uri": "https://cat/api", "type": "rest"}})
    assert props == {"type": "rest", "uri": "https://cat/api", "token": "t0k"}


def test_the_sql_catalog_lives_in_the_ledgers_database_in_its_own_schema():
    props = ledger_catalog_properties("host=db port=5433 user=eos password=p%w dbname=ledger sslmode=require")
    assert props["type"] == "sql" and props["init_catalog_tables"] == "false"
    assert props["uri"].startswith("postgresql+psycopg://eos:p%25w@db:5433/ledger?")
    assert "sslmode=require" in props["uri"] and "search_path%3Deos_iceberg" in props["uri"]


def test_a_sql_connection_without_a_uri_lends_its_properties_to_the_ledgers_sql_catalog():
    props = catalog_properties_of({"extra": {"type": "sql", "s3.endpoint": "http://minio:9000"}})
    assert props == {"type": "sql", "s3.endpoint": "http://minio:9000"}
    sink = IcebergTarget(table="a.b", ledger_url="host=db user=eos dbname=ledger", catalog_conn_id="s3",
                         catalog_properties=props).sink()
    assert sink.catalog_properties == {**ledger_catalog_properties("host=db user=eos dbname=ledger"), **props}
    rest = {"type": "rest", "uri": "http://cat"}
    assert IcebergTarget(table="a.b", ledger_url="host=db", catalog_conn_id="r",
                         catalog_properties=rest).sink().catalog_properties == rest


def test_spark_reaches_the_catalogs_s3_store_with_the_same_settings():
    from airflow_eos.targets.iceberg.files import s3a_settings

    io = {"s3.endpoint": "http://minio:9000", "s3.region": "eu-west-1", "s3.access-key-id": "AK",
          "s3.secret-access-key": "SK"}
    assert s3a_settings(io) == {"fs.s3a.endpoint": "http://minio:9000", "fs.s3a.endpoint.region": "eu-west-1",
                                "fs.s3a.access.key": "AK", "fs.s3a.secret.key": "SK",
                                "fs.s3a.path.style.access": "true"}
    assert s3a_settings({**io, "s3.force-virtual-addressing": "true"})["fs.s3a.path.style.access"] == "false"
    temporary = s3a_settings({"s3.session-token": "T"})
    assert temporary["fs.s3a.session.token"] == "T" and "Temporary" in temporary["fs.s3a.aws.credentials.provider"]
    assert s3a_settings({}) == {}


def test_a_dag_names_connections_never_values():
    with pytest.raises(ConfigurationError, match="catalog_conn_id"):
        IcebergTarget(table="a.b", catalog_properties={"credential": "x:y"}).check_for_dag()
    IcebergTarget(table="a.b", catalog_conn_id="rest").check_for_dag()


def test_every_shipped_kinds_spec_class_is_a_public_name():
    names = {where.partition(":")[2] for where in BUILTIN_KINDS.values()}
    assert names <= set(airflow_eos.__all__) and all(getattr(airflow_eos, n) for n in names)
    assert airflow_eos.IcebergTarget is IcebergTarget
