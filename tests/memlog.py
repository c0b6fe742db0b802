"""An in-memory PartitionLog for unit tests of the pure cut-search logic, and for
cases a test must set up exactly (retention moving the log start under a search,
partitions added to a topic). Kafka-backed tests use Apache Kafka."""

from __future__ import annotations

import bisect

from airflow_eos.core.errors import UnknownTopic
from airflow_eos.core.source import Bounds, Record
from airflow_eos.core.windows import TopicPartition


class MemoryLog:
    def __init__(self):
        self.logs: dict[TopicPartition, list[Record]] = {}
        self.log_start: dict[TopicPartition, int] = {}
        self.ends: dict[TopicPartition, int] = {}
        self.hint: int | None = None  # what time_hint answers (a broker may lie)
        self.probes = 0
        self.reads = 0  # calls of records(): each is a fetch on Kafka

    def add_partition(self, topic: str, partition: int, timestamps=(), *, gaps=()) -> TopicPartition:
        tp = TopicPartition(topic, partition)
        self.logs[tp] = []
        self.log_start[tp] = 0
        self.ends[tp] = 0
        self.append(tp, timestamps, gaps=gaps)
        return tp

    def append(self, tp: TopicPartition, timestamps, *, gaps=()) -> None:
        """Append records; an offset in ``gaps`` is skipped (a transaction marker)."""
        offset = self.ends[tp]
        for ts in timestamps:
            while offset in gaps:
                offset += 1
            self.logs[tp].append(Record(offset, ts))
            offset += 1
        self.ends[tp] = offset

    def partitions(self, topics):
        out = []
        for topic in topics:
            tps = sorted(tp for tp in self.logs if tp.topic == topic)
            if not tps:
                raise UnknownTopic(f"topic {topic!r} does not exist")
            out.extend(tps)
        return out

    def bounds(self, tp):
        return Bounds(self.log_start[tp], self.ends[tp])

    def first_at_or_after(self, tp, offset, end):
        self.probes += 1
        recs = self.logs[tp]
        i = bisect.bisect_left(recs, max(offset, self.log_start[tp]), key=lambda r: r.offset)
        return recs[i] if i < len(recs) and recs[i].offset < end else None

    def records(self, tp, start, end):
        self.reads += 1
        recs = self.logs[tp]
        i = bisect.bisect_left(recs, max(start, self.log_start[tp]), key=lambda r: r.offset)
        j = bisect.bisect_left(recs, end, key=lambda r: r.offset)
        return recs[i:j]

    def time_hint(self, tp, timestamp_ms):
        return self.hint
