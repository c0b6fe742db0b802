"""FileSink: windows published as Parquet partition directories by the
temp-directory-then-rename two-phase commit.

A file system has no transactions, so the ledger (schema ``eos``) stays in
PostgreSQL and the commit is a classic two-phase commit: one ledger transaction
is the *decision*; moving the files into place follows it, is idempotent, and is
finished by whoever comes next. In the order of a window's life:

- **begin** opens an attempt (new epoch: older attempts are fenced) and creates
  its staging directory ``<root>/_eos_staging/<attempt.staging>/`` (see
  :mod:`~airflow_eos.targets.files.writer` for what is inside).
- **write** (Spark tasks, or :class:`~airflow_eos.targets.files.writer.FileWriter`)
  puts Parquet files into the staging's ``data/``, dead letters into
  ``dead_letters/``; a file appears under its name only once complete.
- **checkpoint + seal** (the job commit, one ledger transaction): the seal
  reads every staged file's Parquet footer, checks each checkpointed chunk holds
  what its task counted, moves exactly the checkpointed files into ``publish/``
  and ``sealed_dead_letters/`` (where no writer writes), and records the
  manifest (file, size, rows) in ``eos.staged_files``.
- **prepare** (the sensor): every manifest file is there with its size and rows.
- **commit**: the decision, then the publication (see :meth:`FileSink.commit`).
- **abort** marks the attempt aborted, then deletes its staging directory.

Readers (Spark, Hive, PyArrow, DuckDB) skip names that start with ``_`` or
``.``: ``_eos_staging``, ``_eos_trash`` and each partition's ``_eos_commit.json``
are invisible to them.
"""

from __future__ import annotations

import getpass
import json
import logging
import os
import secrets
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING, Any

from airflow_eos.core import attempt as attempts
from airflow_eos.core.attempt import ABORTED, COMMITTED, Attempt, Checkpoint, StagedChunk
from airflow_eos.core.errors import InvalidCheckpoint, NotPrepared, TargetError
from airflow_eos.core.faults import fault_point
from airflow_eos.core.ledger import Ledger
from airflow_eos.core.sink import ALREADY_COMMITTED, PUBLISHED, REPLACED, SKIPPED, CommitResult, Sink
from airflow_eos.core.windows import Window, to_utc
from airflow_eos.targets.files import fs
from airflow_eos.targets.files.layout import DEFAULT_LAYOUT, Layout
from airflow_eos.targets.files.writer import (
    COMMIT_FILE,
    DEAD_LETTER_COLUMNS,
    KINDS,
    PUBLISH,
    STAGING_DIR,
    STAGING_SUBDIRS,
    TRASH_DIR,
    FileWriter,
    StagedFile,
    counts,
    file_digest,
    read_footer,
    scan,
    visible,
)

if TYPE_CHECKING:
    import psycopg
    from psycopg import sql

log = logging.getLogger(__name__)

COMMIT_FORMAT = "airflow-eos/files/1"
LINEAGE_COLUMNS = ("eos_topic", "eos_partition", "eos_offset")
# publication states (eos.publications, migration 7)
DECIDED = "decided"
PUBLISHED_STATE = "published"
SUPERSEDED = "superseded"

# How the files of a decided window reached their place (FileSink.publish).
RENAMED = "renamed"  # the staging became the partition directory
EXCHANGED = "exchanged"  # the staging was swapped with the window's older partition (replace)
COMPLETE = "complete"  # the partition already held this attempt: nothing to do
SUPERSEDED_HOW = "superseded"  # another attempt committed the window since: this one is never published


@dataclass(frozen=True)
class ManifestFile:
    path: str  # relative to the staging directory: publish/<name> or sealed_dead_letters/<name>
    kind: str
    chunk: int
    bytes: int
    rows: int

    @property
    def name(self) -> str:
        return os.path.basename(self.path)


@dataclass(frozen=True)
class FileSink(Sink):
    """The runtime sink of a bound :class:`~airflow_eos.targets.files.FileTarget`."""

    root: str
    ledger_url: str = field(repr=False)
    layout: str = DEFAULT_LAYOUT
    on_committed: str = "skip"
    format: str = "parquet"

    @property
    def ledger(self) -> Ledger:  # type: ignore[override]
        return Ledger(self.ledger_url)

    @property
    def target_id(self) -> str:
        return "files:" + self.root

    # ------------------------------------------------------------------ where things are

    @property
    def staging_root(self) -> str:
        return os.path.join(self.root, STAGING_DIR)

    @property
    def trash_root(self) -> str:
        return os.path.join(self.root, TRASH_DIR)

    def staging_dir(self, attempt: Attempt) -> str:
        return os.path.join(self.staging_root, attempt.staging)

    def partition_path(self, attempt: Attempt | Window) -> str:
        """The window's partition directory, relative to the root."""
        if isinstance(attempt, Attempt):
            attempt = attempt.window
        return Layout(self.layout).render(attempt.pipeline, attempt.start, attempt.end)

    def partition_dir(self, attempt: Attempt | Window) -> str:
        return os.path.join(self.root, self.partition_path(attempt))

    def _check_root(self) -> None:
        """The root must be a writable directory: a clear error otherwise,
        before an attempt is opened."""
        user = _user()
        if not os.path.exists(self.root):
            raise TargetError(f"the root directory {self.root} of the file target does not exist: create it "
                              f"(mkdir -p {self.root}) where the tasks and the Spark executors see it, writable by "
                              f"{user}, or correct FileTarget(path=...)")
        if not os.path.isdir(self.root):
            raise TargetError(f"the root {self.root} of the file target is not a directory: give a directory")
        for path in (self.root, self.staging_root):
            if os.path.isdir(path) and not os.access(path, os.W_OK | os.X_OK):
                raise TargetError(f"{path} is not writable by {user}: grant it write access (chown/chmod) for the "
                                  "tasks and the Spark executors, or choose another FileTarget(path=...)")

    def _unwritable(self, path: str, exc: OSError) -> TargetError:
        return TargetError(f"cannot create {path}: {exc.strerror or exc}. The root {self.root} of the file target must "
                           f"be writable by {_user()} (the tasks and the Spark executors): grant it write access, "
                           "free space on its file system, or choose another FileTarget(path=...); no attempt was "
                           "opened")

    # ------------------------------------------------------------------ begin

    def begin(self, window: Window) -> Attempt:
        """Open an attempt and create its empty staging directory in the
        attempt's transaction: a root that cannot take it fails here, before
        any Spark work, leaving no attempt behind."""
        self._check_root()
        try:
            os.makedirs(self.staging_root, exist_ok=True)
        except OSError as exc:
            raise self._unwritable(self.staging_root, exc) from exc
        with self.ledger.connect() as conn, conn.transaction():
            attempt = attempts.open_attempt(conn, window)
            staging = self.staging_dir(attempt)
            try:
                # A directory of this name can only be left by a begin whose
                # transaction rolled back (the epoch was given again): nobody wrote to it.
                fs.remove_tree(staging)
                os.mkdir(staging)
                for sub in STAGING_SUBDIRS:
                    os.mkdir(os.path.join(staging, sub))
                fs.fsync_dir(self.staging_root)
            except OSError as exc:
                raise self._unwritable(staging, exc) from exc
        log.info("%s: staging directory %s created", attempt, staging)
        return attempt

    # ------------------------------------------------------------------ stage

    def writer(self, attempt: Attempt) -> FileWriter:
        writer = FileWriter(self.staging_dir(attempt), self.root, Layout(self.layout).keys)
        if not os.path.isdir(writer.data_dir):
            raise TargetError(f"staging directory {writer.staging_dir} of {attempt} does not exist: the attempt was "
                              "aborted or committed")
        return writer

    def staged_chunks(self, attempt: Attempt) -> list[StagedChunk]:
        """The chunks in the staging's ``data/`` and ``dead_letters/``, one per
        file, counted from the Parquet footers: what the Spark job passes to
        :meth:`checkpoint` after its own Parquet writer committed its job into
        ``writer(attempt).data_dir`` (and its dead letters into
        ``dead_letter_dir``)."""
        staging = self.staging_dir(attempt)
        files = scan(staging, [KINDS[k][0] for k in KINDS])
        if files is None:
            raise TargetError(f"staging directory {staging} of {attempt} does not exist: the attempt was aborted "
                              "or committed")
        broken = [f.path for f in files if f.rows is None]
        if broken:
            raise TargetError(f"{attempt}: staged file(s) without a readable Parquet footer in {staging}: "
                              f"{', '.join(broken)}")
        chunks = []
        for chunk, (rows, dead) in sorted(counts(files).items()):
            paths = [os.path.join(staging, f.path) for f in files if f.chunk == chunk]
            chunks.append(StagedChunk(chunk, rows, dead, file_digest(sorted(paths))))
        return chunks

    def clear_writes(self, attempt: Attempt) -> int:
        """Delete what earlier runs of the attempt's stage job left in the
        writers' folders (``data/``, ``dead_letters/``), before a new run
        writes: :meth:`staged_chunks` counts every file there. What a
        checkpoint sealed is kept (a new checkpoint's seal sorts it). Returns
        the files deleted."""
        staging = self.staging_dir(attempt)
        files = scan(staging, [KINDS[k][0] for k in KINDS])
        if files is None:
            raise TargetError(f"staging directory {staging} of {attempt} does not exist: the attempt was aborted "
                              "or committed")
        for f in files:
            try:
                os.unlink(os.path.join(staging, f.path))
            except FileNotFoundError:
                pass
        for k in KINDS:
            for entry in os.scandir(os.path.join(staging, KINDS[k][0])):
                if entry.is_dir(follow_symlinks=False):  # e.g. Spark's _temporary of a run that died
                    fs.remove_tree(entry.path)
        return len(files)

    def count_staged(self, attempt: Attempt) -> dict[int, tuple[int, int]] | None:
        files = scan(self.staging_dir(attempt))
        return None if files is None else counts(files)

    # ------------------------------------------------------------------ seal (the checkpoint's transaction)

    def seal(self, conn: psycopg.Connection, attempt: Attempt, checkpoint: Checkpoint) -> None:
        """Make the staging's ``publish/`` hold exactly the checkpoint: check
        each checkpointed chunk's files (Parquet footers) hold what its task
        counted, move them out of the writers' folders into the sealed ones
        (files of other chunks go back, for a retried job commit), flush them to
        disk, and record the manifest. A writer still running (a task after its
        job's commit) writes only into ``data/`` and cannot change what is
        sealed; prepare and commit check the manifest, file by file."""
        started = time.monotonic()
        staging = self.staging_dir(attempt)
        files = scan(staging)
        if files is None:
            raise TargetError(f"staging directory {staging} of {attempt} does not exist: the attempt was aborted "
                              "or committed; no checkpoint written")
        listed = {c.chunk for c in checkpoint.chunks}
        kept = [f for f in files if f.chunk in listed]
        problems = [f"{f.path}: no readable Parquet footer" for f in kept if f.rows is None]
        problems += attempts.chunk_problems(checkpoint.chunks, counts(kept), staging)
        if problems:
            raise InvalidCheckpoint(f"{attempt}: the staging does not hold what the write tasks reported, no "
                                    "checkpoint written:\n  " + "\n  ".join(problems))
        schema = self._one_schema(attempt, [f for f in kept if f.kind == "data"])
        self._check_schema(conn, attempt, schema)
        manifest = []
        try:
            for f in files:
                writers_folder, sealed_folder = KINDS[f.kind]
                folder = sealed_folder if f.chunk in listed else writers_folder
                if f.folder != folder:
                    os.rename(os.path.join(staging, f.path), os.path.join(staging, folder, f.name))
                if f.chunk in listed:
                    fs.fsync_file(os.path.join(staging, folder, f.name))
                    manifest.append(ManifestFile(f"{folder}/{f.name}", f.kind, f.chunk, f.bytes, f.rows or 0))
            for folder in STAGING_SUBDIRS:
                fs.fsync_dir(os.path.join(staging, folder))
        except FileNotFoundError as exc:
            raise TargetError(f"staging directory {staging} of {attempt} vanished while sealing it: the attempt was "
                              "aborted") from exc
        key = (attempt.pipeline, attempt.window_start, attempt.epoch)
        conn.execute("DELETE FROM eos.staged_files WHERE pipeline = %s AND window_start = %s AND epoch = %s", key)
        with conn.cursor() as cur:
            cur.executemany(
                "INSERT INTO eos.staged_files (pipeline, window_start, epoch, path, kind, chunk, bytes, rows)"
                " VALUES (%s, %s, %s, %s, %s, %s, %s, %s)",
                [(*key, m.path, m.kind, m.chunk, m.bytes, m.rows) for m in manifest])
        log.info("%s: staging sealed in %.2fs: %d file(s) in the manifest, %d left out (not in the checkpoint)",
                 attempt, time.monotonic() - started, len(manifest), len(files) - len(kept))

    @staticmethod
    def _one_schema(attempt: Attempt, data: Sequence[StagedFile]) -> str | None:
        schemas: dict[str, list[str]] = {}
        for f in data:
            schemas.setdefault(f.schema or "", []).append(f.name)
        if len(schemas) > 1:
            described = "\n  ".join(f"{', '.join(names[:3])}{' ...' if len(names) > 3 else ''}:\n    "
                                    + schema.replace("\n", "\n    ") for schema, names in schemas.items())
            raise TargetError(f"{attempt}: the staged Parquet files disagree on the schema; a window's files share "
                              f"one schema (cast the transform's output to fixed types):\n  {described}")
        return next(iter(schemas), None)

    def _check_schema(self, conn: psycopg.Connection, attempt: Attempt, schema: str | None) -> None:
        """The documented rule: every window published into one root has the
        same schema (readers of the directory see one table). The window's
        files are compared with the last window published into the root;
        another schema fails the job commit, naming both, and nothing is
        published."""
        if schema is None:
            return
        row = conn.execute(
            "SELECT pipeline, window_start, schema FROM eos.publications WHERE target = %s AND schema IS NOT NULL"
            " AND state <> 'superseded' AND NOT (pipeline = %s AND window_start = %s)"
            " ORDER BY decided_at DESC LIMIT 1", (self.target_id, attempt.pipeline, attempt.window_start),
        ).fetchone()
        if row is not None and row[2] != schema:
            raise TargetError(
                f"{attempt}: the transform's output schema differs from the one of {self.root}, whose window "
                f"{row[0]} {to_utc(row[1]).isoformat()} was published with:\n    "
                + row[2].replace("\n", "\n    ") + "\n  this window's:\n    " + schema.replace("\n", "\n    ")
                + "\n  a root holds one schema: cast the output to it, or publish into a new root")

    # ------------------------------------------------------------------ prepare

    def staging_problems(self, attempt: Attempt, checkpoint: Checkpoint) -> list[str]:
        with self.ledger.connect() as conn, conn.transaction():
            manifest = self._load_manifest(conn, attempt)
        return self._manifest_problems(attempt, checkpoint, manifest)

    @staticmethod
    def _load_manifest(conn: psycopg.Connection, attempt: Attempt) -> list[ManifestFile]:
        rows = conn.execute(
            "SELECT path, kind, chunk, bytes, rows FROM eos.staged_files WHERE pipeline = %s AND window_start = %s"
            " AND epoch = %s ORDER BY path", (attempt.pipeline, attempt.window_start, attempt.epoch)).fetchall()
        return [ManifestFile(*r) for r in rows]

    def _manifest_problems(self, attempt: Attempt, checkpoint: Checkpoint,
                           manifest: Sequence[ManifestFile]) -> list[str]:
        """Where the sealed staging differs from the manifest (each file there,
        with its size and its footer's rows) or the manifest from the checkpoint."""
        staging = self.staging_dir(attempt)
        if not os.path.isdir(staging):
            return attempts.chunk_problems(checkpoint.chunks, None, staging)
        problems = []
        rows = sum(m.rows for m in manifest if m.kind == "data")
        dead = sum(m.rows for m in manifest if m.kind == "dead_letters")
        if (rows, dead) != (checkpoint.row_count, checkpoint.dead_letter_count):
            problems.append(f"the manifest of {staging} lists {rows} rows and {dead} dead letters, the checkpoint "
                            f"counts {checkpoint.row_count} and {checkpoint.dead_letter_count} (a checkpoint written "
                            "without the file target's seal?)")
        for m in manifest:
            path = os.path.join(staging, m.path)
            try:
                size = os.stat(path).st_size
            except FileNotFoundError:
                problems.append(f"{path} is missing ({m.bytes} bytes, {m.rows} rows in the manifest)")
                continue
            if size != m.bytes:
                problems.append(f"{path} has {size} bytes, the manifest {m.bytes}")
                continue
            try:
                found = read_footer(path)[0]
            except Exception as exc:  # noqa: BLE001 - any unreadable footer is the problem to report
                problems.append(f"{path}: unreadable Parquet footer ({exc})")
                continue
            if found != m.rows:
                problems.append(f"{path} holds {found} rows, the manifest {m.rows}")
        return problems

    # ------------------------------------------------------------------ commit

    def commit(self, attempt: Attempt) -> CommitResult:
        """Commit a prepared attempt: a two-phase commit.

        1. **The decision**, one ledger transaction: lock the window row, then
           the attempt's; this attempt committed before → skip to 2; the window
           committed by another attempt → ``skip`` (this attempt is aborted, its
           staging deleted; reported) or ``replace``; check the attempt is
           prepared and holds the current epoch; check every manifest file is
           in the staging with its size and rows; put the dead letters in
           ``eos.dead_letters``; mark the window committed with the pipeline's
           offsets; record the publication as *decided*. Nothing is visible to
           readers yet, and from here on the window is committed.
        2. **The publication** (:meth:`publish`), idempotent, under the window's
           row lock: write ``_eos_commit.json`` into the staging's ``publish/``,
           then rename it to the window's partition directory (``replace``:
           swap it with the old one in one atomic exchange) and mark the
           publication *published*; then delete what is left of the staging.
        3. Finish any other decided publication of this root (a commit that
           died between 1 and 2).

        A retry after a crash anywhere: before the decision's commit nothing
        happened; after it, 2 finishes the publication — the destination
        complete → nothing to do, the staging complete → rename, neither → a
        loud error naming both. The decision is the commit: only the call that
        made it reports PUBLISHED (REPLACED); a retry or a racing call reports
        ALREADY_COMMITTED, and logs it if it finished the publication.
        """
        started = time.monotonic()
        decided = self.decide(attempt)
        if isinstance(decided, CommitResult):  # skipped
            self._remove_staging(attempt)
            # The attempt that committed the window may be decided and not yet
            # published (its commit died after the decision): a clear's commit
            # is a later commit of the pipeline, and finishes it.
            self.finish_pending()
            return decided
        replaced_rows, replacing, committed_before = decided
        fault_point("commit.after_decision")
        how = self.publish(attempt)
        with self.ledger.connect() as conn, conn.transaction():
            status = attempts.load_status(conn, attempt)
            offsets = attempts.load_offsets(conn, attempt.pipeline)
        # The decision is the commit: the call that made it reports PUBLISHED or
        # REPLACED; every other call (a retry, a racing commit) ALREADY_COMMITTED,
        # also when it is the one that moved the files into place (logged).
        outcome = ALREADY_COMMITTED if committed_before else REPLACED if replacing else PUBLISHED
        if committed_before and how in (RENAMED, EXCHANGED):
            log.info("%s: committed before; this call finished its publication (%s)", attempt, how)
        result = CommitResult(attempt, outcome, status.committed_epoch, status.published_rows,
                              status.dead_letter_rows, replaced_rows, offsets, time.monotonic() - started)
        log.info("%s (%s, %s)", result, how, self.partition_dir(attempt))
        self.finish_pending()
        return result

    def decide(self, attempt: Attempt) -> CommitResult | tuple[int, bool, bool]:
        """Step 1 of :meth:`commit`, the decision. Returns the SKIPPED result,
        or (rows replaced, replacing, committed before)."""
        with self.ledger.connect() as conn, conn.transaction():
            status = attempts.load_status(conn, attempt, lock=True)
            if status.state == COMMITTED:
                replaces = conn.execute(
                    "SELECT replaces FROM eos.publications WHERE pipeline = %s AND window_start = %s AND epoch = %s",
                    (attempt.pipeline, attempt.window_start, attempt.epoch)).fetchone()
                return 0, bool(replaces and replaces[0] is not None), True
            replacing = status.window_state == COMMITTED
            if replacing and self.on_committed == "skip":
                attempts.mark_aborted(conn, attempt, f"window already committed by attempt {status.committed_epoch};"
                                                     " on_committed='skip'")
                result = CommitResult(attempt, SKIPPED, status.committed_epoch, status.published_rows,
                                      status.dead_letter_rows, offsets=attempts.load_offsets(conn, attempt.pipeline))
                log.info("%s", result)
                return result
            attempts.check_committable(attempt, status)
            checkpoint = attempts.load_checkpoint(conn, attempt)
            manifest = self._load_manifest(conn, attempt)
            problems = self._manifest_problems(attempt, checkpoint, manifest)
            if problems:
                raise NotPrepared(f"cannot commit {attempt}: its staging no longer holds what it checkpointed; "
                                  "nothing published, stage the window again:\n  " + "\n  ".join(problems),
                                  missing=problems)
            dead = self._read_dead_letters(attempt, manifest)
            fault_point("commit.before_publish")
            replaced = 0
            if replacing:
                conn.execute("DELETE FROM eos.dead_letters WHERE pipeline = %s AND window_start = %s",
                             (attempt.pipeline, attempt.window_start))
                replaced = status.published_rows or 0
            with conn.cursor() as cur, cur.copy(
                    'COPY eos.dead_letters (pipeline, window_start, epoch, topic, partition, "offset", error, key,'
                    " value) FROM STDIN") as copy:
                for record in dead:
                    copy.write_row((attempt.pipeline, attempt.window_start, attempt.epoch, *record))
            attempts.mark_committed(conn, attempt, checkpoint.row_count, len(dead))
            schema = next((f.schema for f in self._sealed_data(attempt, manifest)), None)
            conn.execute(
                "INSERT INTO eos.publications (pipeline, window_start, epoch, target, location, schema, replaces)"
                " VALUES (%s, %s, %s, %s, %s, %s, %s)",
                (attempt.pipeline, attempt.window_start, attempt.epoch, self.target_id, self.partition_path(attempt),
                 schema, status.committed_epoch if replacing else None))
        log.info("%s: decided (committed in the ledger with its offsets); publishing %s", attempt,
                 self.partition_dir(attempt))
        return replaced, replacing, False

    def _sealed_data(self, attempt: Attempt, manifest: Sequence[ManifestFile]) -> Iterable[StagedFile]:
        for m in manifest:
            if m.kind == "data":
                _, schema = read_footer(os.path.join(self.staging_dir(attempt), m.path))
                yield StagedFile(m.kind, os.path.dirname(m.path), m.name, m.bytes, m.rows, schema)

    def _read_dead_letters(self, attempt: Attempt, manifest: Sequence[ManifestFile]) -> list[tuple]:
        import pyarrow.parquet as pq
        dead = []
        for m in manifest:
            if m.kind != "dead_letters":
                continue
            table = pq.read_table(os.path.join(self.staging_dir(attempt), m.path), columns=list(DEAD_LETTER_COLUMNS))
            for r in table.to_pylist():
                dead.append(tuple(r[c] for c in DEAD_LETTER_COLUMNS))
        return dead

    # ------------------------------------------------------------------ publish (idempotent)

    def publish(self, attempt: Attempt) -> str:
        """Step 2 of :meth:`commit`: move a decided attempt's files into place,
        idempotently, holding the window's row lock (a replace deciding
        meanwhile waits, so two publications of one window never race).
        Returns how (RENAMED, EXCHANGED, COMPLETE, SUPERSEDED_HOW)."""
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
                doc = self._commit_document(conn, attempt, location)
                how = self._move_into_place(attempt, location, doc)
                self._set_publication(conn, attempt, PUBLISHED_STATE)
        if how == SUPERSEDED_HOW:
            log.info("%s: the window was committed by a newer attempt since; this one is never published", attempt)
        elif how == COMPLETE:
            log.info("%s: %s holds it already; nothing to do", attempt, os.path.join(self.root, location))
        self._remove_staging(attempt)
        fs.remove_tree(os.path.join(self.trash_root, attempt.staging))
        return how

    @staticmethod
    def _set_publication(conn: psycopg.Connection, attempt: Attempt, state: str) -> None:
        conn.execute("UPDATE eos.publications SET state = %s, published_at = CASE WHEN %s = 'published' THEN now()"
                     " END WHERE pipeline = %s AND window_start = %s AND epoch = %s",
                     (state, state, attempt.pipeline, attempt.window_start, attempt.epoch))

    def _commit_document(self, conn: psycopg.Connection, attempt: Attempt, location: str) -> dict[str, Any]:
        manifest = [m for m in self._load_manifest(conn, attempt) if m.kind == "data"]
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
        if not os.path.isdir(source) or self._files_missing(source, doc):
            found = (f"holds attempt {there['epoch']}" if there is not None else "does not exist")
            raise TargetError(
                f"cannot publish {attempt}: neither its partition {destination} ({found}) nor its staging {source} "
                f"is complete ({', '.join(self._files_missing(source, doc)) or 'missing'}); the window is committed in "
                "the ledger but its files are lost: restore them, or replace the window by a new run with "
                "on_committed='replace'")
        self.write_commit_file(source, doc)
        if there is None:
            os.makedirs(os.path.dirname(destination), exist_ok=True)
            try:
                fs.rename_noreplace(source, destination)
            except FileExistsError:  # it appeared since read_partition: check it again, never overwrite
                self.read_partition(destination, attempt)
                raise TargetError(f"{destination} appeared while publishing {attempt}; retry the commit") from None
            fs.fsync_dir(os.path.dirname(destination))
            fault_point("commit.after_rename")
            log.info("%s: published %s", attempt, destination)
            return RENAMED
        try:
            fs.rename_exchange(source, destination)
        except fs.RenameUnsupported as exc:
            raise TargetError(
                f"cannot replace {destination} atomically: {exc.strerror}. on_committed='replace' needs Linux's "
                "renameat2(RENAME_EXCHANGE) on a file system that supports it (ext4, xfs, btrfs, tmpfs); two "
                "renames would leave readers a moment without the window, so nothing was changed") from exc
        fs.fsync_dir(os.path.dirname(destination))
        fs.fsync_dir(os.path.dirname(source))
        fault_point("commit.after_rename")
        # The old version now sits where the staging was: out of the way, then deleted.
        os.makedirs(self.trash_root, exist_ok=True)
        old = os.path.join(self.trash_root, attempt.staging)
        fs.remove_tree(old)
        os.rename(source, old)
        log.info("%s: replaced attempt %s's files in %s in one atomic exchange", attempt, there["epoch"],
                 destination)
        return EXCHANGED

    @staticmethod
    def write_commit_file(directory: str, doc: Mapping[str, Any]) -> None:
        path = os.path.join(directory, COMMIT_FILE)
        data = (json.dumps(doc, indent=1, sort_keys=True) + "\n").encode()
        try:
            with open(path, "rb") as f:
                if f.read() == data:
                    return
        except FileNotFoundError:
            pass
        fs.write_atomically(path, data)

    @staticmethod
    def _files_missing(directory: str, doc: Mapping[str, Any]) -> list[str]:
        missing = []
        for f in doc["files"]:
            try:
                size = os.stat(os.path.join(directory, f["name"])).st_size
            except FileNotFoundError:
                missing.append(f["name"])
                continue
            if size != f["bytes"]:
                missing.append(f"{f['name']} ({size} bytes, not {f['bytes']})")
        return missing

    def read_partition(self, directory: str, attempt: Attempt) -> dict[str, Any] | None:
        """The commit manifest of the window's partition directory; None if
        there is no such directory. A directory this pipeline did not write
        for this window (no manifest, or another's) is never touched: a
        TargetError says what is there."""
        if not os.path.lexists(directory):
            return None
        foreign = (f"{directory} exists but was not published by pipeline {attempt.pipeline!r} for window "
                   f"{attempt.window_start.isoformat()}")
        advice = ("it is never overwritten: move it away (or choose another root or layout), then retry the commit; "
                  "the window stays committed in the ledger and is published by that retry")
        if not os.path.isdir(directory) or os.path.islink(directory):
            raise TargetError(f"{foreign}: it is not a directory; {advice}")
        try:
            with open(os.path.join(directory, COMMIT_FILE), "rb") as f:
                doc = json.loads(f.read())
        except FileNotFoundError:
            raise TargetError(f"{foreign}: it has no {COMMIT_FILE}; {advice}") from None
        except ValueError as exc:
            raise TargetError(f"{foreign}: its {COMMIT_FILE} is unreadable ({exc}); {advice}") from None
        if (doc.get("format") != COMMIT_FORMAT or doc.get("pipeline") != attempt.pipeline
                or to_utc(doc.get("window_start")) != attempt.window_start):
            raise TargetError(f"{foreign}: its {COMMIT_FILE} names pipeline {doc.get('pipeline')!r}, window "
                              f"{doc.get('window_start')}; {advice}")
        return doc

    def finish_pending(self) -> list[Attempt]:
        """Publish every decided, unpublished window of this root (a commit
        that died after its decision). Returns those finished; one that cannot
        be finished now is logged loudly and left for the next commit, its own
        retry or the sweep."""
        with self.ledger.connect() as conn, conn.transaction():
            rows = conn.execute(
                "SELECT a.pipeline, a.window_start, w.window_end, a.epoch, a.staging_table FROM eos.publications p"
                " JOIN eos.attempts a USING (pipeline, window_start, epoch) JOIN eos.windows w USING (pipeline,"
                " window_start) WHERE p.target = %s AND p.state = 'decided' ORDER BY p.decided_at",
                (self.target_id,)).fetchall()
        finished = []
        for row in rows:
            pending = Attempt(*row)
            try:
                how = self.publish(pending)
            except Exception as exc:  # noqa: BLE001 - one stuck window must not stop the others
                log.error("%s is committed but not published yet: %s", pending, exc)
                continue
            if how in (RENAMED, EXCHANGED):
                log.info("%s: finished its publication (%s), decided by an earlier commit", pending, how)
                finished.append(pending)
        return finished

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

    # ------------------------------------------------------------------ for verify

    def published_partitions(self, pipeline: str) -> list[tuple[str, dict[str, Any]]]:
        """(directory, commit manifest) of every partition under the root whose
        ``_eos_commit.json`` names ``pipeline``: what a reader of the root
        sees of the pipeline. Hidden directories are skipped as readers skip them."""
        found = []
        for directory, dirs, files in os.walk(self.root):
            dirs[:] = sorted(d for d in dirs if visible(d))
            if COMMIT_FILE in files:
                try:
                    with open(os.path.join(directory, COMMIT_FILE), "rb") as f:
                        doc = json.loads(f.read())
                except (OSError, ValueError):
                    continue
                if doc.get("format") == COMMIT_FORMAT and doc.get("pipeline") == pipeline:
                    found.append((directory, doc))
        return found

    def published_relation(self, conn: psycopg.Connection, pipeline: str,
                           columns: Sequence[str] = ()) -> sql.Composable:
        """A TEMP table, in ``conn``'s session, of every published row of the
        pipeline: ``eos_pipeline``, ``eos_window_start`` (from the partition's
        commit manifest), the lineage ``eos_topic``, ``eos_partition``,
        ``eos_offset`` and ``columns``. It holds what a reader of the root sees:
        every visible Parquet file of every partition directory that says it
        belongs to the pipeline, whether or not the ledger agrees (verify's
        comparison with the ledger is what finds a stray or stale one)."""
        import pyarrow as pa
        import pyarrow.csv as pacsv
        import pyarrow.parquet as pq
        from psycopg import sql
        extra = [c for c in columns if c not in LINEAGE_COLUMNS + ("eos_pipeline", "eos_window_start")]
        wanted = list(LINEAGE_COLUMNS) + extra
        name = f"eos_published_{secrets.token_hex(6)}"
        tables: list[tuple[str, pa.Table]] = []
        for directory, doc in self.published_partitions(pipeline):
            for entry in sorted(os.scandir(directory), key=lambda e: e.name):
                if not visible(entry.name) or not entry.is_file():
                    continue
                names = pq.read_schema(entry.path).names
                absent = [c for c in wanted if c not in names]
                if absent:
                    raise TargetError(f"{entry.path} has no column(s) {absent}: verify needs the lineage columns "
                                      f"{list(LINEAGE_COLUMNS)} (a record-level pipeline) and the columns asked for")
                tables.append((to_utc(doc["window_start"]).isoformat(), pq.read_table(entry.path, columns=wanted)))
        types = {c: _pg_type(next((t.schema.field(c).type for _, t in tables), pa.string())) for c in extra}
        conn.execute(sql.SQL("CREATE TEMP TABLE {} (eos_pipeline text NOT NULL, eos_window_start timestamptz NOT NULL,"
                             " eos_topic text, eos_partition integer, eos_offset bigint{})").format(
            sql.Identifier(name), sql.SQL("").join(sql.SQL(", {} {}").format(sql.Identifier(c), sql.SQL(types[c]))
                                                    for c in extra)))
        with conn.cursor() as cur, cur.copy(sql.SQL("COPY {} FROM STDIN (FORMAT csv)").format(
                sql.Identifier(name))) as copy:
            for window_start, table in tables:
                n = table.num_rows
                arrays = [pa.array([pipeline] * n, pa.string()), pa.array([window_start] * n, pa.string())]
                arrays += [_csv_ready(table.column(c)) for c in wanted]
                out = pa.BufferOutputStream()
                pacsv.write_csv(pa.Table.from_arrays(arrays, names=["p", "w", *wanted]), out,
                                pacsv.WriteOptions(include_header=False))
                copy.write(out.getvalue())
        return sql.Identifier(name)

    # ------------------------------------------------------------------ for the Spark stage job

    def spark_output(self, attempt: Attempt):  # -> core.sink.SparkOutput
        """The stage job writes with Spark's own Parquet writer (JVM side) into
        the staging's writers' folders: rows into ``data/``, dead letters into
        ``dead_letters/``; the layout's keys are dropped from the rows (the
        partition directory gives them to readers). Then it checkpoints with
        :meth:`staged_chunks`, whose seal keeps exactly those files."""
        from airflow_eos.core.sink import SparkOutput

        writer = self.writer(attempt)
        return SparkOutput("file://" + writer.data_dir, "file://" + writer.dead_letter_dir, writer.reserved)


def _pg_type(t) -> str:
    import pyarrow as pa
    if pa.types.is_integer(t):
        return "bigint"
    if pa.types.is_floating(t):
        return "double precision"
    if pa.types.is_decimal(t):
        return "numeric"
    if pa.types.is_boolean(t):
        return "boolean"
    if pa.types.is_timestamp(t):
        return "timestamp"  # UTC wall clock (see _csv_ready): no dependence on the session's time zone
    if pa.types.is_date(t):
        return "date"
    return "text"


def _csv_ready(column):
    import pyarrow as pa
    t = column.type
    if pa.types.is_dictionary(t):
        column, t = column.cast(t.value_type), t.value_type
    if pa.types.is_timestamp(t) and t.tz is not None:
        return column.cast(pa.timestamp(t.unit, tz="UTC")).cast(pa.timestamp(t.unit))
    if (pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_decimal(t) or pa.types.is_boolean(t)
            or pa.types.is_timestamp(t) or pa.types.is_date(t) or pa.types.is_string(t)
            or pa.types.is_large_string(t)):
        return column
    return pa.array([None if v is None else str(v) for v in column.to_pylist()], pa.string())


def _user() -> str:
    try:
        return f"user {getpass.getuser()!r} (uid {os.getuid()})"
    except Exception:  # noqa: BLE001 - only for a message
        return f"uid {os.getuid()}"
