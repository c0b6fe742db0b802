"""The Kafka target's commit marker expired and its records deleted: the
commit cannot tell whether its crashed try committed, so it refuses, says
what to do, and after `airflow-eos resolve` the window ends committed once.
The broker and the helpers are test_kafka_marker_expiry.py's; this module has
a broker of its own so that test workers wait for the two modules' expiries
side by side."""

from __future__ import annotations

import io
from collections import Counter

import pytest
import test_sink_kafka as kafka
from test_kafka_marker_expiry import (  # noqa: F401 - expiring_kafka and window are fixtures
    PIPELINE,
    crash_after_kafka_commit,
    delete_records,
    expiring_kafka,
    intents,
    lineage_in_topic,
    topic_ends,
    wait_for_marker_expiry,
    window,
)

from airflow_eos.cli import main
from airflow_eos.core.errors import CommitOutcomeUnknown
from airflow_eos.core.sink import ALREADY_COMMITTED


def test_marker_expired_and_records_deleted_refuses_until_a_person_answers(pg_url, ledger, window, monkeypatch):
    plan, sink, config = window
    attempt = crash_after_kafka_commit(sink, plan, monkeypatch)
    [(_, token, *_)] = intents(pg_url)
    ends = topic_ends(sink)
    delete_records(config, sink.topic, ends)
    wait_for_marker_expiry(sink, plan)

    for finish in (lambda: sink.commit(attempt), lambda: sink.abort_window(plan.window, "commit failed")):
        with pytest.raises(CommitOutcomeUnknown) as refused:
            finish()
        message = str(refused.value)
        for said in (str(plan.window), "attempt 1", f"commit token {token}", sink.transactional_id(attempt),
                     sink.marker_group(attempt), "offsets.retention.minutes", "were deleted",
                     "Nothing was published", f"airflow-eos resolve --pipeline {PIPELINE}", "--committed"):
            assert said in message, (said, message)
        assert CommitOutcomeUnknown.terminal
    assert kafka.window_row(pg_url, plan.window)[0] == "planned"
    assert kafka.attempt_state(pg_url, attempt) == "prepared"
    assert topic_ends(sink) == ends and lineage_in_topic(sink) == Counter()  # nothing published again

    out = io.StringIO()
    argv = ["resolve", "--postgres-url", pg_url, "--pipeline", PIPELINE, "--window-start",
            plan.window.start.isoformat(), "--token", str(token), "--committed"]
    assert main(argv, out=out) == 0, out.getvalue()
    assert "committed" in out.getvalue()
    assert main(argv, out=io.StringIO(), err=io.StringIO()) == 2  # answered already

    result = sink.commit(attempt)
    assert result.outcome == ALREADY_COMMITTED
    assert kafka.window_row(pg_url, plan.window) == ("committed", 1, 1, 10)
    assert kafka.execute(pg_url, "SELECT token FROM eos.kafka_commits") == [(token,)]
    assert topic_ends(sink) == ends and lineage_in_topic(sink) == Counter()  # committed once: never republished
