"""Finding a cut by reading: the first record of a partition stamped at or
after an instant.

A cut for instant t is the first offset whose record timestamp is >= t. The
broker's ``offsets_for_times`` answer is a hint only; the cut is found and
verified by reading records (a search over offsets with few probes, then one
short scan). Timestamps are assumed to grow with offsets for the search; where
they do not (clock skew, producers with their own timestamps), the offset found
is still a boundary where the record before it is older than t and the record at
it is not. What a boundary far beyond t means is the skew rule's question
(core/skew.py); freezing cuts is the planner's (core/plan.py).
"""

from __future__ import annotations

import math

from airflow_eos.core.source import PartitionLog, Record
from airflow_eos.core.windows import TopicPartition

# Below this many offsets a linear read (one fetch) beats more single-record probes.
SCAN_BELOW = 512


def first_offset_at_or_after(log_: PartitionLog, tp: TopicPartition, t_ms: int, lo: int, hi: int) -> int | None:
    """Offset of the first record in ``[lo, hi)`` whose timestamp is >= t_ms, or None."""
    found = first_record_at_or_after(log_, tp, t_ms, lo, hi)
    return found.offset if found is not None else None


def first_record_at_or_after(log_: PartitionLog, tp: TopicPartition, t_ms: int, lo: int, hi: int) -> Record | None:
    """The first record in ``[lo, hi)`` whose timestamp is >= t_ms, or None.

    P(o) = "the first record at/after o is absent or has timestamp >= t" is false
    then true over ``[lo, hi]`` (with non-decreasing timestamps); find its first
    true point by probing, then read the short remainder.

    Every probe is a fetch round trip, so where they go matters. After a probe at
    each end, they follow the ITP method (Oliveira & Takahashi, 2020): guess where
    a steady rate between the records seen on either side of t puts it
    (interpolation), nudge the guess toward the middle so that one side cannot
    stall, and keep it within a band around the middle that shrinks so the search
    never needs more than one probe over plain halving. A log written at a steady
    rate takes 1-6 probes per cut where halving took 9 (250k offsets), a bursty
    one at most halving's count plus three. Where the probes go never changes the
    answer: each keeps P false before ``left`` and true at ``right``.
    """
    left, right = lo, hi  # the first true point lies in [left, right]
    at_right: Record | None = None  # the first record at/after `right` (None: none before hi)
    below: Record | None = None  # the record just before `left`: timestamp < t
    above: Record | None = None  # a record at/after `right`: timestamp >= t

    def probe(o: int) -> bool:
        nonlocal left, right, at_right, below, above
        rec = log_.first_at_or_after(tp, o, hi)
        if rec is None or rec.timestamp_ms >= t_ms:
            right, at_right = o, rec
            above = rec or above
            return True
        # Every offset in [o, rec.offset] has this record first: P is false there too.
        left, below = rec.offset + 1, rec
        return False

    hint = log_.time_hint(tp, t_ms)
    if hint is not None and lo < hint < hi and probe(hint):
        probe(hint - 1)  # a right hint ends the search here: two probes
    if right - left > SCAN_BELOW and below is None:
        probe(left)  # the timestamps at both ends steer the guesses
    if right - left > SCAN_BELOW and above is None:
        probe(right - 1)
    if right - left > SCAN_BELOW:
        budget = math.ceil(math.log2((right - left) / SCAN_BELOW)) + 1  # probes left: halving's, plus one
        nudge = 0.05 / (right - left)  # how far toward the middle a guess is moved, per offset of width squared
        while right - left > SCAN_BELOW:
            slack = max(SCAN_BELOW / 2 * 2**budget - (right - left) / 2, 0.0)
            probe(_itp_point(left, right, below, above, t_ms, nudge, slack))
            budget -= 1
    for rec in log_.records(tp, left, right):
        if rec.timestamp_ms >= t_ms:
            return rec
    # Nothing in [left, right): the cut is the first record at/after `right`, which
    # the probe that set `right` returned (none when `right` is still hi).
    return at_right


def _itp_point(left: int, right: int, below: Record | None, above: Record | None, t_ms: int,
               nudge: float, slack: float) -> int:
    """The next probe of the ITP search in ``[left, right)``."""
    if below is None or above is None:  # a side with no record seen yet: halve
        return (left + right) // 2
    middle = (left + right) / 2
    # Interpolate: below.timestamp < t <= above.timestamp, so the span is positive.
    span = above.timestamp_ms - below.timestamp_ms
    guess = below.offset + (t_ms - below.timestamp_ms) * (above.offset - below.offset) / span
    guess = min(max(guess, left), right - 1)
    # Truncate: move the guess toward the middle by nudge * width^2 (or onto it).
    toward = 1 if middle >= guess else -1
    step = nudge * (right - left) ** 2
    point = guess + toward * step if step <= abs(middle - guess) else middle
    # Project: no farther from the middle than the budget of probes allows.
    if abs(point - middle) > slack:
        point = middle - toward * slack
    return int(min(max(round(point), left), right - 1))
