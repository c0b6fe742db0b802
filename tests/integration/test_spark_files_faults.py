"""Faults of the file target through the real stage job: Spark's own (JVM)
Parquet writer, local mode, the real broker, a real PostgreSQL ledger.

- Disk full in the middle of staging: the target's root is a real, small
  file system (a tmpfs this test mounts, and unmounts), filled by a ballast file
  to less than the window needs. The job fails with an error that says the disk
  is full and where, nothing is published, the abort deletes the staging; with
  the ballast gone the rerun publishes the window, exactly once by lineage.
- The transform's output schema changing between windows: window 2 is refused
  at its job commit, naming the column and both schemas; nothing of it is
  published and window 1 stays as it was.
"""

from __future__ import annotations

import os
import shutil
from datetime import timedelta

import pytest

from airflow_eos.core.attempt import ABORTED
from airflow_eos.core.ledger import Ledger
from airflow_eos.core.windows import PartitionRange, Window, WindowPlan
from airflow_eos.spark.submit import error_line, job_error
from airflow_eos.targets.files import FileTarget
from airflow_eos.targets.files.identity import ROOT_CLAIM
from airflow_eos.targets.files.writer import STAGING_DIR
from airflow_eos.verify import verify

from harness.full_disk import fill, orders_with_blob, small_file_system
from test_spark_stage_files import (  # noqa: F401 - spark and orders are fixtures
    ORDERS, PARTITIONS, PER_PARTITION, PIPELINE, WINDOW, execute, orders, planned, published_lineage, spark)

pytestmark = pytest.mark.slow

HOUR = timedelta(hours=1)


@pytest.fixture
def small_fs():
    with small_file_system("8m") as mount_point:
        yield mount_point


def test_disk_full_in_the_middle_of_staging_fails_clearly_publishes_nothing_and_the_rerun_succeeds(
        spark, pg_url, ledger, kafka_config, orders, small_fs):  # noqa: F811 - fixtures of test_spark_stage_files
    from airflow_eos.spark import StageFailed, run_stage

    topic, truth = orders
    bad = sorted(k for k, v in truth.items() if v.startswith(b"{not json"))
    good = sorted(set(truth) - set(bad))
    root = os.path.join(small_fs, "lake", "orders")
    os.makedirs(root)
    free = 256 * 1024
    ballast = fill(small_fs, leave=free)  # the window's files need ~1 MB
    plan = planned(pg_url, topic)
    sink = FileTarget(path=root, ledger_url=pg_url).sink()
    attempt = sink.begin(plan.window)  # the first begin claims the root: _eos_root.json takes some of the space
    free = shutil.disk_usage(small_fs).free
    staging = os.path.join(root, STAGING_DIR, attempt.staging)

    with pytest.raises(StageFailed) as failed:
        run_stage(spark, plan, attempt, sink, kafka_config, orders_with_blob, max_bad_records=len(bad))
    message = str(failed.value)
    # the cause, the place and what to do, first (not Spark's "task failed while writing rows" and a stack trace)
    assert message.startswith(f"the stage job of {attempt} failed (attempt aborted, staging dropped): the disk is "
                              "full (No space left on device): Spark's Parquet writer could not write the window's "
                              f"files into {staging}/data, on the file system mounted at {small_fs} ("), message
    assert "Nothing was published" in message and "free space on that file system" in message, message
    assert "\tat org.apache" not in message, message
    # what the operator makes of the job's error line (spark-submit) is the same headline
    headline = job_error(error_line(failed.value))
    assert headline.headline == message and not headline.terminal
    [(state, reason)] = execute(pg_url, "SELECT state, reason FROM eos.attempts")
    assert state == ABORTED and "the disk is full (No space left on device)" in reason, reason
    assert execute(pg_url, "SELECT state FROM eos.windows") == [("planned",)]
    assert published_lineage(spark, root) == []  # nothing published
    assert sorted(os.listdir(root)) == [ROOT_CLAIM, STAGING_DIR] and os.listdir(os.path.join(root, STAGING_DIR)) == []
    # the failed writes' files are deleted and closed: their space is free again
    assert shutil.disk_usage(small_fs).free == free

    os.unlink(ballast)  # space freed; the rerun (a retry, a Clear: a new attempt) publishes the window once
    rerun = sink.begin(plan.window)
    report = run_stage(spark, plan, rerun, sink, kafka_config, orders_with_blob, max_bad_records=len(bad))
    assert (report.records_read, report.rows_staged, report.dead_letters) == (len(truth), len(good), len(bad))
    assert sink.prepare(rerun).prepared and sink.commit(rerun).outcome == "published"
    assert sorted(published_lineage(spark, root)) == good
    assert os.listdir(os.path.join(root, STAGING_DIR)) == []
    audit = verify(ledger, kafka_config, sink, PIPELINE)
    assert audit.clean, str(audit)
    assert (audit.totals.published_rows, audit.totals.dead_letters) == (len(good), len(bad))


# --------------------------------------------------------------------------- the output schema changes


def freeze_halves(pg_url, topic) -> list[WindowPlan]:
    """Two consecutive windows: the first and the second half of each partition."""
    half = PER_PARTITION // 2
    ledger = Ledger(pg_url)
    plans = []
    for i in range(2):
        window = Window(PIPELINE, WINDOW.start + i * HOUR, WINDOW.end + i * HOUR)
        plan = WindowPlan(window, tuple(PartitionRange(topic, p, i * half, (i + 1) * half)
                                        for p in range(PARTITIONS)))
        with ledger.connect() as conn, conn.transaction():
            ledger.lock_pipeline(conn, plan.pipeline)
            ledger.freeze(conn, plan, [])
        plans.append(plan)
    return plans


def with_coupon(df):
    """The example transform's next version: one more column."""
    from pyspark.sql import functions as F

    return orders_transform(df).withColumn("coupon", F.lit("WELCOME"))


def amount_as_double(df):
    """The example transform's next version: the amount's type changed."""
    from pyspark.sql import functions as F

    return orders_transform(df).withColumn("amount", F.col("amount").cast("double"))


def orders_transform(df):
    from airflow_eos.spark.transform import load_transform

    return load_transform(ORDERS)(df)


def tree(path: str) -> dict[str, bytes]:
    """Every file under ``path`` with its content."""
    found = {}
    for folder, _, names in os.walk(path):
        for name in names:
            with open(os.path.join(folder, name), "rb") as f:
                found[os.path.relpath(os.path.join(folder, name), path)] = f.read()
    return found


@pytest.mark.parametrize("changed, change", [
    (with_coupon, "column 'coupon' added (string not null)"),
    (amount_as_double, "column 'amount' is double, published as decimal128(12, 2)"),
], ids=["a column added", "a column's type changed"])
def test_a_schema_change_between_windows_is_refused_naming_the_column_and_window_one_is_untouched(
        spark, pg_url, ledger, kafka_config, orders, tmp_path, changed, change):  # noqa: F811 - fixtures
    from airflow_eos.spark import StageFailed, run_stage

    topic, truth = orders
    bad = {k for k, v in truth.items() if v.startswith(b"{not json")}
    root = tmp_path / "lake" / "orders"
    root.mkdir(parents=True)
    w1, w2 = freeze_halves(pg_url, topic)
    sink = FileTarget(path=str(root), ledger_url=pg_url).sink()
    first = sink.begin(w1.window)
    run_stage(spark, w1, first, sink, kafka_config, ORDERS, max_bad_records=len(bad))
    assert sink.prepare(first).prepared and sink.commit(first).outcome == "published"
    window_one = sink.partition_dir(w1.window)
    published = tree(window_one)
    in_w1 = sorted(k for k in truth if k not in bad and k[2] < PER_PARTITION // 2)
    assert sorted(published_lineage(spark, root)) == in_w1

    second = sink.begin(w2.window)
    with pytest.raises(StageFailed) as failed:
        run_stage(spark, w2, second, sink, kafka_config, changed, max_bad_records=len(bad))
    message = str(failed.value)
    assert message.startswith(f"the stage job of {second} failed (attempt aborted, staging dropped): TargetError: "
                              f"{second}: the transform's output schema differs from the one of {root}: {change}. "
                              f"Its window {PIPELINE} {w1.window.start.isoformat()} was published with:\n"), message
    published_schema, this_schema = message.split("was published with:\n")[1].split("\n  this window's:\n")
    assert "    amount: decimal128(12, 2)\n" in published_schema and "coupon" not in published_schema, message
    assert (("    coupon: string not null\n" in this_schema) if changed is with_coupon
            else ("    amount: double\n" in this_schema)), message
    assert this_schema.endswith("\n  a root holds one schema, so nothing of this window is published: cast the "
                                "transform's output to the published schema (or publish into a new root) and rerun "
                                "the window"), message
    # nothing of window 2 published or left; window 1 exactly as it was
    assert execute(pg_url, "SELECT window_start, state FROM eos.windows ORDER BY 1") == [
        (w1.window.start, "committed"), (w2.window.start, "planned")]
    assert execute(pg_url, "SELECT epoch, state FROM eos.attempts WHERE window_start = %s",
                   (w2.window.start,)) == [(1, ABORTED)]
    assert not os.path.exists(sink.partition_dir(w2.window))
    assert os.listdir(root / STAGING_DIR) == []
    assert tree(window_one) == published
    assert sorted(published_lineage(spark, root)) == in_w1

    # what the error says to do: the transform's output cast to the published schema, then the window reruns
    rerun = sink.begin(w2.window)
    run_stage(spark, w2, rerun, sink, kafka_config, ORDERS, max_bad_records=len(bad))
    assert sink.prepare(rerun).prepared and sink.commit(rerun).outcome == "published"
    assert sorted(published_lineage(spark, root)) == sorted(set(truth) - bad)
    assert tree(window_one) == published
    audit = verify(ledger, kafka_config, sink, PIPELINE)
    assert audit.clean and audit.committed_windows == 2, str(audit)
