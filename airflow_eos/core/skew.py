"""The skew rule: a record stamped far beyond a window's boundary.

A record stamped far beyond t (by more than ``max_timestamp_skew``) and
followed by records older than t would hold every later cut at its offset: each
later window would plan an empty range there, and the records behind it would
wait for a window past its timestamp (past retention: lost). Such a *skewed cut*
is never frozen silently: by default planning fails naming the record
(``on_skewed_timestamp="fail"``); with ``"position"`` the record does not close
the window, the search goes on past it, and it is published in the window of
its position. verify uses the same look behind a cut to report a partition
that a committed skewed cut holds.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from airflow_eos.core import cut_search
from airflow_eos.core.cut_search import first_record_at_or_after
from airflow_eos.core.errors import ConfigurationError, SkewedTimestamp
from airflow_eos.core.source import PartitionLog, Record
from airflow_eos.core.windows import TopicPartition, Window, describe_millis, to_millis

# The skew check reads, after a record stamped beyond the skew, the next
# SCAN_BELOW offsets and the last TAIL_OFFSETS before the end of what is searched.
# SCAN_BELOW is the search's (read as cut_search.SCAN_BELOW when called, so that
# one value steers the search and the skew check alike).
TAIL_OFFSETS = 16
# What to do with a skewed cut (see the module's docstring).
ON_SKEWED_FAIL = "fail"
ON_SKEWED_POSITION = "position"
ON_SKEWED_TIMESTAMP = (ON_SKEWED_FAIL, ON_SKEWED_POSITION)
DEFAULT_MAX_TIMESTAMP_SKEW = timedelta(hours=1)


def check_skew_rule(max_timestamp_skew, on_skewed_timestamp, owner: str = "") -> None:
    """Refuse a skew rule that can never work, at DAG parse time where possible."""
    of = f" of {owner}" if owner else ""
    if not isinstance(max_timestamp_skew, timedelta) or max_timestamp_skew <= timedelta(0):
        raise ConfigurationError(
            f"max_timestamp_skew{of} must be a positive timedelta, got {max_timestamp_skew!r}: it is how far beyond "
            "a window's boundary a record may be stamped before it counts as skewed (default 1 hour)")
    if on_skewed_timestamp not in ON_SKEWED_TIMESTAMP:
        raise ConfigurationError(
            f"on_skewed_timestamp{of} must be {' or '.join(map(repr, ON_SKEWED_TIMESTAMP))}, got "
            f"{on_skewed_timestamp!r}: 'fail' stops planning at a skewed record, 'position' publishes it in the "
            "window of its offset")


def records_after(log_: PartitionLog, tp: TopicPartition, offset: int, hi: int) -> tuple[list[Record], int]:
    """What the skew check sees after ``offset``: the records of the next
    SCAN_BELOW offsets (one short read) and, beyond them, of the last
    TAIL_OFFSETS offsets before ``hi`` (the newest records). Returns them in
    offset order, and where the first read stopped: it saw every record below."""
    read_to = min(hi, offset + 1 + cut_search.SCAN_BELOW)
    after = log_.records(tp, offset + 1, read_to)
    if read_to < hi:
        after += log_.records(tp, max(read_to, hi - TAIL_OFFSETS), hi)
    return after, read_to


def held_behind(log_: PartitionLog, tp: TopicPartition, cut: Record, after: list[Record], read_to: int,
                t_ms: int, skew_ms: int, hi: int) -> Record | None:
    """A record after ``cut`` stamped before t, if ``cut`` is stamped more than
    the skew beyond t: a cut there holds that record back. None: a cut there
    holds nothing back that can be seen (or it is not skewed).

    ``after`` and ``read_to`` are what records_after returned for a cut at or
    before this one. Where no record read after the cut is stamped more than
    the skew before it (a run of skewed records longer than the read, or a
    partition that was silent and goes on), the first record that is, is
    looked for with a few probes; if it is older than t, the cut holds it."""
    if cut.timestamp_ms <= t_ms + skew_ms:
        return None
    older = next((r for r in after if r.offset > cut.offset and r.timestamp_ms < t_ms), None)
    run_limit = cut.timestamp_ms - skew_ms  # records stamped above this are of the cut's run
    if older is None and read_to < hi and all(r.timestamp_ms > run_limit for r in after
                                              if cut.offset < r.offset < read_to):
        first = first_after_run(log_, tp, read_to, hi, run_limit)
        if first is not None and first.timestamp_ms < t_ms:
            older = first
    return older


def first_after_run(log_: PartitionLog, tp: TopicPartition, start: int, hi: int, limit_ms: int) -> Record | None:
    """The first record at/after ``start`` stamped <= limit_ms, where a run of
    records stamped beyond it starts at ``start``, or None if the run reaches hi.

    Probes at growing distances (SCAN_BELOW, twice that, ...) until one lands
    past the run, then halves back to the run's end and reads the rest: about
    2 log2(run / SCAN_BELOW) probes. The run is taken to be one: a burst of
    records from a wrong clock, then the log as it was. The newest
    TAIL_OFFSETS offsets are not probed (records_after read them)."""
    false_to = start  # every offset below this has its first record stamped beyond the limit (or is the run's)
    step, at = cut_search.SCAN_BELOW, start
    found: Record | None = None
    while at < hi:
        rec = log_.first_at_or_after(tp, at, hi)
        if rec is None:
            return None
        if rec.timestamp_ms <= limit_ms:
            found = rec
            break
        false_to = rec.offset + 1
        at, step = min(rec.offset + step, hi - TAIL_OFFSETS), step * 2
        if at <= rec.offset:
            return None  # the run goes on into the newest records
    if found is None:
        return None
    right = at  # the first record at/after `right` is `found`, within the limit
    while right - false_to > cut_search.SCAN_BELOW:
        middle = (false_to + right) // 2
        rec = log_.first_at_or_after(tp, middle, hi)
        if rec is not None and rec.timestamp_ms <= limit_ms:
            right, found = middle, rec
        else:
            false_to = rec.offset + 1 if rec is not None else hi
    return next((r for r in log_.records(tp, false_to, right) if r.timestamp_ms <= limit_ms), found)


def first_record_past_skew(
    log_: PartitionLog, tp: TopicPartition, at: datetime, lo: int, hi: int, *,
    max_timestamp_skew: timedelta, on_skewed_timestamp: str, window: Window | None,
) -> tuple[Record | None, list[tuple[Record, int, Record]]]:
    """The first record in ``[lo, hi)`` stamped >= ``at`` that is not a skewed
    cut, and the skewed records passed over on the way: each as (the record,
    the last offset of its run, the older record that follows). Under "fail"
    the first skewed record raises.

    Costs nothing more on a sane log: only a record stamped beyond the skew is
    looked behind (one short read, one read of the tail, probes past a run)."""
    t_ms, skew_ms = to_millis(at), int(max_timestamp_skew.total_seconds() * 1000)
    passed: list[tuple[Record, int, Record]] = []
    candidate = first_record_at_or_after(log_, tp, t_ms, lo, hi)
    while candidate is not None and candidate.timestamp_ms > t_ms + skew_ms:
        after, read_to = records_after(log_, tp, candidate.offset, hi)
        resume = read_to
        while candidate is not None and (
                older := held_behind(log_, tp, candidate, after, read_to, t_ms, skew_ms, hi)) is not None:
            if on_skewed_timestamp == ON_SKEWED_FAIL:
                raise SkewedTimestamp(_skewed_message(window, tp, at, candidate, older, max_timestamp_skew))
            if older.offset >= read_to and older not in after:
                # Found past a run of skewed records longer than the read: the run is passed over whole.
                passed.append((candidate, older.offset - 1, older))
                candidate, resume = None, older.offset
                break
            passed.append((candidate, candidate.offset, older))
            # The next record at/after t within the read (it saw every record up to read_to).
            candidate = next((r for r in after if candidate.offset < r.offset < read_to and r.timestamp_ms >= t_ms),
                             None)
        if candidate is not None:
            return candidate, passed
        candidate = first_record_at_or_after(log_, tp, t_ms, resume, hi) if resume < hi else None
    return candidate, passed


def describe_passed_over(record: Record, last: int, older: Record) -> str:
    """One skewed record (or run) that first_record_past_skew passed over, for the log."""
    span = f"offset {record.offset}" if last == record.offset else f"offsets {record.offset} to {last}, the first"
    return (f"{span} stamped {describe_millis(record.timestamp_ms)} (offset {older.offset} after it: "
            f"{describe_millis(older.timestamp_ms)})")


def _skewed_message(window: Window | None, tp: TopicPartition, at: datetime, record: Record, older: Record,
                    skew: timedelta) -> str:
    where = f"window {window}: " if window is not None else ""
    return (
        f"{where}{tp} offset {record.offset} is stamped {describe_millis(record.timestamp_ms)}, more than "
        f"max_timestamp_skew ({skew}) beyond the window boundary {at.isoformat()}, yet offset {older.offset} after "
        f"it is stamped {describe_millis(older.timestamp_ms)}, before that boundary. A cut at offset "
        f"{record.offset} would hold every later record of the partition there until a window ends after "
        f"{describe_millis(record.timestamp_ms)} (past retention, they are lost); nothing was frozen. "
        "Set on_skewed_timestamp=\"position\" for this pipeline (such records are then published in the window "
        "of their offset) and clear the run; or, if the partition was really silent for longer than "
        "max_timestamp_skew and the older record is late data, raise max_timestamp_skew. Fixing the producer's "
        "clock stops new ones; this record stays in the log."
    )
