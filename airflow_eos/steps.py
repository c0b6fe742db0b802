"""The steps of a window's life, once, without Airflow.

Read this module top to bottom to follow one window::

    plan ──► stage ──► prepare ──► commit
      └──────── abort (the teardown) ◄──┘

Each step takes plain values (a ledger, a Kafka log, a bound target's Sink, an
attempt) and returns a plain, serialisable result. The Airflow operators and
the sensor turn their connections into those values through a hook and call one
step; the fault suite (tests/harness/chaos.py) calls the same functions, with
only the Spark job replaced by its Python stand-in; the benchmark reads its
figures from the results (the tasks' XCom). The protocol inside each step
(epochs, fencing, checkpoints, the commit's transaction) is the core's and the
target's: :mod:`airflow_eos.core.attempt`, :class:`airflow_eos.core.sink.Sink`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from airflow_eos.core.attempt import Attempt, Readiness, load_offsets
from airflow_eos.core.errors import WindowNotClosed
from airflow_eos.core.faults import fault_point
from airflow_eos.core.ledger import Ledger, WindowRecord
from airflow_eos.core.plan import PlanRequest, plan_window
from airflow_eos.core.sink import CommitOutcome, CommitResult, Sink
from airflow_eos.core.source import PartitionLog, mirror_offsets
from airflow_eos.core.windows import Window, WindowPlan

log = logging.getLogger(__name__)

# The stage job: given the open attempt, read the plan, transform, stage and
# checkpoint; returns its report (plain values) or None. Spark in production
# (spark-submit or Spark Connect), a Python stand-in in the fault suite.
StageJob = Callable[[Attempt], "Mapping[str, Any] | None"]


# --------------------------------------------------------------------------- 1. plan


def plan(ledger: Ledger, kafka_log: PartitionLog, request: PlanRequest) -> WindowPlan | None:
    """Freeze the window's cuts (or return the frozen ones): None while the
    window is not closed yet (a partition has not passed its end). Raises
    SkewedTimestamp, OwnershipConflict, WindowConflict when planning cannot
    succeed as asked (terminal errors: see core/errors.py)."""
    try:
        window_plan = plan_window(ledger, kafka_log, request)
    except WindowNotClosed as exc:
        log.info("%s", exc)
        return None
    log.info("window %s planned: %d partition range(s), at most %d records",
             window_plan.window, len(window_plan.ranges), window_plan.max_records)
    for r in window_plan.ranges:
        log.info("  %s [%d, %d)", r.tp, r.start_offset, r.end_offset)
    return window_plan


# --------------------------------------------------------------------------- 2. stage


@dataclass(frozen=True)
class Staged:
    """The stage step's result: the attempt it opened, and the job's report.
    Its dict is the attempt's dict plus ``report`` and ``stage_seconds``, so
    every consumer of an attempt (the sensor, the commit) reads it as one.

    No attempt (``attempt`` None, ``committed`` set): the window was committed
    already and its target skips a rerun (``on_committed="skip"``), so nothing
    was staged and nothing will be published; the dict is then ``committed``'s
    (outcome ``skipped``, the committed epoch and counts, ``epoch`` None)."""

    attempt: Attempt | None
    report: Mapping[str, Any] | None = None
    seconds: float = 0.0
    committed: "Committed | None" = None

    def to_dict(self) -> dict[str, Any]:
        if self.attempt is None:
            return {**self.committed.to_dict(), "staging": None, "report": None, "stage_seconds": 0.0}
        return {**self.attempt.to_dict(), "report": dict(self.report) if self.report else None,
                "stage_seconds": round(self.seconds, 3)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "Staged":
        if data.get("epoch") is None:
            return cls(None, committed=Committed.from_dict(data))
        return cls(Attempt.from_dict(data), data.get("report"), float(data.get("stage_seconds") or 0.0))


def stage(sink: Sink, window_plan: WindowPlan, job: StageJob) -> Staged:
    """Open a new attempt of the planned window (its epoch fences every older
    attempt, zombies included) and run the stage job for it. If the job fails,
    the attempt is aborted (its staging dropped) before the error goes on; if
    the process dies instead, the attempt stays live until the window's abort
    task, a newer attempt or the sweep ends it.

    A window committed already, whose target skips reruns: no attempt, no job
    (a Clear of a committed window costs seconds, not a Spark job whose
    staging the commit would throw away); the result says who committed it."""
    record = sink.committed_rerun(window_plan.window)
    if record is not None:
        committed = Committed.nothing_staged(window_plan.window, record)
        log.info("%s", committed.describe())
        return Staged(None, committed=committed)
    attempt = sink.begin(window_plan.window)
    log.info("%s opened (epoch %d fences every older attempt); staging %s", attempt, attempt.epoch, attempt.staging)
    started = time.monotonic()
    try:
        report = job(attempt)
    except Exception as exc:
        _abort_after(sink, attempt, f"stage job failed: {type(exc).__name__}: {exc}")
        raise
    staged = Staged(attempt, report, time.monotonic() - started)
    log.info("%s: stage job finished in %.1fs", attempt, staged.seconds)
    return staged


def _abort_after(sink: Sink, attempt: Attempt, reason: str) -> None:
    try:
        if sink.abort(attempt, reason[:2000]):
            log.info("%s aborted after its stage job failed; its staging is dropped", attempt)
    except Exception as exc:  # noqa: BLE001 - the job's failure is the one to report; the abort task retries
        log.warning("could not abort %s after its stage job failed: %s", attempt, exc)


# --------------------------------------------------------------------------- 3. prepare


def prepare(sink: Sink, attempt: Attempt) -> Readiness:
    """The barrier: mark the attempt prepared once its checkpoint is durable
    and proves the window complete. Not ready (the checkpoint is not written
    yet) is an answer; raises when waiting cannot help (fenced, aborted,
    incomplete)."""
    readiness = sink.prepare(attempt)
    log.info("%s", readiness.detail)
    return readiness


# --------------------------------------------------------------------------- 4. commit


@dataclass(frozen=True)
class OffsetMirror:
    """Where a commit also mirrors the pipeline's offsets, for lag tools."""

    kafka_config: Mapping[str, Any] = field(repr=False)
    group_id: str


@dataclass(frozen=True)
class Committed:
    """The commit step's result (the commit task's XCom and its Asset event's extra)."""

    pipeline: str
    window_start: str
    window_end: str
    epoch: int | None  # None: no attempt was opened (see Staged)
    outcome: str  # a CommitOutcome value: published | replaced | already_committed | skipped
    committed_epoch: int
    published_rows: int
    dead_letter_rows: int
    replaced_rows: int = 0
    seconds: float = 0.0  # the target's commit (its transaction), not the task
    mirrored_to: str | None = None
    # This step was the first to finish for the window's committed epoch: the target changed and
    # Airflow was not told yet, so the commit task emits the target's Asset event. False for a no-op
    # whose change was announced before (a retried or rerun commit): no event, nothing downstream reruns.
    announce: bool = False

    @classmethod
    def of(cls, result: CommitResult, mirrored_to: str | None = None, *, announce: bool = False) -> "Committed":
        a = result.attempt
        return cls(a.pipeline, a.window_start.isoformat(), a.window_end.isoformat(), a.epoch,
                   CommitOutcome(result.outcome).value, result.committed_epoch, result.published_rows,
                   result.dead_letter_rows, result.replaced_rows, round(result.seconds, 3), mirrored_to, announce)

    @classmethod
    def nothing_staged(cls, window: Window, record: WindowRecord) -> "Committed":
        """A rerun of a committed window that its target skips: no attempt."""
        return cls(window.pipeline, window.start.isoformat(), window.end.isoformat(), None,
                   CommitOutcome.SKIPPED.value, record.committed_epoch, record.published_rows or 0,
                   record.dead_letter_rows or 0)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "Committed":
        return cls(**{f.name: data[f.name] for f in fields(cls) if f.name in data})

    def describe(self) -> str:
        if self.epoch is None:
            return (f"window {self.window_start} .. {self.window_end} of {self.pipeline} was committed by attempt "
                    f"{self.committed_epoch} ({self.published_rows} rows, {self.dead_letter_rows} dead letters); "
                    "its target skips reruns of committed windows (on_committed='skip'): nothing staged, nothing "
                    "published")
        return f"attempt {self.epoch} of window {self.window_start} of {self.pipeline}: {self.outcome}"

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def commit(sink: Sink, attempt: Attempt, *, mirror: OffsetMirror | None = None) -> Committed:
    """Publish the prepared attempt atomically with the pipeline's offsets.
    Idempotent: a retry after success does nothing and says so; a window
    committed by another attempt is skipped or replaced, as the target says.
    Then, if asked, mirror the pipeline's offsets to a consumer group (after
    the commit: the ledger stays the source of truth, a lost mirror is redone
    by the next commit or the retry; see :func:`mirror_ledger_offsets`).
    Last, mark the commit announced: its task's Asset event follows as the
    task ends, and a rerun of the window may now be skipped without staging
    (see :func:`stage`). ``Committed.announce`` says
    whether this step announced it: a window published or replaced now, or
    one an earlier step committed and died before announcing; never a no-op
    whose change was announced already."""
    result = sink.commit(attempt)
    log.info("%s", result)
    fault_point("commit.after_commit")
    mirrored_to = None
    if mirror is not None and result.offsets:
        mirror_ledger_offsets(sink.ledger, attempt.pipeline, mirror)
        mirrored_to = mirror.group_id
    with sink.ledger.connect() as conn, conn.transaction():
        announce = sink.ledger.mark_announced(conn, attempt.window, result.committed_epoch)
    return Committed.of(result, mirrored_to, announce=announce)


def mirror_ledger_offsets(ledger: Ledger, pipeline: str, mirror: OffsetMirror) -> None:
    """Mirror the pipeline's offsets as the ledger holds them now, holding the
    pipeline's mirror lock while Kafka is told. Not the offsets the commit's
    own transaction saw: two commits of one pipeline that end together would
    mirror those in either order, and the older, written last, left the
    consumer group behind the ledger for good (the N=2000 chaos soak found it:
    seeds 20263402, 20263493). Under the lock each mirror writes what is
    committed when it writes, and every commit is followed by a mirror of its
    own, so the group ends where the ledger ends."""
    with ledger.connect() as conn, conn.transaction():
        ledger.lock_mirror(conn, pipeline)
        offsets = load_offsets(conn, pipeline)
        if offsets:
            mirror_offsets(dict(mirror.kafka_config), mirror.group_id, offsets)
    log.info("offsets of %d partition(s) mirrored to consumer group %r, as the ledger holds them",
             len(offsets), mirror.group_id)


# --------------------------------------------------------------------------- 5. abort


def abort(sink: Sink, window: Window, reason: str) -> list[int]:
    """Abort every live attempt of the window (the teardown of its task group):
    each is marked aborted and its staging dropped; the window stays planned
    and can run again. Returns the epochs aborted."""
    aborted = sink.abort_window(window, reason)
    if aborted:
        log.info("window %s: aborted attempt(s) %s and dropped their staging",
                 window, ", ".join(str(a.epoch) for a in aborted))
    else:
        log.info("window %s: no live attempt to abort", window)
    return [a.epoch for a in aborted]
