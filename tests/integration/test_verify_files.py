"""verify on the file target (issue 33): it sees what readers of the root see.
Windows are planned from the broker and staged with lineage read from Kafka
(``build`` of test_verify.py), published into a real directory with the ledger
in a real PostgreSQL; verify then reads the root as PyArrow and Spark do."""

from __future__ import annotations

import io
import os

import pytest

from airflow_eos import verify as v
from airflow_eos.cli.verify import print_report
from airflow_eos.core.errors import TargetError
from airflow_eos.targets.files import FileTarget
from airflow_eos.verify import verify
from test_verify import HOUR, PIPELINE, T0, build


@pytest.fixture
def lake(tmp_path, pg_url, ledger):
    root = tmp_path / "lake" / "orders"
    root.mkdir(parents=True)
    return FileTarget(path=str(root), ledger_url=pg_url).sink()


class DecideOnly:
    """The sink, except that the commit of ``window_start`` dies after its
    decision and a directory appears at the window's partition path before
    anyone publishes it."""

    def __init__(self, sink, window_start):
        self.sink, self.window_start = sink, window_start

    def __getattr__(self, name):
        return getattr(self.sink, name)

    def commit(self, attempt):
        if attempt.window_start != self.window_start:
            return self.sink.commit(attempt)
        self.sink.decide(attempt)
        os.makedirs(self.sink.partition_dir(attempt))


def kinds(report):
    return sorted(x.kind for x in report.violations)


def test_a_window_decided_and_not_published_is_reported_as_such(ledger, kafka_config, lake):
    build(ledger, kafka_config, DecideOnly(lake, T0 + HOUR), windows=2)
    report = verify(ledger, kafka_config, lake, PIPELINE)
    [unpublished] = [x for x in report.violations if x.kind == v.UNPUBLISHED]
    assert unpublished.window_start == T0 + HOUR
    assert "decided, not published" in unpublished.message and "retry the commit task" in unpublished.message
    assert kinds(report) == [v.COUNT] + [v.MISSING] * 6 + [v.UNPUBLISHED]  # its 6 records, and the row count
    assert [a.unpublished for a in report.windows] == [False, True]
    assert report.to_dict()["windows"][1]["published"] is False
    text = io.StringIO()
    print_report(report, text)
    assert "decided, not published" in text.getvalue()


def write_parquet(path, **columns):
    import pyarrow as pa
    import pyarrow.parquet as pq
    os.makedirs(os.path.dirname(path), exist_ok=True)
    pq.write_table(pa.table(columns), path)


def test_verify_reads_the_whole_root_as_readers_do(ledger, kafka_config, lake):
    """Rows a reader of the root sees and no committed window accounts for
    are violations, each named by file and by what its manifest or lineage
    says. Before, verify read only the pipeline's partitions: clean."""
    import pyarrow as pa
    import pyarrow.dataset as ds
    from airflow_eos.targets.files.writer import COMMIT_FILE

    built = build(ledger, kafka_config, lake, windows=2)
    assert verify(ledger, kafka_config, lake, PIPELINE).clean
    root = lake.root
    published = ds.dataset(root, format="parquet", partitioning="hive").count_rows()
    # a foreign file at the root, with lineage: records of window 0 once more
    stray = os.path.join(root, "stray.parquet")
    write_parquet(stray, eos_topic=[built.topic] * 2, eos_partition=pa.array([0, 0], pa.int32()),
                  eos_offset=pa.array(built.records(built.plans[0], 0)[:2], pa.int64()))
    # a second pipeline's window, published by an older version into this root
    other = os.path.join(root, "eos_window_start=2030-01-01T00%3A00%3A00Z")
    write_parquet(os.path.join(other, "part-0.parquet"), id=pa.array([1, 2, 3], pa.int64()))
    with open(os.path.join(other, COMMIT_FILE), "w") as f:
        f.write('{"format": "airflow-eos/files/1", "pipeline": "another", "window_start": "2030-01-01T00:00:00+00:00",'
                ' "epoch": 4, "files": []}')
    # leftovers readers skip are no finding
    write_parquet(os.path.join(root, "_leftover", "x.parquet"), id=[1])
    write_parquet(os.path.join(root, ".hidden.parquet"), id=[1])
    assert ds.dataset(root, format="parquet", partitioning="hive").count_rows() == published + 5  # what readers see

    report = verify(ledger, kafka_config, lake, PIPELINE)
    assert kinds(report) == [v.FOREIGN] * 2, str(report)
    [of_stray] = [x.message for x in report.violations if stray in x.message]
    [of_other] = [x.message for x in report.violations if other in x.message]
    assert "2 row(s)" in of_stray and "no _eos_commit.json" in of_stray
    assert f"its lineage says: records of {built.topic}[0] offsets" in of_stray
    assert "3 row(s)" in of_other and "pipeline 'another'" in of_other
    assert "a second pipeline's rows in a root of one pipeline" in of_other
    assert report.totals.extra == 5 and not report.clean

    with open(os.path.join(root, "notes.txt"), "w") as f:  # a visible file that is no Parquet: readers fail
        f.write("hello")
    report = verify(ledger, kafka_config, lake, PIPELINE)
    assert any("notes.txt" in x.message and "not a Parquet file" in x.message for x in report.violations)


def test_a_vanished_root_is_reported_as_gone_not_as_every_record_missing(ledger, kafka_config, lake):
    import shutil

    build(ledger, kafka_config, lake, windows=2)
    shutil.rmtree(lake.root)
    with pytest.raises(TargetError) as failed:
        verify(ledger, kafka_config, lake, PIPELINE)
    message = str(failed.value)
    assert f"{lake.root}: the directory is gone" in message and "2 window(s) of pipeline" in message
    assert "restore the directory" in message


def test_other_pipelines_windows_in_a_root_shared_by_layout_are_theirs(tmp_path, pg_url, ledger, kafka_config):
    """A layout with {pipeline}: another pipeline of the ledger published
    its window into the root; readers see it, and it is not this pipeline's
    violation. A partition the ledger does not know is."""
    import pickle

    import pyarrow as pa
    from airflow_eos.core.attempt import ConsumedRange
    from airflow_eos.core.windows import PartitionRange, Window, WindowPlan

    root = tmp_path / "shared"
    root.mkdir()
    lake = FileTarget(path=str(root), ledger_url=pg_url, layout="eos_pipeline={pipeline}/w={window_start}").sink()
    build(ledger, kafka_config, lake, windows=1)
    window = Window("neighbour", T0, T0 + HOUR)
    plan = WindowPlan(window, (PartitionRange("elsewhere", 0, 0, 3),))
    with ledger.connect() as conn, conn.transaction():
        ledger.lock_pipeline(conn, "neighbour")
        ledger.freeze(conn, plan, [])
    attempt = lake.begin(window)
    writer = pickle.loads(pickle.dumps(lake.writer(attempt)))
    chunk = writer.write([pa.record_batch({"id": pa.array([1, 2, 3], pa.int64()),
                                           "value": pa.array(["a", "b", "c"]),
                                           "eos_topic": pa.array(["elsewhere"] * 3),
                                           "eos_partition": pa.array([0] * 3, pa.int32()),
                                           "eos_offset": pa.array([0, 1, 2], pa.int64())})])
    lake.checkpoint(attempt, [ConsumedRange("elsewhere", 0, 0, 3, 3)], [chunk])
    assert lake.prepare(attempt).prepared
    lake.commit(attempt)
    assert verify(ledger, kafka_config, lake, PIPELINE).clean
    os.rename(lake.partition_dir(window), os.path.join(root, "eos_pipeline=neighbour", "w=stale"))
    report = verify(ledger, kafka_config, lake, PIPELINE)
    assert kinds(report) == [v.FOREIGN] and "a window the ledger does not record as published here" in str(report)
