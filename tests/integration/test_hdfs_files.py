"""What is HDFS's own in the file target's file operations (targets/files/hdfs.py;
what every file system does is tests/integration/test_file_systems.py), on a
real NameNode and DataNode (Hadoop's mini-cluster, one per pytest worker): the
rename of ``FileSystem.rename`` (WebHDFS's ``op=RENAME`` without options) moves
a directory into an existing one, which is why it is not the client; a rename
that overwrites takes only an empty directory, so a replace is two renames; a
replace cut between its two renames leaves no mix of versions; Spark's own Parquet
writer and reader work on the ``hdfs://`` paths the client renames.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
import uuid

import pytest
from harness.spark import quiet_session

from airflow_eos.targets.files.hdfs import HdfsFiles, split_url


@pytest.fixture
def files(hdfs):
    return HdfsFiles(hdfs.address)


@pytest.fixture
def root(hdfs, files):
    """A fresh directory of the session's cluster for each test (a URL)."""
    url = f"{hdfs.address}/tests/{uuid.uuid4().hex}"
    files.makedirs(url)
    yield url
    files.remove_tree(url)


def staged(files, directory, contents):
    files.makedirs(directory)
    for name, data in contents.items():
        files.write_atomically(f"{directory}/{name}", data)


def names(files, directory):
    return [e.name for e in files.entries(directory)]


def webhdfs(hdfs, url, op, method="GET", **params):
    query = "&".join([f"op={op}", "user.name=eos", *(f"{k}={v}" for k, v in params.items())])
    path = split_url(url)[1]
    request = urllib.request.Request(f"http://{hdfs.embedded.http_address}/webhdfs/v1{path}?{query}", method=method)
    with urllib.request.urlopen(request) as response:
        return json.loads(response.read() or b"{}")


def test_webhdfs_rename_without_options_moves_into_an_existing_directory_which_is_why_it_is_not_used(hdfs, files,
                                                                                                     root):
    """``FileSystem.rename`` semantics: the source lands inside the existing
    destination. With ``renameoptions=NONE`` (``rename2``) WebHDFS refuses, as
    the client the sink uses does."""
    staged(files, f"{root}/a", {"f": b"1"})
    staged(files, f"{root}/b", {"f": b"2"})
    files.makedirs(f"{root}/taken")

    with pytest.raises(urllib.error.HTTPError) as refused:
        webhdfs(hdfs, f"{root}/b", "RENAME", "PUT", destination=split_url(f"{root}/taken")[1], renameoptions="NONE")
    assert b"already exists" in refused.value.read()
    assert webhdfs(hdfs, f"{root}/a", "RENAME", "PUT", destination=split_url(f"{root}/taken")[1]) == {"boolean": True}
    assert names(files, f"{root}/taken") == ["a"]


def test_a_replace_cut_between_its_renames_leaves_no_mix_and_a_rename_finishes_it(files, root, monkeypatch):
    staged(files, f"{root}/window", {"old-0": b"o"})
    staged(files, f"{root}/staging/publish", {"new-0": b"n"})
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

    assert names(files, root) == ["_trash", "staging"]  # a reader sees no window, never half of one
    files.rename_noreplace(f"{root}/staging/publish", f"{root}/window")
    assert names(files, f"{root}/window") == ["new-0"]
    assert names(files, f"{root}/_trash/1") == ["old-0"]


def test_a_rename_that_overwrites_takes_only_an_empty_directory_so_a_replace_is_two_renames(files, root):
    """HDFS has no exchange, and ``rename2`` with ``Options.Rename.OVERWRITE``
    is no atomic replace of a window: the NameNode replaces an empty
    destination directory only ("rename destination directory is not empty"
    otherwise, FSDirRenameOp.validateOverwrite); the old version must leave
    first, so a replace is two renames."""
    staged(files, f"{root}/window", {"old-0": b"o"})
    staged(files, f"{root}/publish", {"new-0": b"n"})
    with pytest.raises(Exception, match="not empty"):
        files.client.rename(split_url(f"{root}/publish")[1], split_url(f"{root}/window")[1], True)
    assert names(files, f"{root}/window") == ["old-0"] and names(files, f"{root}/publish") == ["new-0"]

    files.makedirs(f"{root}/empty")
    files.client.rename(split_url(f"{root}/publish")[1], split_url(f"{root}/empty")[1], True)
    assert names(files, f"{root}/empty") == ["new-0"]


def test_urls_name_a_cluster_and_a_directory_of_it(files):
    assert split_url("hdfs://nn:8020/lake/orders/") == ("hdfs://nn:8020", "/lake/orders")
    for bad in ("hdfs:///lake", "hdfs://nn:8020/", "file:///lake", "hdfs://nn/lake?x=1"):
        with pytest.raises(Exception, match="HDFS|NameNode|root|query"):
            split_url(bad)
    with pytest.raises(ValueError, match="not a path of"):
        files.exists("hdfs://elsewhere:8020/lake")


@pytest.mark.slow
def test_spark_writes_and_reads_the_paths_the_client_renames(files, root):
    """Spark's Parquet writer stages into ``_eos_staging``, the client renames
    the staging to the window's directory, and ``spark.read.parquet`` of the
    root reads each row once (names starting with ``_`` are skipped)."""
    with quiet_session("eos-test-hdfs", master="local[1]") as spark:
        spark.range(100).selectExpr("id AS n").write.parquet(f"{root}/_eos_staging/1/publish")
        spark.range(100, 150).selectExpr("id AS n").write.parquet(f"{root}/_eos_staging/2/publish")
        files.rename_noreplace(f"{root}/_eos_staging/1/publish", f"{root}/eos_window_start=a")

        rows = spark.read.parquet(root).collect()
        assert sorted(r.n for r in rows) == list(range(100))
        assert {r.eos_window_start for r in rows} == {"a"}
