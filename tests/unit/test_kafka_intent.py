"""The decision a Kafka-target commit makes about an earlier commit of its
window whose marker is gone (airflow_eos/targets/kafka/intent.py): committed,
aborted, or nobody can tell. Pure logic; the integration tests drive it on
Apache Kafka (tests/integration/test_kafka_marker_expiry.py)."""

from __future__ import annotations

from datetime import datetime, timezone

from airflow_eos.targets.kafka.client import PartitionBounds
from airflow_eos.targets.kafka.intent import ABORTED, COMMITTED, UNKNOWN, Intent, judge, scan_starts


def intent(records=10, ends=None):
    return Intent("p", datetime(2024, 1, 1, tzinfo=timezone.utc), 1, (1 << 32) | 7, "tx", "tx.marker",
                  {0: 5, 1: 8} if ends is None else ends, records)


def bounds(*triples):
    return {p: PartitionBounds(start, end, end) for p, (start, end) in enumerate(triples)}


def test_found_records_mean_committed_whatever_else_happened():
    deleted = bounds((9, 20), (9, 20))
    assert judge(intent(), deleted, compacted=True, found=True).outcome == COMMITTED


def test_nothing_found_in_a_log_that_holds_every_offset_means_aborted():
    verdict = judge(intent(), bounds((0, 20), (8, 20)), compacted=False, found=False)
    assert verdict.outcome == ABORTED, verdict


def test_deleted_records_leave_it_unknown_and_say_from_which_offset():
    verdict = judge(intent(), bounds((0, 20), (9, 20)), compacted=False, found=False)
    assert verdict.outcome == UNKNOWN
    assert "partition 1's records from offset 8 to 8 were deleted" in verdict.why
    assert "partition 0" not in verdict.why


def test_a_compacted_topic_cannot_prove_an_abort():
    verdict = judge(intent(), bounds((0, 20), (0, 20)), compacted=True, found=False)
    assert verdict.outcome == UNKNOWN and "compact" in verdict.why


def test_a_topic_created_again_or_with_a_partition_gone_is_unknown():
    assert "created again" in judge(intent(), bounds((0, 3), (0, 20)), compacted=False, found=False).why
    gone = judge(intent(), bounds((0, 20)), compacted=False, found=False)
    assert gone.outcome == UNKNOWN and "partition 1 is gone" in gone.why


def test_a_partition_added_since_counts_from_offset_zero():
    added = bounds((0, 20), (0, 20), (0, 4))
    assert judge(intent(), added, compacted=False, found=False).outcome == ABORTED
    trimmed = bounds((0, 20), (0, 20), (2, 4))
    assert judge(intent(), trimmed, compacted=False, found=False).outcome == UNKNOWN
    assert scan_starts(intent(), added) == {0: 5, 1: 8, 2: 0}


def test_an_intent_of_no_records_is_taken_as_aborted_even_when_the_log_is_gone():
    verdict = judge(intent(records=0), bounds((50, 60), (50, 60)), compacted=True, found=False)
    assert verdict.outcome == ABORTED and "duplicates nothing" in verdict.why


def test_the_scan_starts_at_the_log_start_past_deleted_records_and_never_past_the_end():
    assert scan_starts(intent(), bounds((7, 20), (0, 20))) == {0: 7, 1: 8}
    assert scan_starts(intent(), bounds((0, 3), (0, 20))) == {0: 3, 1: 8}
