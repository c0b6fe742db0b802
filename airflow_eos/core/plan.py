"""Step 1 of a window's life: resolve and freeze its cuts, giving its plan.

A cut for instant t is the first offset whose record timestamp is >= t. The
broker's ``offsets_for_times`` answer is a hint only; the cut is found and
verified by reading records (a binary search over offsets, then one short scan).
Timestamps are assumed to grow with offsets for the search; where they do not
(clock skew, producers with their own timestamps), the cut found is still a
boundary where the record before it is older than t and the record at it is not,
and since every cut is frozen and clamped between its frozen neighbours, windows
still tile the log: each record belongs to exactly one window.

A record stamped far beyond t (by more than ``max_timestamp_skew``) and
followed by records older than t would hold every later cut at its offset: each
later window would plan an empty range there, and the records behind it would
wait for a window past its timestamp (past retention: lost). Such a *skewed cut*
is never frozen silently: by default planning fails naming the record
(``on_skewed_timestamp="fail"``); with ``"position"`` the record does not close
the window, the search goes on past it, and it is published in the window of
its position.

A partition that has no record at/after t has not "passed" t. The window waits
for it unless the partition has been idle past ``idle_partition_grace`` after t;
then the cut is frozen at the end of the log, and records that arrive later with
older timestamps belong to the next window.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone

from airflow_eos.core.errors import (
    ConfigurationError,
    LogTruncated,
    OffsetsExpired,
    SkewedTimestamp,
    OwnershipConflict,
    WindowConflict,
    WindowNotClosed,
)
from airflow_eos.core.faults import fault_point
from airflow_eos.core.ledger import CutContext, Ledger
from airflow_eos.core.ownership import Claim, own_claim_conflict, shared_target_conflict
from airflow_eos.core.source import Bounds, PartitionLog, Record, normalise_topics
from airflow_eos.core.windows import (
    CUT_BY_IDLE,
    CUT_BY_NEIGHBOUR,
    CUT_BY_RECORD,
    CUT_BY_SKEWED,
    CUT_NEW_PARTITION,
    Cut,
    PartitionRange,
    TopicPartition,
    Window,
    WindowPlan,
    describe_millis,
    to_millis,
)

log = logging.getLogger(__name__)

# Below this many offsets a linear read (one fetch) beats more single-record probes.
SCAN_BELOW = 512
# The skew check reads, after a record stamped beyond the skew, the next
# SCAN_BELOW offsets and the last TAIL_OFFSETS before the end of what is searched.
TAIL_OFFSETS = 16
# What to do with a skewed cut (see the module's docstring).
ON_SKEWED_FAIL = "fail"
ON_SKEWED_POSITION = "position"
ON_SKEWED_TIMESTAMP = (ON_SKEWED_FAIL, ON_SKEWED_POSITION)
DEFAULT_MAX_TIMESTAMP_SKEW = timedelta(hours=1)
# Optimistic freezing: how often to re-resolve when a concurrent planner froze a
# neighbouring cut between our read and our lock.
MAX_FREEZE_ROUNDS = 10


# --------------------------------------------------------------------------- searching


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


def records_after(log_: PartitionLog, tp: TopicPartition, offset: int, hi: int) -> tuple[list[Record], int]:
    """What the skew check sees after ``offset``: the records of the next
    SCAN_BELOW offsets (one short read) and, beyond them, of the last
    TAIL_OFFSETS offsets before ``hi`` (the newest records). Returns them in
    offset order, and where the first read stopped: it saw every record below."""
    read_to = min(hi, offset + 1 + SCAN_BELOW)
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
    step, at = SCAN_BELOW, start
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
    while right - false_to > SCAN_BELOW:
        middle = (false_to + right) // 2
        rec = log_.first_at_or_after(tp, middle, hi)
        if rec is not None and rec.timestamp_ms <= limit_ms:
            right, found = middle, rec
        else:
            false_to = rec.offset + 1 if rec is not None else hi
    return next((r for r in log_.records(tp, false_to, right) if r.timestamp_ms <= limit_ms), found)


def _first_record_past_skew(
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


def _passed_over(record: Record, last: int, older: Record) -> str:
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


def resolve_cut(
    log_: PartitionLog,
    tp: TopicPartition,
    at: datetime,
    ctx: CutContext,
    bounds: Bounds,
    *,
    now: datetime,
    idle_partition_grace: timedelta,
    max_timestamp_skew: timedelta = DEFAULT_MAX_TIMESTAMP_SKEW,
    on_skewed_timestamp: str = ON_SKEWED_FAIL,
    window: Window | None = None,
) -> Cut | None:
    """A new cut for (tp, at) consistent with the frozen neighbours in ``ctx``,
    or None when the partition has not passed ``at`` yet.

    A skewed cut (see the module's docstring) raises SkewedTimestamp under
    ``on_skewed_timestamp="fail"``; under ``"position"`` the search passes
    over it. ``window`` only names the window in messages."""
    if ctx.frozen is not None:
        return Cut(tp, at, ctx.frozen, "frozen")
    lower = ctx.lower if ctx.lower is not None else bounds.log_start
    upper = ctx.upper

    def clamp(offset: int, how: str) -> Cut:
        clamped = max(offset, lower)
        if upper is not None:
            clamped = min(clamped, upper)
        return Cut(tp, at, clamped, how if clamped == offset else CUT_BY_NEIGHBOUR)

    if ctx.new_partition:
        # The window ending at `at` was planned without this partition: every
        # record before `at` that no window holds yet belongs to the next window.
        return clamp(bounds.log_start, CUT_NEW_PARTITION)
    # Records below the log start are gone; search what is left.
    lo = max(lower, bounds.log_start)
    hi = min(upper, bounds.end) if upper is not None else bounds.end
    found, passed = _first_record_past_skew(
        log_, tp, at, lo, hi, max_timestamp_skew=max_timestamp_skew, on_skewed_timestamp=on_skewed_timestamp,
        window=window) if lo < hi else (None, [])
    if passed:
        log.warning(
            "%s%s: records stamped more than max_timestamp_skew (%s) beyond %s are followed by older records; "
            "on_skewed_timestamp=%r: they do not close the window and are published in the window of their "
            "offset: %s%s", f"window {window}: " if window is not None else "", tp, max_timestamp_skew,
            at.isoformat(), on_skewed_timestamp,
            ", ".join(_passed_over(r, last, o) for r, last, o in passed[:5]),
            " ..." if len(passed) > 5 else "")
    if found is not None:
        return clamp(found.offset, CUT_BY_SKEWED if passed else CUT_BY_RECORD)
    if upper is not None:
        return clamp(upper, CUT_BY_NEIGHBOUR)
    if now - at >= idle_partition_grace:
        return clamp(bounds.end, CUT_BY_IDLE)
    return None


# --------------------------------------------------------------------------- planning


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


@dataclass(frozen=True)
class PlanRequest:
    """What to plan: a window of a pipeline over its topics, the rules for
    silent partitions and skewed timestamps (see the module's docstring), and
    who asks: ``dag_id`` (None: not planned from a DAG) and ``target_id`` (the
    target's identity, None: not named) with ``target_exclusive`` (the target
    holds one pipeline only) make the claim the plan checks, or records, in the
    ledger (see core/ownership.py)."""

    window: Window
    topics: tuple[str, ...]
    idle_partition_grace: timedelta = timedelta(minutes=5)
    max_timestamp_skew: timedelta = DEFAULT_MAX_TIMESTAMP_SKEW
    on_skewed_timestamp: str = ON_SKEWED_FAIL
    dag_id: str | None = None
    target_id: str | None = None
    target_exclusive: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "topics", normalise_topics(self.topics, self.window.pipeline))
        if self.idle_partition_grace < timedelta(0):
            raise ConfigurationError("idle_partition_grace must not be negative")
        check_skew_rule(self.max_timestamp_skew, self.on_skewed_timestamp, f"pipeline {self.window.pipeline!r}")
        for name in ("dag_id", "target_id"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value):
                raise ConfigurationError(f"{name} of pipeline {self.window.pipeline!r} must be a non-empty "
                                         f"string or None, not {value!r}")
        if self.target_exclusive and self.target_id is None:
            raise ConfigurationError(f"pipeline {self.window.pipeline!r}: target_exclusive needs the target_id "
                                     "of the target it makes exclusive")

    @property
    def claim(self) -> Claim:
        return Claim(self.window.pipeline, self.topics, self.dag_id, self.target_id, self.target_exclusive)


def check_readable(plan: WindowPlan, bounds: dict[TopicPartition, Bounds]) -> None:
    """A frozen range that retention already deleted, or that lies past the end
    of the log, can no longer be read as planned: say so loudly."""
    for r in plan.ranges:
        if r.width == 0:
            continue
        b = bounds[r.tp]
        if r.start_offset < b.log_start:
            raise OffsetsExpired(
                f"window {plan.window}: {r.tp} must be read from offset {r.start_offset} to {r.end_offset}, "
                f"but the log now starts at offset {b.log_start} (retention deleted "
                f"{min(b.log_start, r.end_offset) - r.start_offset} planned offsets). "
                "Raise the topic's retention above the backfill horizon; these records cannot be re-read."
            )
        if r.end_offset > b.end:
            raise LogTruncated(
                f"window {plan.window}: {r.tp} is planned up to offset {r.end_offset}, but the log ends at "
                f"{b.end}. The topic was recreated or lost data since the window was planned."
            )


def plan_window(
    ledger: Ledger,
    log_: PartitionLog,
    request: PlanRequest,
    *,
    now: Callable[[], datetime] = lambda: datetime.now(timezone.utc),
) -> WindowPlan:
    """The window's frozen plan: the stored one, or a new one frozen now.

    Raises WindowNotClosed (catchable, a reason to wait) when a partition has not
    passed the window's end. Safe under any number of concurrent planners of the
    same or neighbouring windows: they end with the same frozen cuts.

    Every plan first checks the pipeline's claim (core/ownership.py) and claims
    it if nobody has: a plan from another DAG, for other topics or into another
    target, or one whose target another pipeline already receives the same
    topics in, raises OwnershipConflict before anything of it is frozen.
    """
    window = request.window
    asked = request.claim
    with ledger.connect() as conn:
        with conn.transaction():
            # Every plan, also of a frozen window, checks who owns the pipeline:
            # a second DAG clearing a window the first one planned is refused too.
            claimed = ledger.load_claim(conn, window.pipeline)
            if claimed is not None:
                _refuse_conflict(own_claim_conflict(claimed, asked))
            frozen = ledger.load_plan(conn, window)
        claimed_already = claimed is not None and claimed.covers(asked)
        if frozen is not None:
            _check_topics(frozen, request)
            if not claimed_already:
                claim_pipeline(ledger, conn, asked)
            check_readable(frozen, {tp: log_.bounds(tp) for tp in {r.tp for r in frozen.ranges}})
            return frozen

        tps = log_.partitions(list(request.topics))  # claim only topics that exist
        if not claimed_already:
            claim_pipeline(ledger, conn, asked)
        for _round in range(MAX_FREEZE_ROUNDS):
            started = time.monotonic()
            with conn.transaction():
                contexts = ledger.cut_contexts(conn, window, tps)
            bounds = {tp: log_.bounds(tp) for tp in tps}
            cuts, waiting = _resolve_all(log_, window, tps, contexts, bounds, request, now())
            if waiting:
                raise WindowNotClosed(
                    f"window {window} is not closed yet: {len(waiting)} partition(s) have no record at or after "
                    f"{window.end.isoformat()} and have not been idle for {request.idle_partition_grace}: "
                    + ", ".join(str(tp) for tp in waiting[:10]) + (" ..." if len(waiting) > 10 else ""),
                    waiting_for=[(tp.topic, tp.partition) for tp in waiting],
                )
            plan = WindowPlan(window, tuple(sorted(
                PartitionRange(tp.topic, tp.partition, cuts[tp, window.start].offset, cuts[tp, window.end].offset)
                for tp in tps
            )))
            with conn.transaction():
                ledger.lock_pipeline(conn, window.pipeline)
                winner = ledger.load_plan(conn, window)
                if winner is not None:  # a concurrent planner froze it first
                    _check_topics(winner, request)
                    return winner
                overlaps = ledger.overlapping_windows(conn, window)
                if overlaps:
                    raise WindowConflict(
                        f"window {window} overlaps window(s) planned before with other boundaries: "
                        + ", ".join(f"[{s.isoformat()}, {e.isoformat()})" for s, e in overlaps)
                    )
                if ledger.cut_contexts(conn, window, tps) != contexts:
                    log.info("window %s: a neighbouring cut was frozen meanwhile; resolving again", window)
                    continue
                check_readable(plan, bounds)
                ledger.freeze(conn, plan, [c for c in cuts.values() if c.how != "frozen"])
            fault_point("plan.after_freeze")
            log.info("window %s: plan frozen in %.2fs: %s", window, time.monotonic() - started,
                     ", ".join(f"{r.tp} [{r.start_offset}, {r.end_offset})" for r in plan.ranges))
            return plan
        raise WindowConflict(f"window {window}: could not freeze a plan in {MAX_FREEZE_ROUNDS} rounds "
                             "of concurrent planning; try again")


def claim_pipeline(ledger: Ledger, conn, asked: Claim) -> None:
    """Record ``asked`` as the pipeline's claim, or fill in what its claim did
    not name yet; raise OwnershipConflict (nothing written) when the pipeline
    belongs to another DAG, topics or target, or another pipeline publishes the
    same records into the target. Claims of one target are serialised, so two
    pipelines claiming it at once see each other."""
    with conn.transaction():
        if asked.target is not None:
            ledger.lock_target(conn, asked.target)
        ledger.lock_pipeline(conn, asked.pipeline)
        claimed = ledger.load_claim(conn, asked.pipeline)
        if claimed is not None:  # claimed meanwhile, or a claim to fill in
            _refuse_conflict(own_claim_conflict(claimed, asked))
        claim = asked if claimed is None else claimed.filled_from(asked)
        if asked.target is not None:
            for other in ledger.claims_on_target(conn, asked.target):
                _refuse_conflict(shared_target_conflict(other, claim))
        ledger.save_claim(conn, claim)
    log.info("%s %s", "claimed" if claimed is None else "claim filled in:", claim.describe())


def _refuse_conflict(reason: str | None) -> None:
    if reason is not None:
        raise OwnershipConflict(reason)


def _resolve_all(log_, window, tps, contexts, bounds, request, now):
    cuts: dict[tuple[TopicPartition, datetime], Cut] = {}
    waiting: list[TopicPartition] = []
    for tp in tps:
        start_ctx = contexts[tp, window.start]
        rules = dict(now=now, idle_partition_grace=request.idle_partition_grace,
                     max_timestamp_skew=request.max_timestamp_skew,
                     on_skewed_timestamp=request.on_skewed_timestamp, window=window)
        start_cut = resolve_cut(log_, tp, window.start, start_ctx, bounds[tp], **rules)
        if start_cut is None:
            waiting.append(tp)
            continue
        # The end cut can never fall below this window's own start cut.
        end_ctx = contexts[tp, window.end]
        if end_ctx.frozen is None:
            end_ctx = CutContext(None, max(end_ctx.lower or 0, start_cut.offset), end_ctx.upper,
                                 end_ctx.new_partition)
        end_cut = resolve_cut(log_, tp, window.end, end_ctx, bounds[tp], **rules)
        if end_cut is None:
            waiting.append(tp)
            continue
        cuts[tp, window.start] = start_cut
        cuts[tp, window.end] = end_cut
    return cuts, waiting


def _check_topics(plan: WindowPlan, request: PlanRequest) -> None:
    """A frozen plan covers the topics it was planned with; asking for others
    would silently read something else."""
    planned = set(plan.topics)
    if plan.ranges and planned != set(request.topics):
        raise WindowConflict(
            f"window {plan.window} was planned for topics {sorted(planned)}, "
            f"not {sorted(request.topics)}; a pipeline's topics cannot change under existing windows"
        )
