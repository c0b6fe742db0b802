"""One root, one pipeline (issue 33): the file target's identity is the real
directory, and the root records who publishes into it, so a second pipeline
is refused whatever path names the root and whatever ledger it uses. Real
PostgreSQL ledgers (two databases where asked), real directories and symlinks;
what readers see is read back with PyArrow's Hive-partitioned dataset reader."""

from __future__ import annotations

import json
import os
import pickle
from datetime import datetime, timedelta, timezone

import pyarrow as pa
import pyarrow.dataset as ds
import pytest

from airflow_eos.core.attempt import ConsumedRange
from airflow_eos.core.errors import OwnershipConflict, TargetError
from airflow_eos.core.ledger import Ledger
from airflow_eos.core.plan import PlanRequest, plan_window
from airflow_eos.core.sink import PUBLISHED
from airflow_eos.core.windows import PartitionRange, Window, WindowPlan
from airflow_eos.targets.files import FileTarget
from airflow_eos.targets.files.identity import ROOT_CLAIM
from harness.databases import empty_database
from memlog import MemoryLog

T0 = datetime(2024, 1, 1, tzinfo=timezone.utc)
HOUR = timedelta(hours=1)


@pytest.fixture
def root(tmp_path):
    path = tmp_path / "lake" / "orders"
    path.mkdir(parents=True)
    return path


@pytest.fixture
def link(tmp_path, root):
    """Another name of the root: a symlink to its parent, then the same child."""
    os.symlink(root.parent, tmp_path / "shortcut")
    return tmp_path / "shortcut" / root.name


@pytest.fixture
def other_ledger(pg_server):
    """A second ledger: another database on the same server, migrated on its own (a copy of
    ledger_template would be the same ledger: a ledger's identity is when its schema was created)."""
    with empty_database(pg_server.address) as url:
        ledger = Ledger(url)
        ledger.migrate()
        yield ledger


def freeze(ledger, pipeline, i=0):
    window = Window(pipeline, T0 + i * HOUR, T0 + (i + 1) * HOUR)
    plan = WindowPlan(window, (PartitionRange("orders", 0, i * 5, (i + 1) * 5),))
    with ledger.connect() as conn, conn.transaction():
        ledger.lock_pipeline(conn, pipeline)
        ledger.freeze(conn, plan, [])
    return plan


def commit_window(sink, plan):
    """begin → one write → checkpoint → prepare → commit; rows carry lineage."""
    attempt = sink.begin(plan.window)
    [r] = plan.ranges
    offsets = list(range(r.start_offset, r.end_offset))
    writer = pickle.loads(pickle.dumps(sink.writer(attempt)))
    chunk = writer.write([pa.record_batch({"eos_topic": pa.array([r.topic] * len(offsets)),
                                           "eos_partition": pa.array([r.partition] * len(offsets), pa.int32()),
                                           "eos_offset": pa.array(offsets, pa.int64())})])
    sink.checkpoint(attempt, [ConsumedRange(r.topic, r.partition, r.start_offset, r.end_offset, r.width)], [chunk])
    assert sink.prepare(attempt).prepared
    return sink.commit(attempt)


def epoch(ledger, window):
    with ledger.connect() as conn:
        return ledger.window(conn, window).epoch


def test_a_root_is_one_target_whatever_path_names_it(root, link, pg_url):
    real = FileTarget(path=str(root), ledger_url=pg_url)
    via_link = FileTarget(path=str(link), ledger_url=pg_url)
    assert real.target_id == via_link.target_id == f"files:{os.path.realpath(root)}"
    assert via_link.sink().target_id == real.sink().target_id == real.target_id
    assert via_link.target_aliases == (f"files:{link}",)  # what earlier versions claimed it as
    assert FileTarget(path=f"file:{link}/").target_id == real.target_id


def plan(ledger, pipeline, spec, i=0, *, aliases=None):
    log = MemoryLog()
    tp = log.add_partition("orders", 0)
    log.append(tp, [int((T0 + timedelta(hours=h, minutes=5)).timestamp() * 1000) for h in range(4)])
    request = PlanRequest(Window(pipeline, T0 + i * HOUR, T0 + (i + 1) * HOUR), ("orders",),
                          target_id=spec.target_id, target_exclusive=spec.exclusive,
                          target_aliases=spec.target_aliases if aliases is None else aliases)
    return plan_window(ledger, log, request, now=lambda: T0 + timedelta(days=1))


def claimed_target(ledger, pipeline):
    with ledger.connect() as conn:
        return ledger.load_claim(conn, pipeline).target


def test_a_second_pipeline_through_a_symlink_is_refused_by_the_ledgers_claim(root, link, ledger, pg_url):
    plan(ledger, "first", FileTarget(path=str(root), ledger_url=pg_url))
    with pytest.raises(OwnershipConflict, match="one pipeline only") as refused:
        plan(ledger, "second", FileTarget(path=str(link), ledger_url=pg_url))
    assert "'first'" in str(refused.value) and os.path.realpath(root) in str(refused.value)


def test_a_claim_recorded_under_the_unresolved_path_is_still_the_targets(root, link, ledger, pg_url):
    """Compatibility: earlier versions recorded ``files:<path as written>``.
    A plan of the same pipeline and root now reads that claim as its own and
    records it under the real path; another pipeline is refused as before."""
    spec = FileTarget(path=str(link), ledger_url=pg_url)
    plan(ledger, "orders_hourly", spec, 0, aliases=())
    with ledger.connect() as conn, conn.transaction():  # as an earlier version recorded it
        conn.execute("UPDATE eos.pipelines SET target = %s", (f"files:{link}",))
    plan(ledger, "orders_hourly", spec, 1)
    assert claimed_target(ledger, "orders_hourly") == spec.target_id
    with pytest.raises(OwnershipConflict, match="one pipeline only"):
        plan(ledger, "another", FileTarget(path=str(root), ledger_url=pg_url))


def test_a_second_pipeline_is_refused_at_begin_by_the_roots_claim(root, link, ledger, pg_url):
    """Two pipelines of one ledger planned without their target (no ledger
    claim to compare): the claim in the root refuses the second at begin."""
    first = FileTarget(path=str(root), ledger_url=pg_url).sink()
    assert commit_window(first, freeze(ledger, "first")).outcome == PUBLISHED
    claim = json.loads((root / ROOT_CLAIM).read_text())
    assert claim["pipeline"] == "first" and claim["format"] == "airflow-eos/files-root/1"
    assert "password" not in json.dumps(claim) and "@" not in claim["ledger_at"]
    second = freeze(ledger, "second")
    with pytest.raises(TargetError, match="belongs to pipeline 'first'") as refused:
        FileTarget(path=str(link), ledger_url=pg_url).sink().begin(second.window)
    assert str(link) in str(refused.value) and f"delete {link}/{ROOT_CLAIM}" in str(refused.value)
    assert epoch(ledger, second.window) == 0  # no attempt opened
    # the claim is never read as data: readers see the first pipeline's rows only
    rows = ds.dataset(str(root), format="parquet", partitioning="hive").to_table().to_pylist()
    assert sorted(r["eos_offset"] for r in rows) == [0, 1, 2, 3, 4]


def test_a_pipeline_whose_ledger_is_another_database_is_refused_at_begin(root, link, ledger, pg_url, other_ledger):
    assert commit_window(FileTarget(path=str(root), ledger_url=pg_url).sink(),
                         freeze(ledger, "orders_hourly")).outcome == PUBLISHED
    # the same pipeline id, but another ledger: another pipeline altogether
    elsewhere = freeze(other_ledger, "orders_hourly", 1)
    with pytest.raises(TargetError, match="another ledger") as refused:
        FileTarget(path=str(link), ledger_url=other_ledger.url).sink().begin(elsewhere.window)
    message = str(refused.value)
    assert "pipeline 'orders_hourly' of the ledger in" in message and pg_url.rpartition("/")[2] in message
    assert epoch(other_ledger, elsewhere.window) == 0


def test_pipelines_of_one_ledger_share_a_root_whose_layout_tells_them_apart(root, ledger, pg_url, other_ledger):
    layout = "eos_pipeline={pipeline}/eos_window_start={window_start}"
    for pipeline in ("a", "b"):
        sink = FileTarget(path=str(root), ledger_url=pg_url, layout=layout).sink()
        assert commit_window(sink, freeze(ledger, pipeline)).outcome == PUBLISHED
    assert json.loads((root / ROOT_CLAIM).read_text())["pipeline"] is None
    with pytest.raises(TargetError, match="another ledger"):
        FileTarget(path=str(root), ledger_url=other_ledger.url, layout=layout).sink().begin(
            freeze(other_ledger, "c").window)
    with pytest.raises(TargetError, match="has no {pipeline}"):
        FileTarget(path=str(root), ledger_url=pg_url).sink().begin(freeze(ledger, "d").window)
    rows = ds.dataset(str(root), format="parquet", partitioning="hive").to_table().to_pylist()
    assert sorted((r["eos_pipeline"], r["eos_offset"]) for r in rows) == [(p, o) for p in "ab" for o in range(5)]
