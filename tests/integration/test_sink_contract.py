"""The sink contract (core/sink.py, core/commit.py), one set of tests run by
every registered target kind against the real services (PostgreSQL, a
directory, Apache Kafka), without Spark: begin, write, checkpoint, prepare,
commit twice, commit after a newer attempt fenced it, abort, sweep, skip and
replace, a failure at each commit fault point the target reaches, and at the
abort's. A target gets these tests by registering its kind
(core/target.py) and saying how to make one (harness/sink_contract.py).

What readers see is read as verify reads it: by lineage, through the sink's
``published_relation``."""

from __future__ import annotations

import pickle
from datetime import timedelta

import psycopg
import pytest
from psycopg import sql

from airflow_eos.core.attempt import ConsumedRange, load_offsets
from airflow_eos.core.commit import ALREADY_COMMITTED, PUBLISHED, REPLACED, SKIPPED
from airflow_eos.core.errors import AttemptClosed, AttemptFenced, ConfigurationError, NotPrepared
from airflow_eos.core.faults import FaultInjected, injected
from airflow_eos.core.target import registered_kinds
from airflow_eos.core.windows import TopicPartition
from harness.sink_contract import CONTRACT_TARGETS, PARTITIONS, ContractTarget, Services, contract_ids

PIPELINE = "contract_hourly"
PER_WINDOW = 5  # records per window and source partition (freeze_windows' default)


def execute(url, statement, params=None):
    with psycopg.connect(url, autocommit=True) as conn:
        cur = conn.execute(statement, params)
        return cur.fetchall() if cur.description else None


class Contract:
    """One target of the kind under test, in this test's services."""

    def __init__(self, target: ContractTarget, services: Services, freeze_windows, on_committed: str = "skip"):
        self.target, self.services, self._freeze = target, services, freeze_windows
        self.spec = target.spec(services, on_committed)
        self.sink = self.spec.sink()
        self.source = target.source_topic(services)

    def plans(self, indices):
        return self._freeze(PIPELINE, list(indices), partitions=[(self.source, p) for p in range(PARTITIONS)])

    def stage(self, plan, *, version=1, prepare=True, dead_letters=0):
        """begin → one writer call per planned partition (as Spark tasks) → checkpoint → prepare;
        the last ``dead_letters`` records of each range staged as dead letters."""
        attempt = self.sink.begin(plan.window)
        writer = pickle.loads(pickle.dumps(self.sink.writer(attempt)))  # as Spark ships it to a task
        chunks = [writer.write([self.target.batch(r.topic, r.partition,
                                                  list(range(r.start_offset, r.end_offset - dead_letters)), version)],
                               [{"topic": r.topic, "partition": r.partition, "offset": o, "error": "unreadable"}
                                for o in range(r.end_offset - dead_letters, r.end_offset)])
                  for r in plan.ranges]
        self.sink.checkpoint(attempt, [ConsumedRange(r.topic, r.partition, r.start_offset, r.end_offset, r.width)
                                       for r in plan.ranges], chunks)
        if prepare:
            assert self.sink.prepare(attempt).prepared
        return attempt

    def seen(self):
        """The pipeline's published rows by lineage, as verify reads them."""
        with psycopg.connect(self.services.pg_url) as conn, conn.transaction():
            relation = self.sink.published_relation(conn, PIPELINE)
            rows = conn.execute(sql.SQL("SELECT eos_topic, eos_partition, eos_offset FROM {} t"
                                        " WHERE eos_pipeline = %s").format(relation), (PIPELINE,)).fetchall()
        return sorted(rows)

    def state(self, attempt):
        return execute(self.services.pg_url, "SELECT state FROM eos.attempts WHERE pipeline = %s"
                       " AND window_start = %s AND epoch = %s",
                       (attempt.pipeline, attempt.window_start, attempt.epoch))[0][0]

    def window_state(self, window):
        return execute(self.services.pg_url, "SELECT state FROM eos.windows WHERE pipeline = %s"
                       " AND window_start = %s", (window.pipeline, window.start))[0][0]


def lineage(*plans):
    return sorted((r.topic, r.partition, o) for plan in plans for r in plan.ranges
                  for o in range(r.start_offset, r.end_offset))


@pytest.fixture(params=contract_ids(registered_kinds()))
def target(request) -> ContractTarget:
    if request.param not in CONTRACT_TARGETS:
        pytest.fail(f"target kind {request.param!r} is registered but the contract suite cannot make one: add it "
                    "to CONTRACT_TARGETS in tests/harness/sink_contract.py")
    return CONTRACT_TARGETS[request.param]


@pytest.fixture
def services(pg_url, ledger, tmp_path, request):
    return Services(pg_url, tmp_path, request.getfixturevalue)


@pytest.fixture
def contract(target, services, freeze_windows):
    return Contract(target, services, freeze_windows)


# --------------------------------------------------------------------------- a window's life


def test_a_prepared_attempt_commits_once_and_a_second_commit_does_nothing(contract):
    [plan] = contract.plans([0])
    attempt = contract.stage(plan)
    assert contract.seen() == []  # staged, prepared: nothing visible before the decision
    first = contract.sink.commit(attempt)
    assert (first.outcome, first.committed_epoch, first.published_rows) == (PUBLISHED, attempt.epoch,
                                                                            PARTITIONS * PER_WINDOW)
    assert first.offsets == {TopicPartition(contract.source, p): PER_WINDOW for p in range(PARTITIONS)}
    assert contract.seen() == lineage(plan)
    again = contract.sink.commit(attempt)
    assert (again.outcome, again.committed_epoch, again.published_rows) == (ALREADY_COMMITTED, attempt.epoch,
                                                                            PARTITIONS * PER_WINDOW)
    assert again.offsets == first.offsets and not again.changed
    assert contract.seen() == lineage(plan)
    assert contract.state(attempt) == "committed" and contract.window_state(plan.window) == "committed"


def test_prepare_waits_for_the_checkpoint_and_refuses_one_that_does_not_cover_the_plan(contract):
    [plan] = contract.plans([0])
    attempt = contract.sink.begin(plan.window)
    waiting = contract.sink.prepare(attempt)
    assert not waiting and "no checkpoint yet" in waiting.detail
    writer = contract.sink.writer(attempt)
    chunks = [writer.write([contract.target.batch(r.topic, r.partition, list(range(r.start_offset, r.end_offset)),
                                                  1)]) for r in plan.ranges]
    first = plan.ranges[0]  # the job reports one partition only
    contract.sink.checkpoint(attempt, [ConsumedRange(first.topic, first.partition, first.start_offset,
                                                     first.end_offset, first.width)], chunks)
    with pytest.raises(NotPrepared):
        contract.sink.prepare(attempt)
    contract.sink.checkpoint(attempt, [ConsumedRange(r.topic, r.partition, r.start_offset, r.end_offset, r.width)
                                       for r in plan.ranges], chunks)  # the job commit's retry, complete
    assert contract.sink.prepare(attempt).prepared
    assert contract.sink.commit(attempt).outcome == PUBLISHED and contract.seen() == lineage(plan)


def test_windows_commit_out_of_order_and_offsets_move_with_the_contiguous_prefix(contract):
    w0, w1 = contract.plans([0, 1])
    later = contract.sink.commit(contract.stage(w1))
    assert later.outcome == PUBLISHED and later.offsets == {}  # window 0 is not committed: no prefix yet
    earlier = contract.sink.commit(contract.stage(w0))
    assert earlier.offsets == {TopicPartition(contract.source, p): 2 * PER_WINDOW for p in range(PARTITIONS)}
    assert contract.seen() == lineage(w0, w1)


def test_an_attempt_fenced_by_a_newer_one_cannot_commit_and_the_newer_one_publishes(contract):
    [plan] = contract.plans([0])
    zombie = contract.stage(plan)
    newer = contract.stage(plan, version=2)
    with pytest.raises(AttemptFenced, match="fenced"):
        contract.sink.commit(zombie)
    with pytest.raises(AttemptFenced):
        contract.sink.prepare(zombie)
    assert contract.seen() == [] and contract.window_state(plan.window) != "committed"
    assert contract.sink.commit(newer).outcome == PUBLISHED
    assert contract.seen() == lineage(plan)
    # the fenced attempt, committed after the window was: skipped, never published twice
    assert contract.sink.commit(zombie).outcome == SKIPPED
    assert contract.seen() == lineage(plan)


def test_abort_ends_the_attempt_and_drops_its_staging_and_a_second_abort_does_nothing(contract):
    [plan] = contract.plans([0])
    attempt = contract.stage(plan)
    assert contract.sink.abort(attempt, "the run failed") is True
    assert contract.state(attempt) == "aborted"
    assert contract.sink.count_staged(attempt) is None
    assert contract.sink.abort(attempt, "again") is False
    with pytest.raises(AttemptClosed, match="aborted"):
        contract.sink.commit(attempt)
    assert contract.seen() == []
    rerun = contract.stage(plan)  # the window stays planned: a rerun publishes it
    assert contract.sink.commit(rerun).outcome == PUBLISHED and contract.seen() == lineage(plan)


def test_abort_of_a_committed_attempt_leaves_it_committed(contract):
    [plan] = contract.plans([0])
    attempt = contract.stage(plan)
    contract.sink.commit(attempt)
    assert contract.sink.abort(attempt, "a late teardown") is False
    assert contract.sink.abort_window(plan.window, "a late teardown") == []
    assert contract.state(attempt) == "committed" and contract.seen() == lineage(plan)


def test_the_sweep_aborts_a_stale_attempt_of_its_pipeline_and_nothing_live_and_recent(contract, ledger):
    from airflow_eos.core.ownership import Claim
    w0, w1 = contract.plans([0, 1])
    with ledger.connect() as conn, conn.transaction():
        ledger.lock_pipeline(conn, PIPELINE)
        ledger.save_claim(conn, Claim(PIPELINE, (contract.source,), f"dag_{PIPELINE}", contract.sink.target_id))
    zombie = contract.stage(w0, prepare=False)  # a stage that died
    recent = contract.stage(w1)
    execute(contract.services.pg_url, "UPDATE eos.attempts SET opened_at = now() - interval '3 hours'"
            " WHERE window_start = %s", (w0.window.start,))
    assert contract.sink.sweep(timedelta(hours=1)) == [zombie]
    assert contract.state(zombie) == "aborted" and contract.sink.count_staged(zombie) is None
    assert contract.state(recent) == "prepared"
    assert contract.sink.commit(recent).outcome == PUBLISHED and contract.seen() == lineage(w1)


# --------------------------------------------------------------------------- a committed window again


def test_a_rerun_of_a_committed_window_is_skipped_and_its_staging_dropped(contract):
    [plan] = contract.plans([0])
    first = contract.stage(plan)
    contract.sink.commit(first)
    rerun = contract.stage(plan, version=2)
    result = contract.sink.commit(rerun)
    assert (result.outcome, result.committed_epoch, result.published_rows) == (SKIPPED, first.epoch,
                                                                               PARTITIONS * PER_WINDOW)
    assert result.offsets == {TopicPartition(contract.source, p): PER_WINDOW for p in range(PARTITIONS)}
    assert contract.state(rerun) == "aborted" and contract.sink.count_staged(rerun) is None
    assert contract.sink.commit(rerun).outcome == SKIPPED  # asked again: the same answer
    assert contract.seen() == lineage(plan)


def test_a_rerun_of_a_committed_window_replaces_it_where_the_target_can(target, services, freeze_windows):
    if "replace" not in target.on_committed:
        # a target that cannot replace refuses the setting in its spec, before any window runs
        with pytest.raises(ConfigurationError, match="replace"):
            target.spec(services, "replace")
        return
    contract = Contract(target, services, freeze_windows, on_committed="replace")
    [plan] = contract.plans([0])
    contract.sink.commit(contract.stage(plan))
    rerun = contract.stage(plan, version=2)
    result = contract.sink.commit(rerun)
    assert (result.outcome, result.committed_epoch, result.replaced_rows) == (REPLACED, rerun.epoch,
                                                                              PARTITIONS * PER_WINDOW)
    assert contract.sink.commit(rerun).outcome == ALREADY_COMMITTED
    assert contract.seen() == lineage(plan)  # replaced, not added to


# --------------------------------------------------------------------------- failures


KIND_POINTS = [(kind, point) for kind in contract_ids(registered_kinds()) if kind in CONTRACT_TARGETS
               for point in sorted(CONTRACT_TARGETS[kind].commit_points)]


@pytest.mark.parametrize("kind, point", KIND_POINTS)
def test_a_commit_failing_at_a_fault_point_is_finished_by_its_retry_exactly_once(kind, point, services,
                                                                                 freeze_windows):
    target = CONTRACT_TARGETS[kind]
    contract = Contract(target, services, freeze_windows)
    [plan] = contract.plans([0])
    attempt = contract.stage(plan)
    with injected(f"{point}=raise"), pytest.raises(FaultInjected):
        contract.sink.commit(attempt)
    decided = point in target.decided_points
    if not decided:  # nothing visible, nothing recorded: the failure rolled the commit back
        assert contract.seen() == [] and contract.window_state(plan.window) == "planned"
    retried = contract.sink.commit(attempt)
    assert retried.outcome == (ALREADY_COMMITTED if decided else PUBLISHED)
    assert contract.seen() == lineage(plan)
    assert contract.sink.commit(attempt).outcome == ALREADY_COMMITTED
    with psycopg.connect(services.pg_url) as conn:
        assert load_offsets(conn, PIPELINE) == {TopicPartition(contract.source, p): PER_WINDOW
                                                for p in range(PARTITIONS)}


def test_an_abort_failing_inside_is_finished_by_its_retry(contract):
    [plan] = contract.plans([0])
    attempt = contract.stage(plan)
    with injected("abort.inside=raise"), pytest.raises(FaultInjected):
        contract.sink.abort(attempt, "the run failed")
    contract.sink.abort_window(plan.window, "the teardown's retry")
    assert contract.state(attempt) == "aborted" and contract.sink.count_staged(attempt) is None
    assert contract.seen() == []
    assert contract.sink.commit(contract.stage(plan)).outcome == PUBLISHED and contract.seen() == lineage(plan)
