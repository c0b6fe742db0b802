"""The fault matrix (harness/chaos/matrix.py) of the PostgreSQL target, and
a regression of its offsets mirror."""

from __future__ import annotations

from harness.chaos import Harness, check
from harness.chaos.matrix import WINDOWS, matrix_module

matrix, test_fault_then_recovery_is_exactly_once = matrix_module("postgres")


def test_a_retried_commit_mirrors_the_offsets_that_a_failure_after_the_commit_left_unmirrored(
        make_pipeline, tmp_path, tally):
    """Regression: a failure between the commit and the offsets mirror used to
    leave the consumer group stale for good, because the retry (or a clear)
    found the window committed and returned no offsets to mirror. Window 0 is
    planned but fails to commit, window 1 commits (the committed prefix is
    still empty: nothing to mirror), then window 0's commit fails right after
    committing and is retried."""
    p = make_pipeline("mirror_after_retry", mirror=True)
    h = Harness(p, tmp_path, faults={0: "commit.before_publish=raise*1,commit.after_commit=raise*1"})
    assert h.run(0).failed_step == "commit"
    assert h.run(1).summary["outcome"] == "published"
    run = h.run(0, retries=1)
    assert run.state == "success" and run.summary["outcome"] == "already_committed", h.history()
    tally.add(check(h, WINDOWS))
