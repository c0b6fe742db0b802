"""The file target's two-phase-commit sink against a real PostgreSQL ledger and
a real directory, without Spark: a window's life (begin, write, checkpoint,
prepare, commit, abort), the crash points of the commit, zombies, replace, and
every bad input the issue names. What readers see is read back with PyArrow's
Hive-partitioned dataset reader, which skips ``_`` and ``.`` names as Spark does;
rows are asserted exactly by lineage."""

from __future__ import annotations

import io
import json
import os
import pickle
import subprocess
import threading
import time
from collections import Counter
from contextlib import contextmanager
from datetime import timedelta

import psycopg
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest

from airflow_eos.core.attempt import ConsumedRange, load_offsets, mark_aborted
from airflow_eos.core.errors import AttemptClosed, AttemptFenced, ConfigurationError, NotPrepared, TargetError
from airflow_eos.core.sink import ALREADY_COMMITTED, PUBLISHED, REPLACED, SKIPPED
from airflow_eos.core.target import target_from_dict
from airflow_eos.core.windows import TopicPartition
from airflow_eos.targets.files import FileTarget
from airflow_eos.targets.files.sink import COMMIT_FORMAT, EXCHANGED, RENAMED
from airflow_eos.targets.files.writer import COMMIT_FILE, PUBLISH, STAGING_DIR, TRASH_DIR, FileWriter

PIPELINE = "orders_hourly"


def execute(url, statement, params=None):
    with psycopg.connect(url, autocommit=True) as conn:
        cur = conn.execute(statement, params)
        return cur.fetchall() if cur.description else None


@pytest.fixture
def root(tmp_path):
    path = tmp_path / "lake" / "orders"
    path.mkdir(parents=True)
    return path


def file_target(root, pg_url, **kw):
    return FileTarget(path=str(root), ledger_url=pg_url, **kw)


@pytest.fixture
def sink(root, pg_url, ledger):
    return file_target(root, pg_url).sink()


def records(plan, version=1, skip=()):
    """The rows a transform makes of a window's records: one per source record,
    one Arrow batch per planned partition (as one Spark task each)."""
    batches = []
    for r in plan.ranges:
        offsets = [o for o in range(r.start_offset, r.end_offset) if (r.partition, o) not in skip]
        batches.append(pa.record_batch({
            "id": pa.array([r.partition * 1_000_000 + o for o in offsets], pa.int64()),
            "amount": pa.array([o * version / 100 for o in offsets], pa.float64()),
            "note": pa.array([f"v{version} {r.topic}/{r.partition}/{o}" for o in offsets]),
            "eos_topic": pa.array([r.topic] * len(offsets)),
            "eos_partition": pa.array([r.partition] * len(offsets), pa.int32()),
            "eos_offset": pa.array(offsets, pa.int64()),
        }))
    return batches


def lineage(plan, skip=()):
    return sorted((r.topic, r.partition, o) for r in plan.ranges for o in range(r.start_offset, r.end_offset)
                  if (r.partition, o) not in skip)


def consumed(plan):
    return [ConsumedRange(r.topic, r.partition, r.start_offset, r.end_offset, r.width) for r in plan.ranges]


def stage(sink, plan, *, version=1, prepare=True, dead=None, skip=()):
    """begin → one writer call per partition (as Spark tasks) → checkpoint → prepare."""
    attempt = sink.begin(plan.window)
    writer = pickle.loads(pickle.dumps(sink.writer(attempt)))  # as Spark ships it to a task
    chunks = [writer.write([batch], dead if i == 0 and dead else ()) for i, batch in
              enumerate(records(plan, version, skip))]
    sink.checkpoint(attempt, consumed(plan), chunks)
    if prepare:
        assert sink.prepare(attempt).prepared
    return attempt


def read_root(root):
    """What a reader of the root sees: PyArrow's dataset over Hive partitions
    (it skips names starting with "_" or ".", as Spark does)."""
    if not any(os.scandir(root)):
        return []
    table = ds.dataset(str(root), format="parquet", partitioning="hive").to_table()
    return table.to_pylist()


def seen_lineage(root):
    rows = read_root(root)
    return sorted((r["eos_topic"], r["eos_partition"], r["eos_offset"]) for r in rows)


def visible_entries(root):
    return sorted(e for e in os.listdir(root) if not e.startswith(("_", ".")))


def attempt_state(url, attempt):
    return execute(url, "SELECT state, reason FROM eos.attempts WHERE pipeline = %s AND window_start = %s"
                        " AND epoch = %s", (attempt.pipeline, attempt.window_start, attempt.epoch))[0]


def window_row(url, window):
    return execute(url, "SELECT state, epoch, committed_epoch, published_rows, dead_letter_rows FROM eos.windows"
                        " WHERE pipeline = %s AND window_start = %s", (window.pipeline, window.start))[0]


def publication(url, attempt):
    rows = execute(url, "SELECT state, location, replaces FROM eos.publications WHERE pipeline = %s"
                        " AND window_start = %s AND epoch = %s",
                   (attempt.pipeline, attempt.window_start, attempt.epoch))
    return rows[0] if rows else None


def staging_dirs(root):
    try:
        return sorted(os.listdir(root / STAGING_DIR))
    except FileNotFoundError:
        return []


def commit_doc(path):
    with open(os.path.join(path, COMMIT_FILE)) as f:
        return json.load(f)


# --------------------------------------------------------------------------- the happy path


def test_window_life_publishes_files_dead_letters_and_offsets(pg_url, root, sink, freeze_windows):
    [plan] = freeze_windows(PIPELINE, [0])
    attempt = sink.begin(plan.window)
    assert attempt.epoch == 1 and staging_dirs(root) == [attempt.staging]
    assert sorted(os.listdir(sink.staging_dir(attempt))) == sorted(
        ["data", "dead_letters", "publish", "sealed_dead_letters"])
    writer = FileWriter.from_json(sink.writer(attempt).to_json())
    bad = [{"topic": "orders", "partition": 0, "offset": 2, "error": "amount is not a number",
            "key": b"k\x00", "value": b"\xff{"}]
    batches = records(plan, skip={(0, 2)})
    chunks = [writer.write([batches[0]], bad), writer.write([batches[1]])]
    assert [(c.rows, c.dead_letters) for c in chunks] == [(4, 1), (5, 0)]
    assert visible_entries(root) == []  # nothing visible to readers while staging

    assert sink.prepare(attempt).prepared is False  # no checkpoint yet: keep waiting
    checkpoint = sink.checkpoint(attempt, consumed(plan), chunks)
    assert (checkpoint.row_count, checkpoint.dead_letter_count) == (9, 1)
    assert sink.prepare(attempt).prepared and attempt_state(pg_url, attempt)[0] == "prepared"
    manifest = execute(pg_url, "SELECT path, kind, rows FROM eos.staged_files ORDER BY kind, rows")
    assert [(k, n) for _, k, n in manifest] == [("data", 4), ("data", 5), ("dead_letters", 1)]
    assert all(p.startswith(("publish/", "sealed_dead_letters/")) for p, _, _ in manifest)
    assert seen_lineage(root) == []

    result = sink.commit(attempt)
    assert (result.outcome, result.published_rows, result.dead_letter_rows) == (PUBLISHED, 9, 1)
    partition = sink.partition_dir(attempt)
    assert os.path.basename(partition) == "eos_window_start=2024-01-01T00%3A00%3A00Z"
    assert visible_entries(root) == [os.path.basename(partition)]
    assert seen_lineage(root) == lineage(plan, skip={(0, 2)})
    rows = read_root(root)
    assert {str(r["eos_window_start"]) for r in rows} == {"2024-01-01T00:00:00Z"}  # the directory's value
    assert sorted(r["note"] for r in rows if r["eos_partition"] == 1) == [f"v1 orders/1/{o}" for o in range(5)]

    doc = commit_doc(partition)
    assert (doc["format"], doc["pipeline"], doc["epoch"], doc["rows"], doc["dead_letters"]) == (
        COMMIT_FORMAT, PIPELINE, 1, 9, 1)
    assert doc["window_start"] == plan.window.start.isoformat()
    assert sorted(f["name"] for f in doc["files"]) == sorted(e for e in os.listdir(partition) if e != COMMIT_FILE)
    assert doc["offsets"] == [{"topic": "orders", "partition": p, "start_offset": 0, "end_offset": 5} for p in (0, 1)]

    assert execute(pg_url, 'SELECT epoch, topic, partition, "offset", error, key, value FROM eos.dead_letters') == [
        (1, "orders", 0, 2, "amount is not a number", b"k\x00", b"\xff{")]
    assert window_row(pg_url, plan.window) == ("committed", 1, 1, 9, 1)
    assert publication(pg_url, attempt) == ("published", os.path.relpath(partition, root), None)
    with psycopg.connect(pg_url) as conn:
        assert load_offsets(conn, PIPELINE) == {TopicPartition("orders", 0): 5, TopicPartition("orders", 1): 5}
    assert result.offsets == {TopicPartition("orders", 0): 5, TopicPartition("orders", 1): 5}
    assert staging_dirs(root) == []  # the staging became the partition; the rest is deleted


def test_retried_commit_is_nothing_to_do(pg_url, root, sink, freeze_windows):
    [plan] = freeze_windows(PIPELINE, [0])
    attempt = stage(sink, plan)
    assert sink.commit(attempt).outcome == PUBLISHED
    partition = sink.partition_dir(attempt)
    before = {e.name: (e.inode(), e.stat().st_mtime_ns) for e in os.scandir(partition)}
    again = sink.commit(attempt)
    assert (again.outcome, again.published_rows) == (ALREADY_COMMITTED, 10)
    assert "nothing to do" in str(again)
    assert {e.name: (e.inode(), e.stat().st_mtime_ns) for e in os.scandir(partition)} == before
    assert seen_lineage(root) == lineage(plan)


def test_racing_commits_of_one_attempt_publish_exactly_once(pg_url, root, sink, freeze_windows):
    [plan] = freeze_windows(PIPELINE, [0])
    attempt = stage(sink, plan)
    results, errors = [], []

    def commit():
        try:
            results.append(sink.commit(attempt).outcome)
        except Exception as exc:  # noqa: BLE001 - handed to the test
            errors.append(exc)

    threads = [threading.Thread(target=commit) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert errors == [] and sorted(results) == sorted([PUBLISHED, ALREADY_COMMITTED, ALREADY_COMMITTED])
    assert seen_lineage(root) == lineage(plan) and staging_dirs(root) == []


def test_out_of_order_windows_advance_offsets_over_the_contiguous_prefix(pg_url, root, sink, freeze_windows):
    w0, w1, w2 = freeze_windows(PIPELINE, [0, 1, 2])
    sink.commit(stage(sink, w1))
    with psycopg.connect(pg_url) as conn:
        assert load_offsets(conn, PIPELINE) == {}
    sink.commit(stage(sink, w0))
    with psycopg.connect(pg_url) as conn:
        assert load_offsets(conn, PIPELINE) == {TopicPartition("orders", 0): 10, TopicPartition("orders", 1): 10}
    sink.commit(stage(sink, w2))
    assert seen_lineage(root) == sorted(lineage(w0) + lineage(w1) + lineage(w2))
    assert len(visible_entries(root)) == 3


# --------------------------------------------------------------------------- crash points of the commit


def test_crash_after_the_decision_before_any_file_moved_then_a_retry_publishes(pg_url, root, sink, freeze_windows):
    [plan] = freeze_windows(PIPELINE, [0])
    attempt = stage(sink, plan)
    sink.decide(attempt)  # the commit task dies right after the decision's transaction
    assert window_row(pg_url, plan.window)[0] == "committed"
    assert publication(pg_url, attempt)[0] == "decided"
    assert visible_entries(root) == [] and seen_lineage(root) == []  # decided, not visible yet

    result = sink.commit(attempt)  # the retried commit task finishes it (the decision was the commit)
    assert result.outcome == ALREADY_COMMITTED and seen_lineage(root) == lineage(plan)
    assert publication(pg_url, attempt)[0] == "published" and staging_dirs(root) == []
    assert sink.commit(attempt).outcome == ALREADY_COMMITTED


def test_crash_between_the_commit_file_and_the_rename_then_a_retry_publishes(pg_url, root, sink, freeze_windows):
    [plan] = freeze_windows(PIPELINE, [0])
    attempt = stage(sink, plan)
    sink.decide(attempt)
    with sink.ledger.connect() as conn, conn.transaction():
        doc = sink._commit_document(conn, attempt, sink.partition_path(attempt))
    sink.write_commit_file(os.path.join(sink.staging_dir(attempt), PUBLISH), doc)  # then the task dies
    assert visible_entries(root) == []

    assert sink.commit(attempt).outcome == ALREADY_COMMITTED
    assert seen_lineage(root) == lineage(plan) and commit_doc(sink.partition_dir(attempt))["epoch"] == 1


def test_crash_after_the_rename_before_the_ledger_knows_then_a_retry_has_nothing_to_do(pg_url, root, sink,
                                                                                         freeze_windows):
    [plan] = freeze_windows(PIPELINE, [0])
    attempt = stage(sink, plan)
    sink.decide(attempt)
    with sink.ledger.connect() as conn, conn.transaction():
        doc = sink._commit_document(conn, attempt, sink.partition_path(attempt))
    assert sink._move_into_place(attempt, sink.partition_path(attempt), doc) == RENAMED  # then the task dies
    assert seen_lineage(root) == lineage(plan)  # published, with its commit file, in one rename
    assert commit_doc(sink.partition_dir(attempt))["epoch"] == 1
    assert publication(pg_url, attempt)[0] == "decided"

    again = sink.commit(attempt)
    assert again.outcome == ALREADY_COMMITTED  # the destination is complete: nothing to do
    assert publication(pg_url, attempt)[0] == "published" and staging_dirs(root) == []
    assert seen_lineage(root) == lineage(plan)


def test_a_later_commit_or_the_sweep_finishes_a_decided_window(pg_url, root, sink, freeze_windows):
    w0, w1, w2 = freeze_windows(PIPELINE, [0, 1, 2])
    a0 = stage(sink, w0)
    sink.decide(a0)  # its commit task died and is never retried
    assert sink.commit(stage(sink, w1)).outcome == PUBLISHED  # the next window's commit finishes window 0
    assert publication(pg_url, a0)[0] == "published"
    assert seen_lineage(root) == sorted(lineage(w0) + lineage(w1))

    a2 = stage(sink, w2)
    sink.decide(a2)
    assert sink.sweep(timedelta(hours=1)) == []  # nothing to abort; window 2's publication finished
    assert publication(pg_url, a2)[0] == "published"
    assert seen_lineage(root) == sorted(lineage(w0) + lineage(w1) + lineage(w2))


def test_a_clear_whose_commit_is_skipped_finishes_the_decided_window(pg_url, root, sink, freeze_windows):
    """Regression (found by the fault suite): the commit task died after the
    decision, and the run was cleared instead of retried. The clear's attempt
    is skipped (on_committed='skip'); its commit is a later commit of the
    pipeline and must finish the committed attempt's publication."""
    [plan] = freeze_windows(PIPELINE, [0])
    first = stage(sink, plan)
    sink.decide(first)  # the commit task dies here
    assert visible_entries(root) == []
    cleared = stage(sink, plan)  # the clear: a new attempt of the committed window
    assert sink.commit(cleared).outcome == SKIPPED
    assert publication(pg_url, first)[0] == "published" and seen_lineage(root) == lineage(plan)
    assert staging_dirs(root) == []


def test_neither_the_partition_nor_the_staging_complete_is_a_loud_error(pg_url, root, sink, freeze_windows):
    [plan] = freeze_windows(PIPELINE, [0])
    attempt = stage(sink, plan)
    sink.decide(attempt)
    staged = os.path.join(sink.staging_dir(attempt), PUBLISH)
    os.unlink(os.path.join(staged, sorted(os.listdir(staged))[0]))  # a decided window's file is lost
    with pytest.raises(TargetError) as failed:
        sink.commit(attempt)
    message = str(failed.value)
    assert sink.partition_dir(attempt) in message and staged in message and "does not exist" in message
    assert visible_entries(root) == [] and publication(pg_url, attempt)[0] == "decided"


# --------------------------------------------------------------------------- what is never published


def test_a_chunk_the_checkpoint_does_not_list_is_never_published(pg_url, root, sink, freeze_windows):
    [plan] = freeze_windows(PIPELINE, [0])
    attempt = sink.begin(plan.window)
    writer = sink.writer(attempt)
    batches = records(plan)
    chunks = [writer.write([b]) for b in batches]
    writer.write([records(plan, version=9)[0]])  # a task that failed after writing, or a speculative copy
    sink.checkpoint(attempt, consumed(plan), chunks)
    assert sink.prepare(attempt).prepared
    assert sink.commit(attempt).outcome == PUBLISHED
    assert seen_lineage(root) == lineage(plan)
    assert {r["note"][:2] for r in read_root(root)} == {"v1"}


def test_a_zombie_writer_after_fencing_never_reaches_a_published_partition(pg_url, root, sink, freeze_windows):
    [plan] = freeze_windows(PIPELINE, [0])
    zombie = sink.begin(plan.window)
    zombie_writer = sink.writer(zombie)
    zombie_chunk = zombie_writer.write([records(plan, version=7)[0]])
    rerun = sink.begin(plan.window)  # fences the zombie
    zombie_chunk2 = zombie_writer.write([records(plan, version=7)[1]])  # it keeps writing its own staging
    with pytest.raises(AttemptFenced):
        sink.checkpoint(zombie, consumed(plan), [zombie_chunk, zombie_chunk2])

    writer = sink.writer(rerun)
    chunks = [writer.write([b]) for b in records(plan)]
    sink.checkpoint(rerun, consumed(plan), chunks)
    assert sink.prepare(rerun).prepared
    zombie_writer.write([records(plan, version=7)[0]])  # still writing, during the commit's window
    with pytest.raises(AttemptFenced):
        sink.commit(zombie)
    assert sink.commit(rerun).outcome == PUBLISHED
    assert seen_lineage(root) == lineage(plan) and {r["note"][:2] for r in read_root(root)} == {"v1"}
    # committing the zombie now: the window is committed, so it is skipped, aborted and its staging deleted
    assert sink.commit(zombie).outcome == SKIPPED
    assert attempt_state(pg_url, zombie)[0] == "aborted" and staging_dirs(root) == []
    assert sink.abort(zombie, "zombie") is False
    with pytest.raises(TargetError, match="aborted or committed"):
        zombie_writer.write([records(plan, version=7)[0]])  # its staging is gone: refused, nothing recreated
    with pytest.raises(TargetError, match="aborted or committed"):
        writer.write([records(plan, version=8)[0]])  # the committed attempt's staging is gone as well
    assert staging_dirs(root) == [] and seen_lineage(root) == lineage(plan)


def test_staging_changed_after_prepare_is_refused_before_the_decision(pg_url, root, sink, freeze_windows):
    [plan] = freeze_windows(PIPELINE, [0])
    attempt = stage(sink, plan)
    sealed = os.path.join(sink.staging_dir(attempt), PUBLISH)
    victim = os.path.join(sealed, sorted(os.listdir(sealed))[0])
    with open(victim, "ab") as f:
        f.write(b"x")
    with pytest.raises(NotPrepared, match="bytes"):
        sink.commit(attempt)
    assert window_row(pg_url, plan.window)[0] == "planned" and publication(pg_url, attempt) is None
    assert visible_entries(root) == []
    assert sink.abort(attempt, "staging damaged") and staging_dirs(root) == []
    assert sink.commit(stage(sink, plan)).outcome == PUBLISHED and seen_lineage(root) == lineage(plan)


def test_a_half_written_file_never_counts(pg_url, root, sink, freeze_windows):
    [plan] = freeze_windows(PIPELINE, [0])
    attempt = sink.begin(plan.window)
    writer = sink.writer(attempt)

    def dying_batches():
        yield records(plan)[0]
        raise OSError(28, "No space left on device")  # the disk fills in the middle of the chunk

    with pytest.raises(TargetError, match="No space left"):
        writer.write(dying_batches())
    assert os.listdir(writer.data_dir) == []  # its temporary file is gone, no part of it is counted
    assert sink.count_staged(attempt) == {}
    # a file some writer left half written under a visible name is refused at the job commit
    with open(os.path.join(writer.data_dir, "part-00000-broken.parquet"), "wb") as f:
        f.write(b"PAR1 not really")
    with pytest.raises(TargetError, match="footer"):
        sink.staged_chunks(attempt)
    assert sink.abort(attempt, "disk full") and window_row(pg_url, plan.window)[0] == "planned"
    assert sink.commit(stage(sink, plan)).outcome == PUBLISHED and seen_lineage(root) == lineage(plan)


# --------------------------------------------------------------------------- Spark's own writer


def test_files_of_a_native_parquet_writer_are_staged_counted_and_published(pg_url, root, sink, freeze_windows):
    """What the Spark stage job does: its own Parquet writer fills data/ (with
    Spark's file names, _SUCCESS, .crc files and a _temporary folder of a task
    that never committed), the dead letters go to dead_letters/, and the job
    commit checkpoints ``staged_chunks``."""
    [plan] = freeze_windows(PIPELINE, [0])
    attempt = sink.begin(plan.window)
    writer = sink.writer(attempt)
    for i, batch in enumerate(records(plan, skip={(1, 4)})):
        name = f"part-{i:05d}-5b6c7d8e-0000-4000-8000-00000000000{i}-c000.snappy.parquet"
        pq.write_table(pa.Table.from_batches([batch]), os.path.join(writer.data_dir, name), compression="snappy")
        open(os.path.join(writer.data_dir, f".{name}.crc"), "wb").close()
    open(os.path.join(writer.data_dir, "_SUCCESS"), "wb").close()
    os.makedirs(os.path.join(writer.data_dir, "_temporary", "0", "task_1"))
    pq.write_table(pa.Table.from_batches([records(plan, version=5)[0]]),
                   os.path.join(writer.data_dir, "_temporary", "0", "task_1", "part-x.parquet"))
    dead = pa.table({"topic": ["orders"], "partition": pa.array([1], pa.int32()), "offset": pa.array([4], pa.int64()),
                     "error": ["bad"], "key": pa.array([None], pa.binary()), "value": pa.array([b"v"], pa.binary())})
    pq.write_table(dead, os.path.join(writer.dead_letter_dir, "part-00000-dl.snappy.parquet"))

    chunks = sink.staged_chunks(attempt)
    assert sorted((c.rows, c.dead_letters) for c in chunks) == [(0, 1), (4, 0), (5, 0)]
    # a second run of the job (the first died after writing) starts from empty writers' folders
    assert sink.clear_writes(attempt) == 3 and sink.count_staged(attempt) == {}
    assert visible_entries(writer.data_dir) == [] and os.listdir(writer.dead_letter_dir) == []
    assert not os.path.exists(os.path.join(writer.data_dir, "_temporary"))
    for i, batch in enumerate(records(plan, skip={(1, 4)})):
        name = f"part-{i:05d}-5b6c7d8e-0000-4000-8000-00000000000{i}-c000.snappy.parquet"
        pq.write_table(pa.Table.from_batches([batch]), os.path.join(writer.data_dir, name), compression="snappy")
    pq.write_table(dead, os.path.join(writer.dead_letter_dir, "part-00000-dl.snappy.parquet"))
    chunks = sink.staged_chunks(attempt)
    sink.checkpoint(attempt, consumed(plan), chunks)
    assert sink.prepare(attempt).prepared
    result = sink.commit(attempt)
    assert (result.outcome, result.published_rows, result.dead_letter_rows) == (PUBLISHED, 9, 1)
    assert seen_lineage(root) == lineage(plan, skip={(1, 4)})
    assert sorted(os.listdir(sink.partition_dir(attempt))) == sorted(
        [COMMIT_FILE] + [f"part-{i:05d}-5b6c7d8e-0000-4000-8000-00000000000{i}-c000.snappy.parquet" for i in (0, 1)])
    assert execute(pg_url, 'SELECT partition, "offset", error FROM eos.dead_letters') == [(1, 4, "bad")]


# --------------------------------------------------------------------------- rerun of a committed window


def test_a_reader_whose_listing_began_before_a_replace_reads_the_whole_old_version(pg_url, root, ledger,
                                                                                   freeze_windows):
    """The old version is moved to the trash, not deleted: a reader holding the
    partition directory open from before the exchange (a listing in progress)
    still finds every file of the old version, whole; the sweep deletes it only
    after the retention; with a retention of 0 the commit deletes it at once."""
    sink = file_target(root, pg_url, on_committed="replace").sink()
    (w0,) = freeze_windows(PIPELINE, [0])
    first = stage(sink, w0)
    sink.commit(first)
    rerun = stage(sink, w0, version=2)
    listing = os.open(sink.partition_dir(first), os.O_RDONLY | os.O_DIRECTORY)  # the reader's opendir
    try:
        assert sink.commit(rerun).outcome == REPLACED
        names = sorted(n for n in os.listdir(listing) if not n.startswith("_"))
        rows = []
        for name in names:
            with open(os.open(name, os.O_RDONLY, dir_fd=listing), "rb") as f:
                rows += pq.read_table(f).to_pylist()
    finally:
        os.close(listing)
    assert sorted((r["eos_topic"], r["eos_partition"], r["eos_offset"]) for r in rows) == lineage(w0)
    assert {r["note"][:2] for r in rows} == {"v1"}  # the old version, whole
    assert {r["note"][:2] for r in read_root(root)} == {"v2"}  # a new listing: the new one
    assert sink.sweep(timedelta(0)) == [] and len(os.listdir(root / TRASH_DIR)) == 1  # young: kept
    assert len(sink.delete_expired_trash(now=time.time() + 600)) == 1 and os.listdir(root / TRASH_DIR) == []

    at_once = file_target(root, pg_url, on_committed="replace", replaced_retention=timedelta(0)).sink()
    third = stage(at_once, w0, version=3)
    assert at_once.commit(third).outcome == REPLACED
    assert os.listdir(root / TRASH_DIR) == [] and {r["note"][:2] for r in read_root(root)} == {"v3"}



def test_replace_swaps_the_partition_atomically_readers_never_see_it_missing(pg_url, root, ledger, freeze_windows):
    sink = file_target(root, pg_url, on_committed="replace").sink()
    w0, w1 = freeze_windows(PIPELINE, [0, 1])
    first = stage(sink, w0, dead=[{"topic": "orders", "partition": 0, "offset": 0, "error": "old"}],
                  skip={(0, 0)})
    assert sink.commit(first).outcome == PUBLISHED
    sink.commit(stage(sink, w1))
    partition = sink.partition_dir(first)
    rerun = stage(sink, w0, version=2)  # the fix: every record published, none dead

    old_names = set(os.listdir(partition))
    new_names = {os.path.basename(p) for (p,) in execute(
        pg_url, "SELECT path FROM eos.staged_files WHERE epoch = 2 AND kind = 'data'")} | {COMMIT_FILE}
    assert len(old_names) == len(new_names) == 3 and not old_names & new_names - {COMMIT_FILE}

    def observe():
        """A reader listing the window's directory sees one whole version:
        never nothing, never a mix of the two versions' files."""
        names = set(os.listdir(partition))
        assert names in (old_names, new_names), f"a half-replaced or missing window: {sorted(names)}"
        return 1 if names == old_names else 2

    seen, stop, errors = [], threading.Event(), []

    def reader():
        while not stop.is_set():
            try:
                seen.append(observe())
            except Exception as exc:  # noqa: BLE001 - handed to the test
                errors.append(exc)

    assert observe() == 1
    sink.decide(rerun)  # step by step: decided, not yet swapped
    assert observe() == 1 and seen_lineage(root) == sorted(lineage(w0, skip={(0, 0)}) + lineage(w1))
    watcher = threading.Thread(target=reader, daemon=True)
    watcher.start()
    try:
        assert sink.publish(rerun) == EXCHANGED
    finally:
        stop.set()
        watcher.join(5)
    assert errors == [], f"a reader saw the window missing or half replaced: {errors[0]!r}"
    assert observe() == 2 and seen and set(seen) <= {1, 2}
    assert seen_lineage(root) == sorted(lineage(w0) + lineage(w1))
    assert {r["note"][:2] for r in read_root(root) if r["id"] % 1_000_000 < 5} == {"v2"}
    # the old version waits in the trash for its retention (readers still listing it), then goes
    (kept,) = os.listdir(root / TRASH_DIR)
    assert sorted(os.listdir(root / TRASH_DIR / kept)) == sorted(old_names) and staging_dirs(root) == []
    assert json.loads((root / TRASH_DIR / kept / COMMIT_FILE).read_text())["epoch"] == 1
    assert sink.delete_expired_trash() == [] and os.listdir(root / TRASH_DIR) == [kept]
    assert sink.delete_expired_trash(now=time.time() + sink.replaced_retention_s) == [kept]
    assert os.listdir(root / TRASH_DIR) == []
    result = sink.commit(rerun)  # the retried task: nothing left to do
    assert (result.outcome, result.committed_epoch) == (ALREADY_COMMITTED, 2)
    assert execute(pg_url, "SELECT count(*) FROM eos.dead_letters") == [(0,)]
    assert window_row(pg_url, w0.window) == ("committed", 2, 2, 10, 0)
    assert publication(pg_url, rerun) == ("published", sink.partition_path(rerun), 1)


def test_replace_through_commit_reports_the_rows_replaced(pg_url, root, ledger, freeze_windows):
    sink = file_target(root, pg_url, on_committed="replace").sink()
    [plan] = freeze_windows(PIPELINE, [0])
    sink.commit(stage(sink, plan))
    result = sink.commit(stage(sink, plan, version=3, skip={(1, 1)}))
    assert (result.outcome, result.replaced_rows, result.published_rows) == (REPLACED, 10, 9)
    assert seen_lineage(root) == lineage(plan, skip={(1, 1)})


def test_skip_rerun_is_a_reported_noop_and_its_staging_is_deleted(pg_url, root, sink, freeze_windows):
    [plan] = freeze_windows(PIPELINE, [0])
    sink.commit(stage(sink, plan))
    before = sorted(os.listdir(sink.partition_dir(plan.window)))
    rerun = stage(sink, plan, version=2)
    result = sink.commit(rerun)
    assert (result.outcome, result.committed_epoch, result.changed) == (SKIPPED, 1, False)
    assert attempt_state(pg_url, rerun)[0] == "aborted" and staging_dirs(root) == []
    assert sorted(os.listdir(sink.partition_dir(plan.window))) == before
    assert {r["note"][:2] for r in read_root(root)} == {"v1"}
    assert sink.commit(rerun).outcome == SKIPPED


# --------------------------------------------------------------------------- abort and sweep


def test_abort_deletes_staging_and_leaves_the_window_rerunnable(pg_url, root, sink, freeze_windows):
    [plan] = freeze_windows(PIPELINE, [0])
    first = stage(sink, plan, prepare=False)
    second = sink.begin(plan.window)
    assert len(staging_dirs(root)) == 2
    aborted = sink.abort_window(plan.window, "stage failed")
    assert aborted == [first, second] and staging_dirs(root) == []
    assert [attempt_state(pg_url, a) for a in aborted] == [("aborted", "stage failed")] * 2
    assert sink.abort(first, "again") is False  # idempotent
    with pytest.raises(AttemptClosed, match="aborted"):
        sink.prepare(first)
    with pytest.raises(TargetError, match="aborted or committed"):
        sink.writer(second)
    rerun = stage(sink, plan)
    assert sink.commit(rerun).outcome == PUBLISHED
    assert sink.abort(rerun, "late abort") is False  # a committed attempt stays committed
    assert seen_lineage(root) == lineage(plan)


def test_the_teardowns_retry_finishes_an_abort_that_died_before_deleting_the_staging(pg_url, root, sink,
                                                                                     freeze_windows):
    """Regression (found by the fault suite, abort.inside=crash): the abort
    marked its attempt aborted, then its process died; the teardown's retry
    finds no live attempt, and must still delete the staging."""
    [plan] = freeze_windows(PIPELINE, [0])
    attempt = stage(sink, plan, prepare=False)
    with sink.ledger.connect() as conn, conn.transaction():
        assert mark_aborted(conn, attempt, "the teardown, then its process died")
    assert staging_dirs(root) == [attempt.staging]
    assert sink.abort_window(plan.window, "the teardown's retry") == []  # nothing live to abort ...
    assert staging_dirs(root) == []  # ... and the staging is gone all the same


def test_sweep_aborts_stale_attempts_and_deletes_orphaned_staging(pg_url, root, sink, freeze_windows):
    old, recent = freeze_windows(PIPELINE, [0, 1])
    stale = stage(sink, old)
    fresh = sink.begin(recent.window)
    orphan = root / STAGING_DIR / "left_by_a_begin_that_rolled_back"
    orphan.mkdir()
    os.utime(orphan, (0, 0))
    execute(pg_url, "UPDATE eos.attempts SET opened_at = now() - interval '3 hours' WHERE window_start = %s",
            (old.window.start,))
    assert sink.sweep(timedelta(hours=1)) == [stale]
    assert staging_dirs(root) == [fresh.staging]
    assert attempt_state(pg_url, stale)[0] == "aborted"


PAYMENTS_DDL = """
    CREATE TABLE payments (
        id bigint NOT NULL, eos_topic text NOT NULL, eos_partition integer NOT NULL, eos_offset bigint NOT NULL,
        eos_pipeline text NOT NULL, eos_window_start timestamptz NOT NULL
    );
"""


def claim(ledger, pipeline, topics, target):
    """The claim a DAG's plan records (PlanRequest(target_id=...))."""
    from airflow_eos.core.ownership import Claim
    with ledger.connect() as conn, conn.transaction():
        ledger.lock_pipeline(conn, pipeline)
        ledger.save_claim(conn, Claim(pipeline, topics, f"dag_{pipeline}", target))


def two_targets_with_zombies(pg_url, ledger, sink, freeze_windows, *, claimed):
    """One ledger database, two pipelines: orders_hourly into the file target,
    payments_hourly into a PostgreSQL table; each with a zombie attempt opened
    3 hours ago (staged into the root, begun in eos_staging)."""
    from airflow_eos.targets.postgres.target import PostgresTarget
    execute(pg_url, PAYMENTS_DDL)
    pg = PostgresTarget(pg_url, "payments").sink()
    [files_plan] = freeze_windows(PIPELINE, [0])
    [pg_plan] = freeze_windows("payments_hourly", [0], partitions=(("payments", 0),))
    if claimed:
        claim(ledger, PIPELINE, ("orders",), sink.target_id)
        claim(ledger, "payments_hourly", ("payments",), pg.target_id)
    files_zombie = stage(sink, files_plan, prepare=False)
    pg_zombie = pg.begin(pg_plan.window)
    execute(pg_url, "UPDATE eos.attempts SET opened_at = now() - interval '3 hours'")
    return pg, files_zombie, pg_zombie


def pg_staging(url):
    return sorted(r[0] for r in execute(url, "SELECT tablename FROM pg_tables WHERE schemaname = 'eos_staging'"))


@pytest.mark.parametrize("first", ["files", "postgres"])
def test_each_targets_sweep_aborts_only_the_attempts_of_its_own_pipelines(pg_url, root, sink, ledger,
                                                                           freeze_windows, first):
    """Regression: Sink.sweep aborted the live attempts of every pipeline in
    the ledger's database. The file sink's sweep marked a PostgreSQL
    pipeline's attempt aborted (no directory to delete), and its staging
    tables were orphaned for good; the PostgreSQL sink's sweep did the same to
    a file pipeline's attempt. Each sweeps the pipelines claimed for it."""
    pg, files_zombie, pg_zombie = two_targets_with_zombies(pg_url, ledger, sink, freeze_windows, claimed=True)
    assert sink.stale_attempts(timedelta(hours=1)) == [files_zombie]
    assert pg.stale_attempts(timedelta(hours=1)) == [pg_zombie]
    pg_tables = pg_staging(pg_url)
    assert pg_zombie.staging in pg_tables
    if first == "files":
        assert sink.sweep(timedelta(hours=1)) == [files_zombie]
        assert staging_dirs(root) == [] and attempt_state(pg_url, files_zombie)[0] == "aborted"
        assert attempt_state(pg_url, pg_zombie)[0] == "open" and pg_staging(pg_url) == pg_tables  # survives
        assert pg.sweep(timedelta(hours=1)) == [pg_zombie]
    else:
        assert pg.sweep(timedelta(hours=1)) == [pg_zombie]
        assert pg_staging(pg_url) == [] and attempt_state(pg_url, pg_zombie)[0] == "aborted"
        assert attempt_state(pg_url, files_zombie)[0] == "checkpointed"  # survives
        assert staging_dirs(root) == [files_zombie.staging]
        assert sink.sweep(timedelta(hours=1)) == [files_zombie]
    assert staging_dirs(root) == [] and pg_staging(pg_url) == []
    assert [attempt_state(pg_url, a) for a in (files_zombie, pg_zombie)] == [
        ("aborted", "swept: live for longer than 1:00:00")] * 2
    assert sink.sweep(timedelta(hours=1)) == [] and pg.sweep(timedelta(hours=1)) == []


def test_the_cli_sweeps_each_claimed_target_with_its_own_sink(pg_url, root, sink, ledger, freeze_windows):
    import io

    from airflow_eos.cli import main

    def run(*argv):
        out = io.StringIO()
        assert main(["sweep", "--older-than", "1h", "--postgres-url", pg_url, *argv], out=out) == 0
        return out.getvalue()

    pg, files_zombie, pg_zombie = two_targets_with_zombies(pg_url, ledger, sink, freeze_windows, claimed=True)
    listed = run("--dry-run")
    assert listed.startswith("would abort 2 attempt(s) opened before ")
    assert [line.split()[-2:] for line in listed.splitlines()[3:]] == [
        [files_zombie.staging, sink.target_id], [pg_zombie.staging, pg.target_id]]
    assert run("--table", "other_table").startswith("nothing to sweep: no live attempt of target "
                                                    "postgresql:public.other_table opened before ")
    assert [attempt_state(pg_url, a)[0] for a in (files_zombie, pg_zombie)] == ["checkpointed", "open"]
    swept = run()
    assert swept.startswith("aborted 2 attempt(s) opened before ")
    assert [line.split()[-1] for line in swept.splitlines()[3:]] == [sink.target_id, pg.target_id]
    assert staging_dirs(root) == [] and pg_staging(pg_url) == []
    assert run().startswith("nothing to sweep: no live attempt opened before ")


def test_attempts_of_pipelines_claimed_for_no_target(pg_url, root, sink, ledger, freeze_windows):
    """Pipelines planned without their target (a version before claims, a
    hand-built plan operator without target=): the PostgreSQL sink sweeps
    them, as before targets were told apart; the file sink sweeps only those
    whose staging directory is under its root, never a PostgreSQL one."""
    pg, files_zombie, pg_zombie = two_targets_with_zombies(pg_url, ledger, sink, freeze_windows, claimed=False)
    pg_tables = pg_staging(pg_url)
    assert sink.sweep(timedelta(hours=1)) == [files_zombie]
    assert staging_dirs(root) == []
    assert attempt_state(pg_url, pg_zombie)[0] == "open" and pg_staging(pg_url) == pg_tables  # survives
    assert pg.sweep(timedelta(hours=1)) == [pg_zombie]
    assert pg_staging(pg_url) == []

    # The PostgreSQL sink takes an unclaimed file pipeline's attempt for its
    # own; the file sink's sweep then deletes the staging of the ended attempt.
    [plan] = freeze_windows(PIPELINE, [1])
    zombie = stage(sink, plan, prepare=False)
    execute(pg_url, "UPDATE eos.attempts SET opened_at = now() - interval '3 hours' WHERE state <> 'aborted'")
    assert pg.sweep(timedelta(hours=1)) == [zombie]
    assert staging_dirs(root) == [zombie.staging]
    assert sink.sweep(timedelta(hours=1)) == [] and staging_dirs(root) == []


# --------------------------------------------------------------------------- bad input


def test_an_existing_foreign_partition_directory_is_never_overwritten(pg_url, root, sink, freeze_windows):
    [plan] = freeze_windows(PIPELINE, [0])
    foreign = sink.partition_dir(plan.window)
    os.makedirs(foreign)
    with open(os.path.join(foreign, "precious.parquet"), "wb") as f:
        f.write(b"someone else's data")
    attempt = stage(sink, plan)
    with pytest.raises(TargetError, match="never overwritten") as failed:
        sink.commit(attempt)
    assert foreign in str(failed.value) and "no _eos_commit.json" in str(failed.value)
    assert "Nothing was decided" in str(failed.value) and "Move the directory away" in str(failed.value)
    assert os.listdir(foreign) == ["precious.parquet"]
    # Issue 33: the destination is checked before the decision. The window is not committed, the offsets did
    # not move, no publication is decided (before, the window was committed and never published).
    assert window_row(pg_url, plan.window)[0] == "planned" and publication(pg_url, attempt) is None
    assert load_offsets_of(pg_url) == {}
    assert attempt_state(pg_url, attempt)[0] == "prepared"
    # moving the foreign directory away and retrying the commit publishes it
    os.rename(foreign, str(root / "_moved_away"))
    assert sink.commit(attempt).outcome == PUBLISHED and seen_lineage(root) == lineage(plan)


def load_offsets_of(url):
    with psycopg.connect(url) as conn:
        return load_offsets(conn, PIPELINE)


def test_a_window_decided_and_not_published_fails_its_commit_and_every_rerun_until_published(
        pg_url, root, sink, freeze_windows):
    """Issue 33: a directory appears at the partition path between the
    decision and the rename. The window is committed in the ledger and not
    in the root: the commit fails, and so does every rerun (a retried commit,
    a Clear's stage, a cleared attempt's skipped commit) until it is
    published; status, the UI page and verify say "decided, not published"."""
    from airflow_eos import steps
    from airflow_eos.cli.status import print_status, read_status
    from airflow_eos.core.ledger import Ledger
    from airflow_eos.ui.page import render
    from airflow_eos.ui.status import read_ledger

    [plan] = freeze_windows(PIPELINE, [0])
    attempt = stage(sink, plan)
    sink.decide(attempt)  # the decision; then someone creates the directory before the rename
    foreign = sink.partition_dir(plan.window)
    os.makedirs(foreign)
    with pytest.raises(TargetError, match="decided, not published|NOT published") as failed:
        sink.commit(attempt)  # the commit's retry
    assert foreign in str(failed.value) and "retry the commit task or clear the run" in str(failed.value)
    cleared = stage(sink, plan)  # a Clear whose stage ran before this fix: its commit is skipped
    with pytest.raises(TargetError, match="decided, not published") as failed:
        sink.commit(cleared)  # was SKIPPED: the run ended successful with the window invisible
    assert foreign in str(failed.value)
    with pytest.raises(TargetError, match="decided, not published"):
        steps.stage(sink, plan, job=lambda a: pytest.fail("a rerun must not stage a window it cannot publish"))
    assert seen_lineage(root) == [] and publication(pg_url, attempt)[0] == "decided"

    status = read_status(Ledger(pg_url), PIPELINE)
    assert [w["state"] for w in status["windows"]] == ["decided, not published"]
    text = io.StringIO()
    print_status(status, text)
    assert "1 decided, not published" in text.getvalue() and "retry the commit task" in text.getvalue()
    [page] = read_ledger(Ledger(pg_url))
    assert [w.status.label for w in page.windows] == ["decided, not published"]
    assert "decided, not published" in render([page], source="test")

    os.rmdir(foreign)  # the directory moved away: the commit task's retry publishes the window
    assert steps.commit(sink, attempt).outcome == ALREADY_COMMITTED
    assert publication(pg_url, attempt)[0] == "published" and seen_lineage(root) == lineage(plan)
    assert read_status(Ledger(pg_url), PIPELINE)["windows"][0]["state"] == "committed"


def test_an_empty_or_other_pipelines_partition_directory_is_never_replaced(pg_url, root, sink, freeze_windows):
    [plan] = freeze_windows(PIPELINE, [0])
    partition = sink.partition_dir(plan.window)
    os.makedirs(partition)  # empty: a plain rename(2) would replace it silently
    attempt = stage(sink, plan)
    with pytest.raises(TargetError, match="never overwritten"):
        sink.commit(attempt)
    with open(os.path.join(partition, COMMIT_FILE), "w") as f:
        json.dump({"format": COMMIT_FORMAT, "pipeline": "another", "window_start": plan.window.start.isoformat(),
                   "epoch": 1, "files": []}, f)
    with pytest.raises(TargetError, match="'another'"):
        sink.commit(attempt)
    assert os.listdir(partition) == [COMMIT_FILE]


def test_a_missing_or_unwritable_root_fails_begin_clearly_and_opens_no_attempt(pg_url, tmp_path, ledger,
                                                                             freeze_windows):
    [plan] = freeze_windows(PIPELINE, [0])
    missing = tmp_path / "nowhere"
    with pytest.raises(TargetError, match="does not exist") as failed:
        file_target(missing, pg_url).sink().begin(plan.window)
    assert f"mkdir -p {missing}" in str(failed.value)
    assert window_row(pg_url, plan.window)[1] == 0  # no attempt opened

    locked = tmp_path / "locked"
    locked.mkdir()
    with read_only(locked):
        with pytest.raises(TargetError) as failed:
            file_target(locked, pg_url).sink().begin(plan.window)
    assert str(locked) in str(failed.value) and "writable" in str(failed.value)
    assert window_row(pg_url, plan.window)[1] == 0
    file_target(locked, pg_url).sink().begin(plan.window)  # once writable, it works


@contextmanager
def read_only(path):
    """A directory nobody can create anything in: chmod for a user, the
    immutable attribute for root (which ignores permissions)."""
    if os.geteuid() == 0:
        subprocess.run(["chattr", "+i", str(path)], check=True)
        try:
            yield
        finally:
            subprocess.run(["chattr", "-i", str(path)], check=True)
    else:
        os.chmod(path, 0o555)
        try:
            yield
        finally:
            os.chmod(path, 0o755)


def test_a_schema_change_between_windows_is_refused_at_the_job_commit(pg_url, root, sink, freeze_windows):
    w0, w1 = freeze_windows(PIPELINE, [0, 1])
    sink.commit(stage(sink, w0))
    attempt = sink.begin(w1.window)
    writer = sink.writer(attempt)
    changed = [b.set_column(1, "amount", pa.array([str(v) for v in b["amount"].to_pylist()]))
               for b in records(w1)]
    chunks = [writer.write([b]) for b in changed]
    with pytest.raises(TargetError, match="schema differs") as failed:
        sink.checkpoint(attempt, consumed(w1), chunks)
    assert "amount: double" in str(failed.value) and "amount: string" in str(failed.value)
    assert "column 'amount' is string, published as double" in str(failed.value)
    assert attempt_state(pg_url, attempt)[0] == "open"  # no checkpoint written
    assert seen_lineage(root) == lineage(w0)


def test_the_rows_may_not_hold_a_column_the_layout_gives(pg_url, root, sink, freeze_windows):
    [plan] = freeze_windows(PIPELINE, [0])
    writer = sink.writer(sink.begin(plan.window))
    batch = records(plan)[0]
    with pytest.raises(TargetError, match="eos_window_start"):
        writer.write([batch.append_column("eos_window_start", pa.array(["x"] * batch.num_rows))])


def test_object_stores_are_refused_at_parse_time():
    for url in ("s3://bucket/orders", "s3a://bucket/orders", "gs://bucket/orders",
                "abfss://c@account.dfs.core.windows.net/orders", "wasbs://c@a.blob.core.windows.net/o",
                "oss://bucket/orders"):
        with pytest.raises(ConfigurationError, match="no atomic rename") as failed:
            FileTarget(path=url)
        assert "table format" in str(failed.value)
    for url in ("viewfs://cluster/orders", "webhdfs://namenode:9870/orders", "swebhdfs://namenode:9871/orders"):
        with pytest.raises(ConfigurationError, match="does not support .* give the cluster's hdfs://"):
            FileTarget(path=url)
    with pytest.raises(ConfigurationError, match="relative"):
        FileTarget(path="lake/orders")


# --------------------------------------------------------------------------- the spec and verify


def test_the_spec_round_trips_binds_and_builds_its_sink(pg_url, root):
    spec = FileTarget(path=f"file://{root}/", postgres_conn_id="lake_ledger", on_committed="replace")
    assert target_from_dict(spec.to_dict()) == spec
    assert [(c.role, c.conn_type, c.conn_id) for c in spec.connections()] == [("ledger", "postgres", "lake_ledger")]
    with pytest.raises(ConfigurationError, match="not bound"):
        spec.sink()
    bound = spec.bind({"ledger": pg_url})
    assert bound.connections() == () and bound.sink().root == str(root) and bound.sink().on_committed == "replace"
    assert spec.target_id == f"files:{root}" == FileTarget(path=str(root)).target_id
    assert spec.exclusive and not FileTarget(path=str(root), layout="p={pipeline}/w={window_start}").exclusive
    with pytest.raises(ConfigurationError, match="postgres_conn_id"):
        bound.check_for_dag()
    spec.check_for_dag()


def test_published_relation_holds_every_row_readers_see_with_its_lineage(pg_url, root, sink, freeze_windows):
    w0, w1, w2 = freeze_windows(PIPELINE, [0, 1, 2])
    sink.commit(stage(sink, w0))
    sink.commit(stage(sink, w1, skip={(0, 7)}))
    stage(sink, w2)  # prepared, not committed: not published, not in the relation
    with psycopg.connect(pg_url) as conn, conn.transaction():
        relation = sink.published_relation(conn, PIPELINE, ["amount", "note"])
        rows = conn.execute(f"SELECT eos_pipeline, eos_window_start, eos_topic, eos_partition, eos_offset, amount,"
                            f" note FROM {relation.as_string(conn)}").fetchall()
        assert sink.published_relation(conn, "another", []).as_string(conn) != relation.as_string(conn)
    lineage_rows = sorted((r[2], r[3], r[4]) for r in rows)
    assert lineage_rows == sorted(lineage(w0) + lineage(w1, skip={(0, 7)}))
    assert max(Counter(lineage_rows).values()) == 1  # no duplicate
    assert {(r[0], r[1]) for r in rows} == {(PIPELINE, w0.window.start), (PIPELINE, w1.window.start)}
    assert {r[6][:2] for r in rows} == {"v1"} and isinstance(rows[0][5], float)
