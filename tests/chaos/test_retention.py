"""Whole windows over a topic whose retention deletes records (issue 34, item 3): a planned
range before its stage, and a committed window's records before verify.

Each window runs through the production steps as the fault suite drives them and
ends in ``check`` and a lineage check: see harness/real_kafka.py.
"""

from __future__ import annotations

import io
import uuid

import psycopg
import pytest

from airflow_eos.cli.verify import print_report
from airflow_eos.core.errors import OffsetsExpired
from airflow_eos.verify import verify
from harness import chaos
from harness.chaos import Harness, check
from harness.real_kafka import (
    assert_lineage,
    create_topic,
    on_topic,
    retention_deletes_window_0,
    two_windows_in_two_segments,
)


def test_retention_deleting_a_planned_range_before_its_stage_is_terminal_and_publishes_nothing(
        make_pipeline, kafka, tmp_path, tally):
    """Window 0 is planned; then Kafka's size retention (``retention.bytes``:
    every segment but the active one) deletes its records before its stage.
    The stage fails with OffsetsExpired naming the partition and the offsets
    it cannot read: its attempt is aborted (nothing staged, checkpointed or
    published), the window stays planned, and the task fails without retries
    (a terminal error); a clear fails at the plan with the same error. The next
    window, whose records retention kept, is published as usual, and verify is
    clean: it audits committed windows only, so the expired window is not
    reported as missing records; the pipeline's offsets stay at the expired
    window's start (the committed prefix ends there)."""
    from airflow.exceptions import AirflowFailException

    from airflow_eos.hooks.eos import failing_terminally

    topic = f"retention-{uuid.uuid4().hex[:8]}"
    create_topic(kafka, topic, 1, segment_ms="100")
    p = on_topic(make_pipeline("retention"), topic)
    h = Harness(p, tmp_path)
    two_windows_in_two_segments(kafka, topic)
    plan = chaos.plan_step(p, p.window(0))
    assert [(r["start_offset"], r["end_offset"]) for r in plan["ranges"]] == [(0, 12)], plan

    retention_deletes_window_0(kafka, topic)

    with pytest.raises(AirflowFailException) as failed, failing_terminally():  # as the stage task runs it
        chaos.stage_step(p, plan)
    expired = failed.value.__cause__
    assert isinstance(expired, OffsetsExpired) and expired.terminal, repr(expired)
    assert f"{topic}[0]" in str(expired) and "retention deleted planned records [0, 12)" in str(expired), expired
    assert chaos.attempt_states(p, 0) == [(1, "aborted")]
    cleared = h.run(0)
    assert cleared.tries == [("plan", "raised OffsetsExpired")], cleared.tries
    assert h.run(1).state == "success"

    tally.add(check(h, (1,)))
    assert_lineage(p)
    report = verify(p.ledger, dict(p.kafka_config), p.target, p.name)
    assert [(w.state, w.published_rows, w.dead_letters, w.kafka_records) for w in report.windows] == [
        ("planned", 0, 0, None), ("committed", 11, 1, 12)]  # order 18 is malformed: a dead letter
    assert report.offsets == report.expected_offsets and list(report.offsets.values()) in ([], [0])
    with psycopg.connect(p.url) as conn:
        assert conn.execute(f"SELECT count(*) FROM {p.table} WHERE eos_window_start = %s",
                            (p.window(0).start,)).fetchone() == (0,)
        assert conn.execute("SELECT state FROM eos.windows WHERE pipeline = %s AND window_start = %s",
                            (p.name, p.window(0).start)).fetchone() == ("planned",)


def test_verify_after_retention_deleted_a_committed_windows_records_is_clean_and_names_it(
        make_pipeline, kafka, tmp_path, tally):
    """Windows 0 and 1 commit; then Kafka's size retention deletes window 0's
    segment (as the default 7-day retention does to every window in time).
    verify is clean (a pipeline on such a topic verifies clean again) and names
    window 0 as no longer checkable against the source, with the deleted
    offsets; its rows are still checked: published twice there, a row is a
    duplicate. A row published twice in window 1, still in the log, is one too."""
    topic = f"retained-{uuid.uuid4().hex[:8]}"
    create_topic(kafka, topic, 1, segment_ms="100")
    p = on_topic(make_pipeline("retained"), topic)
    h = Harness(p, tmp_path)
    two_windows_in_two_segments(kafka, topic)
    assert h.run_until_committed([0, 1]) == 1
    tally.add(check(h, (0, 1)))

    retention_deletes_window_0(kafka, topic)

    report = verify(p.ledger, dict(p.kafka_config), p.target, p.name)
    assert report.clean, str(report)
    assert [(x.window_start, str(x.tp), x.start_offset, x.end_offset) for x in report.not_checkable] == [
        (p.window(0).start, f"{topic}[0]", 0, 12)]
    assert f"no longer checkable against the source: retention deleted offsets [0, 12) of {topic}[0]" in str(report)
    assert [(w.state, w.published_rows, w.dead_letters, w.kafka_records) for w in report.windows] == [
        ("committed", 11, 1, None), ("committed", 11, 1, 12)]  # orders 5 and 18 are malformed: dead letters
    as_json = report.to_dict()
    assert [w["result"] for w in as_json["windows"]] == ["source_expired", "ok"] and as_json["clean"]
    assert as_json["not_checkable"][0]["start_offset"] == 0 and as_json["not_checkable"][0]["end_offset"] == 12
    printed = io.StringIO()
    print_report(report, printed)  # what `airflow-eos verify` prints (exit code 0: clean)
    assert "NO LONGER CHECKABLE AGAINST THE SOURCE: 1 committed window(s)" in printed.getvalue(), printed.getvalue()
    assert "ok, source expired" in printed.getvalue() and "CLEAN:" in printed.getvalue(), printed.getvalue()

    with psycopg.connect(p.url, autocommit=True) as conn:  # one row twice in each window: in the log and not
        conn.execute(f"INSERT INTO {p.table} SELECT * FROM {p.table} WHERE eos_offset IN (3, 15)")
    twice = verify(p.ledger, dict(p.kafka_config), p.target, p.name)
    assert sorted((v.kind, v.offset) for v in twice.violations if v.kind == "duplicate") == [
        ("duplicate", 3), ("duplicate", 15)], str(twice)
    assert twice.totals.duplicates == 2 and not twice.clean, str(twice)
