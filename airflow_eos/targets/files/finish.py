"""Finishing the file target's decided publications: a window whose commit
died between its decision and its rename is published by whoever comes next
(a later commit, a Clear, the sweep), and one that cannot be published is
never reported as done. A mixin of
:class:`~airflow_eos.targets.files.sink.FileSink`."""

from __future__ import annotations

import logging

from airflow_eos.core.attempt import Attempt
from airflow_eos.core.errors import TargetError
from airflow_eos.core.ledger import WindowRecord, WindowState
from airflow_eos.core.windows import Window
from airflow_eos.targets.files.commit import EXCHANGED, RENAMED
from airflow_eos.targets.files.fields import FileSinkFields

log = logging.getLogger(__name__)


class FileFinish(FileSinkFields):
    """``committed_rerun``, ``require_published`` and ``finish_pending`` of
    :class:`~airflow_eos.targets.files.sink.FileSink`."""

    def committed_rerun(self, window: Window) -> WindowRecord | None:
        """As :meth:`Sink.committed_rerun`, once the window's files are in
        place: a window decided by a commit that died before its rename is
        published here first (a Clear finishes it, as its commit did before).
        If it cannot be published, TargetError: the rerun fails at once,
        saying why, instead of staging a window whose commit would skip it."""
        if not self.replaces_committed:
            with self.ledger.connect() as conn:
                record = self.ledger.window(conn, window)
            if record is not None and record.state == WindowState.COMMITTED:
                self.finish_pending()
                self.require_published(window)
        return super().committed_rerun(window)

    def require_published(self, window: Window) -> None:
        """Raise TargetError if the window's committed attempt is decided and
        not published (after one more try to publish it): committed in the
        ledger with its offsets, invisible to readers. Nothing otherwise."""
        with self.ledger.connect() as conn:
            row = conn.execute(
                "SELECT a.pipeline, a.window_start, w.window_end, a.epoch, a.staging_table FROM eos.windows w"
                " JOIN eos.publications p ON p.pipeline = w.pipeline AND p.window_start = w.window_start"
                " AND p.epoch = w.committed_epoch JOIN eos.attempts a ON a.pipeline = p.pipeline"
                " AND a.window_start = p.window_start AND a.epoch = p.epoch"
                " WHERE w.pipeline = %s AND w.window_start = %s AND w.state = 'committed' AND p.state = 'decided'",
                (window.pipeline, window.start)).fetchone()
        if row is None:
            return
        pending = Attempt(*row)
        try:
            self.publish(pending)
        except Exception as exc:
            raise TargetError(f"window {window} is decided, not published: {pending} is committed in the ledger "
                              f"(the pipeline's offsets advanced past it) but its files are not in "
                              f"{self.partition_dir(pending)}. {exc}") from exc

    def pending_publications(self) -> list[Attempt]:
        """The committed attempts of this root's decided, unpublished windows
        (what :meth:`finish_pending`, and so the sweep, publishes), oldest
        decision first."""
        with self.ledger.connect() as conn, conn.transaction():
            rows = conn.execute(
                "SELECT a.pipeline, a.window_start, w.window_end, a.epoch, a.staging_table FROM eos.publications p"
                " JOIN eos.attempts a USING (pipeline, window_start, epoch) JOIN eos.windows w USING (pipeline,"
                " window_start) WHERE p.target = ANY(%s) AND p.state = 'decided' ORDER BY p.decided_at",
                (self.target_ids,)).fetchall()
        return [Attempt(*row) for row in rows]

    def finish_pending(self) -> list[Attempt]:
        """Publish every decided, unpublished window of this root (a commit
        that died after its decision). Returns those finished; one that cannot
        be finished now is logged loudly and left for the next commit, its own
        retry or the sweep."""
        finished = []
        for pending in self.pending_publications():
            try:
                how = self.publish(pending)
            except Exception as exc:  # noqa: BLE001 - one stuck window must not stop the others
                log.error("%s is decided, not published (committed in the ledger, invisible to readers): %s",
                          pending, exc)
                continue
            if how in (RENAMED, EXCHANGED):
                log.info("%s: finished its publication (%s), decided by an earlier commit", pending, how)
                finished.append(pending)
        return finished
