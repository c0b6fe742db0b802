"""The commit protocol, written once for every target: the sequence of a
commit and of an abort, and the few hooks (:class:`Committer`) through which
a target does what only it can do.

A commit is a chain of small steps, the target's own part at the end (as
Iceberg's Flink committer: find what is committed already, then build the
table's snapshot update and commit it). :func:`decide` runs them in one
ledger transaction (:meth:`Committer.decision_transaction`):

1. lock the window row, then the attempt row (begins, aborts and other
   commits of the window wait; a second commit then finds the first's outcome);
2. this attempt committed before → ALREADY_COMMITTED, nothing done; the
   window committed by another attempt → ``on_committed``: :func:`skip`
   (SKIPPED) unless the target :attr:`~Committer.replaces_committed`;
3. :meth:`Committer.settle`: a target whose commit can be decided outside the
   ledger (a Kafka transaction) learns here whether an earlier, crashed commit
   of the window already committed there, and records it; the steps of 2 then
   run again on the ledger as it now is;
4. the attempt must be prepared and hold the window's current epoch
   (AttemptFenced, AttemptClosed, NotPrepared otherwise), its checkpoint is
   read, and :meth:`Committer.commit_problems` must find its staging as
   checkpointed (NotPrepared: nothing published, stage the window again);
5. :meth:`Committer.publish_in_decision`: the target publishes (PostgreSQL:
   ``INSERT … SELECT`` or ``ATTACH PARTITION``; Kafka: its whole transaction)
   or records what it will publish after the decision (files), and returns
   the counts;
6. the window and the attempt are marked committed and the pipeline's
   offsets advance to its contiguous committed prefix; a staging in the
   ledger's database is dropped in the same transaction.

:func:`commit` is :func:`decide` followed by
:meth:`Committer.after_decision`, where a target that publishes after the
decision (files: a directory rename) does so, idempotently; a decided window
whose publication did not finish is finished by the next call. The decision
is the commit: only the call that made it reports PUBLISHED or REPLACED.

:func:`abort` marks an attempt aborted and discards its staging, after the
target settled anything of it decided outside the ledger
(:meth:`Committer.settle_before_abort`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import time
from abc import ABC
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING, Any, ClassVar

from airflow_eos.core import attempt as attempts
from airflow_eos.core.attempt import ABORTED, COMMITTED, Attempt, AttemptStatus, Checkpoint
from airflow_eos.core.errors import NotPrepared
from airflow_eos.core.faults import fault_point
from airflow_eos.core.ledger import Ledger, WindowRecord, WindowState
from airflow_eos.core.windows import TopicPartition, Window

if TYPE_CHECKING:
    import psycopg

log = logging.getLogger(__name__)


class CommitOutcome(str, Enum):
    """What a commit did (a str: it travels in XCom and Asset events as its value)."""

    PUBLISHED = "published"  # the window's rows were published for the first time
    REPLACED = "replaced"  # the window was committed before; its rows were replaced (on_committed="replace")
    ALREADY_COMMITTED = "already_committed"  # this attempt committed before: a retried commit, nothing done
    SKIPPED = "skipped"  # another attempt committed the window; on_committed="skip": nothing done

    def __str__(self) -> str:
        return self.value


PUBLISHED = CommitOutcome.PUBLISHED
REPLACED = CommitOutcome.REPLACED
ALREADY_COMMITTED = CommitOutcome.ALREADY_COMMITTED
SKIPPED = CommitOutcome.SKIPPED


@dataclass(frozen=True)
class CommitResult:
    attempt: Attempt
    outcome: CommitOutcome
    committed_epoch: int  # the epoch whose rows the target holds now
    published_rows: int  # rows of the window in the target, as recorded when it was committed
    dead_letter_rows: int
    replaced_rows: int = 0  # rows of the window deleted by a replace
    # The pipeline's offsets after this commit; for a no-op (already committed,
    # skipped) the offsets as they are, so a retry can still mirror them.
    offsets: Mapping[TopicPartition, int] | None = None
    seconds: float = 0.0

    @property
    def changed(self) -> bool:
        return self.outcome in (PUBLISHED, REPLACED)

    def __str__(self) -> str:
        if self.outcome == ALREADY_COMMITTED:
            return f"{self.attempt}: committed before ({self.published_rows} rows); nothing to do"
        if self.outcome == SKIPPED:
            return (f"{self.attempt}: the window was committed before by attempt {self.committed_epoch} "
                    f"({self.published_rows} rows); on_committed='skip', nothing published")
        replaced = f", replacing {self.replaced_rows} rows" if self.outcome == REPLACED else ""
        return (f"{self.attempt}: published {self.published_rows} rows and {self.dead_letter_rows} dead letters"
                f"{replaced} in {self.seconds:.2f}s")


@dataclass(frozen=True)
class Published:
    """What :meth:`Committer.publish_in_decision` published (or, for a target
    that publishes after the decision, will publish): the rows and dead
    letters of the window the ledger records, and the rows a replace deleted."""

    rows: int
    dead_letters: int
    replaced: int = 0


@dataclass(frozen=True)
class Settlement:
    """What :meth:`Committer.settle` learnt before the decision.

    ``recorded``: the window's commit was decided outside the ledger by an
    earlier call that died before telling it, and is recorded in the ledger
    now (the protocol reads the attempt's status again). ``publishing``: what
    the target's :meth:`~Committer.publish_in_decision` needs from the
    settling (a Kafka producer that already fenced the window's others)."""

    recorded: bool = False
    publishing: Any = None


NOTHING_SETTLED = Settlement()


class Committer(ABC):
    """The committer role of a sink: the hooks the commit and abort protocols
    of this module call, each doing only what differs between targets.

    Contract: :meth:`publish_in_decision` runs inside the decision's ledger
    transaction holding the window's lock; it publishes atomically with that
    transaction, or records what :meth:`after_decision` publishes after it,
    idempotently. Nothing is visible to the target's readers before the
    decision's transaction commits, and nothing of an attempt that never
    commits. Every hook may run again after a crash at any point."""

    # Does the attempt's staging live in the ledger's database? Then it is
    # dropped inside the transaction that ends the attempt; otherwise (a
    # directory) after that transaction commits, so that a staging is never
    # gone while the ledger still holds its attempt live.
    staging_in_ledger: ClassVar[bool] = True
    ledger: Ledger  # the ledger (schema ``eos``) of this target's pipelines

    @property
    def replaces_committed(self) -> bool:
        """Does committing another attempt of a committed window replace it
        (``on_committed="replace"``)? False (the default, ``skip``): it would
        publish nothing, so ``Sink.committed_rerun`` lets the stage step skip
        the job altogether. Targets that can replace say when."""
        return False

    def committed_rerun(self, window: Window) -> WindowRecord | None:
        """The window's ledger row when it is committed and this target skips a
        rerun of it: a Clear of a committed window then opens no attempt and
        runs no Spark job (it would be thrown away at the commit). None when
        a run must stage: not committed yet, ``replace``, or a commit step that
        died before its end (not announced: see ``steps.commit``). A commit that
        lands after this check is the next run's to see; an attempt staged
        meanwhile is skipped at its commit as before."""
        if self.replaces_committed:
            return None
        with self.ledger.connect() as conn:
            record = self.ledger.window(conn, window)
        if record is None or record.state != WindowState.COMMITTED:
            return None
        # A commit that died before its step ended may not have told Airflow (no Asset event): let the rerun
        # commit (skipped), as before, rather than leave the window unannounced.
        return record if record.announced_epoch == record.committed_epoch else None

    def commit(self, attempt: Attempt) -> CommitResult:
        """Publish a prepared attempt atomically with the pipeline's offsets:
        the core's protocol (:func:`airflow_eos.core.commit.commit`) over this
        sink's :class:`~airflow_eos.core.commit.Committer` hooks.

        Idempotent: the same attempt may be committed again after success (a
        retried task: ALREADY_COMMITTED, nothing done), after a crash anywhere
        inside this method (finish what was decided, or decide now), and
        concurrently with another commit of the same or another attempt of
        the window (one wins; the other sees its outcome). A window committed
        by another attempt is SKIPPED or REPLACED as the target's
        ``on_committed`` says, never published twice. Raises AttemptFenced for
        a fenced attempt, NotPrepared if the staging no longer matches its
        checkpoint, and never leaves the target half-published."""
        return commit(self, attempt)

    def abort(self, attempt: Attempt, reason: str) -> bool:
        """Drop the attempt's staging and mark it aborted (False if it had ended):
        the core's protocol (:func:`airflow_eos.core.commit.abort`). The window
        stays planned and can be run again."""
        return abort(self, attempt, reason)

    @contextlib.contextmanager
    def ledger_transaction(self, purpose: str) -> Iterator[psycopg.Connection]:
        """A connection to the ledger inside a transaction, for ``purpose``
        (``"abort <attempt>"``): committed when the block ends, rolled back
        if it raises."""
        with self.ledger.connect() as conn, conn.transaction():
            yield conn

    def decision_transaction(self, attempt: Attempt) -> contextlib.AbstractContextManager[psycopg.Connection]:
        """The ledger transaction of a commit's decision; by default
        :meth:`ledger_transaction`. A target whose publication follows the
        decision makes it durable (``Ledger.durable_commit``)."""
        return self.ledger_transaction(f"commit {attempt}")

    def settle(self, conn: psycopg.Connection, attempt: Attempt) -> Settlement:
        """Before deciding, holding the window's lock: learn whether the
        window was committed outside the ledger by a call that died before
        telling it, and if so record it (``attempts.mark_committed``) and say
        so. Nothing to learn by default: the ledger decides."""
        return NOTHING_SETTLED

    def commit_problems(self, conn: psycopg.Connection, attempt: Attempt, checkpoint: Checkpoint) -> list[str]:
        """Where the attempt's staging differs from its checkpoint now, at the
        commit (NotPrepared, nothing published). None by default: a target
        whose publication counts what it publishes checks it there."""
        return []

    def publish_in_decision(self, conn: psycopg.Connection, attempt: Attempt, checkpoint: Checkpoint,
                            replacing: AttemptStatus | None, settlement: Settlement) -> Published:
        """Publish the checkpointed staging in the decision's transaction (or
        record what :meth:`after_decision` will publish) and return the
        counts. ``replacing``: the status of the window committed by another
        attempt, whose rows this publication replaces; None for a first
        publication. Raise NotPrepared if the staging no longer holds its
        checkpoint, TargetError if the target refuses; the transaction then
        rolls back and nothing is published."""
        raise NotImplementedError(f"{type(self).__name__} cannot publish: it implements no "
                                  "Committer.publish_in_decision")

    def discard(self, attempt: Attempt, conn: psycopg.Connection | None = None) -> None:
        """Drop the attempt's staging (harmless if it is gone): in the ledger
        transaction ``conn`` when :attr:`staging_in_ledger`, after it
        (``conn`` None) otherwise."""

    def after_decision(self, attempt: Attempt, outcome: CommitOutcome) -> str:
        """After the decision's transaction committed: what must follow it (a
        file target moves the window's files into place, finishing a
        publication an earlier call decided). Returns what to add to the
        commit's log line. Nothing by default."""
        return ""

    def settle_before_abort(self, conn: psycopg.Connection, attempt: Attempt) -> None:
        """Before aborting ``attempt``, in the abort's ledger transaction: a
        target whose commit is decided outside the ledger records a commit
        of the window that reached it (an attempt it committed is never
        aborted). Nothing by default."""


# --------------------------------------------------------------------------- commit


def commit(sink: Committer, attempt: Attempt) -> CommitResult:
    """Commit a prepared attempt: :func:`decide`, then what follows the
    decision (:meth:`Committer.after_decision`). Idempotent; see the module's
    docstring and ``Sink.commit``."""
    started = time.monotonic()
    decided = decide(sink, attempt)
    detail = sink.after_decision(attempt, decided.outcome)
    result = dataclasses.replace(decided, seconds=time.monotonic() - started)
    log.info("%s%s", result, detail)
    return result


def decide(sink: Committer, attempt: Attempt) -> CommitResult:
    """Steps 1–6 of the module's docstring, in one ledger transaction: the
    decision. A SKIPPED attempt's staging outside the ledger is deleted
    after it."""
    with sink.decision_transaction(attempt) as conn:
        status = attempts.load_status(conn, attempt, lock=True)
        result = _decided_before(sink, conn, attempt, status)
        settlement = NOTHING_SETTLED
        if result is None:
            settlement = sink.settle(conn, attempt)
            if settlement.recorded:
                status = attempts.load_status(conn, attempt)
                result = _decided_before(sink, conn, attempt, status)
        if result is None:
            result = _publish(sink, conn, attempt, status, settlement)
    if result.outcome == SKIPPED and not sink.staging_in_ledger:
        sink.discard(attempt)
    return result


def _decided_before(sink: Committer, conn: psycopg.Connection, attempt: Attempt,
                    status: AttemptStatus) -> CommitResult | None:
    """The outcome when the ledger has decided the window already: this
    attempt committed it (ALREADY_COMMITTED), or another did and the target
    skips (SKIPPED). None: this commit goes on to publish."""
    if status.state == COMMITTED:
        # The offsets as they are now, so that a retry after a failure between
        # the commit and the offsets mirror still mirrors them.
        return CommitResult(attempt, ALREADY_COMMITTED, status.committed_epoch, status.published_rows,
                            status.dead_letter_rows, offsets=attempts.load_offsets(conn, attempt.pipeline))
    if status.window_state == WindowState.COMMITTED and not sink.replaces_committed:
        return skip(sink, conn, attempt, status)
    return None


def skip(sink: Committer, conn: psycopg.Connection, attempt: Attempt, status: AttemptStatus) -> CommitResult:
    """on_committed='skip' for a window another attempt committed: end this
    attempt (aborted, saying why), drop a staging in the ledger's database,
    and report the committed attempt's counts and the pipeline's offsets, in
    the commit's transaction."""
    attempts.mark_aborted(conn, attempt, f"window already committed by attempt {status.committed_epoch};"
                                         " on_committed='skip'")
    if sink.staging_in_ledger:
        sink.discard(attempt, conn)
    return CommitResult(attempt, SKIPPED, status.committed_epoch, status.published_rows,
                        status.dead_letter_rows, offsets=attempts.load_offsets(conn, attempt.pipeline))


def _publish(sink: Committer, conn: psycopg.Connection, attempt: Attempt, status: AttemptStatus,
             settlement: Settlement) -> CommitResult:
    """Steps 4–6: check, publish, record the decision with the offsets."""
    attempts.check_committable(attempt, status)
    checkpoint = attempts.load_checkpoint(conn, attempt)
    problems = sink.commit_problems(conn, attempt, checkpoint)
    if problems:
        raise NotPrepared(f"cannot commit {attempt}: its staging no longer holds what it checkpointed; "
                          "nothing published, stage the window again:\n  " + "\n  ".join(problems),
                          missing=problems)
    replacing = status if status.window_state == WindowState.COMMITTED else None
    published = sink.publish_in_decision(conn, attempt, checkpoint, replacing, settlement)
    offsets = attempts.mark_committed(conn, attempt, published.rows, published.dead_letters)
    if sink.staging_in_ledger:
        sink.discard(attempt, conn)
    return CommitResult(attempt, REPLACED if replacing else PUBLISHED, attempt.epoch, published.rows,
                        published.dead_letters, published.replaced, offsets)


# --------------------------------------------------------------------------- abort


def abort(sink: Committer, attempt: Attempt, reason: str) -> bool:
    """Mark the attempt aborted and discard its staging; False if it had
    ended already. A committed attempt is left alone (its staging is the
    target's until its publication is done); the staging of an aborted one
    is discarded again (harmless), so a retried abort finishes one that died
    between the two. The window stays planned and can be run again."""
    with sink.ledger_transaction(f"abort {attempt}") as conn:
        sink.settle_before_abort(conn, attempt)
        aborted = attempts.mark_aborted(conn, attempt, reason)
        ended = aborted or attempts.load_state(conn, attempt) in (None, ABORTED)
        if sink.staging_in_ledger:
            fault_point("abort.inside")
            if ended:
                sink.discard(attempt, conn)
    if not sink.staging_in_ledger:
        fault_point("abort.inside")
        if ended:
            sink.discard(attempt)
    return aborted
