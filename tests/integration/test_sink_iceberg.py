"""What only the Iceberg target does, against real PostgreSQL (the ledger and
the table's SQL catalog) and a real table on disk, without Spark (the sink
contract suite covers a window's life for it already): a foreign writer
committing between our load of the table and our commit, two commits of one
window at once, a commit whose snapshot landed and whose history then expired,
a zombie attempt's files, a replace under a reader pinned to a snapshot, and
the schema rule. Each case ends with what readers see checked by lineage.
The cases of a window's life run on both catalogs the target takes, the SQL
catalog in the ledger's database and a REST catalog (Iceberg's own REST
catalog server, whose commits are its compare-and-swap, not ours), and with
the table's files on an object store (an S3 endpoint: no directory, no
rename)."""

from __future__ import annotations

import pyarrow as pa
import pytest

from airflow_eos.core.commit import ALREADY_COMMITTED, PUBLISHED, REPLACED
from airflow_eos.core.errors import TargetError
from airflow_eos.core.faults import FaultInjected, injected
from airflow_eos.targets.iceberg import table as tables
from harness.concurrency import at_once
from harness.iceberg import catalog, create_table
from harness.sink_contract import CONTRACT_TARGETS, PARTITIONS, Services
from test_sink_contract import PER_WINDOW, PIPELINE, Contract, lineage



@pytest.fixture
def services(pg_url, ledger, tmp_path, request):
    return Services(pg_url, tmp_path, request.getfixturevalue)


# the contract suite's entries: the SQL catalog in the ledger, a REST catalog, the table's files on S3
CATALOGS = ["iceberg", "iceberg-rest", "iceberg-s3"]


@pytest.fixture(params=CATALOGS)
def iceberg(services, freeze_windows, request):
    return Contract(CONTRACT_TARGETS[request.param], services, freeze_windows)


@pytest.fixture(params=CATALOGS)
def replacing(services, freeze_windows, request):
    return Contract(CONTRACT_TARGETS[request.param], services, freeze_windows, on_committed="replace")


def load(contract):
    """The contract's table, loaded anew from its catalog."""
    return catalog(contract.services.pg_url, contract.spec.catalog_properties).load_table(contract.spec.table)


def foreign_append(contract, n=3):
    """Another writer's rows (no lineage: other data of the table)."""
    load(contract).append(pa.table({"id": pa.array(range(n), pa.int64()), "note": pa.array(["foreign"] * n),
                                  "eos_topic": pa.array([None] * n, pa.string()),
                                  "eos_partition": pa.array([None] * n, pa.int32()),
                                  "eos_offset": pa.array([None] * n, pa.int64())}))


def ours(contract) -> list:
    """Our snapshots: (operation, epoch) in the table's history."""
    return [(s.summary.operation.value, s.summary[tables.EPOCH]) for s in load(contract).metadata.snapshots
            if s.summary[tables.TOKEN]]


def test_a_foreign_commit_between_our_load_and_our_commit_is_retried_on_the_table_loaded_again(
        iceberg, services, monkeypatch):
    [plan] = iceberg.plans([0])
    attempt = iceberg.stage(plan)
    loaded = []

    def load_then_a_foreign_writer_commits(table):
        loaded.append(table.metadata.current_snapshot_id)
        if len(loaded) == 1:
            foreign_append(iceberg)  # the catalog moves on under the table we hold
        return tables_without_retries(table)

    tables_without_retries = tables.without_commit_retries
    monkeypatch.setattr(tables, "without_commit_retries", load_then_a_foreign_writer_commits)
    assert iceberg.sink.commit(attempt).outcome == PUBLISHED
    assert len(loaded) == 2 and loaded[0] is None and loaded[1] is not None  # lost once, then loaded again
    assert iceberg.seen() == lineage(plan)
    rows = load(iceberg).scan().to_arrow().to_pylist()
    assert sorted(r["note"] for r in rows if r["eos_topic"] is None) == ["foreign"] * 3  # theirs kept
    assert ours(iceberg) == [("append", "1")]
    with iceberg.sink.ledger.connect() as conn:
        assert list(iceberg.sink.unattributed(conn, PIPELINE, [iceberg.source])) == []  # not our records


def test_two_commits_of_one_window_at_once_publish_it_once(iceberg, services):
    [plan] = iceberg.plans([0])
    attempt = iceberg.stage(plan)
    outcomes = at_once([lambda: iceberg.sink.commit(attempt), lambda: iceberg.sink.commit(attempt)])
    assert [e for _, e in outcomes] == [None, None]
    assert sorted(r.outcome.value for r, _ in outcomes) == ["already_committed", "published"]
    assert iceberg.seen() == lineage(plan)
    assert ours(iceberg) == [("append", "1")]


def test_a_snapshot_that_landed_before_the_ledger_knew_is_found_after_its_history_expired(iceberg, services):
    """The commit dies after the table's commit, before the ledger marks it
    published; other writers commit, and the user expires the window's
    snapshot. The retry finds the window's files in the current snapshot and
    appends nothing."""
    [plan] = iceberg.plans([0])
    attempt = iceberg.stage(plan)
    with injected("commit.after_publish=raise"), pytest.raises(FaultInjected):
        iceberg.sink.commit(attempt)
    [(ours_id)] = [s.snapshot_id for s in load(iceberg).metadata.snapshots]
    foreign_append(iceberg)
    foreign_append(iceberg)
    load(iceberg).maintenance.expire_snapshots().by_id(ours_id).commit()
    assert ours(iceberg) == []  # its token is gone from the history
    assert iceberg.sink.commit(attempt).outcome == ALREADY_COMMITTED
    assert iceberg.seen() == lineage(plan)  # once
    assert len(load(iceberg).metadata.snapshots) == 2  # nothing appended again
    with iceberg.sink.ledger.connect() as conn:
        assert conn.execute("SELECT state FROM eos.publications").fetchall() == [("published",)]


def test_a_zombie_attempts_files_are_deleted_and_never_a_committed_one(iceberg, services):
    from datetime import timedelta
    [plan] = iceberg.plans([0])
    zombie = iceberg.stage(plan)
    writer = iceberg.sink.writer(zombie)
    current = iceberg.stage(plan)  # a retry of the stage fences the first attempt
    assert iceberg.sink.commit(current).outcome == PUBLISHED
    writer.write([iceberg.target.batch(iceberg.source, 0, [0, 1], 9)])  # the zombie still writes
    assert iceberg.sink.sweep(timedelta(0))[0] == zombie
    assert not iceberg.sink.store.is_dir(iceberg.sink.attempt_url(zombie))  # deleted
    committed = [t.file.file_path for t in load(iceberg).scan().plan_files()]
    assert all(iceberg.sink.store.size(p) for p in committed)  # every file a snapshot names is there
    assert iceberg.seen() == lineage(plan)


def test_a_commit_that_died_before_its_cleanup_is_cleaned_up_by_the_sweep(iceberg, services):
    """The commit dies once the ledger marked the window published, before
    deleting what no snapshot names (its dead letters' files: the ledger has
    them): readers see the window once meanwhile, and the sweep finishes the
    cleanup, keeping every file a snapshot names."""
    from datetime import timedelta

    from airflow_eos.targets.iceberg.writer import DEAD_LETTERS, ROWS
    [plan] = iceberg.plans([0])
    attempt = iceberg.stage(plan, dead_letters=1)
    url = iceberg.sink.attempt_url(attempt)
    with injected("commit.before_cleanup=raise"), pytest.raises(FaultInjected):
        iceberg.sink.commit(attempt)
    dead = sorted((r.topic, r.partition, r.end_offset - 1) for r in plan.ranges)
    rows = [record for record in lineage(plan) if record not in dead]
    with iceberg.sink.ledger.connect() as conn:
        assert conn.execute("SELECT state FROM eos.publications").fetchall() == [("published",)]
        assert sorted(conn.execute("SELECT topic, partition, \"offset\" FROM eos.dead_letters").fetchall()) == dead
    assert iceberg.seen() == rows
    assert len(iceberg.sink.store.listing(f"{url}/{DEAD_LETTERS}")) == PARTITIONS  # the cleanup did not run
    assert iceberg.sink.sweep(timedelta(0)) == []
    assert iceberg.sink.store.subdirectories(url) == [ROWS]
    committed = sorted(t.file.file_path for t in load(iceberg).scan().plan_files())
    assert sorted(f"{url}/{ROWS}/{f.name}" for f in iceberg.sink.store.listing(f"{url}/{ROWS}")) == committed
    assert iceberg.seen() == rows


def test_a_reader_at_any_snapshot_sees_the_old_window_or_the_new_never_neither_or_both(replacing, services):
    [plan] = replacing.plans([0])
    first = replacing.stage(plan, version=1)
    assert replacing.sink.commit(first).outcome == PUBLISHED
    pinned = load(replacing).metadata.current_snapshot_id
    second = replacing.stage(plan, version=2)
    result = replacing.sink.commit(second)
    assert result.outcome == REPLACED and result.replaced_rows == PARTITIONS * PER_WINDOW
    table = load(replacing)
    for snapshot in table.metadata.snapshots:
        notes = {r["note"].split()[0] for r in table.scan(snapshot_id=snapshot.snapshot_id).to_arrow().to_pylist()}
        rows = table.scan(snapshot_id=snapshot.snapshot_id).to_arrow().num_rows
        assert rows == PARTITIONS * PER_WINDOW and len(notes) == 1, (snapshot, notes)
    assert {r["note"].split()[0] for r in table.scan(snapshot_id=pinned).to_arrow().to_pylist()} == {"v1"}
    assert {r["note"].split()[0] for r in table.scan().to_arrow().to_pylist()} == {"v2"}
    assert ours(replacing) == [("append", "1"), ("overwrite", "2")]
    assert replacing.seen() == lineage(plan)


@pytest.mark.parametrize("change, said", [
    (lambda b: b.append_column("discount", pa.array([1.0] * b.num_rows)), "discount"),
    (lambda b: b.set_column(b.schema.get_field_index("id"), "id", pa.array([str(i) for i in range(b.num_rows)])),
     "id"),
])
def test_output_the_table_cannot_take_fails_the_job_commit_and_nothing_is_published(iceberg, services, change, said):
    from airflow_eos.core.attempt import ConsumedRange
    [plan] = iceberg.plans([0])
    attempt = iceberg.sink.begin(plan.window)
    writer = iceberg.sink.writer(attempt)
    chunks = [writer.write([change(pa.Table.from_batches([iceberg.target.batch(
        r.topic, r.partition, list(range(r.start_offset, r.end_offset)), 1)]))]) for r in plan.ranges]
    with pytest.raises(TargetError, match="does not fit the schema") as raised:
        iceberg.sink.checkpoint(attempt, [ConsumedRange(r.topic, r.partition, r.start_offset, r.end_offset, r.width)
                                          for r in plan.ranges], chunks)
    assert said in str(raised.value) and "evolve the table's schema yourself" in str(raised.value)
    assert load(iceberg).metadata.snapshots == [] and iceberg.seen() == []


def test_a_table_without_the_lineage_columns_is_refused_before_any_attempt(services, freeze_windows, pg_url):
    from airflow_eos.targets.iceberg import IcebergTarget
    create_table(pg_url, "plain.orders", services.tmp_path / "warehouse", pa.schema([("id", pa.int64())]))
    [plan] = freeze_windows(PIPELINE, [0])
    with pytest.raises(TargetError, match="has no column"):
        IcebergTarget(table="plain.orders", ledger_url=pg_url).sink().begin(plan.window)
    with Contract(CONTRACT_TARGETS["iceberg"], services, freeze_windows).sink.ledger.connect() as conn:
        assert conn.execute("SELECT count(*) FROM eos.attempts").fetchone() == (0,)
