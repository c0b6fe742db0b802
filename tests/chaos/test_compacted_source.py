"""Whole windows over a compacted topic (issue 34, item 3): compacted before its
windows are planned, and after they committed.

Each window runs through the production steps as the fault suite drives them and
ends in ``check`` and a lineage check: see harness/real_kafka.py.
"""

from __future__ import annotations

import uuid

import psycopg

from airflow_eos.verify import verify
from harness.chaos import HOUR, T0, Harness, check
from harness.real_kafka import (
    alter_topic,
    assert_lineage,
    await_compacted,
    create_topic,
    on_topic,
    order_id,
    produce_keyed,
    published_ids,
)


def test_a_compacted_source_windows_tile_the_log_and_publish_each_surviving_record_once(
        make_pipeline, kafka, tmp_path, tally):
    """Three hours of orders on 2 partitions, every other one under one of 4
    keys per partition (superseded by the next of its key), the rest under
    keys of their own; the log cleaner removes the superseded records (holes
    in the offsets) before the windows are planned. Windows 0-2 tile each
    partition's log; each surviving record is published (or a dead letter)
    once, in the window of its timestamp; no removed record is; verify clean."""
    topic = f"compacted-{uuid.uuid4().hex[:8]}"
    create_topic(kafka, topic, 2, cleanup_policy="compact", segment_ms="100", min_cleanable_dirty_ratio="0.01",
                 min_compaction_lag_ms="0", delete_retention_ms="100")
    p = on_topic(make_pipeline("compacted_source"), topic)
    h = Harness(p, tmp_path)
    orders = [(i % 2, (f"k{i // 2 % 8}" if i // 2 % 2 else f"u{i}").encode(), i * 1.5, i) for i in range(120)]
    closers = [(partition, f"close{partition}".encode(), 185 + partition, 500 + partition) for partition in (0, 1)]
    produce_keyed(kafka, topic, [orders[i:i + 10] for i in range(0, 120, 10)] + [closers])
    # What compaction leaves: per partition, the last record of each shared key and every record of a key of its own.
    offset = {i: i // 2 for i in range(120)}
    last = {(o[0], o[1]): i for i, o in enumerate(orders)}
    survivors = {(o[0], offset[i]) for i, o in enumerate(orders) if last[o[0], o[1]] == i}
    survivors |= {(partition, 60) for partition in (0, 1)}
    await_compacted(kafka, topic, 2, survivors)

    assert h.run_until_committed([0, 1, 2]) == 1
    tally.add(check(h, (0, 1, 2)))

    truth = assert_lineage(p)
    assert {(k[2], k[3]) for k in truth} == survivors - {(0, 60), (1, 60)}  # each survivor in a window; closers next
    for (ws, _, _, _), value in truth.items():
        n = order_id(value)
        assert n is None or ws == T0 + int(n * 1.5 // 60) * HOUR, (ws, n)  # in the window of its timestamp
    with psycopg.connect(p.url) as conn:
        ranges = conn.execute("SELECT partition, start_offset, end_offset FROM eos.window_ranges WHERE pipeline = %s"
                              " ORDER BY partition, window_start", (p.name,)).fetchall()
    for partition in (0, 1):
        cuts = [(s, e) for q, s, e in ranges if q == partition]
        assert cuts[0][0] == 0 and cuts[-1][1] == 60 and all(a[1] == b[0] for a, b in zip(cuts, cuts[1:])), cuts
    removed = {i for i, o in enumerate(orders) if (o[0], offset[i]) not in survivors}
    assert removed and not set(published_ids(p)) & removed, "a record compaction removed was published"


def test_a_source_compacted_after_its_windows_committed_still_verifies_clean(make_pipeline, kafka, tmp_path, tally):
    """The cleaner removes records of windows already committed (the topic
    becomes compacted after the commits, as any compacted topic's cleaner does
    to records published before it ran): verify stays clean, since a row whose
    record compaction removed from its own window's range was a record when
    the window was read. It still finds a row published twice."""
    topic = f"compacted-late-{uuid.uuid4().hex[:8]}"
    create_topic(kafka, topic, 1, segment_ms="100", min_cleanable_dirty_ratio="0.01", min_compaction_lag_ms="0",
                 delete_retention_ms="100")
    p = on_topic(make_pipeline("compacted_late"), topic)
    h = Harness(p, tmp_path)
    orders = [(0, f"k{i % 3}".encode(), i * 3, i) for i in range(40)]  # 2 hours, 3 keys
    produce_keyed(kafka, topic, [orders[i:i + 5] for i in range(0, 40, 5)] + [[(0, b"close", 125, 900)]])
    assert h.run_until_committed([0, 1]) == 1
    tally.add(check(h, (0, 1)))

    alter_topic(kafka, topic, cleanup_policy="compact")
    await_compacted(kafka, topic, 1, {(0, 37), (0, 38), (0, 39), (0, 40)})  # each key's last, the closer
    report = verify(p.ledger, dict(p.kafka_config), p.target, p.name)
    assert report.clean, str(report)
    assert report.committed_windows == 2 and report.totals.kafka_records == 3
    assert (report.totals.published_rows, report.totals.dead_letters) == (37, 3)  # orders 5, 18 and 31 malformed

    with psycopg.connect(p.url, autocommit=True) as conn:  # a row published twice, its record compacted away
        conn.execute(f"INSERT INTO {p.table} SELECT * FROM {p.table} WHERE eos_offset = 7")
    twice = verify(p.ledger, dict(p.kafka_config), p.target, p.name)
    assert [v.kind for v in twice.violations if v.offset == 7] == ["duplicate"], str(twice)
    assert twice.totals.duplicates == 1, str(twice)
