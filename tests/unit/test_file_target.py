"""FileTarget's spec without services: what a DAG file can write, what is
refused at parse time, and where a window's partition directory lands."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest

from airflow_eos.core.errors import ConfigurationError
from airflow_eos.core.target import spec_class, target_from_dict
from airflow_eos.targets.files import FileTarget
from airflow_eos.targets.files.layout import Layout, escape_path_value

T0 = datetime(2026, 1, 1, tzinfo=timezone.utc)
T1 = datetime(2026, 1, 1, 1, tzinfo=timezone.utc)


def test_the_kind_is_registered_and_round_trips():
    assert spec_class("files") is FileTarget
    spec = FileTarget(path="/data/lake/orders", postgres_conn_id="lake", layout="w={window_start}")
    assert target_from_dict(spec.to_dict()) == spec
    assert spec.to_dict()["kind"] == "files" and spec.ledger_url is None


@pytest.mark.parametrize("path, store", [
    ("s3://bucket/x", "Amazon S3"), ("S3A://bucket/x", "Amazon S3"), ("gs://b/x", "Google Cloud Storage"),
    ("abfs://c@a.dfs.core.windows.net/x", "Azure Data Lake Storage"), ("wasbs://c@a/x", "Azure Blob Storage"),
    ("oss://b/x", "Alibaba OSS")])
def test_object_stores_are_refused_saying_why(path, store):
    with pytest.raises(ConfigurationError) as failed:
        FileTarget(path=path)
    message = str(failed.value)
    assert store in message and "no atomic rename" in message and "Iceberg" in message


@pytest.mark.parametrize("path, why", [
    ("", "needs path"), ("relative/dir", "relative"), ("/", "file system's root"),
    ("file://otherhost/x", "must be local"), ("ftp://h/x", "does not know the scheme"), ("viewfs://c/x", "not support HDFS \\(viewfs\\)"),
    ("webhdfs://nn:9870/x", "not support WebHDFS"), ("hdfs:///x", "names no NameNode"), ("hdfs://nn:8020/", "root"),
    ("hdfs://nn:8020/x?y=1", "no query")])
def test_other_bad_roots_are_refused(path, why):
    with pytest.raises(ConfigurationError, match=why):
        FileTarget(path=path)


def test_an_hdfs_root_is_its_normalised_url():
    spec = FileTarget(path="hdfs://nn:8020/lake/./orders/")
    assert spec.root == "hdfs://nn:8020/lake/orders"
    assert spec.target_id == "files:hdfs://nn:8020/lake/orders" and spec.target_aliases == ()
    assert FileTarget(path="hdfs://nn:8020/lake/a b").asset_uri == "hdfs://nn:8020/lake/a%20b"


def test_a_path_and_its_file_url_are_one_target():
    assert {FileTarget(path=p).target_id for p in ("/data/x", "/data/x/", "file:///data/x", "file://localhost/data/x/",
                                                     "/data/./y/../x", "file:/data/x", "file:/data/x/")
            } == {"files:/data/x"}
    assert FileTarget(path="/data/x").asset_uri == "file:///data/x"


@pytest.mark.parametrize("layout, why", [
    ("day={window_end}", "must contain {window_start}"), ("_w={window_start}", "skip"),
    ("x/.w={window_start}", "skip"), ("/w={window_start}", "relative"), ("../w={window_start}", "'..'"),
    ("w={window_start:%Y}", "no format spec"), ("w={start}", "may name"), ("w={window_start", "not a valid")])
def test_layouts_that_would_hide_or_mix_windows_are_refused(layout, why):
    with pytest.raises(ConfigurationError, match=why):
        FileTarget(path="/data/x", layout=layout)


def test_partition_paths_are_escaped_as_spark_escapes_partition_values():
    assert Layout().render("orders", T0, T1) == "eos_window_start=2026-01-01T00%3A00%3A00Z"
    assert Layout("p={pipeline}/s={window_start}/e={window_end}").render("a/b=c", T0, T1) == (
        "p=a%2Fb%3Dc/s=2026-01-01T00%3A00%3A00Z/e=2026-01-01T01%3A00%3A00Z")
    assert Layout("{pipeline}/{window_start}").render("_hidden", T0, T1).startswith("%5Fhidden/")
    assert escape_path_value("a:b%c") == "a%3Ab%25c"
    assert Layout("p={pipeline}/eos_window_start={window_start}").keys == ("p", "eos_window_start")


def test_a_dag_names_a_connection_not_a_url():
    with pytest.raises(ConfigurationError, match="postgres_conn_id"):
        FileTarget(path="/data/x", ledger_url="postgresql://u:secret@h/db").check_for_dag()
    assert "secret" not in repr(FileTarget(path="/data/x", ledger_url="postgresql://u:secret@h/db"))


def test_other_options_are_checked():
    with pytest.raises(ConfigurationError, match="format"):
        FileTarget(path="/data/x", format="csv")
    with pytest.raises(ConfigurationError, match="on_committed"):
        FileTarget(path="/data/x", on_committed="merge")


def test_building_the_spec_loads_no_client_library():
    """A DAG file builds a FileTarget at parse time: no pyarrow, no psycopg."""
    from test_imports import loaded_heavy_packages

    code = ("from airflow_eos.targets.files import FileTarget\n"
            "t = FileTarget(path='/data/lake/orders', postgres_conn_id='pg')\n"
            "t.target_id, t.asset_uri, t.to_dict(), t.check_for_dag()\n")
    assert loaded_heavy_packages(code) == []


def test_a_schema_change_is_described_column_by_column():
    import pyarrow as pa

    from airflow_eos.targets.files.staging import schema_changes

    def text(*fields):
        return pa.schema(list(fields)).to_string(show_schema_metadata=False)

    published = text(("id", pa.int64()), ("amount", pa.decimal128(12, 2)), ("tags", pa.list_(pa.string())),
                     ("gone", pa.string()))
    staged = text(("id", pa.int64()), ("amount", pa.float64()), ("tags", pa.list_(pa.string())),
                  pa.field("coupon", pa.string(), nullable=False))
    assert schema_changes(published, staged) == [
        "column 'coupon' added (string not null)", "column 'gone' missing (published as string)",
        "column 'amount' is double, published as decimal128(12, 2)"]
    assert schema_changes(published, published) == []
    nested = text(("tags", pa.list_(pa.int32())))  # a nested type differs in its column's line
    assert schema_changes(text(("tags", pa.list_(pa.string()))), nested) == [
        "column 'tags' is list<item: int32>, published as list<item: string>"]


@pytest.mark.parametrize("path", ["file:/tmp/x", "file:///tmp/x", "file://localhost/tmp/x", "file:/tmp/x/"])
def test_the_uri_forms_of_an_absolute_local_path_are_accepted(path):
    """Issue 33: ``file:/tmp/x`` (the one-slash URI form Hadoop and Java print)
    was refused as "relative"."""
    assert FileTarget(path=path).root == "/tmp/x"


@pytest.mark.parametrize("path", ["file:tmp/x", "file:x"])
def test_a_file_uri_without_an_absolute_path_says_which_form_is_expected(path):
    with pytest.raises(ConfigurationError, match="file:/absolute/path, file:///absolute/path or /absolute/path"):
        FileTarget(path=path)
