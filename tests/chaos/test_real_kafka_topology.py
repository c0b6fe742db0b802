"""A source topic whose partitions are added between windows (issue 34: "a
topic with more partitions than planned"), on Apache Kafka, through the
production steps as the fault suite drives them: the new partition's records,
late ones stamped in an already committed window's time included, land in
exactly one window each; every window commits once; verify clean.
"""

from __future__ import annotations

import dataclasses
import uuid

import psycopg
from confluent_kafka.admin import AdminClient, NewPartitions

from airflow_eos.core.kafka_client import client_logging
from airflow_eos.core.windows import to_millis
from harness import chaos
from harness.chaos import HOUR, T0, Harness, check, published_lineage, record_value


def at(hours: float) -> int:
    return to_millis(T0 + hours * HOUR)


def test_a_partition_added_between_windows_lands_each_record_in_exactly_one_window(make_pipeline, kafka, tmp_path,
                                                                                   tally):
    """Window 0 commits on 2 partitions; the topic grows to 3; partition 2 gets
    a late record stamped in window 0's time, then records of windows 1 and 2.
    Windows 1 and 2 commit; partition 2's ranges tile its log from offset 0
    (each of its records in exactly one window, none in the committed window
    0); each record is published (or a dead letter) once; verify clean."""
    topic = f"grown-{uuid.uuid4().hex[:8]}"
    chaos.create_topic(kafka.address, topic, 2)
    p = dataclasses.replace(make_pipeline("grown"), topics=(topic,))
    h = Harness(p, tmp_path)
    n = iter(range(10_000))
    chaos.produce(kafka.address, topic, [(q, at(i / 6), record_value(next(n))) for i in range(6) for q in (0, 1)]
                  + [(q, at(1.1), record_value(next(n))) for q in (0, 1)])
    assert h.run_until_committed([0]) == 1

    admin = AdminClient({**client_logging(), "bootstrap.servers": kafka.address})
    for f in admin.create_partitions([NewPartitions(topic, 3)]).values():
        f.result(15)
    chaos.produce(kafka.address, topic, [(2, at(0.5), record_value(next(n)))])  # late: window 0's time
    chaos.produce(kafka.address, topic, [(q, at(1 + i / 6), record_value(next(n))) for i in range(12)
                                         for q in (0, 1, 2)]
                  + [(q, at(3.1), record_value(next(n))) for q in (0, 1, 2)])
    assert h.run_until_committed([1, 2]) == 1
    tally.add(check(h, (0, 1, 2)))

    with psycopg.connect(p.url) as conn:
        ranges = conn.execute("SELECT window_start, partition, start_offset, end_offset FROM eos.window_ranges"
                              " WHERE pipeline = %s ORDER BY partition, window_start", (p.name,)).fetchall()
    new = [(ws, s, e) for ws, q, s, e in ranges if q == 2 and e > s]
    assert new and new[0][1] == 0 and all(a[2] == b[1] for a, b in zip(new, new[1:])), ranges  # a tiling from 0
    # 1 late record and 12 of windows 1-2; the closer (offset 13) is window 3's. The late record goes with the
    # first window that plans the partition: window 0's cuts were frozen without it.
    assert new[-1][2] == 13 and new[0][0] == p.window(1).start, ranges
    lineage = published_lineage(p)
    assert all(copies == 1 for copies in lineage.values()), lineage
    on_new = {offset for (_, t, q, offset) in lineage if q == 2}
    assert on_new <= set(range(13)) and len(on_new) >= 11, on_new  # malformed records are dead letters
