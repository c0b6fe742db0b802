"""The audit's checks of the ledger against itself and against what was read:
each committed window's recorded counts against the rows and dead letters its
target holds, its checkpoint against its plan and Kafka's records, and the
pipeline's offsets against its contiguous committed prefix."""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from datetime import datetime

import psycopg

from airflow_eos.core.ledger import WindowState
from airflow_eos.core.windows import TopicPartition
from airflow_eos.verify.report import CHECKPOINT, COUNT, OFFSETS, Violation, WindowAudit, _at, _Window


def count_violations(windows: Mapping[datetime, _Window], audits: Mapping[datetime | None, WindowAudit]
                     ) -> list[Violation]:
    """COUNT: a committed window whose target rows or dead letters differ from
    what the ledger recorded when its attempt committed."""
    violations = []
    for ws, window in windows.items():
        if window.state != WindowState.COMMITTED:
            continue
        audit = audits[ws]
        if audit.published_rows != window.published_rows:
            violations.append(Violation(
                COUNT, f"{_at(ws)}: the target holds {audit.published_rows} rows, the ledger recorded "
                       f"{window.published_rows} published by attempt {window.committed_epoch}", ws))
        if audit.dead_letters != window.dead_letter_rows:
            violations.append(Violation(
                COUNT, f"{_at(ws)}: eos.dead_letters holds {audit.dead_letters} rows, the ledger recorded "
                       f"{window.dead_letter_rows} by attempt {window.committed_epoch}", ws))
    return violations


def checkpoint_violations(conn: psycopg.Connection, pipeline: str, windows: Mapping[datetime, _Window],
                          kafka_counts: Mapping[tuple[datetime, TopicPartition], int],
                          compacted: Collection[tuple[datetime, TopicPartition]] = ()) -> list[Violation]:
    """CHECKPOINT: a committed attempt's checkpoint that consumed a partition
    its window does not plan, lacks or differs from a planned range, or counted
    other than the records Kafka holds in it (``kafka_counts``, where read;
    in a range of a compacted topic, ``compacted``, fewer than Kafka holds: the
    cleaner may have removed records since the window read them)."""
    checkpoints: dict[tuple[datetime, TopicPartition], tuple[int, int, int]] = {}
    for ws, topic, partition, start, end, records in conn.execute(
        "SELECT c.window_start, c.topic, c.partition, c.start_offset, c.end_offset, c.records"
        " FROM eos.checkpoint_ranges c JOIN eos.windows w USING (pipeline, window_start)"
        " WHERE c.pipeline = %s AND w.state = 'committed' AND c.epoch = w.committed_epoch", (pipeline,),
    ):
        checkpoints[ws, TopicPartition(topic, partition)] = (start, end, records)
    violations = []
    for ws, window in windows.items():
        if window.state == WindowState.COMMITTED:
            violations += _window_checkpoint_violations(ws, window, checkpoints, kafka_counts, compacted)
    return violations


def _window_checkpoint_violations(ws: datetime, window: _Window,
                                  checkpoints: Mapping[tuple[datetime, TopicPartition], tuple[int, int, int]],
                                  kafka_counts: Mapping[tuple[datetime, TopicPartition], int],
                                  compacted: Collection[tuple[datetime, TopicPartition]]) -> list[Violation]:
    """checkpoint_violations of one committed window; ``checkpoints``: every
    committed checkpoint's (start, end, records) by window and partition."""
    violations = []
    planned = {r.tp: r for r in window.ranges}
    for (cws, tp), (start, end, records) in checkpoints.items():
        if cws == ws and tp not in planned and end > start:
            violations.append(Violation(
                CHECKPOINT, f"{_at(ws)}: the checkpoint of attempt {window.committed_epoch} consumed {tp} "
                            f"[{start}, {end}), which the window does not plan", ws, tp.topic, tp.partition))
    for r in window.ranges:
        got = checkpoints.get((ws, r.tp))
        if got is None:
            if r.width:
                violations.append(Violation(
                    CHECKPOINT, f"{_at(ws)}: the checkpoint of attempt {window.committed_epoch} has no range "
                                f"for {r.tp}, planned [{r.start_offset}, {r.end_offset})",
                    ws, r.topic, r.partition))
            continue
        start, end, records = got
        if (start, end) != (r.start_offset, r.end_offset):
            violations.append(Violation(
                CHECKPOINT, f"{_at(ws)}: the checkpoint of attempt {window.committed_epoch} consumed {r.tp} "
                            f"[{start}, {end}), the plan is [{r.start_offset}, {r.end_offset})",
                ws, r.topic, r.partition))
        present = kafka_counts.get((ws, r.tp))
        if present is not None and (records < present if (ws, r.tp) in compacted else records != present):
            violations.append(Violation(
                CHECKPOINT, f"{_at(ws)}: the checkpoint of attempt {window.committed_epoch} counted {records} "
                            f"records in {r.tp} [{r.start_offset}, {r.end_offset}), Kafka holds {present}",
                ws, r.topic, r.partition))
    return violations


def recorded_offsets(conn: psycopg.Connection, pipeline: str) -> dict[TopicPartition, int]:
    """The pipeline's offsets as eos.partition_offsets holds them."""
    return {TopicPartition(t, p): o for t, p, o in conn.execute(
        'SELECT topic, partition, "offset" FROM eos.partition_offsets WHERE pipeline = %s', (pipeline,))}


def offset_violations(offsets: Mapping[TopicPartition, int], expected: Mapping[TopicPartition, int]
                      ) -> list[Violation]:
    """OFFSETS: each partition whose recorded offset (``offsets``) is not the end
    of the contiguous committed prefix (``expected``, see committed_prefix)."""
    violations = []
    for tp in sorted(set(offsets) | set(expected)):
        have, want = offsets.get(tp), expected.get(tp)
        if have == want:
            continue
        if want is None:
            message = (f"eos.partition_offsets holds {tp} at {have}, but no window of the contiguous "
                       "committed prefix plans that partition")
        elif have is None:
            message = f"eos.partition_offsets has no offset for {tp}; the contiguous committed prefix ends at {want}"
        else:
            message = f"eos.partition_offsets holds {tp} at {have}; the contiguous committed prefix ends at {want}"
        violations.append(Violation(OFFSETS, message, None, tp.topic, tp.partition, have))
    return violations


def committed_prefix(windows: Iterable[_Window]) -> dict[TopicPartition, int]:
    """The end offsets of the windows from the earliest one, in time order, up
    to the first that is not committed or does not start where the one before
    ended: what eos.partition_offsets must hold."""
    offsets: dict[TopicPartition, int] = {}
    previous_end = None
    for w in sorted(windows, key=lambda w: w.start):
        if w.state != WindowState.COMMITTED or (previous_end is not None and w.start != previous_end):
            break
        for r in w.ranges:
            offsets[r.tp] = r.end_offset
        previous_end = w.end
    return offsets
