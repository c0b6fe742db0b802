"""The file target's abort, teardown and sweep. A mixin of
:class:`~airflow_eos.targets.files.sink.FileSink`."""

from __future__ import annotations

import logging
import os
from datetime import datetime, timedelta, timezone

from airflow_eos.core import attempt as attempts
from airflow_eos.core.attempt import ABORTED, Attempt
from airflow_eos.core.faults import fault_point
from airflow_eos.core.windows import Window
from airflow_eos.targets.files import fs

log = logging.getLogger(__name__)


class FileAbort:
    """Abort, abort_window and sweep of
    :class:`~airflow_eos.targets.files.sink.FileSink` (ahead of
    :class:`~airflow_eos.core.sink.Sink` in its bases: ``super()`` reaches the
    Sink's)."""

    # ------------------------------------------------------------------ abort and sweep

    def abort(self, attempt: Attempt, reason: str) -> bool:
        """Mark the attempt aborted, then delete its staging directory (also
        when it was aborted before: deleting again is harmless). A committed
        attempt is left alone (its publication may be pending)."""
        with self.ledger.connect() as conn, conn.transaction():
            aborted = attempts.mark_aborted(conn, attempt, reason)
            row = conn.execute("SELECT state FROM eos.attempts WHERE pipeline = %s AND window_start = %s"
                               " AND epoch = %s", (attempt.pipeline, attempt.window_start, attempt.epoch)).fetchone()
        fault_point("abort.inside")
        if row is None or row[0] == ABORTED:
            self._remove_staging(attempt)
        return aborted

    def _remove_staging(self, attempt: Attempt) -> None:
        staging = self.staging_dir(attempt)
        if not fs.remove_tree(staging):
            log.warning("%s: could not delete all of %s (a writer still adding files?); the sweep deletes it",
                        attempt, staging)

    def abort_window(self, window: Window, reason: str) -> list[Attempt]:
        """Abort every live attempt of the window (the teardown), and delete
        what is left of the staging of its attempts aborted before: an abort
        that died between marking its attempt aborted and deleting the
        directory (or a skipped commit that died there) is finished by the
        teardown's retry, not only by the sweep."""
        aborted = super().abort_window(window, reason)
        with self.ledger.connect() as conn, conn.transaction():
            ended = conn.execute(
                "SELECT pipeline, window_start, %s::timestamptz, epoch, staging_table FROM eos.attempts"
                " WHERE pipeline = %s AND window_start = %s AND state = %s",
                (window.end, window.pipeline, window.start, ABORTED)).fetchall()
        for row in ended:
            attempt = Attempt(*row)
            if os.path.lexists(self.staging_dir(attempt)):
                log.info("%s was aborted before; deleting what is left of its staging", attempt)
                self._remove_staging(attempt)
        return aborted

    def sweeps_unclaimed(self, attempt: Attempt) -> bool:
        """Only an attempt whose staging directory is under this root: begin
        creates it for this target's attempts alone, so an attempt of a
        pipeline claimed for no target (planned without its target) is this
        root's exactly when it has one here. Another target's attempt (a
        PostgreSQL one staging in ``eos_staging``) is never aborted here."""
        return os.path.isdir(self.staging_dir(attempt))

    def sweep(self, older_than: timedelta, *, now: datetime | None = None) -> list[Attempt]:
        """Abort this root's attempts live longer than ``older_than`` (see
        :meth:`Sink.sweep` and :meth:`sweeps_unclaimed`), finish decided
        publications, and delete staging directories that no live or
        unpublished attempt owns (aborted, published, superseded, or left by a
        begin that rolled back, once older than ``older_than``), and the trash."""
        swept = super().sweep(older_than, now=now)
        self.finish_pending()
        self._delete_orphans(older_than, now or datetime.now(timezone.utc))
        return swept

    def _delete_orphans(self, older_than: timedelta, now: datetime) -> None:
        try:
            names = [e.name for e in os.scandir(self.staging_root) if e.is_dir(follow_symlinks=False)]
        except FileNotFoundError:
            names = []
        with self.ledger.connect() as conn, conn.transaction():
            owners = dict(conn.execute(
                "SELECT a.staging_table, CASE WHEN a.state IN ('open', 'checkpointed', 'prepared') THEN 'live'"
                " WHEN a.state = 'committed' AND coalesce(p.state, 'decided') = 'decided' THEN 'live' ELSE 'ended' END"
                " FROM eos.attempts a LEFT JOIN eos.publications p USING (pipeline, window_start, epoch)"
                " WHERE a.staging_table = ANY(%s)", (names,)).fetchall())
        cutoff = (now - older_than).timestamp()
        for name in names:
            path = os.path.join(self.staging_root, name)
            owner = owners.get(name)
            if owner == "live" or (owner is None and os.stat(path).st_mtime > cutoff):
                continue
            log.info("sweep: deleting staging directory %s (%s)", path, "its attempt ended" if owner else
                     "no attempt owns it")
            fs.remove_tree(path)
        try:
            for entry in os.scandir(self.trash_root):
                fs.remove_tree(entry.path)
        except FileNotFoundError:
            pass
