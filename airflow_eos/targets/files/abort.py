"""The file target's teardown and sweep. A mixin of
:class:`~airflow_eos.targets.files.sink.FileSink`."""

from __future__ import annotations

import logging
import os
import time
from datetime import datetime, timedelta, timezone

from airflow_eos.core import attempt as attempts
from airflow_eos.core.attempt import Attempt
from airflow_eos.core.windows import Window
from airflow_eos.targets.files.fields import FileSinkFields
from airflow_eos.targets.files.writer import COMMIT_FILE, PUBLISH

log = logging.getLogger(__name__)

# A trash entry's name: the time its version was replaced (UTC), "-", the staging's name.
TRASH_STAMP = "%Y%m%dT%H%M%S.%fZ"


class FileAbort(FileSinkFields):
    """The staging's removal, abort_window and sweep of
    :class:`~airflow_eos.targets.files.sink.FileSink` (ahead of
    :class:`~airflow_eos.core.sink.Sink` in its bases: ``super()`` reaches the
    Sink's). The abort itself is the core's (:func:`airflow_eos.core.commit.abort`):
    the attempt marked aborted, then its staging directory deleted (also when
    it was aborted before: deleting again is harmless); a committed attempt is
    left alone (its publication may be pending)."""

    # ------------------------------------------------------------------ abort and sweep

    def _remove_staging(self, attempt: Attempt) -> None:
        staging = self.staging_dir(attempt)
        if not self.files.remove_tree(staging):
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
            ended = attempts.aborted_attempts(conn, window)
        for attempt in ended:
            if self.files.lexists(self.staging_dir(attempt)):
                log.info("%s was aborted before; deleting what is left of its staging", attempt)
                self._remove_staging(attempt)
        return aborted

    def sweeps_unclaimed(self, attempt: Attempt) -> bool:
        """Only an attempt whose staging directory is under this root: begin
        creates it for this target's attempts alone, so an attempt of a
        pipeline claimed for no target (planned without its target) is this
        root's exactly when it has one here. Another target's attempt (a
        PostgreSQL one staging in ``eos_staging``) is never aborted here."""
        return self.files.is_dir(self.staging_dir(attempt))

    def sweep(self, older_than: timedelta, *, now: datetime | None = None) -> list[Attempt]:
        """Abort this root's attempts live longer than ``older_than`` (see
        :meth:`Sink.sweep` and :meth:`sweeps_unclaimed`), finish decided
        publications, and delete staging directories that no live or
        unpublished attempt owns (aborted, published, superseded, or left by a
        begin that rolled back, once older than ``older_than``), and the old
        versions of replaced windows past their retention."""
        swept = super().sweep(older_than, now=now)
        self.finish_pending()
        self._delete_orphans(older_than, now or datetime.now(timezone.utc))
        return swept

    def _delete_orphans(self, older_than: timedelta, now: datetime) -> None:
        try:
            names = [e.name for e in self.files.entries(self.staging_root) if e.is_dir]
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
            if owner == "live" or (owner is None and self.files.mtime(path) > cutoff):
                continue
            log.info("sweep: deleting staging directory %s (%s)", path, "its attempt ended" if owner else
                     "no attempt owns it")
            self._retire(path)  # a replace that died before moving the old version out: keep it its retention
            self.files.remove_tree(path)
        self.delete_expired_trash()

    # ------------------------------------------------------------------ replaced versions

    def retired_path(self, staging: str) -> str:
        """Where the window's old version goes when the attempt of ``staging``
        replaces it: the trash, named by the time it was replaced, to be
        deleted after ``replaced_retention_s``."""
        stamp = datetime.now(timezone.utc).strftime(TRASH_STAMP)
        return os.path.join(self.trash_root, f"{stamp}-{os.path.basename(staging)}")

    def retire_old_version(self, attempt: Attempt) -> None:
        """After a local replace that died between its exchange and its move
        to the trash, the window's old version sits where the attempt's
        staging was (the exchange swapped them): move it to the trash
        (:meth:`retired_path`).

        Not deleted at once: a reader whose listing of the partition began
        just before the exchange goes on listing the old directory; deleting
        it under that listing would show the reader a partial or empty window.
        Kept for the retention (as Spark's file sink keeps its compacted log
        files for ``spark.sql.streaming.fileSink.log.cleanupDelay``), any
        listing has long ended. Safe to repeat: a retry finds nothing to move."""
        if self._retire(self.staging_dir(attempt)):
            log.info("%s: the window's old version is kept in %s for %.0f s (readers may still be listing it), "
                     "then deleted", attempt, self.trash_root, self.replaced_retention_s)

    def _retire(self, staging: str) -> bool:
        """Move the old version a staging directory holds after an exchange
        (its ``publish/`` with a commit file) to the trash; False if none."""
        swapped_out = os.path.join(staging, PUBLISH)
        if not self.files.is_file(os.path.join(swapped_out, COMMIT_FILE)):
            return False
        self.files.makedirs(self.trash_root)
        self.files.rename(swapped_out, self.retired_path(staging))
        self.files.sync_dir(self.trash_root)
        return True

    def delete_expired_trash(self, now: float | None = None) -> list[str]:
        """Delete the old versions replaced longer than ``replaced_retention_s``
        ago (every publication and the sweep call this); returns their names.
        An entry whose name carries no time (an older version of this sink)
        ages from its last change."""
        now = time.time() if now is None else now
        deleted = []
        try:
            entries = self.files.entries(self.trash_root)
        except FileNotFoundError:
            return deleted
        for entry in entries:
            try:
                replaced = datetime.strptime(entry.name.split("-", 1)[0], TRASH_STAMP).replace(
                    tzinfo=timezone.utc).timestamp()
            except ValueError:
                replaced = entry.mtime
            if now - replaced >= self.replaced_retention_s:
                log.info("deleting %s: replaced %.0f s ago, past the retention of %.0f s", entry.path,
                         now - replaced, self.replaced_retention_s)
                self.files.remove_tree(entry.path)
                deleted.append(entry.name)
        return deleted
