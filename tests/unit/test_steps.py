"""The orchestration inside airflow_eos.steps, on a recording stand-in sink (the
protocol itself is proven with real services in tests/integration and tests/chaos,
which run these same functions)."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest

from airflow_eos import steps
from airflow_eos.core.attempt import Attempt
from airflow_eos.core.sink import CommitOutcome, CommitResult
from airflow_eos.core.windows import PartitionRange, Window, WindowPlan

T0 = datetime(2026, 1, 1, tzinfo=timezone.utc)
T1 = datetime(2026, 1, 1, 1, tzinfo=timezone.utc)


class RecordingSink:
    def __init__(self, abort_fails: bool = False):
        self.calls: list[tuple] = []
        self.abort_fails = abort_fails

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
