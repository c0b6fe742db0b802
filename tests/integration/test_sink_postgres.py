"""The PostgreSQL two-phase-commit sink against a real PostgreSQL: a window's
life (begin, stage, checkpoint, prepare, commit, abort), with every failure the
issue names. Rows are asserted exactly, lineage included."""

from __future__ import annotations

import dataclasses
import pickle
import threading
import time
from datetime import datetime, timedelta, timezone
from decimal import Decimal

import psycopg
import pyarrow as pa
import pytest
from psycopg import sql

from airflow_eos.core.attempt import ConsumedRange, load_checkpoint, load_offsets
from airflow_eos.core.errors import (
    AttemptClosed,
    AttemptFenced,
    InvalidCheckpoint,
    LedgerUnavailable,
    NotPrepared,
    TargetError,
    WindowNotPlanned,
)
from airflow_eos.targets.postgres.target import PARTITION_PER_WINDOW, PostgresTarget, StagingWriter
from airflow_eos.core.sink import ALREADY_COMMITTED, PUBLISHED, REPLACED, SKIPPED
from airflow_eos.core.windows import TopicPartition, Window
from harness.concurrency import Background, blocked_on_locks

ORDERS_DDL = """
    CREATE SCHEMA analytics;
    CREATE TABLE analytics.orders (
        id               bigint        NOT NULL,
        amount           numeric(12,2) NOT NULL,
        note             text,
        created          timestamptz,
        eos_topic        text          NOT NULL,
        eos_partition    integer       NOT NULL,
        eos_offset       bigint        NOT NULL,
        eos_pipeline     text          NOT NULL,
        eos_window_start timestamptz   NOT NULL
    );
"""
T0 = datetime(2024, 1, 1, tzinfo=timezone.utc)


def execute(url, statement, params=None):
    with psycopg.connect(url, autocommit=True) as conn:
        cur = conn.execute(statement, params)
        return cur.fetchall() if cur.description else None


def orders_ddl(mode):
    """ORDERS_DDL, partitioned by window in mode partition_per_window."""
    if mode == PARTITION_PER_WINDOW:
        return ORDERS_DDL.replace("\n    );", "\n    ) PARTITION BY RANGE (eos_window_start);")
    return ORDERS_DDL


@pytest.fixture(params=["replace_window", PARTITION_PER_WINDOW])
def orders(pg_url, ledger, request):
    """The orders target in each publishing mode: every test of the window's
    life below runs against both."""
    execute(pg_url, orders_ddl(request.param))
    return PostgresTarget(pg_url, "analytics.orders", mode=request.param).sink()


def records(plan, version=1):
    """The rows a transform makes of a window's records: one per source record,
    one Arrow batch per planned partition (as one Spark task each)."""
    batches = []
    for r in plan.ranges:
        offsets = list(range(r.start_offset, r.end_offset))
        batches.append(pa.record_batch({
            "id": pa.array([r.partition * 1_000_000 + o for o in offsets], pa.int64()),
            "amount": pa.array([Decimal(o * version) / 100 for o in offsets], pa.decimal128(12, 2)),
            "note": pa.array([f"v{version} {r.topic}/{r.partition}/{o}" for o in offsets]),
            "created": pa.array([plan.window.start + timedelta(seconds=o) for o in offsets],
                                pa.timestamp("us", tz="UTC")),
            "eos_topic": pa.array([r.topic] * len(offsets)),
            "eos_partition": pa.array([r.partition] * len(offsets), pa.int32()),
            "eos_offset": pa.array(offsets, pa.int64()),
        }))
    return batches


def expected_rows(plan, version=1):
    return sorted(
        (r.partition * 1_000_000 + o, Decimal(o * version) / 100, f"v{version} {r.topic}/{r.partition}/{o}",
         plan.window.start + timedelta(seconds=o), r.topic, r.partition, o, plan.pipeline, plan.window.start)
        for r in plan.ranges for o in range(r.start_offset, r.end_offset)
    )


def published(url, table="analytics.orders"):
    return sorted(tuple(r) for r in execute(
        url, f"SELECT id, amount, note, created, eos_topic, eos_partition, eos_offset, eos_pipeline, eos_window_start"
             f" FROM {table}"))


def consumed(plan):
    return [ConsumedRange(r.topic, r.partition, r.start_offset, r.end_offset, r.width) for r in plan.ranges]


def stage(target, plan, *, version=1, prepare=True):
    """begin → one writer call per partition (as Spark tasks) → checkpoint → prepare."""
    attempt = target.begin(plan.window)
    writer = pickle.loads(pickle.dumps(target.writer(attempt)))  # as Spark ships it to a task
    chunks = [writer.write([batch]) for batch in records(plan, version)]
    target.checkpoint(attempt, consumed(plan), chunks)
    if prepare:
        assert target.prepare(attempt).prepared
    return attempt


def load_checkpoint_chunks(url, attempt):
    with psycopg.connect(url) as conn:
        return list(load_checkpoint(conn, attempt).chunks)


def attempt_state(url, attempt):
    return execute(url, "SELECT state, reason FROM eos.attempts WHERE pipeline = %s AND window_start = %s"
                        " AND epoch = %s", (attempt.pipeline, attempt.window_start, attempt.epoch))[0]


def window_row(url, window):
    return execute(url, "SELECT state, epoch, committed_epoch, published_rows, dead_letter_rows FROM eos.windows"
                        " WHERE pipeline = %s AND window_start = %s", (window.pipeline, window.start))[0]


def staging_tables(url):
    return sorted(r[0] for r in execute(
        url, "SELECT tablename FROM pg_tables WHERE schemaname = 'eos_staging'"))


def offsets(url, pipeline):
    with psycopg.connect(url) as conn:
        return load_offsets(conn, pipeline)


# --------------------------------------------------------------------------- the happy path


def test_window_life_publishes_rows_dead_letters_and_offsets(pg_url, orders, freeze_windows):
    [plan] = freeze_windows("orders_hourly", [0])
    attempt = orders.begin(plan.window)
    assert attempt.epoch == 1 and staging_tables(pg_url) == [attempt.staging, attempt.staging + "_dl"]
    writer = StagingWriter.from_json(orders.writer(attempt).to_json())
    batches = records(plan)
    bad = [{"topic": "orders", "partition": 0, "offset": 2, "error": "amount is not a number",
            "key": b"k\x00", "value": b"\xff{"}]
    # Partition 0's task drops the record at offset 2 as a dead letter.
    good0 = batches[0].filter(pa.array([o != 2 for o in batches[0]["eos_offset"].to_pylist()]))
    chunks = [writer.write([good0], bad), writer.write([batches[1]])]
    assert [(c.rows, c.dead_letters) for c in chunks] == [(4, 1), (5, 0)]

    assert orders.prepare(attempt).prepared is False  # no checkpoint yet: keep waiting
    checkpoint = orders.checkpoint(attempt, consumed(plan), chunks)
    assert (checkpoint.row_count, checkpoint.dead_letter_count) == (9, 1)
    ready = orders.prepare(attempt)
    assert ready.prepared and attempt_state(pg_url, attempt)[0] == "prepared"

    result = orders.commit(attempt)
    assert (result.outcome, result.published_rows, result.dead_letter_rows) == (PUBLISHED, 9, 1)
    assert published(pg_url) == [r for r in expected_rows(plan) if not (r[5] == 0 and r[6] == 2)]
    assert execute(pg_url, 'SELECT pipeline, window_start, epoch, topic, partition, "offset", error, key, value'
                           " FROM eos.dead_letters") == [
        ("orders_hourly", T0, 1, "orders", 0, 2, "amount is not a number", b"k\x00", b"\xff{")]
    assert window_row(pg_url, plan.window) == ("committed", 1, 1, 9, 1)
    assert attempt_state(pg_url, attempt) == ("committed", None)
    assert result.offsets == {TopicPartition("orders", 0): 5, TopicPartition("orders", 1): 5}
    assert offsets(pg_url, "orders_hourly") == result.offsets
    assert staging_tables(pg_url) == []


def test_values_survive_staging_exactly(pg_url, ledger, freeze_windows):
    """Nulls vs empty strings, quotes, newlines, unicode, bytes, NaN and infinities
    make the round trip through the CSV staging unchanged."""
    execute(pg_url, "CREATE TABLE t (s text, b bytea, f float8, ts timestamp, d date, ok boolean,"
                    " eos_pipeline text, eos_window_start timestamptz)")
    target = PostgresTarget(pg_url, "t").sink()
    [plan] = freeze_windows("p", [0])
    attempt = target.begin(plan.window)
    values = {
        "s": ["", None, 'q"uo,te\nnew line', "\\N", "ünï 🐍"],
        "b": [b"", None, b"\x00\xff\\", b"plain", b'"'],
        "f": [float("nan"), float("inf"), float("-inf"), None, 1e-300],
        "ts": [datetime(2024, 5, 6, 7, 8, 9, 123456), None, datetime(1999, 12, 31), datetime(2024, 1, 1),
               datetime(2038, 1, 19, 3, 14, 8)],
        "d": [datetime(2024, 2, 29).date(), None, datetime(1970, 1, 1).date(), datetime(2000, 1, 1).date(),
              datetime(2024, 1, 1).date()],
        "ok": [True, None, False, True, False],
    }
    batch = pa.record_batch({**values, "ts": pa.array(values["ts"], pa.timestamp("us"))})
    chunk = target.writer(attempt).write([batch])
    target.checkpoint(attempt, consumed(plan), [chunk])
    target.prepare(attempt)
    target.commit(attempt)
    got = execute(pg_url, "SELECT s, b, f, ts, d, ok FROM t ORDER BY d NULLS FIRST")
    want = sorted(zip(*values.values()), key=lambda r: (r[4] is not None, r[4] or datetime.min.date()))
    assert len(got) == 5
    for g, w in zip(got, want):
        assert g[0] == w[0] and g[1] == w[1] and g[3:] == w[3:]
        assert (g[2] != g[2] and w[2] != w[2]) or g[2] == w[2]  # NaN == NaN


def test_the_server_names_every_value_a_column_refuses_in_one_question(pg_url, ledger, freeze_windows):
    """StagingWriter.refused_values: the values of one column the staging's type
    cannot take, judged as COPY judges them (the input function with the typmod:
    trailing spaces beyond a varchar's length are cut, not refused) from the text
    COPY receives (quotes, newlines, empty vs null); the rest then stages."""
    execute(pg_url, "CREATE TABLE t (n integer, code varchar(3), eos_pipeline text, eos_window_start timestamptz)")
    target = PostgresTarget(pg_url, "t").sink()
    [plan] = freeze_windows("p", [0])
    attempt = target.begin(plan.window)
    writer = target.writer(attempt)
    codes = ["abc", "abcd", None, "", 'q"u', "ab\ncd", "  x ", "1234567"]
    batch = pa.record_batch({"n": pa.array(range(len(codes)), pa.int32()), "code": codes})

    assert writer.refused_values("n", batch.column("n")) == ("integer", [])
    kind, refused = writer.refused_values("code", batch.column("code"))
    too_long = "value too long for type character varying(3)"
    assert (kind, refused) == ("character varying(3)", [(1, "abcd", too_long), (5, "ab\ncd", too_long),
                                                         (7, "1234567", too_long)])
    # Values are tried 1,000 at a time, a refused block value by value: rows in later blocks, nulls among them.
    many = pa.array([None if i % 7 == 0 else "12345" if i in (1_500, 2_498) else "ok" for i in range(2_500)])
    assert writer.refused_values("code", many) == ("character varying(3)", [(1_500, "12345", too_long),
                                                                            (2_498, "12345", too_long)])
    with pytest.raises(TargetError, match="value too long"):
        writer.write([batch])
    chunk = writer.write([batch.filter(pa.array([i not in (1, 5, 7) for i in range(len(codes))]))])
    assert chunk.rows == 5
    assert sorted(execute(pg_url, sql.SQL("SELECT n, code FROM {}").format(
        sql.Identifier("eos_staging", attempt.staging)))) == [(0, "abc"), (2, None), (3, ""), (4, 'q"u'),
                                                               (6, "  x")]


def test_a_failed_task_or_an_unlisted_chunk_is_never_published(pg_url, orders, freeze_windows):
    [plan] = freeze_windows("p", [0])
    attempt = orders.begin(plan.window)
    writer = orders.writer(attempt)
    batches = records(plan)

    def dies_midway():
        yield batches[0]
        raise RuntimeError("executor lost")

    with pytest.raises(RuntimeError):
        writer.write(dies_midway())
    assert execute(pg_url, f"SELECT count(*) FROM eos_staging.{attempt.staging}") == [(0,)]
    listed = [writer.write([b]) for b in batches]
    writer.write([batches[0]])  # a speculative duplicate whose message Spark discarded
    orders.checkpoint(attempt, consumed(plan), listed)
    assert orders.prepare(attempt).prepared
    assert orders.commit(attempt).published_rows == 10
    assert published(pg_url) == expected_rows(plan)


# --------------------------------------------------------------------------- idempotence, fencing, races


def test_commit_twice_is_a_noop(pg_url, orders, freeze_windows):
    [plan] = freeze_windows("p", [0])
    attempt = stage(orders, plan)
    assert orders.commit(attempt).outcome == PUBLISHED
    again = orders.commit(attempt)
    assert (again.outcome, again.published_rows, again.changed) == (ALREADY_COMMITTED, 10, False)
    assert "nothing to do" in str(again)
    assert published(pg_url) == expected_rows(plan)
    assert window_row(pg_url, plan.window) == ("committed", 1, 1, 10, 0)


def test_an_older_epoch_is_fenced(pg_url, orders, freeze_windows):
    [plan] = freeze_windows("p", [0])
    zombie = stage(orders, plan, version=1)  # prepared, then a rerun starts
    rerun = orders.begin(plan.window)
    assert rerun.epoch == zombie.epoch + 1

    with pytest.raises(AttemptFenced, match="attempt 2 of the window was opened after it"):
        orders.commit(zombie)
    assert published(pg_url) == [] and window_row(pg_url, plan.window)[0] == "planned"
    with pytest.raises(AttemptFenced):
        orders.prepare(zombie)
    # A zombie may still write its own staging (unless its seal closed it), but never checkpoint it.
    zombie_writer = orders.writer(zombie)
    if orders.mode == PARTITION_PER_WINDOW:
        with pytest.raises(TargetError, match="is sealed"):
            zombie_writer.write(records(plan, version=1)[:1])
        late = []
    else:
        late = [zombie_writer.write(records(plan, version=1)[:1])]
    with pytest.raises(AttemptFenced):
        orders.checkpoint(zombie, consumed(plan), late)

    writer = orders.writer(rerun)
    orders.checkpoint(rerun, consumed(plan), [writer.write([b]) for b in records(plan, version=2)])
    orders.prepare(rerun)
    assert orders.commit(rerun).outcome == PUBLISHED
    assert published(pg_url) == expected_rows(plan, version=2)
    assert window_row(pg_url, plan.window) == ("committed", 2, 2, 10, 0)
    # Once the window is committed, a fenced attempt's commit is a reported no-op.
    assert orders.commit(zombie).outcome == SKIPPED
    assert published(pg_url) == expected_rows(plan, version=2)


def test_racing_commits_publish_exactly_once(pg_url, orders, freeze_windows):
    [plan] = freeze_windows("p", [0])
    attempt = stage(orders, plan)
    with psycopg.connect(pg_url) as gate:  # hold the window row so both commits queue up behind it
        gate.execute("SELECT 1 FROM eos.windows FOR UPDATE")
        racers = [Background(PostgresTarget(pg_url, "analytics.orders", mode=orders.mode).sink().commit, attempt) for _ in range(2)]
        blocked_on_locks(pg_url, 2, application="airflow-eos commit")
        gate.rollback()
    outcomes = sorted(r.outcome(timeout=20)[0].outcome for r in racers)
    assert outcomes == [ALREADY_COMMITTED, PUBLISHED]
    assert published(pg_url) == expected_rows(plan)


def test_a_commit_killed_midway_leaves_nothing_and_a_retry_commits_once(pg_url, orders, freeze_windows):
    [plan] = freeze_windows("p", [0])
    attempt = stage(orders, plan)
    with psycopg.connect(pg_url) as gate:
        # The commit publishes its rows, then waits for the pipeline row to advance offsets.
        gate.execute("SELECT 1 FROM eos.pipelines FOR UPDATE")
        commit = Background(orders.commit, attempt)
        [pid] = blocked_on_locks(pg_url, application="airflow-eos commit")
        [(query,)] = execute(pg_url, "SELECT query FROM pg_stat_activity WHERE pid = %s", (pid,))
        assert "FROM eos.pipelines WHERE pipeline" in query  # the rows are inserted, offsets come next
        assert published(pg_url) == []  # inserted, but not visible to anyone else
        execute(pg_url, "SELECT pg_terminate_backend(%s)", (pid,))
        result, error = commit.outcome()
        gate.rollback()
    assert result is None and isinstance(error, LedgerUnavailable)
    assert "retrying the commit is safe" in str(error)
    assert published(pg_url) == []
    assert window_row(pg_url, plan.window) == ("planned", 1, None, None, None)
    assert attempt_state(pg_url, attempt) == ("prepared", None)
    assert offsets(pg_url, "p") == {}

    retry = orders.commit(attempt)
    assert (retry.outcome, retry.published_rows) == (PUBLISHED, 10)
    assert published(pg_url) == expected_rows(plan)
    assert orders.commit(attempt).outcome == ALREADY_COMMITTED


# --------------------------------------------------------------------------- lost staging


# Unlogged staging (a crash empties it) is counted by prepare and by commit. A
# partition_per_window staging is logged and sealed with its checkpoint: see
# test_sealed_staging_refuses_every_change.
@pytest.mark.parametrize("orders", ["replace_window"], indirect=True)
def test_staging_partly_lost_before_prepare_is_refused_then_restaged(pg_url, orders, freeze_windows):
    [plan] = freeze_windows("p", [0])
    attempt = stage(orders, plan, prepare=False)
    execute(pg_url, f"DELETE FROM eos_staging.{attempt.staging} WHERE eos_offset < 2")
    with pytest.raises(NotPrepared) as refused:
        orders.prepare(attempt)
    assert len(refused.value.missing) == 2  # both chunks lost two rows each
    assert all("checkpoint counted 5 rows" in m and "holds 3 and 0" in m for m in refused.value.missing)
    with pytest.raises(NotPrepared, match="checkpointed, not prepared"):
        orders.commit(attempt)
    assert published(pg_url) == []

    orders.abort(attempt, "staging lost")
    rerun = stage(orders, plan)
    assert orders.commit(rerun).outcome == PUBLISHED
    assert published(pg_url) == expected_rows(plan)


@pytest.mark.parametrize("orders", ["replace_window"], indirect=True)
def test_staging_lost_after_prepare_is_refused_at_commit_then_restaged(pg_url, orders, freeze_windows):
    [plan] = freeze_windows("p", [0])
    attempt = stage(orders, plan)
    execute(pg_url, f"TRUNCATE eos_staging.{attempt.staging}")  # what a crash does to unlogged staging
    with pytest.raises(NotPrepared, match="checkpoint counted 10 rows and 0 dead letters, the staging holds 0"):
        orders.commit(attempt)
    assert published(pg_url) == [] and window_row(pg_url, plan.window)[0] == "planned"

    rerun = stage(orders, plan)
    assert orders.commit(rerun).published_rows == 10
    assert published(pg_url) == expected_rows(plan)


@pytest.mark.parametrize("orders", [PARTITION_PER_WINDOW], indirect=True)
def test_sealed_staging_refuses_every_change(pg_url, orders, freeze_windows):
    """The seal checked the staging against the checkpoint; from then on neither
    a late write task nor a hand can change it (prepare and commit trust it),
    until the commit attaches it as an ordinary partition."""
    [plan] = freeze_windows("p", [0])
    attempt = stage(orders, plan, prepare=False)
    rows, dead = f"eos_staging.{attempt.staging}", f"eos_staging.{attempt.staging}_dl"
    for change in (f"DELETE FROM {rows} WHERE eos_offset < 2", f"TRUNCATE {rows}", f"UPDATE {rows} SET note = 'x'",
                   f"INSERT INTO {rows} SELECT * FROM {rows} LIMIT 1", f"DELETE FROM {dead}", f"TRUNCATE {dead}"):
        with pytest.raises(psycopg.errors.RaiseException, match=r"staging .* is sealed"):
            execute(pg_url, change)
    with pytest.raises(TargetError, match="is sealed"):  # a write task of the attempt, after its job's commit
        orders.writer(attempt).write(records(plan)[:1])
    assert execute(pg_url, f"SELECT count(*) FROM {rows}") == [(10,)]
    # A retried job commit seals again, checking the staging again.
    orders.checkpoint(attempt, consumed(plan), load_checkpoint_chunks(pg_url, attempt))
    assert orders.prepare(attempt).prepared
    assert orders.commit(attempt).published_rows == 10
    assert published(pg_url) == expected_rows(plan)
    # Published, it is an ordinary partition again.
    execute(pg_url, f"UPDATE analytics.{attempt.staging} SET note = note")
    assert published(pg_url) == expected_rows(plan)


@pytest.mark.parametrize("orders", [PARTITION_PER_WINDOW], indirect=True)
def test_seal_waits_for_a_writer_still_copying_then_drops_its_chunk(pg_url, orders, freeze_windows):
    """A write task the job commit did not wait for (lost, or a speculative copy)
    may still be copying when the seal starts: the seal waits for its
    transaction, then drops its chunk (not in the checkpoint). A writer that
    starts after the seal is refused."""
    [plan] = freeze_windows("p", [0])
    attempt = orders.begin(plan.window)
    writer = orders.writer(attempt)
    batches = records(plan)
    listed = [writer.write([batch]) for batch in batches]
    copying, release = threading.Event(), threading.Event()

    def slow_batches():
        yield batches[0]
        copying.set()
        release.wait(20)

    straggler = Background(writer.write, slow_batches())
    assert copying.wait(10)
    seal = Background(orders.checkpoint, attempt, consumed(plan), listed)
    deadline = time.monotonic() + 10
    while not execute(pg_url, "SELECT pid FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
                         " AND datname = current_database()"):
        assert time.monotonic() < deadline, "the seal never waited for the writer"
        time.sleep(0.02)
    assert seal.is_alive() and attempt_state(pg_url, attempt)[0] == "open"
    release.set()
    chunk, error = straggler.outcome()
    assert error is None and chunk.rows == 5  # the straggler committed its chunk ...
    _, error = seal.outcome()
    assert error is None and attempt_state(pg_url, attempt)[0] == "checkpointed"
    staged = execute(pg_url, f"SELECT count(*) FROM eos_staging.{attempt.staging}")
    assert staged == [(10,)]  # ... and the seal dropped it
    with pytest.raises(TargetError, match="is sealed"):
        writer.write([batches[1]])
    assert orders.prepare(attempt).prepared
    assert orders.commit(attempt).published_rows == 10
    assert published(pg_url) == expected_rows(plan)


@pytest.mark.parametrize("orders", [PARTITION_PER_WINDOW], indirect=True)
def test_seal_refuses_a_checkpoint_the_staging_does_not_hold(pg_url, orders, freeze_windows):
    """The seal is where a partition_per_window staging is counted: a chunk
    holding other than its task reported fails the job commit, and no
    checkpoint is written."""
    [plan] = freeze_windows("p", [0])
    attempt = orders.begin(plan.window)
    writer = orders.writer(attempt)
    chunks = [writer.write([batch]) for batch in records(plan)]
    miscounted = [dataclasses.replace(chunks[0], rows=chunks[0].rows + 1), chunks[1]]
    with pytest.raises(InvalidCheckpoint, match=f"chunk {chunks[0].chunk}: checkpoint counted 6 rows and 0 dead "
                                                f"letters, staging {attempt.staging} holds 5 and 0"):
        orders.checkpoint(attempt, consumed(plan), miscounted)
    assert attempt_state(pg_url, attempt) == ("open", None)
    orders.checkpoint(attempt, consumed(plan), chunks)
    assert orders.prepare(attempt).prepared
    assert orders.commit(attempt).published_rows == 10
    assert published(pg_url) == expected_rows(plan)


def test_staging_dropped_is_refused(pg_url, orders, freeze_windows):
    [plan] = freeze_windows("p", [0])
    attempt = stage(orders, plan, prepare=False)
    execute(pg_url, f"DROP TABLE eos_staging.{attempt.staging}")
    with pytest.raises(NotPrepared, match="is gone"):
        orders.prepare(attempt)


def test_checkpoint_must_cover_the_plan(pg_url, orders, freeze_windows):
    [plan] = freeze_windows("p", [0])
    attempt = orders.begin(plan.window)
    writer = orders.writer(attempt)
    chunks = [writer.write([b]) for b in records(plan)]
    short = [ConsumedRange("orders", 0, 0, 5, 5), ConsumedRange("orders", 1, 0, 3, 3)]
    orders.checkpoint(attempt, short, chunks)
    with pytest.raises(NotPrepared) as refused:
        orders.prepare(attempt)
    assert refused.value.missing == ["orders[1]: planned [0, 5), consumed [0, 3): offsets [3, 5) not consumed"]
    # a retried job commit replaces the checkpoint
    orders.checkpoint(attempt, [*short[:1], ConsumedRange("orders", 1, 0, 3, 3), ConsumedRange("orders", 1, 3, 5, 2)],
                      chunks)
    assert orders.prepare(attempt).prepared


# --------------------------------------------------------------------------- reruns


@pytest.mark.parametrize("mode", ["replace_window", PARTITION_PER_WINDOW])
def test_replace_rerun_swaps_the_window_atomically_for_readers(pg_url, ledger, freeze_windows, mode):
    execute(pg_url, orders_ddl(mode))
    target = PostgresTarget(pg_url, "analytics.orders", mode=mode, on_committed="replace").sink()
    [w0, w1] = freeze_windows("p", [0, 1])
    assert [target.commit(stage(target, plan)).outcome for plan in (w0, w1)] == [PUBLISHED, PUBLISHED]
    old = expected_rows(w0, version=1)
    # The rerun of window 0 publishes other values and one row fewer.
    rerun = target.begin(w0.window)
    writer = target.writer(rerun)
    batches = records(w0, version=2)
    chunks = [writer.write([batches[0].slice(1)]), writer.write([batches[1]])]
    target.checkpoint(rerun, consumed(w0), chunks)
    target.prepare(rerun)
    new = [r for r in expected_rows(w0, version=2) if not (r[5] == 0 and r[6] == 0)]

    seen = []
    stop = threading.Event()

    def reader():
        with psycopg.connect(pg_url, autocommit=True) as conn:
            while not stop.is_set():
                rows = conn.execute("SELECT id, amount, note, created, eos_topic, eos_partition, eos_offset,"
                                    " eos_pipeline, eos_window_start FROM analytics.orders"
                                    " WHERE eos_window_start = %s", (T0,)).fetchall()
                seen.append(sorted(tuple(r) for r in rows))

    with psycopg.connect(pg_url) as gate:
        gate.execute("SELECT 1 FROM eos.pipelines FOR UPDATE")  # pause the commit after it replaced the rows
        watcher = threading.Thread(target=reader, daemon=True)
        watcher.start()
        # The reader's first read before the commit starts (on a loaded machine
        # the commit could take the table's lock first, and the reader see only
        # the new rows: seen[0] below).
        deadline = time.monotonic() + 10
        while not seen:
            assert time.monotonic() < deadline, "the reader never read"
            time.sleep(0.005)
        commit = Background(target.commit, rerun)
        blocked_on_locks(pg_url, application="airflow-eos commit")
        paused_at = len(seen)
        time.sleep(0.2)
        if mode == "replace_window":
            assert len(seen) > paused_at  # the reader read while the commit was midway
        else:  # dropping the window's old partition locks the table: readers wait for the commit
            assert len(seen) <= paused_at + 1
            assert execute(pg_url, "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
                                   " AND datname = current_database() AND query LIKE 'SELECT id, amount, note%%'"
                           ) == [(1,)]
        gate.rollback()
        result, error = commit.outcome()
    time.sleep(0.05)
    stop.set()
    watcher.join(5)
    assert error is None and (result.outcome, result.replaced_rows, result.published_rows) == (REPLACED, 10, 9)
    assert seen[0] == old and seen[-1] == new
    assert all(s in (old, new) for s in seen), "a reader saw the window half replaced or empty"
    assert published(pg_url) == sorted(new + expected_rows(w1))
    assert window_row(pg_url, w0.window) == ("committed", 2, 2, 9, 0)


def test_skip_rerun_is_a_reported_noop(pg_url, orders, freeze_windows):
    [plan] = freeze_windows("p", [0])
    orders.commit(stage(orders, plan, version=1))
    rerun = stage(orders, plan, version=2)
    result = orders.commit(rerun)
    assert (result.outcome, result.committed_epoch, result.changed) == (SKIPPED, 1, False)
    assert "on_committed='skip'" in str(result)
    assert published(pg_url) == expected_rows(plan, version=1)
    assert attempt_state(pg_url, rerun)[0] == "aborted" and staging_tables(pg_url) == []
    assert orders.commit(rerun).outcome == SKIPPED


def test_upsert_mode_updates_keys_and_replace_reupserts(pg_url, ledger, freeze_windows):
    execute(pg_url, "CREATE TABLE balances (account bigint PRIMARY KEY, balance bigint NOT NULL,"
                    " eos_offset bigint NOT NULL)")
    target = PostgresTarget(pg_url, "balances", mode="upsert", key=("account",), on_committed="replace").sink()
    w0, w1 = freeze_windows("p", [0, 1], partitions=(("tx", 0),))

    def run(plan, accounts, balance):
        attempt = target.begin(plan.window)
        batch = pa.record_batch({"account": pa.array(accounts, pa.int64()),
                                 "balance": pa.array([balance] * len(accounts), pa.int64()),
                                 "eos_offset": pa.array(range(len(accounts)), pa.int64())})
        target.checkpoint(attempt, consumed(plan), [target.writer(attempt).write([batch])])
        target.prepare(attempt)
        return target.commit(attempt)

    assert run(w0, [1, 2, 3], 10).published_rows == 3
    assert run(w1, [3, 4], 20).published_rows == 2
    assert execute(pg_url, "SELECT account, balance FROM balances ORDER BY 1") == [(1, 10), (2, 10), (3, 20), (4, 20)]
    assert run(w0, [1], 30).outcome == REPLACED
    assert execute(pg_url, "SELECT account, balance FROM balances ORDER BY 1") == [(1, 30), (2, 10), (3, 20), (4, 20)]


def test_upsert_key_without_unique_index_is_refused_at_begin(pg_url, ledger, freeze_windows):
    execute(pg_url, "CREATE TABLE balances (account bigint, balance bigint)")
    [plan] = freeze_windows("p", [0])
    with pytest.raises(TargetError, match=r"upsert key \(account\) of balances needs a unique index"):
        PostgresTarget(pg_url, "balances", mode="upsert", key="account").sink().begin(plan.window)
    assert window_row(pg_url, plan.window)[1] == 0  # no attempt opened


# --------------------------------------------------------------------------- offsets


def test_out_of_order_commits_advance_offsets_over_the_contiguous_prefix(pg_url, orders, freeze_windows):
    plans = dict(zip([3, 1, 2], freeze_windows("p", [3, 1, 2], per_window=10)))
    plans[0] = freeze_windows("p", [0], per_window=10)[0]
    tps = [TopicPartition("orders", 0), TopicPartition("orders", 1)]
    attempts = {i: stage(orders, plan) for i, plan in plans.items()}
    after = {}
    for i in [3, 1, 0, 2]:
        after[i] = orders.commit(attempts[i]).offsets
        assert offsets(pg_url, "p") == after[i]
    assert after[3] == {}  # windows 0..2 are not committed: nothing is contiguous yet
    assert after[1] == {}  # window 0 still missing
    assert after[0] == {tp: 20 for tp in tps}  # windows 0, 1
    assert after[2] == {tp: 40 for tp in tps}  # windows 0..3
    assert published(pg_url) == sorted(sum((expected_rows(p) for p in plans.values()), []))


def test_concurrent_commits_of_neighbouring_windows_leave_the_whole_prefix(pg_url, orders, freeze_windows):
    """Each commit sees the other's window uncommitted until it takes the
    pipeline lock; after it, the second one computes over both."""
    plans = freeze_windows("p", [0, 1])
    attempts = [stage(orders, plan) for plan in plans]
    with psycopg.connect(pg_url) as gate:
        gate.execute("SELECT 1 FROM eos.pipelines FOR UPDATE")
        commits = [Background(PostgresTarget(pg_url, "analytics.orders", mode=orders.mode).sink().commit, a) for a in attempts]
        blocked_on_locks(pg_url, 2, application="airflow-eos commit")  # both windows published, offsets not yet computed
        gate.rollback()
        results = [c.outcome()[0] for c in commits]
    assert sorted(r.outcome for r in results) == [PUBLISHED, PUBLISHED]
    assert offsets(pg_url, "p") == {TopicPartition("orders", 0): 10, TopicPartition("orders", 1): 10}


# --------------------------------------------------------------------------- abort and sweep


def test_abort_drops_staging_and_leaves_the_window_rerunnable(pg_url, orders, freeze_windows):
    [plan] = freeze_windows("p", [0])
    first = stage(orders, plan, prepare=False)
    second = orders.begin(plan.window)
    aborted = orders.abort_window(plan.window, "stage failed")
    assert aborted == [first, second]
    assert [attempt_state(pg_url, a) for a in aborted] == [("aborted", "stage failed")] * 2
    assert staging_tables(pg_url) == [] and window_row(pg_url, plan.window)[0] == "planned"
    assert orders.abort(first, "again") is False
    with pytest.raises(AttemptClosed, match="aborted"):
        orders.prepare(first)
    with pytest.raises(TargetError, match="aborted or committed"):
        orders.writer(second)

    rerun = stage(orders, plan)
    assert orders.commit(rerun).outcome == PUBLISHED
    assert orders.abort(rerun, "late abort") is False  # committed attempts stay committed
    assert published(pg_url) == expected_rows(plan)


def test_sweep_aborts_attempts_left_open_too_long(pg_url, orders, freeze_windows):
    old, recent, done = freeze_windows("p", [0, 1, 2])
    stale = [stage(orders, old, prepare=False), stage(orders, old)]  # a fenced one and a prepared one
    fresh = orders.begin(recent.window)
    committed = stage(orders, done)
    orders.commit(committed)
    execute(pg_url, "UPDATE eos.attempts SET opened_at = now() - interval '3 hours' WHERE window_start <> %s",
            (recent.window.start,))
    swept = orders.sweep(timedelta(hours=1))
    assert swept == stale
    assert [attempt_state(pg_url, a)[0] for a in (*stale, fresh, committed)] == ["aborted", "aborted", "open",
                                                                                  "committed"]
    assert staging_tables(pg_url) == [fresh.staging, fresh.staging + "_dl"]
    assert orders.sweep(timedelta(hours=1)) == []


# --------------------------------------------------------------------------- target problems


@pytest.mark.parametrize("mode", ["replace_window", PARTITION_PER_WINDOW])
def test_hostile_identifiers_are_quoted_never_executed(pg_url, ledger, freeze_windows, mode):
    # '%' too: psycopg would read it as a placeholder if the sink mixed names with parameters
    schema, table = 'we"ird; DROP TABLE eos.windows; --', "Or'ders\"; DROP SCHEMA eos CASCADE; --%s %(x)s"
    execute(pg_url, sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)).as_string(None))
    partitioned = " PARTITION BY RANGE (eos_window_start)" if mode == PARTITION_PER_WINDOW else ""
    execute(pg_url, sql.SQL("CREATE TABLE {} (note text, eos_pipeline text, eos_window_start timestamptz)"
                            + partitioned).format(sql.Identifier(schema, table)).as_string(None))
    # an index the partition must mirror, on a hostile table in a hostile schema
    execute(pg_url, sql.SQL("CREATE INDEX {} ON {} (note)").format(
        sql.Identifier("i'dx\" --%s"), sql.Identifier(schema, table)).as_string(None))
    quoted = '"' + schema.replace('"', '""') + '"."' + table.replace('"', '""') + '"'
    target = PostgresTarget(pg_url, quoted, mode=mode).sink()
    pipeline = "orders'); DROP TABLE eos.attempts; --\"x"
    [plan] = freeze_windows(pipeline, [0])
    attempt = target.begin(plan.window)
    assert attempt.staging.startswith("orders_drop_table_eo_202401010000_") and len(attempt.staging) + 3 <= 63
    chunk = target.writer(attempt).write([pa.record_batch({"note": ["a'; DROP TABLE x; --"]})])
    target.checkpoint(attempt, consumed(plan), [chunk])
    target.prepare(attempt)
    assert target.commit(attempt).published_rows == 1
    rows = execute(pg_url, sql.SQL("SELECT note, eos_pipeline FROM {}").format(
        sql.Identifier(schema, table)).as_string(None))
    assert rows == [("a'; DROP TABLE x; --", pipeline)]
    assert execute(pg_url, "SELECT to_regclass('eos.windows') IS NOT NULL, to_regclass('eos.attempts') IS NOT NULL,"
                           " to_regclass('x') IS NULL") == [(True, True, True)]
    assert execute(pg_url, "SELECT state FROM eos.windows WHERE pipeline = %s", (pipeline,)) == [("committed",)]


def test_missing_target_table_fails_clearly_and_keeps_staging_until_abort(pg_url, orders, freeze_windows):
    [plan] = freeze_windows("p", [0])
    attempt = stage(orders, plan)
    execute(pg_url, "ALTER TABLE analytics.orders RENAME TO orders_old")
    with pytest.raises(TargetError, match="target table analytics.orders does not exist"):
        orders.commit(attempt)
    assert execute(pg_url, f"SELECT count(*) FROM eos_staging.{attempt.staging}") == [(10,)]
    assert attempt_state(pg_url, attempt)[0] == "prepared"
    with pytest.raises(TargetError, match="does not exist"):
        orders.begin(plan.window)
    assert window_row(pg_url, plan.window)[1] == 1  # the failed begin opened no attempt

    execute(pg_url, "ALTER TABLE analytics.orders_old RENAME TO orders")
    assert orders.commit(attempt).published_rows == 10  # fixed: the kept staging commits
    assert published(pg_url) == expected_rows(plan)


def test_wrong_column_types_fail_clearly_and_keep_staging_until_abort(pg_url, orders, freeze_windows):
    [plan] = freeze_windows("p", [0])
    attempt = orders.begin(plan.window)
    writer = orders.writer(attempt)
    bad = records(plan)[0].set_column(1, "amount", pa.array(["12.5", "n/a", "1", "2", "3"]))
    with pytest.raises(TargetError, match=r'invalid input syntax for type numeric: "n/a".*column amount'):
        writer.write([bad])
    with pytest.raises(TargetError, match=r"unexpected: \['extra'\], missing: \['note'\]"):
        writer.write([records(plan)[0].drop_columns(["note"]).append_column("extra", pa.array([1] * 5))])

    orders.checkpoint(attempt, consumed(plan), [writer.write([b]) for b in records(plan)])
    orders.prepare(attempt)
    execute(pg_url, "ALTER TABLE analytics.orders ALTER COLUMN note TYPE integer USING NULL")
    refusal = {"replace_window": r'column "note" is of type integer but expression is of type text',
               PARTITION_PER_WINDOW: r'child table ".*" has different type for column "note"'}[orders.mode]
    with pytest.raises(TargetError, match=refusal):
        orders.commit(attempt)
    assert published(pg_url) == []
    assert execute(pg_url, f"SELECT count(*) FROM eos_staging.{attempt.staging}") == [(10,)]
    assert orders.abort(attempt, "target changed") is True
    assert staging_tables(pg_url) == [] and window_row(pg_url, plan.window)[0] == "planned"


def test_begin_needs_a_planned_window(pg_url, orders):
    with pytest.raises(WindowNotPlanned):
        orders.begin(Window("p", T0, T0 + timedelta(hours=1)))


# --------------------------------------------------------------------------- with the real planner


def test_windows_planned_from_kafka_publish_each_record_once(pg_url, ledger, orders, topics, kafka_config):
    """Records of two hourly windows, planned by plan_window against the broker,
    staged with their lineage: each record lands once, in its window, and the
    offsets end at the second window's end cuts."""
    from airflow_eos.core.plan import PlanRequest, plan_window
    from airflow_eos.core.source import KafkaLog
    from airflow_eos.core.windows import to_millis

    topic = topics.create(partitions=2)
    stamps = {0: [5, 30, 65, 70, 125], 1: [1, 61, 62, 119, 130]}  # minutes after T0; 120+ closes window 2
    topics.produce(topic, [(p, to_millis(T0 + timedelta(minutes=m)), f"{p}:{m}".encode())
                           for p, ms in stamps.items() for m in ms])
    hour = timedelta(hours=1)
    with KafkaLog(kafka_config) as log_:
        plans = [plan_window(ledger, log_, PlanRequest(Window("kafka_orders", T0 + i * hour, T0 + (i + 1) * hour),
                                                       (topic,)), now=lambda: T0 + timedelta(days=1))
                 for i in (1, 0)]
        record_offsets = {}
        for r in (r for plan in plans for r in plan.ranges):
            record_offsets.setdefault(r.tp, []).extend(rec.offset for rec in log_.records(r.tp, r.start_offset,
                                                                                          r.end_offset))

    for plan in plans:  # window 1 first: offsets wait for window 0
        attempt = orders.begin(plan.window)
        writer = orders.writer(attempt)
        chunks, ranges = [], []
        for r in plan.ranges:  # one Spark task per partition range
            offsets_read = [o for o in record_offsets[r.tp] if r.start_offset <= o < r.end_offset]
            chunks.append(writer.write([pa.record_batch({
                "id": pa.array(offsets_read, pa.int64()), "amount": pa.array([1] * len(offsets_read), pa.int64()),
                "note": pa.array([None] * len(offsets_read), pa.string()),
                "created": pa.array([None] * len(offsets_read), pa.timestamp("us", tz="UTC")),
                "eos_topic": [topic] * len(offsets_read), "eos_partition": [r.partition] * len(offsets_read),
                "eos_offset": pa.array(offsets_read, pa.int64())})]))
            ranges.append(ConsumedRange(topic, r.partition, r.start_offset, r.end_offset, len(offsets_read)))
        orders.checkpoint(attempt, ranges, chunks)
        orders.prepare(attempt)
        orders.commit(attempt)

    rows = execute(pg_url, "SELECT eos_partition, eos_offset, eos_window_start FROM analytics.orders"
                           " ORDER BY 1, 2")
    assert rows == [(0, 0, T0), (0, 1, T0), (0, 2, T0 + hour), (0, 3, T0 + hour),
                    (1, 0, T0), (1, 1, T0 + hour), (1, 2, T0 + hour), (1, 3, T0 + hour)]
    assert offsets(pg_url, "kafka_orders") == {TopicPartition(topic, 0): 4, TopicPartition(topic, 1): 4}


# --------------------------------------------------------------------------- partition_per_window


PARTITIONED_ORDERS_DDL = orders_ddl(PARTITION_PER_WINDOW) + """
    ALTER TABLE analytics.orders ADD CONSTRAINT orders_lineage UNIQUE (eos_topic, eos_partition, eos_offset,
                                                                        eos_window_start),
                                 ADD CHECK (amount >= 0);
    CREATE INDEX orders_note ON analytics.orders (note);
"""


@pytest.fixture
def partitioned_orders(pg_url, ledger):
    """The orders target partitioned by window, with a unique lineage
    constraint, a CHECK and a plain index the partitions must carry."""
    execute(pg_url, PARTITIONED_ORDERS_DDL)
    return PostgresTarget(pg_url, "analytics.orders", mode=PARTITION_PER_WINDOW).sink()


def relation(url, name):
    """(filenode, schema, table) of a relation by name, None if there is none."""
    rows = execute(url, "SELECT pg_relation_filenode(c.oid), n.nspname, c.relname FROM pg_class c"
                        " JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = to_regclass(%s)", (name,))
    return rows[0] if rows else None


def test_partition_per_window_attaches_the_sealed_staging_without_copying_a_row(pg_url, partitioned_orders, freeze_windows):
    target = partitioned_orders
    [plan] = freeze_windows("p", [0])
    attempt = target.begin(plan.window)
    writer = target.writer(attempt)
    assert writer.columns == ("id", "amount", "note", "created", "eos_topic", "eos_partition", "eos_offset")
    batches = records(plan)
    listed = [writer.write([b]) for b in batches]
    writer.write([batches[0]])  # a speculative duplicate Spark discarded: would break the unique index
    target.checkpoint(attempt, consumed(plan), listed)  # the seal removes it, then builds the indexes

    staging = f"eos_staging.{attempt.staging}"
    indexes = execute(pg_url, "SELECT indexrelid::regclass::text FROM pg_index WHERE indrelid = %s::regclass"
                              " ORDER BY 1", (staging,))
    assert indexes == [(f"eos_staging.{attempt.staging}_i1",), (f"eos_staging.{attempt.staging}_i2",)]
    assert execute(pg_url, f"SELECT count(*) FROM {staging}") == [(10,)]
    # Tasks of this attempt staging after the seal (a lost task still running) are
    # refused: the sealed staging holds exactly the checkpoint, so nothing counts it again.
    for late in (batches[1], batches[1].set_column(6, "eos_offset", pa.array(range(100, 105), pa.int64()))):
        with pytest.raises(TargetError, match=f"staging eos_staging.{attempt.staging} is sealed"):
            writer.write([late])
    assert execute(pg_url, f"SELECT count(*) FROM {staging}") == [(10,)]
    assert target.prepare(attempt).prepared
    filenode = relation(pg_url, staging)[0]

    result = target.commit(attempt)
    assert (result.outcome, result.published_rows) == (PUBLISHED, 10)
    assert published(pg_url) == expected_rows(plan)
    # The staging itself became the window's partition: same file, no row copied.
    assert relation(pg_url, staging) is None
    assert relation(pg_url, f"analytics.{attempt.staging}") == (filenode, "analytics", attempt.staging)
    assert execute(pg_url, "SELECT c.relname, pg_get_expr(c.relpartbound, c.oid) FROM pg_inherits i"
                           " JOIN pg_class c ON c.oid = i.inhrelid WHERE i.inhparent = 'analytics.orders'::regclass"
                           " AND c.relkind = 'r'") == [
        (attempt.staging, "FOR VALUES FROM ('2024-01-01 00:00:00+00') TO ('2024-01-01 01:00:00+00')")]
    # Its indexes are the seal's, attached to the target's; no sink column or constraint is left.
    assert execute(pg_url, "SELECT i.inhrelid::regclass::text, i.inhparent::regclass::text FROM pg_inherits i"
                           " JOIN pg_class c ON c.oid = i.inhrelid WHERE c.relkind = 'i' ORDER BY 1") == [
        (f"analytics.{attempt.staging}_i1", "analytics.orders_lineage"),
        (f"analytics.{attempt.staging}_i2", "analytics.orders_note")]
    assert execute(pg_url, "SELECT conname FROM pg_constraint WHERE conrelid = %s::regclass AND contype = 'c'"
                           " ORDER BY 1", (f"analytics.{attempt.staging}",)) == [("orders_amount_check",)]
    assert execute(pg_url, "SELECT count(*) FROM pg_attribute WHERE attrelid = %s::regclass AND attname = 'eos_chunk'",
                   (f"analytics.{attempt.staging}",)) == [(0,)]
    assert staging_tables(pg_url) == []
    with pytest.raises(TargetError, match="aborted or committed"):  # a zombie writer cannot add to it now
        writer.write([batches[0]])
    assert target.commit(attempt).outcome == ALREADY_COMMITTED
    assert published(pg_url) == expected_rows(plan)


def test_partition_per_window_refuses_a_target_not_partitioned_by_window(pg_url, ledger, freeze_windows):
    [plan] = freeze_windows("p", [0])
    execute(pg_url, ORDERS_DDL)
    with pytest.raises(TargetError, match=r"PARTITION BY RANGE \(eos_window_start\).*it is not partitioned"):
        PostgresTarget(pg_url, "analytics.orders", mode=PARTITION_PER_WINDOW).sink().begin(plan.window)
    execute(pg_url, "DROP TABLE analytics.orders")
    execute(pg_url, ORDERS_DDL.replace("CREATE SCHEMA analytics;", "").replace(
        "\n    );", "\n    ) PARTITION BY LIST (eos_pipeline);"))
    with pytest.raises(TargetError, match=r"it is partitioned by LIST \(eos_pipeline\)"):
        PostgresTarget(pg_url, "analytics.orders", mode=PARTITION_PER_WINDOW).sink().begin(plan.window)
    assert window_row(pg_url, plan.window)[1] == 0 and staging_tables(pg_url) == []  # no attempt opened


def test_partition_per_window_duplicate_key_fails_the_seal_and_publishes_nothing(pg_url, partitioned_orders, freeze_windows):
    target = partitioned_orders
    [plan] = freeze_windows("p", [0])
    attempt = target.begin(plan.window)
    writer = target.writer(attempt)
    batches = records(plan)
    twice = batches[1].set_column(6, "eos_offset", pa.array([0, 0, 1, 2, 3], pa.int64()))  # a transform's bug
    chunks = [writer.write([batches[0]]), writer.write([twice])]
    with pytest.raises(TargetError, match=r"cannot seal the staging of .* as a partition of analytics.orders: "
                                          r"could not create unique index"):
        target.checkpoint(attempt, consumed(plan), chunks)
    assert attempt_state(pg_url, attempt)[0] == "open"  # the checkpoint was rolled back with the seal
    assert target.abort(attempt, "stage failed")
    assert staging_tables(pg_url) == [] and published(pg_url) == []


def test_partition_per_window_overlapping_partition_fails_the_commit_clearly(pg_url, partitioned_orders,
                                                                              freeze_windows):
    """Another partition already covers the window (a second pipeline writing
    the same table, a hand-made partition): the commit is refused, nothing
    published, the staging kept until the attempt is aborted."""
    target = partitioned_orders
    execute(pg_url, "CREATE TABLE analytics.orders_2024 PARTITION OF analytics.orders"
                    " FOR VALUES FROM ('2024-01-01') TO ('2025-01-01')")
    [plan] = freeze_windows("p", [0])
    attempt = stage(target, plan)
    with pytest.raises(TargetError, match=r"cannot publish .* would overlap partition \"orders_2024\"; staging kept"):
        target.commit(attempt)
    assert published(pg_url) == [] and window_row(pg_url, plan.window)[0] == "planned"
    assert execute(pg_url, f"SELECT count(*) FROM eos_staging.{attempt.staging}") == [(10,)]
