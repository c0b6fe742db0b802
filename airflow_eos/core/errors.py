"""Every failure the core reports on purpose.

Each error names what it is about (pipeline, window, topic, partition, offsets) so
that a person reading an Airflow task log knows what to do without a debugger.
"""

from __future__ import annotations


class EosError(Exception):
    """Base of every error airflow-eos raises on purpose."""


class ConfigurationError(EosError, ValueError):
    """Arguments that can never work (empty topic list, start >= end, ...)."""


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


class LedgerUnavailable(EosError):
    """The target database (which holds the ledger) could not be reached."""


class OffsetsExpired(EosError):
    """A planned range starts below the partition's log-start offset: retention
    deleted records this window must read. Never skipped silently."""


class LogTruncated(EosError):
    """A frozen cut lies beyond the partition's end: the topic was recreated or
    lost data. The frozen plan can no longer be read as it was planned."""


class WindowConflict(EosError):
    """The window overlaps a window already planned with other boundaries, or
    its frozen plan disagrees with the topics asked for now."""
