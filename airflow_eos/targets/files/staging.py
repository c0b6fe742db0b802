"""The file target's staging: where things are, begin, the writers' folders,
the seal (the checkpoint's transaction) and prepare's check of the manifest.
A mixin of :class:`~airflow_eos.targets.files.sink.FileSink` (see there for a
window's life)."""

from __future__ import annotations

import getpass
import logging
import os
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

from airflow_eos.core import attempt as attempts
from airflow_eos.core.attempt import Attempt, Checkpoint, StagedChunk
from airflow_eos.core.errors import InvalidCheckpoint, TargetError
from airflow_eos.core.staged_files import ManifestFile, load_manifest, record_manifest
from airflow_eos.core.windows import Window, to_utc
from airflow_eos.targets.files.fields import FileSinkFields
from airflow_eos.targets.files.identity import ROOT_CLAIM, RootClaim, claim_root, ledger_identity
from airflow_eos.targets.files.layout import Layout
from airflow_eos.targets.files.writer import (
    KINDS,
    STAGING_DIR,
    STAGING_SUBDIRS,
    TRASH_DIR,
    FileWriter,
    StagedFile,
    counts,
    file_digest,
    read_footer,
    scan,
)

if TYPE_CHECKING:
    import psycopg

log = logging.getLogger(__name__)


class FileStaging(FileSinkFields):
    """Staging of :class:`~airflow_eos.targets.files.sink.FileSink`: the
    directories of an attempt, its writers, the seal and prepare's check."""

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
        if not self.files.exists(self.root):
            raise TargetError(f"the root directory {self.root} of the file target does not exist: create it "
                              f"(mkdir -p {self.root}) where the tasks and the Spark executors see it, writable by "
                              f"{user}, or correct FileTarget(path=...)")
        if not self.files.is_dir(self.root):
            raise TargetError(f"the root {self.root} of the file target is not a directory: give a directory")
        for path in (self.root, self.staging_root):
            if self.files.is_dir(path) and not self.files.writable(path):
                raise TargetError(f"{path} is not writable by {user}: grant it write access (chown/chmod) for the "
                                  "tasks and the Spark executors, or choose another FileTarget(path=...)")

    def _claim_root(self, window: Window) -> None:
        """The root's claim (``_eos_root.json``, see identity.py) must name this
        ledger, and this pipeline unless the layout tells pipelines apart; the
        first begin into a root records it. TargetError otherwise, before an
        attempt is opened."""
        with self.ledger.connect() as conn:
            ledger, where = ledger_identity(conn)
        exclusive = "{pipeline}" not in self.layout
        try:
            claim_root(self.files, self.root,
                       RootClaim(ledger, where, window.pipeline if exclusive else None, self.layout))
        except OSError as exc:
            raise self._unwritable(os.path.join(self.root, ROOT_CLAIM), exc) from exc

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
        self._claim_root(window)
        try:
            self.files.makedirs(self.staging_root)
        except OSError as exc:
            raise self._unwritable(self.staging_root, exc) from exc
        with self.ledger.connect() as conn, conn.transaction():
            attempt = attempts.open_attempt(conn, window)
            staging = self.staging_dir(attempt)
            try:
                # A directory of this name can only be left by a begin whose
                # transaction rolled back (the epoch was given again): nobody wrote to it.
                self.files.remove_tree(staging)
                self.files.mkdir(staging)
                for sub in STAGING_SUBDIRS:
                    self.files.mkdir(os.path.join(staging, sub))
                self.files.sync_dir(self.staging_root)
            except OSError as exc:
                raise self._unwritable(staging, exc) from exc
        log.info("%s: staging directory %s created", attempt, staging)
        return attempt

    # ------------------------------------------------------------------ stage

    def writer(self, attempt: Attempt) -> FileWriter:
        writer = FileWriter(self.staging_dir(attempt), self.root, Layout(self.layout).keys)
        if not self.files.is_dir(writer.data_dir):
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
        files = scan(self.files, staging, [KINDS[k][0] for k in KINDS])
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
            chunks.append(StagedChunk(chunk, rows, dead, file_digest(self.files, sorted(paths))))
        return chunks

    def clear_writes(self, attempt: Attempt) -> int:
        """Delete what earlier runs of the attempt's stage job left in the
        writers' folders (``data/``, ``dead_letters/``), before a new run
        writes: :meth:`staged_chunks` counts every file there. What a
        checkpoint sealed is kept (a new checkpoint's seal sorts it). Returns
        the files deleted."""
        staging = self.staging_dir(attempt)
        files = scan(self.files, staging, [KINDS[k][0] for k in KINDS])
        if files is None:
            raise TargetError(f"staging directory {staging} of {attempt} does not exist: the attempt was aborted "
                              "or committed")
        for f in files:
            try:
                self.files.unlink(os.path.join(staging, f.path))
            except FileNotFoundError:
                pass
        for k in KINDS:
            for entry in self.files.entries(os.path.join(staging, KINDS[k][0])):
                if entry.is_dir:  # e.g. Spark's _temporary of a run that died
                    self.files.remove_tree(entry.path)
        return len(files)

    def count_staged(self, attempt: Attempt) -> dict[int, tuple[int, int]] | None:
        files = scan(self.files, self.staging_dir(attempt))
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
        files = scan(self.files, staging)
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
                    self.files.rename(os.path.join(staging, f.path), os.path.join(staging, folder, f.name))
                if f.chunk in listed:
                    self.files.sync_file(os.path.join(staging, folder, f.name))
                    manifest.append(ManifestFile(f"{folder}/{f.name}", f.kind, f.chunk, f.bytes, f.rows or 0))
            for folder in STAGING_SUBDIRS:
                self.files.sync_dir(os.path.join(staging, folder))
        except FileNotFoundError as exc:
            raise TargetError(f"staging directory {staging} of {attempt} vanished while sealing it: the attempt was "
                              "aborted") from exc
        record_manifest(conn, attempt, manifest)
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
            "SELECT pipeline, window_start, schema FROM eos.publications WHERE target = ANY(%s) AND schema IS NOT NULL"
            " AND state <> 'superseded' AND NOT (pipeline = %s AND window_start = %s)"
            " ORDER BY decided_at DESC LIMIT 1", (self.target_ids, attempt.pipeline, attempt.window_start),
        ).fetchone()
        if row is not None and row[2] != schema:
            changes = "; ".join(schema_changes(row[2], schema)) or "the columns' order or nested fields"
            raise TargetError(
                f"{attempt}: the transform's output schema differs from the one of {self.root}: {changes}. Its "
                f"window {row[0]} {to_utc(row[1]).isoformat()} was published with:\n    "
                + row[2].replace("\n", "\n    ") + "\n  this window's:\n    " + schema.replace("\n", "\n    ")
                + "\n  a root holds one schema, so nothing of this window is published: cast the transform's output "
                "to the published schema (or publish into a new root) and rerun the window")

    # ------------------------------------------------------------------ prepare

    def staging_problems(self, attempt: Attempt, checkpoint: Checkpoint) -> list[str]:
        with self.ledger.connect() as conn, conn.transaction():
            manifest = load_manifest(conn, attempt)
        return self._manifest_problems(attempt, checkpoint, manifest)

    def _manifest_problems(self, attempt: Attempt, checkpoint: Checkpoint,
                           manifest: Sequence[ManifestFile]) -> list[str]:
        """Where the sealed staging differs from the manifest (each file there,
        with its size and its footer's rows) or the manifest from the checkpoint."""
        staging = self.staging_dir(attempt)
        if not self.files.is_dir(staging):
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
                size = self.files.size(path)
            except FileNotFoundError:
                problems.append(f"{path} is missing ({m.bytes} bytes, {m.rows} rows in the manifest)")
                continue
            if size != m.bytes:
                problems.append(f"{path} has {size} bytes, the manifest {m.bytes}")
                continue
            try:
                found = read_footer(self.files, path)[0]
            except Exception as exc:  # noqa: BLE001 - any unreadable footer is the problem to report
                problems.append(f"{path}: unreadable Parquet footer ({exc})")
                continue
            if found != m.rows:
                problems.append(f"{path} holds {found} rows, the manifest {m.rows}")
        return problems

    # ------------------------------------------------------------------ for the Spark stage job

    def spark_output(self, attempt: Attempt):  # -> core.sink.SparkOutput
        """The stage job writes with Spark's own Parquet writer (JVM side) into
        the staging's writers' folders: rows into ``data/``, dead letters into
        ``dead_letters/``; the layout's keys are dropped from the rows (the
        partition directory gives them to readers). Then it checkpoints with
        :meth:`staged_chunks`, whose seal keeps exactly those files."""
        from airflow_eos.core.sink import SparkOutput

        writer = self.writer(attempt)
        return SparkOutput(_url(writer.data_dir), _url(writer.dead_letter_dir), writer.reserved)


def _url(path: str) -> str:
    """A path as Spark's writer names it: a local path as a file:// URL (Spark's default file system may be
    another), a URL (hdfs://) as it is."""
    return path if "://" in path else "file://" + path


def _columns(schema: str) -> dict[str, str]:
    """column -> type of an Arrow schema's text (its top-level lines; nested
    fields are indented lines of their column's type)."""
    columns = {}
    for line in schema.splitlines():
        if line and not line[0].isspace():
            name, _, kind = line.partition(": ")
            columns[name] = kind
    return columns


def schema_changes(published: str, staged: str) -> list[str]:
    """What differs, column by column, between the schema a root was published
    with and a window's, both as Arrow schema text: for the error a person reads."""
    before, after = _columns(published), _columns(staged)
    changes = [f"column {name!r} added ({kind})" for name, kind in after.items() if name not in before]
    changes += [f"column {name!r} missing (published as {kind})" for name, kind in before.items() if name not in after]
    changes += [f"column {name!r} is {after[name]}, published as {kind}" for name, kind in before.items()
                if name in after and after[name] != kind]
    return changes


def _user() -> str:
    try:
        return f"user {getpass.getuser()!r} (uid {os.getuid()})"
    except Exception:  # noqa: BLE001 - only for a message
        return f"uid {os.getuid()}"
