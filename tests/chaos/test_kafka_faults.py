"""Fault cells of the Kafka target (KafkaTarget: each window one producer
transaction into a topic, fenced per window by its transactional.id, the
window's marker in the same transaction; staging and ledger in PostgreSQL),
through the same steps as every other target (harness.chaos: only the Spark
job is replaced by its Python stand-in). A ``crash`` kills the commit's
process (exit 137: no ``finally``, no abort of the Kafka transaction).

The matrix (harness/chaos/matrix.py) runs the fault points of the Kafka target's own
code x {raise, crash} x {retry, clear, rerun later, backfill}, and the
randomized schedules (test_randomized.py) run on it too (every point it
reaches). The cells here look, step by step, at what only a commit that runs a
whole Kafka transaction has:

- a crash before producing, in the middle of producing, and after the Kafka
  commit before the ledger, each recovered by the commit's retry, by the
  teardown and a clear, or by the sweep (nobody retries, no teardown ran);
- a zombie committer: paused in the middle of producing, its ledger session
  lost, fenced by a rerun's commit, then resumed: it goes on producing;
- two commits of one window at once (of one attempt, and two DAG runs);
- ``airflow-eos sweep`` after a commit died after the Kafka commit and a
  clear's stage died too, with no teardown: the window recorded from its
  marker, the stale attempt aborted, its staging dropped.

Each ends with harness.chaos.check: verify clean by lineage (every source
record of the committed windows exactly once among the records of the
committed transactions, whose tokens the ledger holds; offsets the committed
prefix), each record's key, value and headers its source's, the topic read to
its end as a read_committed consumer, no transaction left open in it (a
read_committed reader reaches each partition's end where its log ends), no live
attempt or staging left.
"""

from __future__ import annotations

import io
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta

import psycopg
import pytest

from airflow_eos import cli
from airflow_eos.core.sink import ALREADY_COMMITTED, PUBLISHED, SKIPPED
from airflow_eos.targets.kafka import client as kclient
from harness.chaos import Harness, StepFailed, Verdict, abort_step, await_step, check, commit_step, plan_step
from harness.chaos import LEFTOVERS, attempt_states, run_step, stage_step
from harness.chaos.cases import PARALLEL, new_pipeline, run_concurrently, scratch_database, selected_params

WINDOWS = (0, 1)


@pytest.fixture
def kafka_pipeline(make_pipeline):
    return lambda name, **kw: make_pipeline(name, target="kafka", **kw)


# --------------------------------------------------------------------------- what the topic and the ledger hold


def tokens_in_topic(p) -> Counter:
    """(epoch, commit token) -> records of the pipeline in the topic, as a
    read_committed reader sees them."""
    return Counter((int(r["headers"][kclient.H_EPOCH]), int(r["headers"][kclient.H_COMMIT]))
                   for r in p.target.published_records(p.name))


def ledger_commits(p) -> dict:
    """window start -> (epoch, token) of the pipeline's committed transactions."""
    with psycopg.connect(p.url) as conn:
        return {ws: (epoch, token) for ws, epoch, token in conn.execute(
            "SELECT window_start, epoch, token FROM eos.kafka_commits WHERE pipeline = %s", (p.name,))}


def window_state(p, i) -> tuple:
    with psycopg.connect(p.url) as conn:
        return conn.execute("SELECT state, committed_epoch FROM eos.windows WHERE pipeline = %s AND window_start = %s",
                            (p.name, p.window(i).start)).fetchone()


def staged_until_commit(p, i) -> dict:
    """Window ``i`` planned, staged and prepared by a run's first tasks, in-process."""
    staged = stage_step(p, plan_step(p, p.window(i)))
    await_step(p, staged)
    return staged


# --------------------------------------------------------------------------- crashes in the commit

CRASH_POINTS = ("commit.before_publish", "commit.mid_produce", "commit.after_kafka_commit")


def crash_cell(point: str, recovery: str, url: str, source: dict, state_dir) -> Verdict:
    """The commit's process is killed at ``point``; then its retry (the same
    attempt, in a new process), or the run's teardown and a clear (a new
    attempt), or -- nobody retries, no teardown ran -- the sweep finishes the
    window. A crash after the Kafka commit is recorded, never published again;
    a crash before it leaves nothing a committed transaction names."""
    p = new_pipeline(url, source, f"crash_{point}_{recovery}", target="kafka", mirror=True)
    state = state_dir / "state"
    h = Harness(p, state, faults={0: f"{point}=crash*1"}, retries=1 if recovery == "retry" else 0)
    kafka_committed = point == "commit.after_kafka_commit"
    if recovery == "sweep":
        staged = staged_until_commit(p, 0)
        with pytest.raises(StepFailed) as failed:
            run_step(commit_step, p, staged, faults=f"{point}=crash*1", state_dir=state / "w0")
        assert failed.value.crashed
        assert attempt_states(p, 0) == [(1, "prepared")] and window_state(p, 0) == ("planned", None)
        with psycopg.connect(p.url) as conn:
            left = LEFTOVERS["kafka"](p, conn)
        # The dead committer's transaction: open (mid-produce) until someone fences it; its staging, kept.
        assert any("transaction left open" in x for x in left) == (point == "commit.mid_produce"), left
        swept = h.sweep()  # older_than=0: the dead run's attempt is stale
        assert swept == ([] if kafka_committed else [1]), h.history()
        if kafka_committed:  # the sweep finished the window from its marker: committed by attempt 1
            assert window_state(p, 0) == ("committed", 1) and attempt_states(p, 0) == [(1, "committed")]
        else:  # the open transaction fenced (aborted), the attempt aborted, its staging dropped
            assert window_state(p, 0) == ("planned", None) and attempt_states(p, 0) == [(1, "aborted")]
        run = h.run(0)  # the failed run cleared (its Asset event)
        assert run.summary["outcome"] == (SKIPPED if kafka_committed else PUBLISHED), h.history()
    else:
        run = h.run(0)
        if recovery == "retry":
            assert [r for s, r in run.tries if s == "commit"] == ["crashed", "ok"], h.history()
            assert run.summary["outcome"] == (ALREADY_COMMITTED if kafka_committed else PUBLISHED), h.history()
        else:
            assert run.failed_step == "commit" and ("abort", "ok") in run.tries, h.history()
            # The teardown fenced the window's producers (ending an open transaction) and read the
            # marker: a transaction that committed is recorded, not aborted.
            expected = [(1, "committed")] if kafka_committed else [(1, "aborted")]
            assert attempt_states(p, 0) == expected, h.history()
            run = h.run(0)
            assert run.summary["outcome"] == (SKIPPED if kafka_committed else PUBLISHED), h.history()
    committed_epoch = window_state(p, 0)[1]
    assert committed_epoch == (1 if kafka_committed or recovery == "retry" else 2)
    topic = tokens_in_topic(p)
    [(epoch, token)] = ledger_commits(p).values()
    assert epoch == committed_epoch and topic[epoch, token] == run.summary["published_rows"]
    others = {k: n for k, n in topic.items() if k != (epoch, token)}
    # a read_committed reader sees no record of a crashed try: what it produced was aborted
    assert others == {}, others
    h.run(1)
    return check(h, WINDOWS)


@pytest.fixture(scope="module")
def crash_cells(request, chaos_db, chaos_source, tmp_path_factory):
    cells = {}
    for params in selected_params(request, "test_a_crashed_commit_publishes_the_window_once_whoever_comes_next"):
        key = (params["point"], params["recovery"])
        cells[key] = (*key, chaos_db, chaos_source, tmp_path_factory.mktemp("cell"))
    return run_concurrently(cells, crash_cell, PARALLEL)


@pytest.mark.parametrize("recovery", ["retry", "teardown_then_clear", "sweep"])
@pytest.mark.parametrize("point", CRASH_POINTS)
def test_a_crashed_commit_publishes_the_window_once_whoever_comes_next(point, recovery, crash_cells, tally):
    result = crash_cells[point, recovery]
    if isinstance(result, BaseException):
        raise result
    tally.add(result)


# --------------------------------------------------------------------------- a zombie committer


class PausedCommitter(threading.Thread):
    """A commit of ``staged`` that stops in the middle of producing (as a
    committer in a long GC pause or cut off by the network), until resumed."""

    def __init__(self, p, staged: dict, monkeypatch):
        super().__init__(daemon=True)
        self.p, self.staged = p, staged
        self.paused, self.resume = threading.Event(), threading.Event()
        self.result: dict | None = None
        self.error: str | None = None  # its text only: a traceback would keep its producer alive
        from airflow_eos.targets.kafka import commit as kafka_commit

        real = kafka_commit.fault_point

        def point(name: str) -> None:
            if name == "commit.mid_produce" and threading.current_thread() is self:
                self.paused.set()
                self.resume.wait(60)
            real(name)

        monkeypatch.setattr(kafka_commit, "fault_point", point)

    def run(self) -> None:
        try:
            self.result = commit_step(self.p, self.staged)
        except BaseException as exc:  # noqa: BLE001 - the test looks at it
            self.error = f"{type(exc).__name__}: {exc}"


def test_a_zombie_committer_producing_after_it_was_fenced_never_counts(kafka_pipeline, tmp_path, monkeypatch, tally):
    p = kafka_pipeline("zombie_committer", max_records_per_task=5)
    h = Harness(p, tmp_path / "state")
    zombie = PausedCommitter(p, staged_until_commit(p, 0), monkeypatch)
    zombie.start()
    try:
        assert zombie.paused.wait(60), "the zombie never reached the middle of producing"
        # Its ledger session is lost (the database ended it, or the network): the
        # window's lock it held is released; its Kafka transaction stays open (a
        # read_committed reader sees nothing of the topic past it).
        with psycopg.connect(p.url, autocommit=True) as conn:
            [(ended,)] = conn.execute(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE datname = current_database()"
                " AND pid <> pg_backend_pid() AND state LIKE 'idle in transaction%%'"
                " AND query LIKE '%%eos_kafka_%%'").fetchall()
        assert ended == 1

        run = h.run(0)  # a clear: attempt 2; its commit fences the zombie and aborts its open transaction
        assert run.summary["outcome"] == PUBLISHED and window_state(p, 0) == ("committed", 2), h.history()
        assert attempt_states(p, 0) == [(1, "aborted"), (2, "committed")]  # the teardown aborted attempt 1
        fenced = tokens_in_topic(p)
    finally:
        zombie.resume.set()  # it wakes up and goes on producing the second half, then commits
        zombie.join(60)
    assert not zombie.is_alive()
    assert zombie.result is None and zombie.error is not None, zombie.result
    h.note(f"w0 zombie committer ended: {zombie.error}")
    after = tokens_in_topic(p)
    [(epoch, token)] = ledger_commits(p).values()
    assert epoch == 2 and after[epoch, token] == fenced[epoch, token] == run.summary["published_rows"]
    # The zombie's records (the half it sent before it was fenced, whatever it
    # sent after): its transaction was aborted by the fencing, so a
    # read_committed reader sees none of them.
    zombie_records = {k: n for k, n in after.items() if k != (epoch, token)}
    assert zombie_records == {}, zombie_records
    h.note(f"w0 zombie's records in the topic: {zombie_records} (before it resumed: "
           f"{ {k: n for k, n in fenced.items() if k != (epoch, token)} })")
    h.run(1)
    tally.add(check(h, WINDOWS))


# --------------------------------------------------------------------------- two commits at once


def test_two_commits_of_one_attempt_at_once_publish_once(kafka_pipeline, tmp_path, tally):
    """Two commit tasks of one attempt (a retry started while the first still
    ran): the window's lock in the ledger makes them run one after the other;
    the second finds it committed."""
    p = kafka_pipeline("two_commits")
    h = Harness(p, tmp_path / "state")
    staged = staged_until_commit(p, 0)
    barrier = threading.Barrier(2)

    def commit():
        barrier.wait(10)
        return commit_step(p, staged)["outcome"]

    with ThreadPoolExecutor(2) as pool:
        outcomes = sorted(pool.map(lambda _: commit(), range(2)))
    assert outcomes == sorted([PUBLISHED, ALREADY_COMMITTED])
    h.emitted(0, PUBLISHED)
    assert abort_step(p, p.window(0)) == []  # the run's teardown: nothing live
    assert len(tokens_in_topic(p)) == 1
    h.run(1)
    tally.add(check(h, WINDOWS))


def test_two_runs_of_one_window_at_once_publish_once(kafka_pipeline, tmp_path, tally):
    """Two DAG runs of one window at once (a clear while it runs), many times:
    whatever the interleaving (a later begin fences the other's attempt, its
    commit then fails or is skipped; the teardowns finish the window), one
    transaction is committed and counted."""
    p = kafka_pipeline("two_runs")
    h = Harness(p, tmp_path / "state")
    for _ in range(3):
        h.run_many([0, 0], parallel=2)
    h.run_until_committed([0])
    assert window_state(p, 0)[0] == "committed"
    assert len(ledger_commits(p)) == 1
    h.run(1)
    tally.add(check(h, WINDOWS))


# --------------------------------------------------------------------------- the sweep


@pytest.fixture
def swept_kafka_pipeline(pg_server, chaos_source):
    """A Kafka target's pipeline in a ledger database of its own (``airflow-eos
    sweep`` sweeps every target of the ledger)."""
    with scratch_database(pg_server.address) as url:
        yield lambda name, **kw: new_pipeline(url, chaos_source, name, target="kafka", **kw)


def test_the_sweep_finishes_a_window_committed_in_kafka_whose_runs_all_died(swept_kafka_pipeline, tmp_path, tally):
    """The commit died after the Kafka commit, then a clear's stage died too,
    and no teardown ran (their worker was lost): nobody retries. ``airflow-eos
    sweep`` (the CLI: the sink built from the target id claimed in the ledger
    and the cluster given) aborts the stale attempts oldest first; the
    committed one's window is finished from its marker (recorded as committed
    by it, its dead letters kept), the other attempt aborted and its staging
    dropped."""
    p = swept_kafka_pipeline("sweep_all_died", max_records_per_task=5)
    state = tmp_path / "state"
    h = Harness(p, state)
    staged = staged_until_commit(p, 0)
    with pytest.raises(StepFailed) as failed:
        run_step(commit_step, p, staged, faults="commit.after_kafka_commit=crash*1", state_dir=state / "w0")
    assert failed.value.crashed
    with pytest.raises(StepFailed) as failed:
        run_step(stage_step, p, plan_step(p, p.window(0)), faults="stage.mid_write=crash*1", state_dir=state / "w0")
    assert failed.value.crashed
    assert attempt_states(p, 0) == [(1, "prepared"), (2, "open")] and window_state(p, 0) == ("planned", None)

    assert p.target.stale_attempts(timedelta(hours=1)) == []  # young: a healthy run may still be at work
    time.sleep(1.1)
    assert [a.epoch for a in p.target.stale_attempts(timedelta(seconds=1))] == [1, 2]
    sweep = ["sweep", "--older-than", "1s", "--postgres-url", p.url]
    out = io.StringIO()
    assert cli.main(sweep, out=out) == 0
    assert f"not swept: target {p.spec.target_id} (its cluster is not given" in out.getvalue()
    assert attempt_states(p, 0) == [(1, "prepared"), (2, "open")]
    out = io.StringIO()
    assert cli.main(sweep + ["--kafka-bootstrap", p.kafka_config["bootstrap.servers"]], out=out) == 0, out.getvalue()
    h.note(f"airflow-eos sweep: {out.getvalue()}")
    assert "aborted 1 attempt(s)" in out.getvalue() and p.spec.target_id in out.getvalue(), out.getvalue()
    assert window_state(p, 0) == ("committed", 1)
    assert attempt_states(p, 0) == [(1, "committed"), (2, "aborted")]
    [(epoch, token)] = ledger_commits(p).values()
    assert epoch == 1 and set(tokens_in_topic(p)) == {(1, token)}
    assert p.target.stale_attempts(timedelta(0)) == [] and h.sweep() == []

    assert h.run(0).summary["outcome"] == SKIPPED, h.history()  # the failed run cleared (its Asset event)
    h.run(1)
    tally.add(check(h, WINDOWS))
