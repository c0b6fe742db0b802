"""Faults from outside the protocol: the database restarted (fast and immediate
shutdown) during stage and during commit, the broker restarted during stage, a
committing backend terminated, commits racing, zombie attempts, clock-skewed
and non-monotone record timestamps. Each ends with verify clean against Kafka.

Restarts use servers of this module's own (the session's are shared); the
broker restart needs a broker process of its own, so that test always runs
one of its own, even when EOS_KAFKA_BOOTSTRAP names a real Kafka.
"""

from __future__ import annotations

import dataclasses
import random
import uuid
from datetime import timedelta

import psycopg
import pytest

from airflow_eos.core.attempt import load_checkpoint
from airflow_eos.core.errors import AttemptFenced, LedgerUnavailable, NotPrepared
from airflow_eos.core.faults import FaultInjected, injected
from airflow_eos.core.ledger import Ledger
from airflow_eos.targets.postgres.target import PARTITION_PER_WINDOW
from airflow_eos.core.sink import ALREADY_COMMITTED, PUBLISHED, SKIPPED
from airflow_eos.core.windows import WindowPlan, to_millis
from airflow_eos.embedded import KafkaBroker, PostgresServer
from harness import chaos
from harness.concurrency import Background, blocked_on_locks
from harness.chaos import HOUR, T0, Harness, Zombie, check, plan_step, stage_attempt, staged_and_prepared
from harness.chaos.cases import PARTITIONS, new_pipeline

WINDOWS = (0, 1)


# --------------------------------------------------------------------------- helpers


@pytest.fixture(scope="module")
def own_pg():
    """A PostgreSQL server these tests may restart and crash."""
    with PostgresServer() as server:
        yield server


@pytest.fixture
def own_db(own_pg):
    """A database on that server, durable: the test servers run with
    synchronous_commit=off, which acknowledges a commit before its WAL is
    written, so a crash (immediate shutdown) loses committed ledger rows. The
    guarantee assumes a durable database (docs/guarantees.md); a per-database
    setting overrides the server's command line."""
    name = f"eos_ext_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(own_pg.url, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
        admin.execute(f'ALTER DATABASE "{name}" SET synchronous_commit = on')
    url = own_pg.url.rpartition("/")[0] + f"/{name}"
    assert sql(url, "SHOW synchronous_commit") == [("on",)]
    Ledger(url).migrate()
    return url


def sql(url, query, *args):
    with psycopg.connect(url, autocommit=True) as conn:
        cur = conn.execute(query, args)
        return cur.fetchall() if cur.description else None


def finish(h, windows=WINDOWS, **kwargs):
    """Run (or clear) whatever is not committed yet, then the full check."""
    h.run_until_committed([i for i in windows if not h.asset_events.get(i)])
    return check(h, windows, **kwargs)


# --------------------------------------------------------------------------- PostgreSQL restarted


@pytest.mark.parametrize("mode", ["fast", "immediate"])
def test_database_restarted_during_stage(mode, own_pg, own_db, chaos_source, tmp_path, tally):
    """The server goes down while a write task's COPY is open: the task's chunk
    rolls back, the stage fails; a clear stages and commits the window once."""
    p = new_pipeline(own_db, chaos_source, f"pg_stage_{mode}")
    h = Harness(p, tmp_path)
    plan = WindowPlan.from_dict(plan_step(p, p.window(0)))
    attempt = p.target.begin(plan.window)
    restarted = []

    def restart(n):
        if not restarted:
            restarted.append(n)
            own_pg.restart(mode)

    with pytest.raises(LedgerUnavailable):
        stage_attempt(p, plan, attempt, between_batches=restart)
    assert restarted
    assert sql(own_db, "SELECT state FROM eos.attempts") == [("open",)]  # the job died: nobody aborted it
    tally.add(finish(h))  # the clear's teardown aborts the dead attempt


@pytest.mark.parametrize("mode", ["fast", "immediate"])
@pytest.mark.parametrize("target_mode", ["replace_window", PARTITION_PER_WINDOW])
def test_database_restarted_after_prepare_loses_unlogged_staging_only_in_a_crash(
        mode, target_mode, own_pg, own_db, chaos_source, tmp_path, tally):
    """Staging is UNLOGGED: a clean restart keeps it, a crash empties it. The
    commit counts it again: lost staging is refused, never half published.
    (partition_per_window stages into a logged table: it survives both.)"""
    p = new_pipeline(own_db, chaos_source, f"pg_prepared_{mode}", mode=target_mode)
    h = Harness(p, tmp_path)
    attempt = staged_and_prepared(p, 0)
    own_pg.restart(mode)
    if mode == "fast" or target_mode == PARTITION_PER_WINDOW:
        assert p.target.commit(attempt).outcome == PUBLISHED
        h.emitted(0, PUBLISHED)
    else:
        with pytest.raises(NotPrepared, match="staging lost or changed after prepare"):
            p.target.commit(attempt)
        assert sql(own_db, f"SELECT count(*) FROM {p.table}") == [(0,)]
    tally.add(finish(h))


@pytest.mark.parametrize("mode", ["fast", "immediate"])
@pytest.mark.parametrize("target_mode", ["replace_window", PARTITION_PER_WINDOW])
def test_database_restarted_inside_the_commit_transaction(mode, target_mode, own_pg, own_db, chaos_source, tmp_path,
                                                          tally):
    """The commit has published the window's rows (inserted them, or attached
    the partition) and waits for the pipeline row (to advance offsets) when the
    server goes down: nothing is published; the retried commit publishes once
    (fast, or a logged partition_per_window staging: kept) or refuses the lost
    staging (immediate), and a clear re-stages the window."""
    p = new_pipeline(own_db, chaos_source, f"pg_commit_{mode}", mode=target_mode)
    h = Harness(p, tmp_path)
    attempt = staged_and_prepared(p, 0)
    gate = psycopg.connect(own_db)
    gate.execute("SELECT 1 FROM eos.pipelines WHERE pipeline = %s FOR UPDATE", (p.name,))
    commit = Background(p.target.commit, attempt)
    [pid] = blocked_on_locks(own_db, application="airflow-eos commit")
    [(query,)] = sql(own_db, "SELECT query FROM pg_stat_activity WHERE pid = %s", pid)
    assert "FROM eos.pipelines WHERE pipeline" in query  # rows inserted, not committed
    own_pg.restart(mode)
    result, error = commit.outcome()
    assert result is None and isinstance(error, LedgerUnavailable), error
    gate.close()
    assert sql(own_db, f"SELECT count(*) FROM {p.table}") == [(0,)]
    assert sql(own_db, "SELECT state FROM eos.windows") == [("planned",)]
    if mode == "fast" or target_mode == PARTITION_PER_WINDOW:
        assert p.target.commit(attempt).outcome == PUBLISHED  # the commit task's retry
        h.emitted(0, PUBLISHED)
    else:
        with pytest.raises(NotPrepared):
            p.target.commit(attempt)
    tally.add(finish(h))


def test_a_file_targets_decision_survives_a_crash_on_a_server_that_commits_asynchronously(
        own_pg, chaos_source, tmp_path, tally):
    """The file target publishes after its ledger decision, so the decision must
    be on disk before the rename: a ledger on a server running
    synchronous_commit=off (a common tuning; the test servers do) would
    acknowledge the decision, publish, then lose the decision in a crash, and
    the window would be published with the ledger saying it is not (the N=2000
    soak on Apache Kafka found it, seed 20270242, files). The decision's own
    transaction asks for a synchronous commit. Here the WAL writer waits 10 s,
    so an asynchronous commit is certainly lost by a crash right after it."""
    name = f"eos_async_{uuid.uuid4().hex[:8]}"
    sql(own_pg.url, f'CREATE DATABASE "{name}"')
    url = own_pg.url.rpartition("/")[0] + f"/{name}"
    assert sql(url, "SHOW synchronous_commit") == [("off",)]
    Ledger(url).migrate()
    sql(own_pg.url, "ALTER SYSTEM SET wal_writer_delay = '10s'")
    sql(own_pg.url, "SELECT pg_reload_conf()")
    try:
        p = new_pipeline(url, chaos_source, "async_decision", target="files", root=tmp_path / "lake")
        h = Harness(p, tmp_path)
        attempt = staged_and_prepared(p, 0)
        p.target.decide(attempt)
        own_pg.restart("immediate")
        assert sql(url, "SELECT state, committed_epoch FROM eos.windows WHERE pipeline = %s",
                   p.name) == [("committed", attempt.epoch)]
        assert p.target.commit(attempt).outcome == ALREADY_COMMITTED  # publishes what was decided
        h.emitted(0, PUBLISHED)
        tally.add(finish(h))
    finally:
        sql(own_pg.url, "ALTER SYSTEM RESET wal_writer_delay")
        sql(own_pg.url, "SELECT pg_reload_conf()")


def test_committing_backend_terminated_after_publish(make_pipeline, chaos_db, tmp_path, tally):
    p = make_pipeline("terminated")
    h = Harness(p, tmp_path)
    attempt = staged_and_prepared(p, 1)
    with psycopg.connect(chaos_db) as gate:
        gate.execute("SELECT 1 FROM eos.pipelines WHERE pipeline = %s FOR UPDATE", (p.name,))
        commit = Background(p.target.commit, attempt)
        [pid] = blocked_on_locks(chaos_db, application="airflow-eos commit")
        sql(chaos_db, "SELECT pg_terminate_backend(%s)", pid)
        result, error = commit.outcome()
        gate.rollback()
    assert isinstance(error, LedgerUnavailable) and "retrying the commit is safe" in str(error)
    assert sql(chaos_db, f"SELECT count(*) FROM {p.table}") == [(0,)]
    assert p.target.commit(attempt).outcome == PUBLISHED
    assert p.target.commit(attempt).outcome == ALREADY_COMMITTED
    h.emitted(1, PUBLISHED)
    tally.add(finish(h))


# --------------------------------------------------------------------------- races and zombies


def test_commits_racing_for_one_attempt_and_for_an_older_one(make_pipeline, chaos_db, tmp_path, tally):
    """Four commits of one prepared attempt at once: one publishes. Then a
    fenced older attempt and the newer one commit at once: only the newer can."""
    p = make_pipeline("racing")
    h = Harness(p, tmp_path)
    attempt = staged_and_prepared(p, 0)
    with psycopg.connect(chaos_db) as gate:  # hold the window row so that all commits queue up
        gate.execute("SELECT 1 FROM eos.windows WHERE pipeline = %s FOR UPDATE", (p.name,))
        racers = [Background(p.target.commit, attempt) for _ in range(4)]
        blocked_on_locks(chaos_db, 4, application="airflow-eos commit")
        gate.rollback()
    outcomes = sorted(r.outcome()[0].outcome for r in racers)
    assert outcomes == [ALREADY_COMMITTED] * 3 + [PUBLISHED]

    older = staged_and_prepared(p, 1)
    newer = staged_and_prepared(p, 1)  # fences the older one
    with psycopg.connect(chaos_db) as gate:
        gate.execute("SELECT 1 FROM eos.windows WHERE pipeline = %s FOR UPDATE", (p.name,))
        racers = [Background(p.target.commit, a) for a in (older, newer, older)]
        blocked_on_locks(chaos_db, 3, application="airflow-eos commit")
        gate.rollback()
    results = [r.outcome() for r in racers]
    assert results[1][0].outcome == PUBLISHED
    for result, error in (results[0], results[2]):
        # fenced; or, once the newer committed, skipped (on_committed='skip'): never published
        assert (result is None and isinstance(error, AttemptFenced)) or result.outcome == SKIPPED, (result, error)
    h.emitted(0, PUBLISHED)
    h.emitted(1, PUBLISHED)
    p.target.abort_window(p.window(1), "teardown")
    tally.add(check(h, WINDOWS))


def test_whole_runs_of_one_window_racing(make_pipeline, tmp_path, tally):
    """Three DAG runs of each window at once (a clear while running, a manual
    run of the same interval): runs fence and abort each other; whatever
    survives commits once, and clears finish the rest."""
    p = make_pipeline("racing_runs")
    h = Harness(p, tmp_path)
    h.run_many([0, 1, 0, 1, 0, 1], parallel=6)
    tally.add(finish(h))


@pytest.mark.parametrize("on_committed", ["skip", "replace"])
@pytest.mark.parametrize("target_mode", ["replace_window", PARTITION_PER_WINDOW])
def test_zombie_attempt_finishing_after_a_newer_commit(on_committed, target_mode, make_pipeline, tmp_path, tally):
    """A zombie stage attempt (its task presumed dead) half-staged; a clear
    commits the window with a newer attempt; then the zombie finishes. If the
    clear's teardown aborted it, its staging is gone; if the teardown failed,
    it stages everything and is fenced at its checkpoint; a zombie prepared
    before it was fenced is refused at commit. The sweeper ends the leftovers."""
    p = make_pipeline(f"zombie_{on_committed}", on_committed=on_committed, mode=target_mode)
    h = Harness(p, tmp_path)
    aborted_by_teardown = Zombie(p, 0)
    h.run(0)
    assert aborted_by_teardown.finish() in ("refused: TargetError", "refused: AttemptClosed")

    h.faults[1] = "abort.inside=raise*2"  # the clears' teardowns fail: zombies stay live
    survivor = Zombie(p, 1)
    assert h.run(1).state == "success"
    assert survivor.finish() == "refused: AttemptFenced"
    prepared = staged_and_prepared(p, 1)  # then fenced by the next clear (replace), or skipped at its commit
    events = len(h.asset_events[1])
    rerun = h.run(1)
    assert rerun.state == "success" and rerun.summary["outcome"] == (
        "skipped" if on_committed == "skip" else "replaced"), h.history()
    # skip: the clear opened no attempt (the window is committed) and emitted no event; replace: it did both
    assert len(h.asset_events[1]) == events + (on_committed == "replace")
    if on_committed == "skip":  # the window is committed: skipping wins over fencing
        assert p.target.commit(prepared).outcome == SKIPPED
    else:
        with pytest.raises(AttemptFenced):
            p.target.commit(prepared)
    assert survivor.attempt.epoch in h.sweep()
    tally.add(check(h, WINDOWS))


# --------------------------------------------------------------------------- the broker restarted


def test_broker_restarted_during_stage(make_pipeline, tmp_path, tally):
    """The test's own broker restarts (a clean shutdown, its log kept) in the
    middle of the stage. The stage either reads on after the restart or fails
    loudly (never short); the window then commits once, verified against the
    restarted broker."""
    records = chaos.source_records(3, 12, 2)
    with KafkaBroker() as broker:
        topic = f"restart-{uuid.uuid4().hex[:6]}"
        chaos.create_topic(broker.bootstrap, topic, 2)
        chaos.produce(broker.bootstrap, topic, records)
        p = dataclasses.replace(make_pipeline("broker_restart"), topics=(topic,),
                                kafka_config={"bootstrap.servers": broker.bootstrap, "fetch.wait.max.ms": 10})
        h = Harness(p, tmp_path)
        plan = WindowPlan.from_dict(plan_step(p, p.window(0)))
        attempt = p.target.begin(plan.window)
        restarted = []

        def restart(n):
            if not restarted:
                restarted.append(n)
                broker.restart()

        try:
            stage_attempt(p, plan, attempt, between_batches=restart)
            outcome = "read on"
        except Exception as exc:  # noqa: BLE001 - the stage may fail; it must fail loudly
            outcome = f"failed: {type(exc).__name__}"
            assert type(exc).__name__ in ("SourceUnavailable", "UnknownTopic", "LogTruncated", "OffsetsExpired"), exc
        h.note(f"stage across the broker restart {outcome}")
        assert restarted
        if outcome == "read on":
            assert p.target.prepare(attempt).prepared
            assert p.target.commit(attempt).outcome == PUBLISHED
            h.emitted(0, PUBLISHED)
        tally.add(finish(h))


def test_broker_restarted_during_a_kafka_target_commit(make_pipeline, tmp_path, tally, monkeypatch):
    """The test's own broker holds the source and the target topic and restarts
    (a clean shutdown, its log and its transaction state kept) while the commit
    has half the window's records produced in its open Kafka transaction. The
    commit goes on or fails; either way the window is then published once: a
    read_committed reader sees each source record once (harness.chaos.check)."""
    from airflow_eos.targets.kafka import commit as kafka_commit

    records = chaos.source_records(3, 12, 2)
    with KafkaBroker() as broker:
        topic = f"restart-{uuid.uuid4().hex[:6]}"
        chaos.create_topic(broker.bootstrap, topic, 2)
        chaos.produce(broker.bootstrap, topic, records)
        p = dataclasses.replace(make_pipeline("broker_restart_commit", target="kafka"), topics=(topic,),
                                kafka_config={"bootstrap.servers": broker.bootstrap, "fetch.wait.max.ms": 10})
        chaos.create_topic(broker.bootstrap, p.target_topic, PARTITIONS)
        h = Harness(p, tmp_path)
        plan = WindowPlan.from_dict(plan_step(p, p.window(0)))
        attempt = p.target.begin(plan.window)
        stage_attempt(p, plan, attempt)
        assert p.target.prepare(attempt).prepared
        restarted = []
        real_fault_point = kafka_commit.fault_point

        def restart_mid_produce(name: str) -> None:
            if name == "commit.mid_produce" and not restarted:
                restarted.append(name)
                broker.restart()
            real_fault_point(name)

        monkeypatch.setattr(kafka_commit, "fault_point", restart_mid_produce)
        try:
            outcome = p.target.commit(attempt).outcome
            h.note(f"commit across the broker restart: {outcome}")
            assert outcome == PUBLISHED
            h.emitted(0, PUBLISHED)
        except Exception as exc:  # noqa: BLE001 - the commit may fail; the window must then commit once
            h.note(f"commit across the broker restart failed: {type(exc).__name__}: {exc}")
        monkeypatch.setattr(kafka_commit, "fault_point", real_fault_point)
        assert restarted
        tally.add(finish(h))


# --------------------------------------------------------------------------- timestamps


def skewed_records(rng: random.Random, hours: int):
    """4 partitions: 0 on time; 1 with a clock 10 minutes behind; 2 with
    timestamps jumping back and forth up to 20 minutes (non-monotone); 3 silent
    after the first hour (closed by idling)."""
    out = []
    for h in range(hours):
        for i in range(15):
            base = to_millis(T0 + h * HOUR) + i * 240_000
            out.append((0, base, chaos.record_value(len(out))))
            out.append((1, base - 600_000, chaos.record_value(len(out))))
            out.append((2, max(0, base + rng.randint(-1_200_000, 1_200_000)), chaos.record_value(len(out))))
            if h == 0:
                out.append((3, base, chaos.record_value(len(out))))
    for part in range(3):
        out.append((part, to_millis(T0 + hours * HOUR) + 900_000, chaos.record_value(len(out))))
    return out


def test_clock_skewed_and_non_monotone_timestamps_still_tile(make_pipeline, kafka, tmp_path, tally):
    """Windows planned in random order and at once over skewed, non-monotone
    and idle partitions, then late records with old timestamps: every offset
    lies in exactly one window (ranges are contiguous per partition from 0),
    and every window commits exactly once."""
    rng = random.Random(20250106)
    topic = f"skew-{uuid.uuid4().hex[:6]}"
    chaos.create_topic(kafka.address, topic, 4)
    chaos.produce(kafka.address, topic, skewed_records(rng, 4))
    p = dataclasses.replace(make_pipeline("skew"), topics=(topic,))
    h = Harness(p, tmp_path)
    windows = [0, 1, 2, 3]
    rng.shuffle(windows)
    h.run_many(windows[:2], parallel=2)
    # Late records with old timestamps: their windows' cuts are frozen, so they
    # belong to later windows (the ones not planned yet), never to two.
    late = [(part, to_millis(T0 + timedelta(minutes=5)), chaos.record_value(10_000 + part)) for part in range(4)]
    chaos.produce(kafka.address, topic, late)
    h.run_many(windows[2:] + [4], parallel=3)
    with psycopg.connect(p.url) as conn:
        ranges = conn.execute(
            "SELECT partition, window_start, start_offset, end_offset FROM eos.window_ranges"
            " WHERE pipeline = %s ORDER BY partition, window_start", (p.name,)).fetchall()
    by_partition: dict[int, list] = {}
    for part, _, start, end in ranges:
        by_partition.setdefault(part, []).append((start, end))
    assert sorted(by_partition) == [0, 1, 2, 3]
    assert by_partition[0][0][0] == 0  # on time: nothing before the first window
    # (a record of a skewed partition stamped before the first window belongs to none of them)
    for part, spans in by_partition.items():
        assert all(a[1] == b[0] for a, b in zip(spans, spans[1:])), (part, spans)  # contiguous: a tiling
    tally.add(finish(h, windows=(0, 1, 2, 3, 4)))


def test_database_crash_after_the_kafka_commit_keeps_the_windows_dead_letters(own_pg, own_db, chaos_source, tmp_path,
                                                                              tally):
    """Regression (the N=2000 soak, seed 20264910): the Kafka target's window
    committed in Kafka, then the commit failed before the ledger recorded it,
    then the database crashed. The retry finds the window's marker and records
    it, with its dead letters, which are only in the staging until then: a
    crash empties unlogged tables, and the window was recorded with 2 fewer."""
    p = new_pipeline(own_db, chaos_source, "kafka_crash_after_commit", target="kafka")
    h = Harness(p, tmp_path)
    attempt = staged_and_prepared(p, 0)
    with Ledger(own_db).connect() as conn:
        staged_dead = load_checkpoint(conn, attempt).dead_letter_count
    assert staged_dead > 0  # the window has dead letters to lose
    with pytest.raises(FaultInjected), injected("commit.after_kafka_commit=raise*1", tmp_path / "faults"):
        p.target.commit(attempt)
    own_pg.restart("immediate")
    result = p.target.commit(attempt)  # the commit task's retry: the marker says it committed
    assert result.dead_letter_rows == staged_dead
    assert sql(own_db, "SELECT count(*) FROM eos.dead_letters") == [(staged_dead,)]
    tally.add(finish(h))
