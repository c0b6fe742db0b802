"""The file target's part of the commit protocol (:mod:`airflow_eos.core.commit`):
what its decision records (dead letters, the publication as *decided*) and
the publication after it (moving the files into place, idempotent, finished
by whoever comes next). A mixin of :class:`~airflow_eos.targets.files.sink.FileSink`."""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from airflow_eos.core import commit as protocol
from airflow_eos.core.attempt import Attempt, AttemptStatus, Checkpoint
from airflow_eos.core.columns import DEAD_LETTER_COLUMNS
from airflow_eos.core.commit import CommitResult, Published, Settlement
from airflow_eos.core.errors import TargetError
from airflow_eos.core.faults import fault_point
from airflow_eos.core.publication import COMPLETE, DECIDED, PUBLISHED_STATE, SUPERSEDED, SUPERSEDED_HOW  # noqa: F401
from airflow_eos.core.staged_files import ManifestFile, dead_letter_records, load_manifest
from airflow_eos.core.windows import to_utc
from airflow_eos.targets.files import fs
from airflow_eos.targets.files.fields import FileSinkFields
from airflow_eos.targets.files.writer import COMMIT_FILE, PUBLISH, StagedFile, read_footer

if TYPE_CHECKING:
    import psycopg

log = logging.getLogger(__name__)

COMMIT_FORMAT = "airflow-eos/files/1"

# How the files of a decided window reached their place (FileSink.publish; COMPLETE and
# SUPERSEDED_HOW are core/publication.py's).
RENAMED = "renamed"  # the staging became the partition directory
EXCHANGED = "exchanged"  # the staging was swapped with the window's older partition (replace)


class FileCommit(FileSinkFields):
    """The committer hooks of :class:`~airflow_eos.targets.files.sink.FileSink`:
    its part of the decision, and the publication after it."""

    # ------------------------------------------------------------------ commit

    staging_in_ledger = False  # a directory: deleted after the transaction that ends its attempt
    fresh_publications = frozenset({RENAMED, EXCHANGED})

    def decide(self, attempt: Attempt) -> CommitResult:
        """The decision alone (the core's :func:`~airflow_eos.core.commit.decide`):
        what a commit task that dies right after it leaves behind."""
        return protocol.decide(self, attempt)

    def commit_problems(self, conn: psycopg.Connection, attempt: Attempt, checkpoint: Checkpoint) -> list[str]:
        """Every manifest file must be in the staging with its size and rows."""
        return self._manifest_problems(attempt, checkpoint, load_manifest(conn, attempt))

    def publish_in_decision(self, conn: psycopg.Connection, attempt: Attempt, checkpoint: Checkpoint,
                            replacing: AttemptStatus | None, settlement: Settlement) -> Published:
        """The file target's part of the decision (the protocol is
        :mod:`airflow_eos.core.commit`): the window's partition directory must
        be free (or, replacing, hold this pipeline's older version); the dead
        letters go into ``eos.dead_letters`` (a replace deletes the window's
        older ones); the publication is recorded as *decided*. Nothing is
        visible to readers yet: :meth:`after_decision` moves the files into
        place once the decision is committed."""
        manifest = load_manifest(conn, attempt)
        self._check_destination(attempt, replacing is not None)
        dead = self._read_dead_letters(attempt, manifest)
        fault_point("commit.before_publish")
        self.record_dead_letters(conn, attempt, dead, replacing is not None)
        schema = next((f.schema for f in self._sealed_data(attempt, manifest)), None)
        self.record_decision(conn, attempt, self.partition_path(attempt), schema,
                             replacing.committed_epoch if replacing is not None else None)
        replaced = (replacing.published_rows or 0) if replacing is not None else 0
        return Published(checkpoint.row_count, len(dead), replaced)

    def discard(self, attempt: Attempt, conn: psycopg.Connection | None = None) -> None:
        """Delete the attempt's staging directory (after its attempt ended in the ledger)."""
        self._remove_staging(attempt)

    def publication_place(self, attempt: Attempt) -> str:
        return self.partition_dir(attempt)

    def _check_destination(self, attempt: Attempt, replacing: bool) -> None:
        """Before the decision: the window's partition directory must be free
        (a replace: hold this pipeline's version of the window). A window
        decided into a place it cannot be renamed to would be committed in the
        ledger, its offsets advanced, and invisible to readers; refused now,
        nothing is decided (TargetError, saying what is there and what to do)."""
        destination = self.partition_dir(attempt)
        there = self.read_partition(destination, attempt, decided=False)
        if there is not None and not replacing:
            raise TargetError(
                f"cannot commit {attempt}: {destination} already holds attempt {there['epoch']} of the window, but the "
                "ledger has the window uncommitted (a copy of the root, or a ledger restored from an older backup?); "
                "it is never overwritten. Nothing was decided: the window is not committed and the pipeline's "
                "offsets did not move. Move the directory away, then retry the commit (or clear the run)")

    def _sealed_data(self, attempt: Attempt, manifest: Sequence[ManifestFile]) -> Iterable[StagedFile]:
        for m in manifest:
            if m.kind == "data":
                _, schema = read_footer(self.files, os.path.join(self.staging_dir(attempt), m.path))
                yield StagedFile(m.kind, os.path.dirname(m.path), m.name, m.bytes, m.rows, schema)

    def _read_dead_letters(self, attempt: Attempt, manifest: Sequence[ManifestFile]) -> list[tuple]:
        import pyarrow.parquet as pq
        dead = []
        for m in manifest:
            if m.kind == "dead_letters":
                with self.files.open_input(os.path.join(self.staging_dir(attempt), m.path)) as f:
                    dead += dead_letter_records(pq.read_table(f, columns=list(DEAD_LETTER_COLUMNS)))
        return dead

    # ------------------------------------------------------------------ publish (idempotent)

    def publish_decided(self, conn: psycopg.Connection, attempt: Attempt, location: str) -> str:
        """Move a decided attempt's files into place (core/publication.py's
        ``publish`` holds the window's row lock): RENAMED or EXCHANGED, or
        COMPLETE when the partition holds it already."""
        return self._move_into_place(attempt, location, self._commit_document(conn, attempt, location))

    def after_publication(self, attempt: Attempt, how: str) -> None:
        """The replaced version to the trash, the staging deleted, expired trash deleted."""
        self.retire_old_version(attempt)
        self._remove_staging(attempt)
        self.delete_expired_trash()

    def _commit_document(self, conn: psycopg.Connection, attempt: Attempt, location: str) -> dict[str, Any]:
        manifest = [m for m in load_manifest(conn, attempt) if m.kind == "data"]
        plan = self.ledger.load_plan(conn, attempt.window)
        dead = conn.execute("SELECT dead_letter_rows FROM eos.windows WHERE pipeline = %s AND window_start = %s",
                            (attempt.pipeline, attempt.window_start)).fetchone()[0]
        return {
            "format": COMMIT_FORMAT, "pipeline": attempt.pipeline,
            "window_start": attempt.window_start.isoformat(), "window_end": attempt.window_end.isoformat(),
            "epoch": attempt.epoch, "partition": location,
            "files": [{"name": m.name, "bytes": m.bytes, "rows": m.rows} for m in manifest],
            "rows": sum(m.rows for m in manifest), "dead_letters": dead,
            "offsets": [{"topic": r.topic, "partition": r.partition, "start_offset": r.start_offset,
                         "end_offset": r.end_offset} for r in (plan.ranges if plan else ())],
        }

    def _move_into_place(self, attempt: Attempt, location: str, doc: Mapping[str, Any]) -> str:
        """The file operations of a publication, each safe to repeat after a
        crash before, between or after them."""
        source = os.path.join(self.staging_dir(attempt), PUBLISH)
        destination = os.path.join(self.root, location)
        there = self.read_partition(destination, attempt)
        if there is not None and there["epoch"] > attempt.epoch:
            raise TargetError(f"{destination} holds attempt {there['epoch']} of the window, newer than {attempt}, "
                              "which the ledger says is the committed one; it is left as it is")
        if there is not None and there["epoch"] == attempt.epoch:
            missing = self._files_missing(destination, there)
            if missing:
                raise TargetError(f"{destination} was published by {attempt} but lacks {', '.join(missing)}: "
                                  "someone removed published files; replace the window (on_committed='replace')")
            return COMPLETE
        if not self.files.is_dir(source) or self._files_missing(source, doc):
            found = (f"holds attempt {there['epoch']}" if there is not None else "does not exist")
            raise TargetError(
                f"cannot publish {attempt}: neither its partition {destination} ({found}) nor its staging {source} "
                f"is complete ({', '.join(self._files_missing(source, doc)) or 'missing'}); the window is committed in "
                "the ledger but its files are lost: restore them, or replace the window by a new run with "
                "on_committed='replace'")
        self.write_commit_file(source, doc)
        if there is None:
            self.files.makedirs(os.path.dirname(destination))
            try:
                self.files.rename_noreplace(source, destination)
            except FileExistsError:  # it appeared since read_partition: check it again, never overwrite
                self.read_partition(destination, attempt)
                raise TargetError(f"{destination} appeared while publishing {attempt}; retry the commit") from None
            self.files.sync_dir(os.path.dirname(destination))
            fault_point("commit.after_rename")
            log.info("%s: published %s", attempt, destination)
            return RENAMED
        try:
            self.files.replace(source, destination, self.retired_path(self.staging_dir(attempt)))
        except fs.RenameUnsupported as exc:
            raise TargetError(
                f"cannot replace {destination} atomically: {exc.strerror}. on_committed='replace' needs Linux's "
                "renameat2(RENAME_EXCHANGE) on a file system that supports it (ext4, xfs, btrfs, tmpfs); two "
                "renames would leave readers a moment without the window, so nothing was changed") from exc
        fault_point("commit.after_rename")
        log.info("%s: replaced attempt %s's files in %s (its old version kept in %s for %.0f s)", attempt,
                 there["epoch"], destination, self.trash_root, self.replaced_retention_s)
        return EXCHANGED

    def write_commit_file(self, directory: str, doc: Mapping[str, Any]) -> None:
        path = os.path.join(directory, COMMIT_FILE)
        data = (json.dumps(doc, indent=1, sort_keys=True) + "\n").encode()
        try:
            if self.files.read_bytes(path) == data:
                return
        except FileNotFoundError:
            pass
        self.files.write_atomically(path, data)

    def _files_missing(self, directory: str, doc: Mapping[str, Any]) -> list[str]:
        missing = []
        for f in doc["files"]:
            try:
                size = self.files.size(os.path.join(directory, f["name"]))
            except FileNotFoundError:
                missing.append(f["name"])
                continue
            if size != f["bytes"]:
                missing.append(f"{f['name']} ({size} bytes, not {f['bytes']})")
        return missing

    def read_partition(self, directory: str, attempt: Attempt, *, decided: bool = True) -> dict[str, Any] | None:
        """The commit manifest of the window's partition directory; None if
        there is no such directory. A directory this pipeline did not write
        for this window (no manifest, or another's) is never touched: a
        TargetError says what is there, and (``decided``: the window is
        committed in the ledger already, or not yet) what that means."""
        if not self.files.lexists(directory):
            return None
        foreign = (f"{directory} exists but was not published by pipeline {attempt.pipeline!r} for window "
                   f"{attempt.window_start.isoformat()}")
        if decided:
            advice = ("it is never overwritten. The window is decided (committed in the ledger, the pipeline's "
                      "offsets advanced) but NOT published: readers do not see it, and the commit and every rerun of "
                      "the window fail until it is. Move the directory away (or choose another root or layout), "
                      "then retry the commit task or clear the run: that publishes the window")
        else:
            advice = ("it is never overwritten. Nothing was decided: the window is not committed and the pipeline's "
                      "offsets did not move. Move the directory away (or choose another root or layout), then retry "
                      "the commit task (or clear the run)")
        if not self.files.is_dir(directory) or self.files.is_link(directory):
            raise TargetError(f"{foreign}: it is not a directory; {advice}")
        try:
            doc = json.loads(self.files.read_bytes(os.path.join(directory, COMMIT_FILE)))
        except FileNotFoundError:
            raise TargetError(f"{foreign}: it has no {COMMIT_FILE}; {advice}") from None
        except ValueError as exc:
            raise TargetError(f"{foreign}: its {COMMIT_FILE} is unreadable ({exc}); {advice}") from None
        if (doc.get("format") != COMMIT_FORMAT or doc.get("pipeline") != attempt.pipeline
                or to_utc(doc.get("window_start")) != attempt.window_start):
            raise TargetError(f"{foreign}: its {COMMIT_FILE} names pipeline {doc.get('pipeline')!r}, window "
                              f"{doc.get('window_start')}; {advice}")
        return doc
