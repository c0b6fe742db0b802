"""The file operations of the file target on HDFS (targets/files/hdfs.py), on a
real NameNode and DataNode (Hadoop's mini-cluster, one per pytest worker): the
publishing rename refuses an existing destination, which the rename of
``FileSystem.rename`` (WebHDFS's ``op=RENAME`` without options) does not;
a replace never shows a reader a mix of two versions; Spark's own Parquet
writer and reader work on the same ``hdfs://`` paths the client renames.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
import uuid

import pytest

from airflow_eos.targets.files.hdfs import HdfsFiles, split_url


@pytest.fixture
def files(hdfs):
    return HdfsFiles(hdfs.address)


@pytest.fixture
def root(files):
    """A fresh directory of the session's cluster for each test."""
    path = f"/tests/{uuid.uuid4().hex}"
    files.makedirs(path)
    yield path
    files.remove_tree(path)


def staged(files, directory, contents):
    files.makedirs(directory)
    for name, data in contents.items():
        files.write_atomically(f"{directory}/{name}", data)


def webhdfs(hdfs, path, op, method="GET", **params):
    query = "&".join([f"op={op}", "user.name=eos", *(f"{k}={v}" for k, v in params.items())])
    request = urllib.request.Request(f"http://{hdfs.embedded.http_address}/webhdfs/v1{path}?{query}", method=method)
    with urllib.request.urlopen(request) as response:
        return json.loads(response.read() or b"{}")


def test_a_rename_publishes_a_directory_and_refuses_an_existing_destination_even_empty(files, root):
    staged(files, f"{root}/a", {"part-0.parquet": b"rows"})
    files.makedirs(f"{root}/taken")

    with pytest.raises(FileExistsError):
        files.rename_noreplace(f"{root}/a", f"{root}/taken")

    assert files.list_names(f"{root}/taken") == []
    assert files.list_names(f"{root}/a") == ["part-0.parquet"]
    files.rename_noreplace(f"{root}/a", f"{root}/window")
    assert files.list_names(root) == ["taken", "window"]
    assert files.read(f"{root}/window/part-0.parquet") == b"rows"


def test_webhdfs_rename_without_options_moves_into_an_existing_directory_which_is_why_it_is_not_used(hdfs, files,
                                                                                                     root):
    """``FileSystem.rename`` semantics: the source lands inside the existing
    destination. With ``renameoptions=NONE`` (``rename2``) WebHDFS refuses, as
    the client the sink uses does."""
    staged(files, f"{root}/a", {"f": b"1"})
    staged(files, f"{root}/b", {"f": b"2"})
    files.makedirs(f"{root}/taken")

    with pytest.raises(urllib.error.HTTPError) as refused:
        webhdfs(hdfs, f"{root}/b", "RENAME", "PUT", destination=f"{root}/taken", renameoptions="NONE")
    assert refused.value.code in (400, 403, 409) and b"already exists" in refused.value.read()
    assert webhdfs(hdfs, f"{root}/a", "RENAME", "PUT", destination=f"{root}/taken") == {"boolean": True}
    assert files.list_names(f"{root}/taken") == ["a"]


def test_a_replace_moves_the_old_version_out_then_the_new_one_in(files, root):
    staged(files, f"{root}/window", {"old-0": b"o", "old-1": b"o"})
    staged(files, f"{root}/staging/publish", {"new-0": b"n"})
    files.makedirs(f"{root}/_trash")

    files.replace(f"{root}/staging/publish", f"{root}/window", f"{root}/_trash/1")

    assert files.list_names(f"{root}/window") == ["new-0"]
    assert files.list_names(f"{root}/_trash/1") == ["old-0", "old-1"]
    assert files.list_names(f"{root}/staging") == []


def test_a_replace_cut_between_its_renames_leaves_no_mix_and_a_rename_finishes_it(files, root, monkeypatch):
    staged(files, f"{root}/window", {"old-0": b"o"})
    staged(files, f"{root}/staging/publish", {"new-0": b"n"})
    files.makedirs(f"{root}/_trash")
    real, calls = files.client.rename, []

    def crash_on_the_second(src, dst, overwrite=False):
        calls.append(src)
        if len(calls) == 2:
            raise ConnectionError("the commit task died here")
        return real(src, dst, overwrite)

    monkeypatch.setattr(files.client, "rename", crash_on_the_second)
    with pytest.raises(ConnectionError):
        files.replace(f"{root}/staging/publish", f"{root}/window", f"{root}/_trash/1")
    monkeypatch.setattr(files.client, "rename", real)

    assert files.list_names(root) == ["_trash", "staging"]  # a reader sees no window, never half of one
    files.rename_noreplace(f"{root}/staging/publish", f"{root}/window")
    assert files.list_names(f"{root}/window") == ["new-0"]


def test_a_file_written_atomically_is_whole_or_keeps_what_it_held(files, root, monkeypatch):
    files.write_atomically(f"{root}/_eos_commit.json", b"first")
    files.write_atomically(f"{root}/_eos_commit.json", b"second")
    assert files.read(f"{root}/_eos_commit.json") == b"second"

    monkeypatch.setattr(files.client, "rename", lambda *a: (_ for _ in ()).throw(ConnectionError("cut")))
    with pytest.raises(ConnectionError):
        files.write_atomically(f"{root}/_eos_commit.json", b"third")
    monkeypatch.undo()
    assert files.read(f"{root}/_eos_commit.json") == b"second"
    assert files.list_names(root) == ["_eos_commit.json"]  # no temp file left


def test_a_removed_tree_is_gone_and_removing_nothing_is_no_error(files, root):
    staged(files, f"{root}/t/u", {"f": b"x"})
    assert files.remove_tree(f"{root}/t")
    assert not files.exists(f"{root}/t")
    assert files.remove_tree(f"{root}/never")


def test_urls_name_a_cluster_and_a_directory_of_it():
    assert split_url("hdfs://nn:8020/lake/orders/") == ("hdfs://nn:8020", "/lake/orders")
    for bad in ("hdfs:///lake", "hdfs://nn:8020/", "file:///lake", "hdfs://nn/lake?x=1"):
        with pytest.raises(Exception, match="HDFS|root|query"):
            split_url(bad)


@pytest.mark.slow
def test_spark_writes_and_reads_the_paths_the_client_renames(hdfs, files, root):
    """Spark's Parquet writer stages into ``_eos_staging``, the client renames
    the staging to the window's directory, and ``spark.read.parquet`` of the
    root reads each row once (names starting with ``_`` are skipped)."""
    from airflow_eos.spark import spark_session, stop_session

    spark = spark_session("eos-test-hdfs", master="local[1]")
    try:
        url = f"{hdfs.address}{root}"
        staging = f"{root}/_eos_staging/1/publish"
        spark.range(100).selectExpr("id AS n").write.parquet(f"{hdfs.address}{staging}")
        files.makedirs(f"{root}/_eos_staging/2")
        spark.range(100, 150).selectExpr("id AS n").write.parquet(f"{hdfs.address}{root}/_eos_staging/2/publish")
        files.rename_noreplace(staging, f"{root}/eos_window_start=a")

        rows = spark.read.parquet(url).collect()
        assert sorted(r.n for r in rows) == list(range(100))
        assert {r.eos_window_start for r in rows} == {"a"}
    finally:
        stop_session(spark)
