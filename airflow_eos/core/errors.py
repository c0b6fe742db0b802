"""Every failure the core reports on purpose.

Each error names what it is about (pipeline, window, topic, partition, offsets) so
that a person reading an Airflow task log knows what to do without a debugger.
"""

from __future__ import annotations

from typing import ClassVar


class EosError(Exception):
    """Base of every error airflow-eos raises on purpose.

    ``terminal``: retrying the same task cannot succeed (the task fails without
    using its retries; the message says what a person must change)."""

    terminal: ClassVar[bool] = False


def error_class(name: str) -> type[EosError] | None:
    """The EosError subclass called ``name`` (for an error that crossed a
    process boundary as its class name: a trigger event, the stage job's line)."""
    todo: list[type[EosError]] = [EosError]
    while todo:
        cls = todo.pop()
        if cls.__name__ == name:
            return cls
        todo.extend(cls.__subclasses__())
    return None


class ConfigurationError(EosError, ValueError):
    """Arguments that can never work (empty topic list, start >= end, ...)."""

    terminal = True


class WindowNotClosed(EosError):
    """The window cannot be planned yet: some partition has not passed its end.

    Not a failure: the plan step waits (reschedules or defers) and tries again.
    """

    def __init__(self, message: str, *, waiting_for: list[tuple[str, int]]):
        super().__init__(message)
        self.waiting_for = waiting_for


class UnknownTopic(EosError):
    """A source topic does not exist on the broker."""


class SourceUnavailable(EosError):
    """The Kafka cluster could not be reached or answered with an error."""


class TransactionOpen(SourceUnavailable):
    """A planned range cannot be read to its end cut yet: a producer
    transaction still open holds the partition's last stable offset below it
    (a read_committed reader stops there). The brokers answer; the read can
    succeed once the transaction commits or aborts, so it is not terminal."""


class LedgerUnavailable(EosError):
    """The target database (which holds the ledger) could not be reached."""


class OffsetsExpired(EosError):
    """A planned range starts below the partition's log-start offset: retention
    deleted records this window must read. Never skipped silently."""

    terminal = True


class LogTruncated(EosError):
    """A frozen cut lies beyond the partition's end: the topic was recreated or
    lost data. The frozen plan can no longer be read as it was planned."""

    terminal = True


# What a person can do about LogTruncated (the planner's and the stage job's).
LOG_TRUNCATED_ADVICE = (
    "Nothing of this window was published and the committed windows stay as they are. Restore the topic's "
    "records (from a backup or a mirror) and clear the window's run; if they are gone for good, this pipeline "
    "cannot go on exactly-once over the topic: start a new pipeline id from the topic's current log")


class SkewedTimestamp(EosError):
    """A cut would land on a record stamped more than ``max_timestamp_skew``
    beyond the window's boundary while records older than the boundary follow
    it: frozen, it would hold the partition at that offset window after window.
    Retrying plans the same: plan the pipeline with ``on_skewed_timestamp=
    "position"`` and clear the run, or raise ``max_timestamp_skew`` where the
    partition was really silent that long (fixing the producer stops new ones)."""

    terminal = True


class WindowConflict(EosError):
    """The window overlaps a window already planned with other boundaries, or
    its frozen plan disagrees with the topics asked for now."""

    terminal = True


class OwnershipConflict(EosError):
    """The pipeline belongs to another DAG, topics or target than this plan
    names, or another pipeline already publishes the same records into the
    target (see core/ownership.py). Terminal: planning again cannot help; the
    message names both claimants and what to change."""

    terminal = True


# --------------------------------------------------------------------------- attempts and sinks


class WindowNotPlanned(EosError):
    """An attempt was asked for a window that has no frozen plan yet."""


class AttemptFenced(EosError):
    """A newer attempt of the window exists: this one may still write its staging,
    but it can never be checkpointed, prepared or committed (zombie fencing)."""

    terminal = True


class AttemptClosed(EosError):
    """The attempt was aborted or committed already; it cannot move any further."""


class InvalidCheckpoint(EosError):
    """What a job reported as consumed or staged cannot be true (overlapping or
    gapped ranges of one partition, more records than offsets, a chunk twice)."""


class NotPrepared(EosError):
    """The attempt's checkpoint does not prove the window complete: a planned
    partition was not consumed to its end cut, or the staging does not hold what
    the checkpoint counted. ``missing`` lists each problem."""

    def __init__(self, message: str, *, missing: list[str]):
        super().__init__(message)
        self.missing = missing


class TargetError(EosError):
    """The target table cannot take the staged rows: it is missing, a column has
    another type, a key has no unique index. The staging is kept for inspection
    until the attempt is aborted."""


class CommitOutcomeUnknown(TargetError):
    """A commit died after its transaction reached the target, and the target
    can no longer tell whether that transaction committed (what recorded it
    expired, the records that would prove it were deleted). Publishing again
    could duplicate the window, recording it could lose it: terminal, nothing
    is published until a person tells the ledger the answer (the message says
    how)."""

    terminal = True
