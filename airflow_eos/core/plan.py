"""Step 1 of a window's life: resolve and freeze its cuts, giving its plan.

A cut for instant t is the first offset whose record timestamp is >= t, found
and verified by reading records (core/cut_search.py). Where timestamps do not
grow with offsets, the cut found is still a boundary where the record before it
is older than t and the record at it is not, and since every cut is frozen and
clamped between its frozen neighbours, windows still tile the log: each record
belongs to exactly one window.

A record stamped more than ``max_timestamp_skew`` beyond t and followed by
older records would hold every later cut at its offset: such a *skewed cut* is
never frozen silently (the skew rule, core/skew.py): planning fails naming it,
or with ``on_skewed_timestamp="position"`` passes over it.

A partition that has no record at/after t has not "passed" t. The window waits
for it unless the partition has been idle past ``idle_partition_grace`` after t;
then the cut is frozen at the end of the log, and records that arrive later with
older timestamps belong to the next window.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone

from airflow_eos.core.errors import (
    LOG_TRUNCATED_ADVICE,
    ConfigurationError,
    LogTruncated,
    OffsetsExpired,
    OwnershipConflict,
    WindowConflict,
    WindowNotClosed,
)
from airflow_eos.core.faults import fault_point
from airflow_eos.core.ledger import CutContext, Ledger
from airflow_eos.core.ownership import Claim, own_claim_conflict, shared_target_conflict
from airflow_eos.core.skew import (
    DEFAULT_MAX_TIMESTAMP_SKEW,
    ON_SKEWED_FAIL,
    check_skew_rule,
    describe_passed_over,
    first_record_past_skew,
)
from airflow_eos.core.source import Bounds, PartitionLog, normalise_topics, per_partition
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
)

log = logging.getLogger(__name__)

# Optimistic freezing: how often to re-resolve when a concurrent planner froze a
# neighbouring cut between our read and our lock.
MAX_FREEZE_ROUNDS = 10


# --------------------------------------------------------------------------- cuts


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
    found, passed = first_record_past_skew(
        log_, tp, at, lo, hi, max_timestamp_skew=max_timestamp_skew, on_skewed_timestamp=on_skewed_timestamp,
        window=window) if lo < hi else (None, [])
    if passed:
        log.warning(
            "%s%s: records stamped more than max_timestamp_skew (%s) beyond %s are followed by older records; "
            "on_skewed_timestamp=%r: they do not close the window and are published in the window of their "
            "offset: %s%s", f"window {window}: " if window is not None else "", tp, max_timestamp_skew,
            at.isoformat(), on_skewed_timestamp,
            ", ".join(describe_passed_over(r, last, o) for r, last, o in passed[:5]),
            " ..." if len(passed) > 5 else "")
    if found is not None:
        return clamp(found.offset, CUT_BY_SKEWED if passed else CUT_BY_RECORD)
    if upper is not None:
        return clamp(upper, CUT_BY_NEIGHBOUR)
    if now - at >= idle_partition_grace:
        return clamp(bounds.end, CUT_BY_IDLE)
    return None


# --------------------------------------------------------------------------- planning


@dataclass(frozen=True)
class PlanRequest:
    """What to plan: a window of a pipeline over its topics, the rules for
    silent partitions and skewed timestamps (see the module's docstring), and
    who asks: ``dag_id`` (None: not planned from a DAG) and ``target_id`` (the
    target's identity, None: not named) with ``target_exclusive`` (the target
    holds one pipeline only) make the claim the plan checks, or records, in the
    ledger (see core/ownership.py); ``target_place`` is the physical thing the
    target resolved to (``Sink.claim_identity``), None where not resolved."""

    window: Window
    topics: tuple[str, ...]
    idle_partition_grace: timedelta = timedelta(minutes=5)
    max_timestamp_skew: timedelta = DEFAULT_MAX_TIMESTAMP_SKEW
    on_skewed_timestamp: str = ON_SKEWED_FAIL
    dag_id: str | None = None
    target_id: str | None = None
    target_exclusive: bool = False
    # Other ids the same target may have been claimed under (TargetSpec.target_aliases): a claim recorded
    # under one is the claim of target_id, and is recorded so by this plan.
    target_aliases: tuple[str, ...] = ()
    target_place: str | None = None
    # An Avro source's reader schema (JSON text), or what resolves it (the subjects' latest in the schema
    # registry), called only when a plan is frozen; None: raw values.
    reader_schema: "str | Callable[[], str] | None" = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "topics", normalise_topics(self.topics, self.window.pipeline))
        object.__setattr__(self, "target_aliases", tuple(a for a in self.target_aliases if a != self.target_id))
        if self.idle_partition_grace < timedelta(0):
            raise ConfigurationError("idle_partition_grace must not be negative")
        check_skew_rule(self.max_timestamp_skew, self.on_skewed_timestamp, f"pipeline {self.window.pipeline!r}")
        for name in ("dag_id", "target_id", "target_place"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value):
                raise ConfigurationError(f"{name} of pipeline {self.window.pipeline!r} must be a non-empty "
                                         f"string or None, not {value!r}")
        if self.target_exclusive and self.target_id is None:
            raise ConfigurationError(f"pipeline {self.window.pipeline!r}: target_exclusive needs the target_id "
                                     "of the target it makes exclusive")

    @property
    def claim(self) -> Claim:
        return Claim(self.window.pipeline, self.topics, self.dag_id, self.target_id, self.target_exclusive,
                     self.target_place if self.target_id is not None else None)

    @property
    def decodes_avro(self) -> bool:
        return self.reader_schema is not None

    def resolved_reader_schema(self) -> str | None:
        """The reader schema to freeze with a new plan (resolved now, if it is resolved from the registry)."""
        return self.reader_schema() if callable(self.reader_schema) else self.reader_schema

    def as_claimed(self, claim: Claim | None) -> Claim | None:
        """A recorded claim, its target read as ``target_id`` when it names one
        of ``target_aliases`` (the same target, spelt as an earlier version did)."""
        if claim is None or claim.target not in self.target_aliases:
            return claim
        return dataclasses.replace(claim, target=self.target_id)


def check_readable(plan: WindowPlan, bounds: dict[TopicPartition, Bounds]) -> None:
    """A frozen range that retention already deleted, or that lies past the end
    of the log, can no longer be read as planned: say so loudly."""
    for r in plan.ranges:
        b = bounds[r.tp]
        # An empty range is checked too: a log that now ends before it (the
        # topic lost its records) would otherwise freeze empty windows at the
        # old cut and commit them, and skip whatever the new log holds below it.
        if r.width > 0 and r.start_offset < b.log_start:
            raise OffsetsExpired(
                f"window {plan.window}: {r.tp} must be read from offset {r.start_offset} to {r.end_offset}, "
                f"but the log now starts at offset {b.log_start} (retention deleted "
                f"{min(b.log_start, r.end_offset) - r.start_offset} planned offsets). "
                "Raise the topic's retention above the backfill horizon; these records cannot be re-read."
            )
        if r.end_offset > b.end:
            raise LogTruncated(
                f"window {plan.window}: {r.tp} is planned up to offset {r.end_offset}, but the log ends at "
                f"{b.end}. The topic was recreated or lost data since the window was planned. {LOG_TRUNCATED_ADVICE}"
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
    with ledger.connect() as conn:
        claimed_already, frozen = _checked_claim(ledger, conn, request)
        if frozen is not None:
            _check_topics(frozen, request)
            if not claimed_already:
                claim_pipeline(ledger, conn, request.claim, request.target_aliases)
            check_readable(frozen, per_partition(log_, log_.bounds, sorted({r.tp for r in frozen.ranges})))
            return frozen

        tps = log_.partitions(list(request.topics))  # claim only topics that exist
        if not claimed_already:
            claim_pipeline(ledger, conn, request.claim, request.target_aliases)
        for _round in range(MAX_FREEZE_ROUNDS):
            plan = _freeze_round(ledger, conn, log_, request, tps, now())
            if plan is not None:
                return plan
        raise WindowConflict(f"window {window}: could not freeze a plan in {MAX_FREEZE_ROUNDS} rounds "
                             "of concurrent planning; try again")


def _checked_claim(ledger: Ledger, conn, request: PlanRequest) -> tuple[bool, WindowPlan | None]:
    """Whether the pipeline's recorded claim already covers the request (else
    the plan claims it), and the window's frozen plan if it has one; raises
    OwnershipConflict when the recorded claim is another DAG's, topics' or
    target's. Every plan, also of a frozen window, checks who owns the
    pipeline: a second DAG clearing a window the first one planned is refused too."""
    with conn.transaction():
        recorded = ledger.load_claim(conn, request.window.pipeline)
        claimed = request.as_claimed(recorded)
        if claimed is not None:
            _refuse_conflict(own_claim_conflict(claimed, request.claim))
        frozen = ledger.load_plan(conn, request.window)
    # a claim recorded under an alias of the target is recorded again under its id
    return claimed is not None and claimed.covers(request.claim) and claimed == recorded, frozen


def _freeze_round(ledger: Ledger, conn, log_: PartitionLog, request: PlanRequest, tps: list[TopicPartition],
                  now: datetime) -> WindowPlan | None:
    """One attempt to freeze the window's plan over the partitions ``tps``:
    resolve its cuts against the log and the neighbouring frozen cuts, then
    freeze them unless a neighbouring cut was frozen meanwhile (None: resolve
    again). A plan a concurrent planner froze first is returned as it is."""
    window = request.window
    started = time.monotonic()
    with conn.transaction():
        contexts = ledger.cut_contexts(conn, window, tps)
    bounds = per_partition(log_, log_.bounds, tps)
    cuts, waiting = _resolve_all(log_, window, tps, contexts, bounds, request, now)
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
    )), request.resolved_reader_schema())
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
            return None
        check_readable(plan, bounds)
        ledger.freeze(conn, plan, [c for c in cuts.values() if c.how != "frozen"])
    fault_point("plan.after_freeze")
    log.info("window %s: plan frozen in %.2fs: %s", window, time.monotonic() - started,
             ", ".join(f"{r.tp} [{r.start_offset}, {r.end_offset})" for r in plan.ranges))
    return plan


def claim_pipeline(ledger: Ledger, conn, asked: Claim, aliases: tuple[str, ...] = ()) -> None:
    """Record ``asked`` as the pipeline's claim, or fill in what its claim did
    not name yet; raise OwnershipConflict (nothing written) when the pipeline
    belongs to another DAG, topics or target, or another pipeline publishes the
    same records into the target. Claims of one target are serialised, so two
    pipelines claiming it at once see each other, also when they name it
    through different ids of one place (the id's lock first, then the place's).
    A claim recorded under one of ``aliases`` (the target's id as an earlier
    version spelt it) is the target's, and is recorded under its id now."""
    def as_target(claim: Claim | None) -> Claim | None:
        return dataclasses.replace(claim, target=asked.target) if claim and claim.target in aliases else claim

    with conn.transaction():
        if asked.target is not None:
            ledger.lock_target(conn, asked.target)
            if asked.place is not None:
                ledger.lock_target(conn, asked.place)
        ledger.lock_pipeline(conn, asked.pipeline)
        claimed = as_target(ledger.load_claim(conn, asked.pipeline))
        if claimed is not None:  # claimed meanwhile, or a claim to fill in
            _refuse_conflict(own_claim_conflict(claimed, asked))
        claim = asked if claimed is None else claimed.filled_from(asked)
        if asked.target is not None:
            for other in [c for t in (asked.target, *aliases) for c in ledger.claims_on_target(conn, t, claim.place)]:
                _refuse_conflict(shared_target_conflict(as_target(other), claim))
        ledger.save_claim(conn, claim)
    log.info("%s %s", "claimed" if claimed is None else "claim filled in:", claim.describe())


def _refuse_conflict(reason: str | None) -> None:
    if reason is not None:
        raise OwnershipConflict(reason)


def _resolve_all(log_, window, tps, contexts, bounds, request, now):
    rules = dict(now=now, idle_partition_grace=request.idle_partition_grace,
                 max_timestamp_skew=request.max_timestamp_skew,
                 on_skewed_timestamp=request.on_skewed_timestamp, window=window)

    def resolve(tp: TopicPartition) -> tuple[Cut, Cut] | None:
        start_cut = resolve_cut(log_, tp, window.start, contexts[tp, window.start], bounds[tp], **rules)
        if start_cut is None:
            return None
        # The end cut can never fall below this window's own start cut.
        end_ctx = contexts[tp, window.end]
        if end_ctx.frozen is None:
            end_ctx = CutContext(None, max(end_ctx.lower or 0, start_cut.offset), end_ctx.upper,
                                 end_ctx.new_partition)
        end_cut = resolve_cut(log_, tp, window.end, end_ctx, bounds[tp], **rules)
        return None if end_cut is None else (start_cut, end_cut)

    cuts: dict[tuple[TopicPartition, datetime], Cut] = {}
    waiting: list[TopicPartition] = []
    for tp, pair in per_partition(log_, resolve, tps).items():
        if pair is None:
            waiting.append(tp)
        else:
            cuts[tp, window.start], cuts[tp, window.end] = pair
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
    if (plan.reader_schema is not None) != request.decodes_avro:
        planned_as, asked = ("Avro", "raw") if plan.reader_schema is not None else ("raw", "Avro")
        raise WindowConflict(f"window {plan.window} was planned with {planned_as} values, its source now reads "
                             f"{asked} ones; a pipeline's value format cannot change under existing windows")
