"""One contract for every file system a FileTarget's root can live on
(targets/files/storage.py): a local directory and HDFS (Hadoop's mini-cluster,
one per pytest worker, started only by the HDFS cases). Each case runs on both.
"""

from __future__ import annotations

import threading
import uuid

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from airflow_eos.targets.files import fs
from airflow_eos.targets.files.storage import LocalFiles, files_for


@pytest.fixture(params=["local", "hdfs"])
def place(request, tmp_path):
    """(files, a fresh empty directory of that file system)."""
    if request.param == "local":
        yield LocalFiles(), str(tmp_path / "root")
        return
    hdfs = request.getfixturevalue("hdfs")
    root = f"{hdfs.address}/tests/{uuid.uuid4().hex}"
    files = files_for(root)
    yield files, root
    files.remove_tree(root)


@pytest.fixture
def files(place):
    files, root = place
    files.makedirs(root)
    return files


@pytest.fixture
def root(place):
    return place[1]


def staged(files, directory, contents):
    files.makedirs(directory)
    for name, data in contents.items():
        files.write_atomically(f"{directory}/{name}", data)


def names(files, directory):
    return [e.name for e in files.entries(directory)]


def test_a_rename_publishes_a_directory_and_refuses_an_existing_destination_even_empty(files, root):
    staged(files, f"{root}/a", {"part-0.parquet": b"rows"})
    files.makedirs(f"{root}/taken")

    with pytest.raises(FileExistsError):
        files.rename_noreplace(f"{root}/a", f"{root}/taken")

    assert names(files, f"{root}/taken") == []
    assert names(files, f"{root}/a") == ["part-0.parquet"]
    files.rename_noreplace(f"{root}/a", f"{root}/window")
    assert names(files, root) == ["taken", "window"]
    assert files.read_bytes(f"{root}/window/part-0.parquet") == b"rows"


def test_a_replace_puts_the_new_version_in_place_and_the_old_one_where_it_is_retired(files, root):
    staged(files, f"{root}/window", {"old-0": b"o", "old-1": b"o"})
    staged(files, f"{root}/staging/publish", {"new-0": b"n"})

    files.replace(f"{root}/staging/publish", f"{root}/window", f"{root}/_trash/1")

    assert names(files, f"{root}/window") == ["new-0"]
    assert names(files, f"{root}/_trash/1") == ["old-0", "old-1"]
    assert names(files, f"{root}/staging") == []


def test_entries_say_what_each_name_is(files, root):
    staged(files, f"{root}/d", {"f": b"12345"})
    files.write_atomically(f"{root}/g", b"x")

    entries = files.entries(root)

    assert [(e.name, e.path, e.is_dir) for e in entries] == [("d", f"{root}/d", True), ("g", f"{root}/g", False)]
    assert entries[1].size == 1 and entries[1].mtime > 1.7e9
    assert files.size(f"{root}/d/f") == 5
    assert files.is_dir(f"{root}/d") and not files.is_dir(f"{root}/g") and not files.is_dir(f"{root}/none")
    assert files.exists(f"{root}/g") and not files.exists(f"{root}/none")
    with pytest.raises(FileNotFoundError):
        files.entries(f"{root}/none")
    with pytest.raises(FileNotFoundError):
        files.size(f"{root}/none")


def test_a_file_written_atomically_is_whole_or_keeps_what_it_held(files, root):
    files.write_atomically(f"{root}/_eos_commit.json", b"first")
    files.write_atomically(f"{root}/_eos_commit.json", b"second")
    assert files.read_bytes(f"{root}/_eos_commit.json") == b"second"

    with pytest.raises(RuntimeError), files.atomic_output(f"{root}/_eos_commit.json") as f:
        f.write(b"thi")
        raise RuntimeError("the writer died mid-file")

    assert files.read_bytes(f"{root}/_eos_commit.json") == b"second"
    assert names(files, root) == ["_eos_commit.json"]  # no temp file left


def test_a_file_is_never_written_into_a_directory_that_is_gone(files, root):
    """A writer of a deleted staging (a zombie task) must fail, not recreate it."""
    with pytest.raises(FileNotFoundError), files.atomic_output(f"{root}/gone/part-0.parquet") as f:
        f.write(b"rows")
    with pytest.raises(FileNotFoundError):
        files.create_exclusive(f"{root}/gone/_eos_root.json", b"mine")
    assert not files.exists(f"{root}/gone")


def test_an_exclusive_file_appears_once_whole_and_never_replaces_one(files, root):
    files.create_exclusive(f"{root}/_eos_root.json", b"mine")
    with pytest.raises(FileExistsError):
        files.create_exclusive(f"{root}/_eos_root.json", b"theirs")
    assert files.read_bytes(f"{root}/_eos_root.json") == b"mine"
    assert names(files, root) == ["_eos_root.json"]


def test_parquet_is_written_and_its_footer_read_through_the_file_objects(files, root):
    table = pa.table({"n": list(range(1000))})
    with files.atomic_output(f"{root}/part-0.parquet") as f:
        pq.write_table(table, f)

    with files.open_input(f"{root}/part-0.parquet") as f:
        assert pq.read_metadata(f).num_rows == 1000
    with files.open_input(f"{root}/part-0.parquet") as f:
        assert pq.read_table(f).equals(table)


def test_directories_are_made_moved_and_removed(files, root):
    files.mkdir(f"{root}/s")
    with pytest.raises(FileExistsError):
        files.mkdir(f"{root}/s")
    files.makedirs(f"{root}/s/a/b")
    files.makedirs(f"{root}/s/a/b")
    files.write_atomically(f"{root}/s/a/b/f", b"x")
    files.rename(f"{root}/s/a/b/f", f"{root}/s/f")
    files.unlink(f"{root}/s/f")
    with pytest.raises(FileNotFoundError):
        files.unlink(f"{root}/s/f")
    files.sync_dir(f"{root}/s")

    assert files.remove_tree(f"{root}/s")
    assert not files.exists(f"{root}/s")
    assert files.remove_tree(f"{root}/never")


def test_a_local_listing_during_exchanges_is_one_whole_version(tmp_path):
    """Local only (HDFS lists a directory in one call and has no exchange):
    a reader listing a window while replaces swap it gets the old version's
    names or the new one's, never "no such directory" for a directory that is
    there. (Stat by path after readdir failed 19,504 of 20,000 listings here.)"""
    files = LocalFiles()
    old = {f"old-{i}.parquet" for i in range(20)} | {"_eos_commit.json"}
    new = {f"new-{i}.parquet" for i in range(20)} | {"_eos_commit.json"}
    staged(files, str(tmp_path / "window"), dict.fromkeys(old, b"o"))
    staged(files, str(tmp_path / "publish"), dict.fromkeys(new, b"n"))
    listed, swaps = threading.Event(), [0]

    def swap_until_listed():
        while not listed.is_set():
            fs.rename_exchange(str(tmp_path / "publish"), str(tmp_path / "window"))
            swaps[0] += 1

    swapper = threading.Thread(target=swap_until_listed)
    swapper.start()
    try:
        listings = [frozenset(names(files, str(tmp_path / "window"))) for _ in range(3000)]
    finally:
        listed.set()
        swapper.join()

    assert swaps[0] > 0
    assert set(listings) <= {frozenset(old), frozenset(new)}
