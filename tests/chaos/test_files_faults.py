"""Fault cells of the file target (FileTarget: Parquet partition directories,
the ledger in PostgreSQL), through the same steps as every other target
(harness.chaos: only the Spark job is replaced by its Python stand-in).

The matrix (harness/chaos/matrix.py) runs every fault point the file target reaches x
{raise, crash} x {retry, clear, rerun later, backfill}, and the randomized
schedules (test_randomized.py) run on it too. The cells here look at what only
a two-phase commit without transactions has, and at what a reader of the
directory sees, step by step:

- a crash after the decision and before the rename: the window is committed
  in the ledger and not visible yet; the retried commit, a clear (whose
  skipped commit is a later commit of the pipeline), a later window's commit
  or the sweep publishes it;
- a crash after the rename, before the ledger knows: the window is whole in
  the directory; the retry has nothing to move and says so;
- a crash or a raise in the middle of the staging write: a hidden temporary
  file at most, nothing counted or published; the teardown deletes the
  staging, the rerun publishes;
- a zombie writer after fencing: its files never reach a partition, its
  writes after its staging was deleted fail, and nothing is recreated;
- a replace while a reader lists and reads the window in a loop: one whole
  version at a time, the old one then the new one, never a mix (also with a
  crash right after the replace); on a local root never a moment without the
  window (an exchange), on HDFS that moment between its two renames.

Each runs on a local root and on HDFS (the ``lake`` parameter).

Each ends with harness.chaos.check: verify clean, the root read with PyArrow
equal to the Kafka records by lineage, no staging, trash or pending
publication left.
"""

from __future__ import annotations

import json
import os
import threading
import time
import uuid
from collections import Counter

import psycopg
import pyarrow.parquet as pq
import pytest

from airflow_eos.core.errors import TargetError
from airflow_eos.targets.files.storage import files_for
from airflow_eos.targets.files.writer import COMMIT_FILE, STAGING_DIR, TRASH_DIR
from harness.chaos import (
    Harness,
    StepFailed,
    Zombie,
    abort_step,
    await_step,
    check,
    commit_step,
    plan_step,
    run_step,
    stage_step,
    transform_batch,
)
from harness.chaos.cases import new_pipeline, scratch_database
from harness.chaos.targets import parquet_source

WINDOWS = (0, 1)


# --------------------------------------------------------------------------- what a reader of the root sees


def listed(directory: str) -> list[str]:
    return [e.name for e in files_for(directory).entries(directory)]


def partitions(p) -> list[str]:
    """The visible directories of the root (what a reader lists)."""
    return sorted(n for n in listed(p.root) if not n.startswith(("_", ".")))


def commit_doc(p, i) -> dict | None:
    try:
        return json.loads(files_for(p.root).read_bytes(os.path.join(p.target.partition_dir(p.window(i)), COMMIT_FILE)))
    except FileNotFoundError:
        return None


def read_rows(p) -> list[dict]:
    if not partitions(p):
        return []
    return pq.read_table(**parquet_source(p.root), partitioning="hive").to_pylist()


def stagings(p) -> list[str]:
    try:
        return listed(os.path.join(p.root, STAGING_DIR))
    except FileNotFoundError:
        return []


def publications(p) -> list[tuple]:
    with psycopg.connect(p.url) as conn:
        return conn.execute("SELECT window_start, epoch, state FROM eos.publications WHERE pipeline = %s"
                            " ORDER BY window_start, epoch", (p.name,)).fetchall()


def window_state(p, i) -> tuple:
    with psycopg.connect(p.url) as conn:
        return conn.execute("SELECT state, committed_epoch FROM eos.windows WHERE pipeline = %s AND window_start = %s",
                            (p.name, p.window(i).start)).fetchone()


@pytest.fixture
def lake(request, tmp_path):
    """Where the cell's roots go: a local directory, or (``indirect`` parameter
    "hdfs") a directory on the session's HDFS."""
    if getattr(request, "param", "local") == "hdfs":
        return f"{request.getfixturevalue('hdfs').address}/chaos/{uuid.uuid4().hex}"
    return tmp_path / "lake"


@pytest.fixture
def files_pipeline(make_pipeline, lake):
    return lambda name, **kw: make_pipeline(name, target="files", root=lake, **kw)


@pytest.fixture
def swept_files_pipeline(pg_server, chaos_source, lake):
    """A file target's pipeline in a ledger database of its own (the sweep is database-wide)."""
    with scratch_database(pg_server.address) as url:
        yield lambda name, **kw: new_pipeline(url, chaos_source, name, target="files", root=lake, **kw)


# --------------------------------------------------------------------------- a crash after the decision


@pytest.mark.parametrize("lake", ["local", "hdfs"], indirect=True)
@pytest.mark.parametrize("recovery", ["retry", "clear", "later_commit", "sweep"])
def test_a_crash_after_the_decision_is_published_by_the_next_one_to_come(recovery, files_pipeline,
                                                                         swept_files_pipeline, tmp_path, tally):
    make = swept_files_pipeline if recovery == "sweep" else files_pipeline
    p = make(f"decided_{recovery}", mirror=True)
    h = Harness(p, tmp_path / "state", faults={0: "commit.after_decision=crash*1"},
                retries=1 if recovery == "retry" else 0)
    run = h.run(0)
    if recovery == "retry":
        assert run.state == "success" and run.summary["outcome"] == "already_committed", h.history()
        assert [r for s, r in run.tries if s == "commit"] == ["crashed", "ok"], h.history()
    else:
        assert run.failed_step == "commit" and ("commit", "crashed") in run.tries, h.history()
        # Decided: committed in the ledger with its offsets, nothing visible yet.
        assert window_state(p, 0) == ("committed", 1)
        assert [s for _, _, s in publications(p)] == ["decided"]
        assert partitions(p) == [] and read_rows(p) == []
        assert stagings(p) != []  # the teardown leaves a committed attempt's staging: it is to be published
        if recovery == "clear":
            again = h.run(0)
            assert again.summary["outcome"] == "skipped", h.history()  # the new attempt: the window is committed
        elif recovery == "later_commit":
            assert h.run(1).summary["outcome"] == "published", h.history()
            assert len(partitions(p)) == 2  # window 1's commit published window 0 too
            h.run(0)  # then the failed run is cleared (its Asset event)
        else:
            h.sweep()
            assert len(partitions(p)) == 1 and [s for _, _, s in publications(p)] == ["published"]
            h.run(0)
    assert commit_doc(p, 0)["epoch"] == 1
    h.run_many([i for i in WINDOWS if not h.asset_events.get(i)])
    tally.add(check(h, WINDOWS))


# --------------------------------------------------------------------------- a crash after the rename


@pytest.mark.parametrize("lake", ["local", "hdfs"], indirect=True)
@pytest.mark.parametrize("action", ["crash", "raise"])
def test_a_failure_after_the_rename_leaves_the_window_whole_and_the_retry_only_records_it(action, files_pipeline,
                                                                                         tmp_path, tally):
    p = files_pipeline(f"renamed_{action}")
    h = Harness(p, tmp_path / "state", faults={0: f"commit.after_rename={action}*1"})
    run = h.run(0)
    assert run.failed_step == "commit", h.history()
    # Renamed: the whole window is there for readers, with its commit file; the ledger not told yet.
    doc = commit_doc(p, 0)
    assert doc["epoch"] == 1 and len(partitions(p)) == 1
    rows = read_rows(p)
    assert len(rows) == doc["rows"]
    assert len({(r["eos_partition"], r["eos_offset"]) for r in rows}) == len(rows)
    assert [s for _, _, s in publications(p)] == ["decided"]

    retry = h.run(0)  # a clear: its commit is skipped and finishes the publication (nothing to move)
    assert retry.summary["outcome"] == "skipped", h.history()
    assert [s for _, _, s in publications(p)] == ["published"] and stagings(p) == []
    assert commit_doc(p, 0) == doc
    h.run(1)
    tally.add(check(h, WINDOWS))


# --------------------------------------------------------------------------- the middle of the staging write


@pytest.mark.parametrize("lake", ["local", "hdfs"], indirect=True)
@pytest.mark.parametrize("action", ["crash", "raise"])
def test_a_failure_in_the_middle_of_the_staging_write_counts_nothing_and_the_rerun_publishes(
        action, files_pipeline, tmp_path, tally):
    p = files_pipeline(f"mid_write_{action}", max_records_per_task=5)
    state = tmp_path / "state"
    plan = plan_step(p, p.window(0))
    with pytest.raises(StepFailed) as failed:
        run_step(stage_step, p, plan, faults=f"stage.mid_write={action}*1", state_dir=state / "w0")
    assert failed.value.crashed == (action == "crash")
    assert (state / "w0" / "stage.mid_write.0").exists()
    if action == "crash":
        [staging] = stagings(p)
        # The writer died with its file half written: under a hidden name only, which nothing counts.
        data = os.path.join(p.root, STAGING_DIR, staging, "data")
        assert all(n.startswith(".") for n in listed(data)) and listed(data), listed(data)
        with psycopg.connect(p.url) as conn:
            assert conn.execute("SELECT state FROM eos.attempts WHERE pipeline = %s", (p.name,)).fetchone() == ("open",)
    else:
        assert stagings(p) == []  # the stage step aborted its attempt after the job failed
    assert partitions(p) == []
    assert abort_step(p, p.window(0)) == ([1] if action == "crash" else [])  # the teardown
    assert stagings(p) == []

    h = Harness(p, state)
    h.run_until_committed(list(WINDOWS))
    tally.add(check(h, WINDOWS))


# --------------------------------------------------------------------------- a zombie writer after fencing


@pytest.mark.parametrize("lake", ["local", "hdfs"], indirect=True)
def test_a_zombie_writer_after_fencing_never_reaches_a_published_partition(files_pipeline, tmp_path, tally):
    p = files_pipeline("zombie_writer", max_records_per_task=5)
    store = files_for(p.root)
    h = Harness(p, tmp_path / "state")
    zombie = Zombie(p, 0)  # attempt 1: opened, one write task's chunk staged, then its driver hangs
    zombie_dir = p.target.staging_dir(zombie.attempt)
    # A newer run's tasks, one by one (its teardown comes later): attempt 2 fences it and commits.
    staged = stage_step(p, plan_step(p, p.window(0)))
    await_step(p, staged)
    assert commit_step(p, staged)["outcome"] == "published"
    h.emitted(0, "published")
    published = set(listed(p.target.partition_dir(p.window(0))))

    # The zombie's write tasks go on writing into their own staging ...
    writer = p.target.writer(zombie.attempt)
    from airflow_eos.spark.kafka_source import plan_tasks, read_range
    plan = zombie.plan
    task = plan_tasks(plan, p.max_records_per_task)[1]
    batches = [transform_batch(raw)[0] for raw in read_range(p.kafka_config, task, batch_rows=p.batch_rows,
                                                               end_grace_s=0.5, poll_timeout_s=20)]
    writer.write(batches)
    zombie_files = {n for sub in ("data", "publish") for n in listed(f"{zombie_dir}/{sub}")}
    assert zombie_files and not zombie_files & published
    # ... and its job commit is refused: fenced.
    assert zombie.finish().startswith("refused: AttemptFenced"), h.history()
    zombie_files |= set(listed(f"{zombie_dir}/data"))
    assert set(listed(p.target.partition_dir(p.window(0)))) == published

    assert abort_step(p, p.window(0)) == [1]  # the run's teardown aborts it and deletes its staging
    assert not store.exists(zombie_dir)
    with pytest.raises(TargetError, match="aborted or committed"):
        writer.write(batches)  # a write after that fails, and recreates nothing
    assert not store.exists(zombie_dir)
    assert set(listed(p.target.partition_dir(p.window(0)))) == published
    for path, _, files in store.walk(p.root):
        assert not zombie_files & set(files), f"a zombie's file in {path}"
    h.run(1)
    tally.add(check(h, WINDOWS))


# --------------------------------------------------------------------------- replace while a reader reads


MISSING = "missing"  # what a reader sees of a window whose directory is not there


class Reader(threading.Thread):
    """Lists and reads the window's directory in a loop, as a query engine
    would, and records the versions it saw, in order (``seen``: the commit
    file's epoch of each whole listing, MISSING where the directory was not
    there), and as problems what a reader must never see on any store: a
    listing that is not one whole version (its commit file and exactly its
    files), or rows that are not exactly the window's records, once each. A
    read that fails with "file not found" (listed before the swap, opened
    after) is allowed: the query is rerun."""

    def __init__(self, p, i: int, expected_rows: int):
        super().__init__(daemon=True)
        self.p, self.i, self.expected_rows = p, i, expected_rows
        self.store = files_for(p.root)
        self.directory = p.target.partition_dir(p.window(i))
        self.source = parquet_source(self.directory)
        self.stop = threading.Event()
        # Set by __exit__: the reader goes on until a listing begun after it has
        # been read whole (the window's last version, once the run has ended).
        self.wrap_up_at: float | None = None
        self.wrapped_up = threading.Event()
        self.problems: list[str] = []
        self.seen: list[int | str] = []
        self.saw_missing = threading.Event()
        self.listings = self.reads = self.retried_reads = self.swaps_seen = 0

    def _see(self, version: int | str) -> None:
        if not self.seen or self.seen[-1] != version:
            self.seen.append(version)
        if version == MISSING:
            self.saw_missing.set()

    def _doc(self) -> dict | None:
        commit_file = f"{self.directory}/{COMMIT_FILE}"
        try:
            return json.loads(self.store.read_bytes(commit_file))
        except FileNotFoundError:
            # No directory; or one that came back whole between the two looks
            # (both: nothing there when read); or a directory without its commit file.
            if self.store.is_dir(self.directory) and not self.store.is_file(commit_file):
                self.problems.append(f"the window's {COMMIT_FILE} was missing")
            else:
                self._see(MISSING)
            return None

    def run(self) -> None:
        while not self.stop.is_set():
            began = time.monotonic()
            before = self._doc()
            try:
                names = {e.name for e in self.store.entries(self.directory)}
            except FileNotFoundError:
                self._see(MISSING)
                continue
            after = self._doc()
            if before is None or after is None:
                continue
            if before["epoch"] != after["epoch"]:
                self.swaps_seen += 1  # swapped while listing: this listing proves nothing either way
                continue
            self.listings += 1
            if names != {f["name"] for f in before["files"]} | {COMMIT_FILE}:
                self.problems.append(f"a half-replaced window: {sorted(names)} (epoch {before['epoch']})")
                continue
            self._see(before["epoch"])
            try:
                rows = pq.read_table(**self.source).to_pylist()
            except OSError:  # listed before the swap, opened after: rerun the query
                self.retried_reads += 1
                continue
            if self._doc() != before:  # read while the swap went on (HDFS: the window gone): proves nothing
                self.retried_reads += 1
                continue
            self.reads += 1
            lineage = Counter((r["eos_partition"], r["eos_offset"]) for r in rows)
            if len(rows) != self.expected_rows or any(c > 1 for c in lineage.values()):
                self.problems.append(f"read {len(rows)} rows ({sum(c > 1 for c in lineage.values())} duplicated), "
                                     f"expected {self.expected_rows}")
            if self.wrap_up_at is not None and began >= self.wrap_up_at:
                self.wrapped_up.set()
                return

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *exc):
        # On a loaded machine the last listing could begin before the swap and
        # the reader be stopped before another: seen [1], nothing wrong seen.
        self.wrap_up_at = time.monotonic()
        self.wrapped_up.wait(30)
        self.stop.set()
        self.join(30)


# The longest the in-process commit of the HDFS replace waits between its two renames.
HOLD_S = 30


def hold_between_the_renames(store, monkeypatch, until: threading.Event) -> None:
    """HDFS's replace (HdfsFiles.replace) waits, once the old version is in the
    trash and before the new one moves in, until the reader has seen the
    window missing (at most HOLD_S): the moment without the window, held
    until it is seen, however slowly a loaded machine runs the reader."""
    rename = store.client.rename

    def renamed_then_held(src, dst, overwrite=False):
        rename(src, dst, overwrite)
        if f"/{TRASH_DIR}/" in dst:
            until.wait(HOLD_S)

    monkeypatch.setattr(store.client, "rename", renamed_then_held)


@pytest.mark.parametrize("lake", ["local", "hdfs"], indirect=True)
@pytest.mark.parametrize("fault", ["", "commit.after_rename=crash*1"])
def test_a_replace_while_a_reader_lists_the_window_shows_the_old_version_whole_then_the_new_one(
        fault, files_pipeline, tmp_path, tally, monkeypatch):
    """A local root (``renameat2(RENAME_EXCHANGE)``): old whole, then new whole,
    never a moment without the window. HDFS (two renames, no exchange): old
    whole, then no window, then new whole; never a mix, never both. The cell
    without a fault commits in this process and holds the HDFS replace between
    its renames (:func:`hold_between_the_renames`), so the reader must see the
    moment without the window; the crashing one commits in a child, unheld."""
    p = files_pipeline("replace_reader" + ("_crash" if fault else ""), on_committed="replace",
                       max_records_per_task=5)
    exchange = not p.root.startswith("hdfs://")
    h = Harness(p, tmp_path / "state", retries=1)
    h.run_many(list(WINDOWS))
    before = commit_doc(p, 0)
    assert before["epoch"] == 1
    h.faults[0] = fault
    reader = Reader(p, 0, before["rows"])
    if not exchange and not fault:
        hold_between_the_renames(files_for(p.root), monkeypatch, until=reader.saw_missing)
    with reader:
        run = h.run(0)  # a clear of the committed window: its rows are replaced
    assert run.state == "success", h.history()
    if fault:  # crashed right after the replace; the retry found the partition complete
        assert [r for s, r in run.tries if s == "commit"] == ["crashed", "ok"], h.history()
        assert run.summary["outcome"] == "already_committed"
    else:
        assert run.summary["outcome"] == "replaced"
    assert reader.problems == [], reader.problems[:5]
    assert reader.listings > 0 and reader.reads > 0
    # It read the old version, then (HDFS) saw no window, then read the new one, and nothing else.
    if exchange:
        assert reader.seen == [1, 2]
    elif not fault:
        assert reader.seen == [1, MISSING, 2]
    else:
        assert reader.seen in ([1, 2], [1, MISSING, 2])
    assert commit_doc(p, 0)["epoch"] == 2 and window_state(p, 0) == ("committed", 2)
    assert {e: s for start, e, s in publications(p) if start == p.window(0).start}[2] == "published"
    tally.add(check(h, WINDOWS))
