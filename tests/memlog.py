"""An in-memory PartitionLog for unit tests of the pure cut-search logic, and for
cases a test must set up exactly (retention moving the log start under a search,
partitions added to a topic). Kafka-backed tests use Apache Kafka."""

from __future__ import annotations

import bisect

from airflow_eos.core.errors import UnknownTopic
from airflow_eos.core.source import Bounds, Record
from airflow_eos.core.windows import TopicPartition


class _Records:
    """A partition's records as two columns, made into :class:`Record` only where read: the
    uneven-log tests hold a million records a partition, and a million frozen dataclasses took
    seconds to build."""

    def __init__(self) -> None:
        self.offsets: list[int] = []
        self.timestamps: list[int] = []

    def __len__(self) -> int:
        return len(self.offsets)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [Record(o, t) for o, t in zip(self.offsets[i], self.timestamps[i])]
        return Record(self.offsets[i], self.timestamps[i])

    def __iter__(self):
        return map(Record, self.offsets, self.timestamps)

    def index(self, offset: int) -> int:
        """Where the first record at or after ``offset`` is (``len`` if none)."""
        return bisect.bisect_left(self.offsets, offset)


class MemoryLog:
    def __init__(self):
        self.logs: dict[TopicPartition, _Records] = {}
        self.log_start: dict[TopicPartition, int] = {}
        self.ends: dict[TopicPartition, int] = {}
        self.hint: int | None = None  # what time_hint answers (a broker may lie)
        self.probes = 0
        self.reads = 0  # calls of records(): each is a fetch on Kafka

    def add_partition(self, topic: str, partition: int, timestamps=(), *, gaps=()) -> TopicPartition:
        tp = TopicPartition(topic, partition)
        self.logs[tp] = _Records()
        self.log_start[tp] = 0
        self.ends[tp] = 0
        self.append(tp, timestamps, gaps=gaps)
        return tp

    def append(self, tp: TopicPartition, timestamps, *, gaps=()) -> None:
        """Append records; an offset in ``gaps`` is skipped (a transaction marker)."""
        recs, offset = self.logs[tp], self.ends[tp]
        if not gaps:
            recs.timestamps.extend(timestamps)
            added = len(recs.timestamps) - len(recs.offsets)
            recs.offsets.extend(range(offset, offset + added))
            self.ends[tp] = offset + added
            return
        for ts in timestamps:
            while offset in gaps:
                offset += 1
            recs.offsets.append(offset)
            recs.timestamps.append(ts)
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
        i = recs.index(max(offset, self.log_start[tp]))
        return recs[i] if i < len(recs) and recs.offsets[i] < end else None

    def records(self, tp, start, end):
        self.reads += 1
        recs = self.logs[tp]
        return recs[recs.index(max(start, self.log_start[tp])):recs.index(end)]

    def time_hint(self, tp, timestamp_ms):
        return self.hint
