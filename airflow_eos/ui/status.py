"""What the window status page shows, read from the ledger: per pipeline its
windows (state, attempts, epochs, rows, dead letters), its committed offsets
and, with a Kafka connection, the end of each log and the lag behind it; the
last `airflow-eos verify` the ledger recorded.

Pure reading through the ledger's own queries (core/ledger.py,
core/attempt/): nothing here writes, and no SQL is repeated.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import timezone
from enum import Enum
from typing import Any

from airflow_eos.core import attempt as attempts
from airflow_eos.core.attempt import AttemptState
from airflow_eos.core.ledger import Ledger, WindowRecord, WindowState
from airflow_eos.core.source import per_partition
from airflow_eos.core.windows import TopicPartition

#: ``airflow-eos verify`` records its last result per pipeline (eos.verify_runs,
#: migration 10); before a first run, or on an older ledger, the page says so
#: instead of showing an invented result.
VERIFY_NOT_RECORDED = "not recorded in the ledger: run airflow-eos verify --pipeline {pipeline}"


def describe_verify(run: Mapping | None, pipeline: str) -> str:
    """The last recorded verify of a pipeline, in one line."""
    if run is None:
        return VERIFY_NOT_RECORDED.format(pipeline=pipeline)
    when = run["verified_at"].astimezone(timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
    verdict = "clean" if run["clean"] else f"{run['violations']} violation(s)"
    counts = (f"{run['kafka_records']} Kafka records: {run['published_rows']} published, {run['dead_letters']} dead "
              f"letters, {run['duplicates']} duplicates, {run['missing']} missing, {run['extra']} extra"
              if run["kafka_records"] is not None else
              f"{run['published_rows']} rows published, {run['dead_letters']} dead letters (counts per window)")
    return f"{verdict} at {when} against {run['target']}: {run['committed_windows']} committed window(s), {counts}"


class WindowStatus(str, Enum):
    """A window as the page shows it, derived from its state and its attempts."""

    PLANNED = "planned"  # frozen, no attempt yet
    RUNNING = "running"  # an attempt is open, checkpointed or prepared
    FAILED = "failed"  # not committed, and every attempt of it was aborted
    COMMITTED = "committed"
    REPLACED = "replaced"  # committed again by a later attempt (on_committed="replace")
    # committed in the ledger (offsets advanced), its publication not in the target (Ledger.unpublished_windows)
    UNPUBLISHED = "unpublished"

    def __str__(self) -> str:
        return self.value

    @property
    def label(self) -> str:
        """What the page says."""
        return "decided, not published" if self is WindowStatus.UNPUBLISHED else self.value


#: What the page says under a pipeline with windows decided, not published.
UNPUBLISHED_ADVICE = ("{n} window(s) decided, not published: committed in the ledger (offsets advanced) but not in the "
                      "target, so readers do not see them. The commit task's log says why; fix that, then retry the "
                      "commit task or clear the run. Their commits and reruns fail until then.")


def window_status(record: WindowRecord, counts: Mapping[AttemptState, int], *,
                  unpublished: bool = False) -> WindowStatus:
    if record.state == WindowState.COMMITTED and unpublished:
        return WindowStatus.UNPUBLISHED
    if record.state == WindowState.COMMITTED:
        return WindowStatus.REPLACED if counts.get(AttemptState.COMMITTED, 0) > 1 else WindowStatus.COMMITTED
    if any(counts.get(s, 0) for s in attempts.LIVE):
        return WindowStatus.RUNNING
    if counts.get(AttemptState.ABORTED, 0):
        return WindowStatus.FAILED
    return WindowStatus.PLANNED


@dataclass(frozen=True)
class WindowRow:
    record: WindowRecord
    status: WindowStatus
    attempts: dict[AttemptState, int]

    def to_dict(self) -> dict[str, Any]:
        r = self.record
        return {"start": r.start.isoformat(), "end": r.end.isoformat(), "status": self.status.value,
                "epoch": r.epoch, "committed_epoch": r.committed_epoch,
                "attempts": {s.value: n for s, n in self.attempts.items()},
                "published_rows": r.published_rows, "dead_letter_rows": r.dead_letter_rows,
                "committed_at": r.committed_at.isoformat() if r.committed_at else None}


@dataclass(frozen=True)
class PartitionRow:
    tp: TopicPartition
    committed_offset: int | None
    end_of_log: int | None = None

    @property
    def lag(self) -> int | None:
        if self.end_of_log is None or self.committed_offset is None:
            return None
        return self.end_of_log - self.committed_offset

    def to_dict(self) -> dict[str, Any]:
        return {"topic": self.tp.topic, "partition": self.tp.partition, "committed_offset": self.committed_offset,
                "end_of_log": self.end_of_log, "lag": self.lag}


@dataclass(frozen=True)
class PipelineStatus:
    pipeline: str
    owner: str | None  # the claim: DAG, topics, target
    dag_id: str | None
    windows: list[WindowRow]
    partitions: list[PartitionRow]
    lag_note: str | None = None  # why there is no lag column (no Kafka connection, Kafka unreachable)
    verify: str = ""
    counts: dict[WindowStatus, int] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"pipeline": self.pipeline, "owner": self.owner, "dag_id": self.dag_id,
                "counts": {s.value: n for s, n in self.counts.items()},
                "windows": [w.to_dict() for w in self.windows],
                "partitions": [p.to_dict() for p in self.partitions],
                "lag_note": self.lag_note, "verify": self.verify}


def read_pipeline(ledger: Ledger, conn, pipeline: str, *, limit: int) -> PipelineStatus:
    """One pipeline's windows (the latest ``limit``) and committed offsets, in the
    caller's transaction; the end of each log is added by :func:`with_lag`."""
    records = ledger.windows(conn, pipeline)
    counts = attempts.attempt_counts(conn, pipeline)
    offsets = attempts.load_offsets(conn, pipeline)
    claim = ledger.load_claim(conn, pipeline) if ledger.records_claims(conn) else None
    planned = ledger.planned_partitions(conn, pipeline)
    unpublished = ledger.unpublished_windows(conn, pipeline)
    rows = [WindowRow(r, window_status(r, counts.get(r.start, {}), unpublished=r.start in unpublished),
                      counts.get(r.start, {})) for r in records]
    by_status: dict[WindowStatus, int] = {}
    for row in rows:
        by_status[row.status] = by_status.get(row.status, 0) + 1
    shown = rows[-limit:] if limit > 0 else rows
    return PipelineStatus(
        pipeline=pipeline, owner=claim.owner() if claim else None, dag_id=claim.dag_id if claim else None,
        windows=list(reversed(shown)),  # newest first, as Airflow lists runs
        partitions=[PartitionRow(tp, offsets.get(tp)) for tp in sorted(planned | set(offsets))],
        verify=describe_verify(ledger.last_verify_run(conn, pipeline), pipeline), counts=by_status)


def read_ledger(ledger: Ledger, *, pipelines: int = 100, windows: int = 48) -> list[PipelineStatus]:
    """Every pipeline of the ledger (the first ``pipelines`` by name), one
    read-only transaction. An empty list where airflow-eos never ran."""
    with ledger.connect() as conn, conn.transaction():
        conn.execute("SET TRANSACTION READ ONLY")
        if not ledger.has_tables(conn, "eos.windows", "eos.attempts", "eos.pipelines"):
            return []
        return [read_pipeline(ledger, conn, p, limit=windows) for p in ledger.pipelines(conn, limit=pipelines)]


def with_lag(status: PipelineStatus, ends: Mapping[TopicPartition, int]) -> PipelineStatus:
    """The status with each partition's end of log (and so its lag)."""
    tps = sorted({p.tp for p in status.partitions} | set(ends))
    committed = {p.tp: p.committed_offset for p in status.partitions}
    return PipelineStatus(status.pipeline, status.owner, status.dag_id, status.windows,
                          [PartitionRow(tp, committed.get(tp), ends.get(tp)) for tp in tps],
                          None, status.verify, status.counts)


def read_log_ends(kafka_log, topics: list[str]) -> dict[TopicPartition, int]:
    """The end of every partition of ``topics``, read from the log (never the
    reported high watermark)."""
    bounds = per_partition(kafka_log, kafka_log.bounds, kafka_log.partitions(sorted(set(topics))))
    return {tp: b.end for tp, b in bounds.items()}


def topics_of(status: PipelineStatus) -> list[str]:
    return sorted({p.tp.topic for p in status.partitions})

