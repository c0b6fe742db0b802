"""The Iceberg target's teardown and sweep. A mixin of
:class:`~airflow_eos.targets.iceberg.sink.IcebergSink`.

Only the folders of attempts this ledger aborted are deleted: an aborted
attempt was never decided, so no snapshot names its files. A folder no
attempt of this ledger owns is never touched (it may be another ledger's
pipeline writing into the same table); the files of published and
superseded attempts are the table's, which Iceberg's own snapshot expiry and
orphan-file removal take care of.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta

from airflow_eos.core import attempt as attempts
from airflow_eos.core.attempt import ABORTED, Attempt
from airflow_eos.core.publication import COMPLETE, PUBLISHED_STATE, SUPERSEDED, SUPERSEDED_HOW
from airflow_eos.core.windows import Window
from airflow_eos.targets.iceberg.fields import IcebergSinkFields
from airflow_eos.targets.iceberg.writer import DEAD_LETTERS

log = logging.getLogger(__name__)


class IcebergAbort(IcebergSinkFields):
    """abort_window, sweeps_unclaimed and sweep of an IcebergSink (ahead of
    :class:`~airflow_eos.core.sink.Sink` in its bases: ``super()`` reaches the Sink's)."""

    def abort_window(self, window: Window, reason: str) -> list[Attempt]:
        """Abort every live attempt of the window, and delete what is left of
        the folders of its attempts aborted before (an abort that died
        between marking its attempt and deleting its files)."""
        aborted = super().abort_window(window, reason)  # type: ignore[misc]
        with self.ledger.connect() as conn, conn.transaction():
            ended = attempts.aborted_attempts(conn, window)
        for attempt in ended:
            self.store.delete_tree(self.attempt_url(attempt))
        return aborted

    def sweeps_unclaimed(self, attempt: Attempt) -> bool:
        """Only an attempt with a folder under this table's location."""
        url = self.attempt_url(attempt)
        return self.store.is_dir(url) or bool(self.store.subdirectories(url))

    def sweep(self, older_than: timedelta, *, now: datetime | None = None) -> list[Attempt]:
        """Abort this table's attempts live longer than ``older_than``, finish
        decided publications, delete the folders of this ledger's aborted
        attempts that are still there, and finish the cleanup of published
        (or superseded) attempts whose publisher died before it: a folder
        that still has ``dead_letters/`` (the cleanup deletes it last)."""
        swept = super().sweep(older_than, now=now)  # type: ignore[misc]
        self.finish_pending()  # type: ignore[attr-defined]
        names = self.store.subdirectories(self.eos_root)
        with self.ledger.connect() as conn, conn.transaction():
            ended = conn.execute(
                "SELECT a.pipeline, a.window_start, w.window_end, a.epoch, a.staging_table, a.state, p.state"
                " FROM eos.attempts a JOIN eos.windows w ON w.pipeline = a.pipeline AND w.window_start = a.window_start"
                " LEFT JOIN eos.publications p ON p.pipeline = a.pipeline AND p.window_start = a.window_start"
                " AND p.epoch = a.epoch WHERE a.staging_table = ANY(%s) AND (a.state = %s OR p.state IN (%s, %s))",
                (names, ABORTED, PUBLISHED_STATE, SUPERSEDED)).fetchall()
        for *key, state, publication in ended:
            attempt = Attempt(*key)
            url = self.attempt_url(attempt)
            if state == ABORTED:
                log.info("sweep: deleting %s (its attempt was aborted)", url)
                self.store.delete_tree(url)
            elif DEAD_LETTERS in self.store.subdirectories(url):
                log.info("sweep: cleaning up %s (its publisher died before it did)", url)
                self.after_publication(  # type: ignore[attr-defined]
                    attempt, SUPERSEDED_HOW if publication == SUPERSEDED else COMPLETE)
        return swept
