"""What ``verify`` reports: the kinds of violation, each finding (Violation),
each window's numbers (WindowAudit), their sums (Totals), the report; and the
words the findings use for a window and a record."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from typing import Any

from airflow_eos.core.ledger import WindowState
from airflow_eos.core.windows import PartitionRange, TopicPartition

# Violation kinds
DUPLICATE = "duplicate"  # a record published more than once in its window
DEAD_AND_PUBLISHED = "dead_and_published"  # a record that is a dead letter and also published
MISSING = "missing"  # a record neither published nor a dead letter
EXTRA = "extra"  # a row or dead letter without a record of its committed window behind it
COUNT = "count"  # the target's counts differ from the ledger's or from Kafka's
CHECKPOINT = "checkpoint"  # the committed attempt's checkpoint differs from plan or Kafka
OFFSETS = "offsets"  # eos.partition_offsets differs from the contiguous committed prefix
SOURCE = "source"  # planned records can no longer be read from Kafka
HELD = "held"  # a partition's last committed end cut is a skewed record that holds older records behind it
FOREIGN = "foreign"  # a row or record of the target its readers see that is not of the pipeline's committed windows
MORE = "more"  # further examples of a kind in a window, not listed one by one
UNPUBLISHED = "unpublished"  # a window decided (committed in the ledger) whose publication never reached the target


@dataclass(frozen=True)
class Violation:
    kind: str
    message: str
    window_start: datetime | None = None
    topic: str | None = None
    partition: int | None = None
    offset: int | None = None

    def __str__(self) -> str:
        return self.message


@dataclass(frozen=True)
class NotCheckable:
    """Offsets [start_offset, end_offset) of a committed window's range that
    retention deleted from Kafka since the window was read: its rows there are
    still checked (no duplicate, each in its window's ranges, counts against
    the ledger), but not against the source records. Not a violation."""

    window_start: datetime
    tp: TopicPartition
    start_offset: int
    end_offset: int
    detail: str  # what Kafka says now (the log's start)

    def __str__(self) -> str:
        return (f"{_at(self.window_start)}: no longer checkable against the source: retention deleted offsets "
                f"[{self.start_offset}, {self.end_offset}) of {self.tp} ({self.detail})")


@dataclass
class WindowAudit:
    """One window's numbers. ``None``: not determinable (the window is not
    committed, its records could not be read, or the target has no lineage)."""

    window_start: datetime | None
    window_end: datetime | None
    state: str  # planned | committed | unplanned (rows under a window the ledger does not know)
    committed_epoch: int | None = None
    recorded_rows: int | None = None  # eos.windows.published_rows
    recorded_dead_letters: int | None = None  # eos.windows.dead_letter_rows
    kafka_records: int | None = None
    published_rows: int = 0  # rows of the window in the target
    dead_letters: int = 0  # the window's rows in eos.dead_letters
    duplicates: int | None = 0
    missing: int | None = 0
    extra: int | None = 0
    unpublished: bool = False  # decided (committed in the ledger), its publication not in the target

    @property
    def shown_state(self) -> str:
        return "decided, not published" if self.unpublished else str(self.state)


@dataclass(frozen=True)
class Totals:
    kafka_records: int | None
    published_rows: int
    dead_letters: int
    duplicates: int | None
    missing: int | None
    extra: int | None


@dataclass
class VerifyReport:
    pipeline: str
    table: str
    lineage: bool  # record-level (lineage columns) or aggregate
    windows: list[WindowAudit]
    offsets: dict[TopicPartition, int]  # eos.partition_offsets
    expected_offsets: dict[TopicPartition, int]  # the contiguous committed prefix, computed by verify
    violations: list[Violation] = field(default_factory=list)
    seconds: float = 0.0
    not_checkable: list[NotCheckable] = field(default_factory=list)  # retention deleted their source records

    @property
    def expired_windows(self) -> set[datetime]:
        """Committed windows with offsets retention deleted (see NotCheckable)."""
        return {x.window_start for x in self.not_checkable}

    @property
    def clean(self) -> bool:
        return not self.violations

    @property
    def committed_windows(self) -> int:
        return sum(w.state == WindowState.COMMITTED for w in self.windows)

    @property
    def totals(self) -> Totals:
        """Sums over the windows; None where no window has the number."""
        def total(name: str) -> int | None:
            known = [n for n in (getattr(w, name) for w in self.windows) if n is not None]
            return sum(known) if known else None

        return Totals(*map(total, ("kafka_records", "published_rows", "dead_letters", "duplicates", "missing",
                                   "extra")))

    def run_record(self) -> dict[str, Any]:
        """What the ledger keeps of this report as the pipeline's last verify
        (``Ledger.record_verify_run``)."""
        t = self.totals
        return {"target": self.table, "clean": self.clean, "committed_windows": self.committed_windows,
                "kafka_records": t.kafka_records, "published_rows": t.published_rows or 0,
                "dead_letters": t.dead_letters or 0, "duplicates": t.duplicates, "missing": t.missing,
                "extra": t.extra, "violations": len(self.violations)}

    def to_dict(self) -> dict[str, Any]:
        """The report as JSON-able values (``airflow-eos verify -o json``):
        stable keys, documented in docs/cli.md; timestamps in ISO 8601 UTC,
        null where a number is not determinable."""
        flagged = {x.window_start for x in self.violations}
        return {
            "pipeline": self.pipeline,
            "target": self.table,
            "lineage": self.lineage,
            "clean": self.clean,
            "seconds": round(self.seconds, 3),
            "committed_windows": self.committed_windows,
            "totals": asdict(self.totals),
            "windows": [{
                "start": _iso(w.window_start), "end": _iso(w.window_end), "state": str(w.state),
                "committed_epoch": w.committed_epoch, "recorded_rows": w.recorded_rows,
                "recorded_dead_letters": w.recorded_dead_letters, "kafka_records": w.kafka_records,
                "published_rows": w.published_rows, "dead_letters": w.dead_letters, "duplicates": w.duplicates,
                "missing": w.missing, "extra": w.extra, "published": not w.unpublished,
                "result": window_result(w, flagged, self.expired_windows),
            } for w in self.windows],
            "offsets": {
                "recorded": _offsets(self.offsets),
                "expected": _offsets(self.expected_offsets),
                "match": not any(x.kind == OFFSETS for x in self.violations),
            },
            "not_checkable": [{
                "window_start": _iso(x.window_start), "topic": x.tp.topic, "partition": x.tp.partition,
                "start_offset": x.start_offset, "end_offset": x.end_offset, "message": str(x),
            } for x in self.not_checkable],
            "violations": [{
                "kind": x.kind, "message": x.message, "window_start": _iso(x.window_start), "topic": x.topic,
                "partition": x.partition, "offset": x.offset,
            } for x in self.violations],
        }

    def __str__(self) -> str:
        t = self.totals
        head = (f"verify {self.pipeline} against {self.table}: {self.committed_windows} committed window(s), "
                f"{t.kafka_records} records in Kafka, {t.published_rows} rows published, {t.dead_letters} dead letters")
        expired = "".join(f"\n  {x}" for x in self.not_checkable)
        if expired:
            head += f"; {len(self.expired_windows)} window(s) no longer checkable against the source"
        if self.clean:
            return head + ": clean" + expired
        return (head + f": {len(self.violations)} violation(s)\n  " + "\n  ".join(map(str, self.violations))
                + expired)


# Results of a window in the report
OK, VIOLATION, SOURCE_EXPIRED = "ok", "violation", "source_expired"


def window_result(window: WindowAudit, flagged: set[datetime | None], expired: set[datetime] = frozenset()
                  ) -> str | None:
    """``violation`` for a window with a finding, ``source_expired`` for a
    committed one without and with records retention deleted (checked as far as
    they can be, see NotCheckable), ``ok`` for another clean committed one, None
    for one not committed (nothing published to prove)."""
    if window.window_start in flagged:
        return VIOLATION
    if window.state != WindowState.COMMITTED:
        return None
    return SOURCE_EXPIRED if window.window_start in expired else OK


def _iso(value: datetime | None) -> str | None:
    return None if value is None else value.astimezone(timezone.utc).isoformat()


def _offsets(offsets: dict[TopicPartition, int]) -> list[dict[str, Any]]:
    return [{"topic": tp.topic, "partition": tp.partition, "offset": o} for tp, o in sorted(offsets.items())]


# --------------------------------------------------------------------------- what the audit reads and says


@dataclass
class _Window:
    """A window of the pipeline as the ledger records it, with its planned ranges."""

    start: datetime
    end: datetime
    state: str
    committed_epoch: int | None
    published_rows: int | None
    dead_letter_rows: int | None
    ranges: list[PartitionRange]


def _at(ws: datetime | None) -> str:
    return f"window {ws.astimezone(timezone.utc).isoformat()}" if ws is not None else "rows without a window"


def _where(topic, partition, offset) -> str:
    if topic is None or partition is None or offset is None:
        return f"lineage ({topic}, {partition}, {offset})"
    return f"{TopicPartition(topic, partition)} offset {offset}"
