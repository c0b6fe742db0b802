"""The nouns of a window's life: windows, cuts, partition ranges and plans.

A *window* is one Airflow data interval ``[start, end)`` of one pipeline. A *cut*
is, for one (pipeline, topic, partition, instant t), the first offset whose record
timestamp is ``>= t``; it is frozen in the ledger the first time it is resolved.
A *plan* is a window's offset ranges ``[cut(start), cut(end))`` per partition.
Consecutive windows share a cut, so windows tile the log.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime, timezone

from airflow_eos.core.errors import ConfigurationError


def to_utc(value: datetime | str) -> datetime:
    """Window boundaries are instants; naive datetimes are ambiguous, so refused."""
    if isinstance(value, str):
        value = datetime.fromisoformat(value)
    if value.tzinfo is None:
        raise ConfigurationError(f"window boundary {value!r} has no time zone; pass an aware datetime")
    return value.astimezone(timezone.utc)


def to_millis(value: datetime) -> int:
    """Kafka record timestamps are milliseconds since the epoch."""
    return int(value.timestamp() * 1000)


def describe_millis(ms: int) -> str:
    """A record timestamp for a message: ISO 8601 where it is a representable
    instant (a broken producer may stamp anything), else the raw number."""
    try:
        return datetime.fromtimestamp(ms / 1000, timezone.utc).isoformat()
    except (OverflowError, OSError, ValueError):
        return f"{ms} ms since the epoch"


@dataclass(frozen=True, order=True)
class TopicPartition:
    topic: str
    partition: int

    def __str__(self) -> str:
        return f"{self.topic}[{self.partition}]"


@dataclass(frozen=True)
class Window:
    pipeline: str
    start: datetime
    end: datetime

    def __post_init__(self) -> None:
        if not self.pipeline or not isinstance(self.pipeline, str):
            raise ConfigurationError("pipeline must be a non-empty string")
        object.__setattr__(self, "start", to_utc(self.start))
        object.__setattr__(self, "end", to_utc(self.end))
        if self.start >= self.end:
            raise ConfigurationError(
                f"window of pipeline {self.pipeline!r} has start {self.start.isoformat()} "
                f"not before end {self.end.isoformat()}"
            )

    def __str__(self) -> str:
        return f"{self.pipeline} [{self.start.isoformat()}, {self.end.isoformat()})"


# How a cut was resolved; stored in the ledger so an operator can tell them apart.
CUT_BY_RECORD = "record"  # the first record with timestamp >= t
CUT_BY_IDLE = "idle"  # no record >= t yet, the partition idled past the grace: end of log
CUT_BY_NEIGHBOUR = "neighbour"  # clamped to a frozen cut of a neighbouring instant
CUT_NEW_PARTITION = "new_partition"  # partition absent from the window ending at t: log start
CUT_BY_SKEWED = "skewed"  # the first record >= t after records stamped far beyond t that older records follow


@dataclass(frozen=True)
class Cut:
    tp: TopicPartition
    at: datetime
    offset: int
    how: str


@dataclass(frozen=True, order=True)
class PartitionRange:
    """Offsets ``[start_offset, end_offset)`` of one partition. Offsets may have
    gaps (transaction markers, compaction), so the record count is at most the width."""

    topic: str
    partition: int
    start_offset: int
    end_offset: int

    @property
    def tp(self) -> TopicPartition:
        return TopicPartition(self.topic, self.partition)

    @property
    def width(self) -> int:
        return self.end_offset - self.start_offset

    def to_dict(self) -> dict:
        return {"topic": self.topic, "partition": self.partition,
                "start_offset": self.start_offset, "end_offset": self.end_offset}


@dataclass(frozen=True)
class WindowPlan:
    """A window's frozen offset ranges: every rerun reads exactly these records;
    an Avro source's reader schema (JSON text; None for raw values) is frozen
    with them: every rerun decodes them the same way."""

    window: Window
    ranges: tuple[PartitionRange, ...] = field(default_factory=tuple)
    reader_schema: str | None = None

    @property
    def pipeline(self) -> str:
        return self.window.pipeline

    @property
    def topics(self) -> tuple[str, ...]:
        return tuple(sorted({r.topic for r in self.ranges}))

    @property
    def max_records(self) -> int:
        return sum(r.width for r in self.ranges)

    def to_dict(self) -> dict:
        data = {
            "pipeline": self.window.pipeline,
            "start": self.window.start.isoformat(),
            "end": self.window.end.isoformat(),
            "ranges": [r.to_dict() for r in self.ranges],
        }
        if self.reader_schema is not None:
            data["reader_schema"] = self.reader_schema
        return data

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_dict(cls, data: dict) -> "WindowPlan":
        return cls(
            Window(data["pipeline"], to_utc(data["start"]), to_utc(data["end"])),
            tuple(sorted(PartitionRange(**r) for r in data["ranges"])),
            data.get("reader_schema"),
        )

    @classmethod
    def from_json(cls, text: str) -> "WindowPlan":
        return cls.from_dict(json.loads(text))
