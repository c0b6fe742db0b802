"""Publication after the decision, for a target whose publication cannot be
part of the ledger's transaction (a directory's rename, an Iceberg table's
commit): the two-phase commit's second phase, written once.

The decision (:func:`airflow_eos.core.commit.decide`) records the window's
publication as *decided* in ``eos.publications`` (:meth:`record_decision`,
called by the target's ``publish_in_decision``); :meth:`publish` then does
the target's part (:meth:`publish_decided`) holding the window's row lock,
so that two publications of one window never race, and marks it
*published*; one whose window a newer attempt committed since (a replace) is
*superseded* and never published. A decided window always ends published:
by its commit's :meth:`after_decision`, or, if that died, by a retry, by the
next commit of the target (:meth:`finish_pending`), by a Clear of the window
(:meth:`committed_rerun`) or by the sweep.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, ClassVar

from airflow_eos.core.attempt import Attempt
from airflow_eos.core.commit import ALREADY_COMMITTED, SKIPPED, CommitOutcome
from airflow_eos.core.errors import TargetError
from airflow_eos.core.faults import fault_point
from airflow_eos.core.ledger import Ledger, WindowRecord, WindowState
from airflow_eos.core.windows import Window

if TYPE_CHECKING:
    import psycopg

log = logging.getLogger(__name__)

# publication states (eos.publications)
DECIDED = "decided"
PUBLISHED_STATE = "published"
SUPERSEDED = "superseded"
# how a publish ended without the target's part doing anything
COMPLETE = "complete"  # published before: nothing to do
SUPERSEDED_HOW = "superseded"  # another attempt committed the window since: this one is never published


class PublishedAfterDecision:
    """The second phase of a target's two-phase commit (see the module).

    A target implements :meth:`publish_decided` (its part, idempotent, in
    the window's lock), :meth:`publication_place` (for messages) and
    :attr:`target_ids` (what its publications are recorded under); it may
    add :meth:`after_publication` (cleaning up after it). ``publish``
    returns how: :data:`COMPLETE`, :data:`SUPERSEDED_HOW` or what
    :meth:`publish_decided` said."""

    staging_in_ledger: ClassVar[bool] = False  # its staging is deleted after the transaction that ends its attempt
    ledger: Ledger
    # What publish_decided returns when it changed what readers see now (for the log of finish_pending).
    fresh_publications: ClassVar[frozenset[str]] = frozenset()

    # ------------------------------------------------------------------ the target's part

    @property
    def target_ids(self) -> list[str]:
        raise NotImplementedError

    def publication_place(self, attempt: Attempt) -> str:
        raise NotImplementedError

    def publish_decided(self, conn: psycopg.Connection, attempt: Attempt, location: str) -> str:
        """Make the decided attempt's rows visible to readers, idempotently
        (a call after a crash finds its own earlier work done and says so);
        ``conn`` holds the window's row lock. Returns how."""
        raise NotImplementedError

    def after_publication(self, attempt: Attempt, how: str) -> None:
        """After :meth:`publish`'s transaction, whatever it found: clean up."""

    # ------------------------------------------------------------------ the decision

    @contextlib.contextmanager
    def decision_transaction(self, attempt: Attempt) -> Iterator[psycopg.Connection]:
        """The ledger transaction of the decision, durable: the publication
        follows it, so the decision must outlive a crash."""
        with self.ledger.connect() as conn, conn.transaction():
            self.ledger.durable_commit(conn)
            yield conn

    def record_dead_letters(self, conn: psycopg.Connection, attempt: Attempt, records: Sequence[tuple],
                            replacing: bool) -> None:
        """The window's dead letters (``eos.dead_letters``' columns after the
        window's) in the decision's transaction; a replace deletes the
        window's older ones first."""
        if replacing:
            conn.execute("DELETE FROM eos.dead_letters WHERE pipeline = %s AND window_start = %s",
                         (attempt.pipeline, attempt.window_start))
        with conn.cursor() as cur, cur.copy(
                'COPY eos.dead_letters (pipeline, window_start, epoch, topic, partition, "offset", error, key,'
                " value) FROM STDIN") as copy:
            for record in records:
                copy.write_row((attempt.pipeline, attempt.window_start, attempt.epoch, *record))

    def record_decision(self, conn: psycopg.Connection, attempt: Attempt, location: str, schema: str | None,
                        replaces: int | None) -> None:
        """The publication as *decided*, in the decision's transaction."""
        conn.execute(
            "INSERT INTO eos.publications (pipeline, window_start, epoch, target, location, schema, replaces)"
            " VALUES (%s, %s, %s, %s, %s, %s, %s)",
            (attempt.pipeline, attempt.window_start, attempt.epoch, self.target_ids[0], location, schema, replaces))

    def after_decision(self, attempt: Attempt, outcome: CommitOutcome) -> str:
        """The publication (:meth:`publish`), then any other decided
        publication of the target. SKIPPED: the attempt that committed the
        window may be decided and not yet published (its commit died after
        the decision): this later commit finishes it, or fails too (a skipped
        commit must not report success for a window readers do not see)."""
        if outcome == SKIPPED:
            self.finish_pending()
            self.require_published(attempt.window)
            return ""
        if outcome != ALREADY_COMMITTED:
            log.info("%s: decided (committed in the ledger with its offsets); publishing into %s", attempt,
                     self.publication_place(attempt))
        fault_point("commit.after_decision")
        how = self.publish(attempt)
        if outcome == ALREADY_COMMITTED and how in self.fresh_publications:
            log.info("%s: committed before; this call finished its publication (%s)", attempt, how)
        self.finish_pending()
        return f" ({how}, {self.publication_place(attempt)})"

    # ------------------------------------------------------------------ publish (idempotent)

    def publish(self, attempt: Attempt) -> str:
        """Publish a decided attempt, idempotently, holding the window's row
        lock (a replace deciding meanwhile waits)."""
        with self.ledger.connect() as conn, conn.transaction():
            window = conn.execute(
                "SELECT committed_epoch FROM eos.windows WHERE pipeline = %s AND window_start = %s FOR UPDATE",
                (attempt.pipeline, attempt.window_start)).fetchone()
            publication = conn.execute(
                "SELECT state, location FROM eos.publications WHERE pipeline = %s AND window_start = %s"
                " AND epoch = %s FOR UPDATE", (attempt.pipeline, attempt.window_start, attempt.epoch)).fetchone()
            if window is None or publication is None:
                raise TargetError(f"{attempt} was never decided (no publication in the ledger): nothing to publish")
            state, location = publication
            if state == PUBLISHED_STATE:
                how = COMPLETE
            elif state == SUPERSEDED or window[0] != attempt.epoch:
                how = SUPERSEDED_HOW
                self._set_publication(conn, attempt, SUPERSEDED)
            else:
                how = self.publish_decided(conn, attempt, location)
                self._set_publication(conn, attempt, PUBLISHED_STATE)
        if how == SUPERSEDED_HOW:
            log.info("%s: the window was committed by a newer attempt since; this one is never published", attempt)
        elif how == COMPLETE:
            log.info("%s: %s holds it already; nothing to do", attempt, self.publication_place(attempt))
        fault_point("commit.before_cleanup")
        self.after_publication(attempt, how)
        return how

    @staticmethod
    def _set_publication(conn: psycopg.Connection, attempt: Attempt, state: str) -> None:
        conn.execute("UPDATE eos.publications SET state = %s, published_at = CASE WHEN %s = 'published' THEN now()"
                     " END WHERE pipeline = %s AND window_start = %s AND epoch = %s",
                     (state, state, attempt.pipeline, attempt.window_start, attempt.epoch))

    # ------------------------------------------------------------------ finishing what was decided

    def committed_rerun(self, window: Window) -> WindowRecord | None:
        """As :meth:`Committer.committed_rerun`, once the window is published:
        a window decided by a commit that died before publishing is published
        here first (a Clear finishes it). If it cannot be, TargetError: the
        rerun fails at once, saying why, instead of staging a window whose
        commit would skip it."""
        if not self.replaces_committed:  # type: ignore[attr-defined]
            with self.ledger.connect() as conn:
                record = self.ledger.window(conn, window)
            if record is not None and record.state == WindowState.COMMITTED:
                self.finish_pending()
                self.require_published(window)
        return super().committed_rerun(window)  # type: ignore[misc]

    def require_published(self, window: Window) -> None:
        """Raise TargetError if the window's committed attempt is decided and
        not published (after one more try to publish it). A published one is
        published again (:data:`COMPLETE`): its cleanup runs once more, in
        case the process that published it died before cleaning up."""
        with self.ledger.connect() as conn:
            row = conn.execute(
                "SELECT a.pipeline, a.window_start, w.window_end, a.epoch, a.staging_table, p.state"
                " FROM eos.windows w JOIN eos.publications p ON p.pipeline = w.pipeline"
                " AND p.window_start = w.window_start AND p.epoch = w.committed_epoch JOIN eos.attempts a"
                " ON a.pipeline = p.pipeline AND a.window_start = p.window_start AND a.epoch = p.epoch"
                " WHERE w.pipeline = %s AND w.window_start = %s AND w.state = 'committed'",
                (window.pipeline, window.start)).fetchone()
        if row is None:
            return
        committed, state = Attempt(*row[:-1]), row[-1]
        try:
            self.publish(committed)
        except Exception as exc:
            if state != DECIDED:  # readers see the window: a failed cleanup is the sweep's to finish
                log.warning("%s: cleaning up after its publication failed (the sweep tries again): %s", committed,
                            exc)
                return
            raise TargetError(f"window {window} is decided, not published: {committed} is committed in the ledger "
                              f"(the pipeline's offsets advanced past it) but not in "
                              f"{self.publication_place(committed)}. {exc}") from exc

    def pending_publications(self) -> list[Attempt]:
        """The committed attempts of this target's decided, unpublished
        windows, oldest decision first."""
        with self.ledger.connect() as conn, conn.transaction():
            rows = conn.execute(
                "SELECT a.pipeline, a.window_start, w.window_end, a.epoch, a.staging_table FROM eos.publications p"
                " JOIN eos.attempts a USING (pipeline, window_start, epoch) JOIN eos.windows w USING (pipeline,"
                " window_start) WHERE p.target = ANY(%s) AND p.state = 'decided' ORDER BY p.decided_at",
                (self.target_ids,)).fetchall()
        return [Attempt(*row) for row in rows]

    def finish_pending(self) -> list[Attempt]:
        """Publish every decided, unpublished window of this target. Returns
        those finished; one that cannot be finished now is logged loudly and
        left for the next commit, its own retry or the sweep."""
        finished = []
        for pending in self.pending_publications():
            try:
                how = self.publish(pending)
            except Exception as exc:  # noqa: BLE001 - one stuck window must not stop the others
                log.error("%s is decided, not published (committed in the ledger, invisible to readers): %s",
                          pending, exc)
                continue
            if how in self.fresh_publications:
                log.info("%s: finished its publication (%s), decided by an earlier commit", pending, how)
                finished.append(pending)
        return finished
