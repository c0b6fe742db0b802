"""The orchestration inside airflow_eos.steps, on a recording stand-in sink (the
protocol itself is proven with real services in tests/integration and tests/chaos,
which run these same functions)."""

from __future__ import annotations

from contextlib import contextmanager
from datetime import datetime, timezone

import pytest

from airflow_eos import steps
from airflow_eos.core.attempt import Attempt
from airflow_eos.core.ledger import WindowRecord, WindowState
from airflow_eos.core.sink import CommitOutcome, CommitResult
from airflow_eos.core.windows import PartitionRange, Window, WindowPlan

T0 = datetime(2026, 1, 1, tzinfo=timezone.utc)
T1 = datetime(2026, 1, 1, 1, tzinfo=timezone.utc)


class RecordingLedger:
    def __init__(self, calls):
        self.calls = calls

    @contextmanager
    def connect(self):
        yield self

    @contextmanager
    def transaction(self):
        yield

    def mark_announced(self, conn, window, epoch):
        first = ("announced", epoch) not in self.calls
        self.calls.append(("announced", epoch))
        return first


class RecordingSink:
    def __init__(self, abort_fails: bool = False, committed: WindowRecord | None = None):
        self.calls: list[tuple] = []
        self.abort_fails = abort_fails
        self.committed = committed
        self.ledger = RecordingLedger(self.calls)

    def committed_rerun(self, window):
        return self.committed

    def begin(self, window):
        self.calls.append(("begin", window))
        return Attempt(window.pipeline, window.start, window.end, 7, "s_e7")

    def abort(self, attempt, reason):
        self.calls.append(("abort", attempt.epoch, reason))
        if self.abort_fails:
            raise RuntimeError("database gone")
        return True

    def commit(self, attempt):
        self.calls.append(("commit", attempt.epoch))
        return CommitResult(attempt, CommitOutcome.ALREADY_COMMITTED, 7, 10, 2, seconds=0.5)


def plan() -> WindowPlan:
    return WindowPlan(Window("p", T0, T1), (PartitionRange("orders", 0, 0, 10),))


def test_stage_returns_the_attempt_with_the_jobs_report_as_one_dict():
    sink = RecordingSink()
    staged = steps.stage(sink, plan(), lambda attempt: {"rows_staged": 10, "epoch_seen": attempt.epoch})
    data = staged.to_dict()
    assert Attempt.from_dict(data) == staged.attempt and data["report"] == {"rows_staged": 10, "epoch_seen": 7}
    assert steps.Staged.from_dict(data).report == data["report"]
    assert [c[0] for c in sink.calls] == ["begin"]


@pytest.mark.parametrize("abort_fails", [False, True])
def test_a_failed_job_aborts_its_attempt_and_its_own_error_goes_on(abort_fails):
    sink = RecordingSink(abort_fails=abort_fails)

    def job(attempt):
        raise ValueError("transform exploded")

    with pytest.raises(ValueError, match="transform exploded"):
        steps.stage(sink, plan(), job)
    assert sink.calls[1][:2] == ("abort", 7) and "transform exploded" in sink.calls[1][2]


def test_commit_summarises_what_the_sink_did():
    sink = RecordingSink()
    attempt = Attempt("p", T0, T1, 7, "s_e7")
    summary = steps.commit(sink, attempt).to_dict()
    assert summary["outcome"] == "already_committed" and type(summary["outcome"]) is str
    assert summary["published_rows"] == 10 and summary["dead_letter_rows"] == 2 and summary["seconds"] == 0.5
    assert summary["window_start"] == T0.isoformat() and summary["mirrored_to"] is None
    assert sink.calls == [("commit", 7), ("announced", 7)]  # announced last: the step ran to its end
    assert summary["announce"] is True  # the first step to announce epoch 7: the commit task emits the event
    assert steps.commit(sink, attempt).announce is False  # announced before: a retry emits none


def test_a_rerun_of_a_committed_window_that_the_target_skips_opens_no_attempt_and_runs_no_job():
    record = WindowRecord(T0, T1, WindowState.COMMITTED, 3, 10, 2, T1, committed_epoch=2, announced_epoch=2)
    sink = RecordingSink(committed=record)

    def job(attempt):
        raise AssertionError("no job may run for a window committed already")

    staged = steps.stage(sink, plan(), job)
    assert staged.attempt is None and sink.calls == []  # no begin: no attempt, no epoch spent
    data = staged.to_dict()
    assert (data["outcome"], data["epoch"], data["committed_epoch"], data["published_rows"],
            data["dead_letter_rows"]) == ("skipped", None, 2, 10, 2)
    assert steps.Staged.from_dict(data) == staged
    assert "committed by attempt 2" in staged.committed.describe()
