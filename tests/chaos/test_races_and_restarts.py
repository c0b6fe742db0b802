"""More kinds of fault (issue 22, part 4), as named scenarios: the broker
restarted empty (a memory-only broker loses its log: the runs must fail loudly
with LogTruncated, publish nothing, and lose nothing of the committed
windows); commits of different windows of one pipeline at the same moment;
a sweep racing a commit. Each on every target that can host it, each ending
with the lineage checks (harness.chaos.check).

PostgreSQL restarted in the middle of a step, the broker restarted and
refilled in the middle of a stage, and skewed or decreasing record timestamps
are in test_external_faults.py.
"""

from __future__ import annotations

import dataclasses
import threading
import uuid
from datetime import timedelta

import psycopg
import pytest

from airflow_eos import steps
from airflow_eos.core.errors import LogTruncated
from airflow_eos.core.sink import PUBLISHED
from airflow_eos.embedded import KafkaBroker
from airflow_eos.targets.postgres.target import PARTITION_PER_WINDOW
from airflow_eos.verify import verify
from harness import chaos
from harness.concurrency import at_once, blocked_on_locks
from harness.chaos import Harness, check, plan_step, published_lineage, staged_and_prepared
from harness.chaos.cases import new_pipeline, scratch_database

# (target, PostgreSQL mode) cells: every target, PostgreSQL in each mode.
CELLS = [("postgres", "replace_window"), ("postgres", PARTITION_PER_WINDOW), ("files", "replace_window"),
         ("kafka", "replace_window"), ("iceberg", "replace_window")]
CELL_IDS = ["postgres-replace_window", "postgres-partition_per_window", "files", "kafka", "iceberg"]


# --------------------------------------------------------------------------- commits of different windows at once


@pytest.mark.parametrize(("target", "mode"), CELLS, ids=CELL_IDS)
def test_commits_of_different_windows_of_one_pipeline_at_once(target, mode, make_pipeline, chaos_db, tmp_path,
                                                              tally):
    """Four windows of one pipeline prepared, then committed at the same
    moment: their commits queue on the windows' ledger rows (held by the test,
    then released together). Each publishes its window once; the pipeline's
    offsets end at the last window's cut whatever the order."""
    p = make_pipeline(f"windows_at_once_{target}", mode=mode, target=target)
    h = Harness(p, tmp_path)
    windows = [0, 1, 2, 3]
    attempts = {i: staged_and_prepared(p, i) for i in windows}
    results: list = []
    with psycopg.connect(p.url) as gate:
        gate.execute("SELECT 1 FROM eos.windows WHERE pipeline = %s FOR UPDATE", (p.name,))
        racing = threading.Thread(daemon=True, target=lambda: results.extend(at_once(
            [lambda i=i: p.target.commit(attempts[i]) for i in windows])))
        racing.start()
        blocked_on_locks(p.url, len(windows))
        gate.rollback()
    racing.join(120)
    assert len(results) == len(windows), results
    for i, (result, error) in zip(windows, results):
        assert error is None, f"window {i}: {error!r}"
        assert result.outcome == PUBLISHED, (i, result)
        h.emitted(i, PUBLISHED)
    for i in windows:  # the teardowns
        p.target.abort_window(p.window(i), "teardown")
    tally.add(check(h, windows))


class CommitHeld:
    """The target, but its commit returns only when the test releases it: a
    commit step descheduled between its transaction and the offsets mirror."""

    def __init__(self, target):
        self.target, self.committed, self.release = target, threading.Event(), threading.Event()

    def __getattr__(self, name):
        return getattr(self.target, name)

    def commit(self, attempt):
        result = self.target.commit(attempt)
        self.committed.set()
        assert self.release.wait(120), "the test never released the held commit"
        return result


@pytest.mark.parametrize(("target", "mode"), CELLS, ids=CELL_IDS)
def test_commit_steps_ending_together_leave_the_mirror_where_the_ledger_ends(target, mode, make_pipeline, tmp_path,
                                                                             tally):
    """Regression (the N=2000 chaos soak, seeds 20263402 and 20263493): each
    commit step mirrored the offsets its own transaction saw, so two commits of
    one pipeline ending together could mirror in the wrong order, and the
    consumer group stayed behind the ledger for good. Window 0's commit step
    is held after its transaction (offsets: window 0's end) while window 1's
    commits and mirrors (window 1's end); then window 0's mirrors. The group
    must end at window 1's end, where the ledger ends."""
    p = make_pipeline(f"mirror_race_{target}", mode=mode, target=target, mirror=True)
    h = Harness(p, tmp_path)
    mirror = steps.OffsetMirror(dict(p.kafka_config), p.mirror_group)
    attempts = {i: staged_and_prepared(p, i) for i in (0, 1)}
    held = CommitHeld(p.target)
    first: list = []
    late = threading.Thread(daemon=True, target=lambda: first.append(steps.commit(held, attempts[0], mirror=mirror)))
    late.start()
    assert held.committed.wait(120), "window 0's commit never committed"
    second = steps.commit(p.target, attempts[1], mirror=mirror)
    held.release.set()
    late.join(120)
    assert not late.is_alive() and len(first) == 1, "window 0's commit step did not finish"
    for i, summary in ((0, first[0]), (1, second)):
        assert summary.outcome == PUBLISHED and summary.mirrored_to == p.mirror_group, (i, summary)
        h.emitted(i, PUBLISHED)
        p.target.abort_window(p.window(i), "teardown")
    tally.add(check(h, [0, 1]))  # the mirrored group equal to the ledger among the checks


# --------------------------------------------------------------------------- a sweep racing a commit


@pytest.mark.parametrize(("target", "mode"), CELLS, ids=CELL_IDS)
def test_a_sweep_racing_a_commit_either_aborts_it_or_lets_it_publish(target, mode, pg_server, chaos_source, tmp_path,
                                                                     tally):
    """A sweep with a zero timeout (it aborts every live attempt) and a commit
    of a prepared attempt, at the same moment, six times: either the commit
    published (the sweep then finds nothing of it to abort) or the sweep
    aborted the attempt (the commit is refused: nothing published). Then the
    swept windows are cleared and commit. The sweep is database-wide: a
    database of the test's own."""
    with scratch_database(pg_server.address) as url:
        p = new_pipeline(url, chaos_source, f"sweep_race_{target}", mode=mode, target=target,
                         root=tmp_path / "lake")
        h = Harness(p, tmp_path / "state")
        windows = list(range(6))
        ways = []
        for i in windows:
            attempt = staged_and_prepared(p, i)
            (committed, commit_error), (swept, sweep_error) = at_once([
                lambda: p.target.commit(attempt), lambda: p.target.sweep(timedelta(0))])
            assert sweep_error is None, repr(sweep_error)
            swept_it = any(a.epoch == attempt.epoch and a.window_start == attempt.window_start for a in swept)
            if commit_error is None:
                assert committed.outcome == PUBLISHED and not swept_it, (i, committed, swept)
                h.emitted(i, PUBLISHED)
                ways.append("published")
            else:
                assert swept_it, f"window {i}: the commit failed ({commit_error!r}) but the sweep did not abort it"
                ways.append(f"swept ({type(commit_error).__name__})")
            h.note(f"w{i} commit racing a sweep: {ways[-1]}")
        h.run_until_committed([i for i in windows if not h.asset_events.get(i)])
        tally.add(check(h, windows))


# --------------------------------------------------------------------------- the broker restarted empty


@pytest.mark.parametrize("target", ["postgres", "files"])
def test_broker_restarted_empty_fails_loudly_and_keeps_the_committed_windows(target, make_pipeline, tmp_path, tally):
    """A broker of the test's own holds the source topic; windows 0 and 1
    commit, window 2 is planned (its cuts frozen). The broker restarts with its
    log directory lost (a new, empty cluster) and the topic comes back empty. Window 2's run (its frozen plan) and window
    3's (planned after the loss) fail at the plan with LogTruncated; nothing
    is published for them; every row of windows 0 and 1 is still there (by
    lineage); verify reports the loss instead of passing. (The Kafka target's
    output topic would live on the same broker and vanish with it: not a
    target that can keep its windows through this loss.)"""
    records = chaos.source_records(4, 12, 2)
    with KafkaBroker() as broker:
        topic = f"lost-{uuid.uuid4().hex[:6]}"
        chaos.create_topic(broker.bootstrap, topic, 2)
        chaos.produce(broker.bootstrap, topic, records)
        p = dataclasses.replace(make_pipeline(f"broker_lost_{target}", target=target), topics=(topic,),
                                kafka_config={"bootstrap.servers": broker.bootstrap, "fetch.wait.max.ms": 10})
        h = Harness(p, tmp_path / "state")
        h.run_until_committed([0, 1])
        verdict = check(h, [0, 1])  # everything, by lineage, before the loss
        plan_step(p, p.window(2))  # frozen, not staged
        before = published_lineage(p)
        assert sum(before.values()) == verdict.report.totals.published_rows > 0

        broker.restart(lose_data=True)
        chaos.create_topic(broker.bootstrap, topic, 2)  # back, empty

        for i in (2, 3):
            outcome = h.run(i)
            assert outcome.state == "failed" and outcome.failed_step == "plan", h.history()
            assert ("plan", "raised LogTruncated") in outcome.tries, h.history()
        with pytest.raises(LogTruncated, match="recreated or lost data"):
            plan_step(p, p.window(2))
        assert published_lineage(p) == before, "rows of committed windows changed after the broker lost its log"
        with psycopg.connect(p.url) as conn:
            states = dict(conn.execute("SELECT window_start, state FROM eos.windows WHERE pipeline = %s",
                                       (p.name,)).fetchall())
            live = conn.execute("SELECT epoch FROM eos.attempts WHERE pipeline = %s AND state NOT IN"
                                " ('committed', 'aborted')", (p.name,)).fetchall()
        assert [states.get(p.window(i).start) for i in range(4)] == ["committed", "committed", "planned", None]
        assert live == []
        assert not h.asset_events.get(2) and not h.asset_events.get(3)
        report = verify(p.ledger, dict(p.kafka_config), p.target, p.name)
        assert not report.clean and "lost data" in str(report), str(report)
        tally.add(verdict)
