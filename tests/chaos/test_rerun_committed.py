"""A Clear of a committed window whose target skips reruns (issue 20, part 4):
the run opens no attempt, runs no stage job, skips the checkpoint and the commit
(no Asset event: the target did not change) and says who committed the window;
verify stays clean. A commit that died after committing and before its step
ended was maybe never announced to Airflow: a Clear of it stages and commits
(skipped) as before, so its Asset event is not lost. ``replace`` always stages (a Kafka topic has no replace).
Through the production steps (harness.chaos), for every target."""

from __future__ import annotations

import pytest

from harness.chaos import ON_COMMITTED, TARGETS, Harness, attempt_states, check

WINDOWS = (0, 1)


@pytest.mark.parametrize("target", TARGETS)
def test_a_clear_of_a_committed_window_costs_no_attempt_and_emits_no_event(make_pipeline, tmp_path, tally, target):
    p = make_pipeline(f"rerun_skip_{target}", target=target)
    h = Harness(p, tmp_path)
    assert [h.run(i).state for i in WINDOWS] == ["success", "success"], h.history()
    first = h.asset_events[0][0]
    assert first["outcome"] == "published" and first["epoch"] == 1

    again = h.run(0)  # the Clear
    assert again.state == "success", h.history()
    assert again.tries == [("plan", "ok"), ("stage", "ok"), ("await_checkpoint", "skipped"), ("commit", "skipped"),
                           ("abort", "ok")], h.history()
    summary = again.summary
    assert (summary["outcome"], summary["epoch"], summary["committed_epoch"], summary["published_rows"]) == (
        "skipped", None, 1, first["published_rows"]), summary
    assert attempt_states(p, 0) == [(1, "committed")]  # no attempt opened, no epoch spent
    assert len(h.asset_events[0]) == 1  # nothing downstream triggered
    tally.add(check(h, WINDOWS))


@pytest.mark.parametrize("target", TARGETS)
def test_a_clear_after_a_commit_that_died_before_its_step_ended_stages_and_announces(make_pipeline, tmp_path,
                                                                                       tally, target):
    p = make_pipeline(f"rerun_unannounced_{target}", target=target)
    h = Harness(p, tmp_path, faults={0: "commit.after_commit=crash*1"})
    failed = h.run(0)
    assert failed.state == "failed" and failed.failed_step == "commit", h.history()
    assert 0 not in h.asset_events
    cleared = h.run(0)  # committed in the ledger, never announced: a full run, its commit skipped, an event
    assert cleared.state == "success" and cleared.summary["outcome"] == "skipped", h.history()
    assert cleared.summary["epoch"] == 2 and cleared.summary["committed_epoch"] == 1
    assert attempt_states(p, 0) == [(1, "committed"), (2, "aborted")]
    assert [e["outcome"] for e in h.asset_events[0]] == ["skipped"]
    again = h.run(0)  # announced now: no attempt
    assert again.summary["epoch"] is None and attempt_states(p, 0) == [(1, "committed"), (2, "aborted")], h.history()
    h.run(1)
    tally.add(check(h, WINDOWS))


@pytest.mark.parametrize("target", [t for t in TARGETS if "replace" in ON_COMMITTED[t]])
def test_replace_always_stages_a_rerun(make_pipeline, tmp_path, tally, target):
    p = make_pipeline(f"rerun_replace_{target}", target=target, on_committed="replace")
    h = Harness(p, tmp_path)
    h.run(0)
    again = h.run(0)
    assert again.state == "success" and again.summary["outcome"] == "replaced", h.history()
    assert attempt_states(p, 0) == [(1, "committed"), (2, "committed")]  # both committed in turn; 2 is the window's
    assert [e["outcome"] for e in h.asset_events[0]] == ["published", "replaced"]
    h.run(1)
    tally.add(check(h, WINDOWS))
