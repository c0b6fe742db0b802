"""The Iceberg target's staging: begin, the writers' folders, the seal (the
checkpoint's transaction: the manifest and the schema rule) and prepare's
check. A mixin of :class:`~airflow_eos.targets.iceberg.sink.IcebergSink`.

An attempt's files, under the table's location::

    <location>/data/eos/<attempt.staging>/
        rows/           the window's data files (Spark's Parquet writer, or IcebergWriter)
        dead_letters/   its dead letters, Parquet (the commit puts them in the ledger)

No snapshot names a file there before the window's commit: readers of the
table (they read snapshots, never listings) see none of it. The commit's
snapshot names exactly the manifest's data files, where they are: nothing
is moved, so an object store serves as well as a file system.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from airflow_eos.core import attempt as attempts
from airflow_eos.core.attempt import Attempt, Checkpoint, StagedChunk
from airflow_eos.core.columns import LINEAGE_COLUMNS
from airflow_eos.core.errors import InvalidCheckpoint, TargetError
from airflow_eos.core.staged_files import ManifestFile, load_manifest, record_manifest
from airflow_eos.core.windows import Window
from airflow_eos.targets.iceberg.fields import IcebergSinkFields
from airflow_eos.targets.iceberg.files import chunk_id, names_digest
from airflow_eos.targets.iceberg.writer import DEAD_LETTERS, FOLDERS, OPEN_MARKER, ROWS, IcebergWriter, staging_gone

if TYPE_CHECKING:
    import psycopg
    import pyarrow as pa

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Staged:
    """A file in an attempt's folder, with its footer's rows and schema."""

    kind: str
    name: str
    bytes: int
    rows: int | None  # None: no readable footer
    schema: pa.Schema | None = None

    @property
    def path(self) -> str:
        return f"{FOLDERS[self.kind]}/{self.name}"


class IcebergStaging(IcebergSinkFields):
    """begin, the writers, seal and prepare of an IcebergSink."""

    def begin(self, window: Window) -> Attempt:
        """Open an attempt once the table is there and keeps lineage: a table
        that cannot take the window fails here, before any Spark work."""
        schema = self.table().schema()
        missing = [c for c in LINEAGE_COLUMNS if c not in schema.column_names]
        if missing:
            raise TargetError(f"{self.label} has no column(s) {missing}: the Iceberg target keeps each row's source "
                              f"record ({', '.join(LINEAGE_COLUMNS)}: string, int, long) so that verify can prove "
                              "exactly-once; add them (ALTER TABLE ... ADD COLUMN) and run the window again")
        with self.ledger.connect() as conn, conn.transaction():
            attempt = attempts.open_attempt(conn, window)
            if self.store.is_local(self.location):
                for folder in (ROWS, DEAD_LETTERS):
                    self.store.make_dirs(f"{self.attempt_url(attempt)}/{folder}")
            else:
                self.store.write_empty(f"{self.attempt_url(attempt)}/{OPEN_MARKER}")
        log.info("%s: staging into %s", attempt, self.attempt_url(attempt))
        return attempt

    def writer(self, attempt: Attempt) -> IcebergWriter:
        url = self.attempt_url(attempt)
        local = self.store.is_local(url)
        if staging_gone(self.store, url, local):
            raise TargetError(f"the staging {url} of {attempt} does not exist: the attempt was aborted")
        return IcebergWriter(url, self.label, self.store, local)

    def spark_output(self, attempt: Attempt):  # -> core.sink.SparkOutput
        """Spark's own Parquet writer writes the rows into ``rows/`` and the dead
        letters into ``dead_letters/`` (an ``s3://`` location as Hadoop's
        ``s3a://``, reached with the catalog's ``s3.*`` properties)."""
        from airflow_eos.core.sink import SparkOutput

        url = self.attempt_url(attempt)
        if url.startswith("s3://"):
            spark_url = "s3a://" + url[len("s3://"):]
            return SparkOutput(f"{spark_url}/{ROWS}", f"{spark_url}/{DEAD_LETTERS}", hadoop=self.store.s3a_settings())
        return SparkOutput(f"{url}/{ROWS}", f"{url}/{DEAD_LETTERS}")

    def _scan(self, attempt: Attempt) -> list[Staged]:
        url = self.attempt_url(attempt)
        found = []
        for kind, folder in FOLDERS.items():
            for f in self.store.listing(f"{url}/{folder}"):
                try:
                    rows, schema = self.store.footer(f"{url}/{folder}/{f.name}")
                except Exception:  # noqa: BLE001 - any unreadable file counts as "no footer"
                    rows, schema = None, None
                found.append(Staged(kind, f.name, f.bytes, rows, schema))
        return found

    def _gone(self, attempt: Attempt) -> bool:
        url = self.attempt_url(attempt)
        return staging_gone(self.store, url, self.store.is_local(url))

    def staged_chunks(self, attempt: Attempt) -> list[StagedChunk]:
        """One chunk per file Spark's writer left (a data file and a dead
        letters' file of one name are one chunk), counted from the footers."""
        if self._gone(attempt):
            raise TargetError(f"the staging {self.attempt_url(attempt)} of {attempt} does not exist: aborted")
        files = self._scan(attempt)
        broken = [f.path for f in files if f.rows is None]
        if broken:
            raise TargetError(f"{attempt}: staged file(s) without a readable Parquet footer in "
                              f"{self.attempt_url(attempt)}: {', '.join(broken)}")
        return [StagedChunk(chunk, rows, dead, names_digest(f.name for f in files if chunk_id(f.name) == chunk))
                for chunk, (rows, dead) in sorted(_counts(files).items())]

    def clear_writes(self, attempt: Attempt) -> int:
        """Delete what earlier runs of the attempt's stage job left (its folder
        is the attempt's alone until a checkpoint seals a manifest)."""
        url = self.attempt_url(attempt)
        files = self._scan(attempt)
        for f in files:
            self.store.delete_file(f"{url}/{f.path}")
        for folder in FOLDERS.values():
            for sub in self.store.subdirectories(f"{url}/{folder}"):  # Spark's _temporary of a run that died
                self.store.delete_tree(f"{url}/{folder}/{sub}")
        return len(files)

    def count_staged(self, attempt: Attempt) -> Mapping[int, tuple[int, int]] | None:
        return None if self._gone(attempt) else _counts(self._scan(attempt))

    # ------------------------------------------------------------------ seal (the checkpoint's transaction)

    def seal(self, conn: psycopg.Connection, attempt: Attempt, checkpoint: Checkpoint) -> None:
        """Check the checkpointed chunks' files hold what the tasks counted and
        fit the table's schema, and record them as the manifest (the only
        files the commit's snapshot will name; others in the folder are
        deleted after the commit or the abort)."""
        started = time.monotonic()
        files = self._scan(attempt)
        listed = {c.chunk for c in checkpoint.chunks}
        kept = [f for f in files if chunk_id(f.name) in listed]
        problems = [f"{f.path}: no readable Parquet footer" for f in kept if f.rows is None]
        problems += attempts.chunk_problems(checkpoint.chunks, _counts(kept), self.attempt_url(attempt))
        if problems:
            raise InvalidCheckpoint(f"{attempt}: the staging does not hold what the write tasks reported, no "
                                    "checkpoint written:\n  " + "\n  ".join(problems))
        self.check_schema(attempt, [f for f in kept if f.kind == "data"])
        record_manifest(conn, attempt, [ManifestFile(f.path, f.kind, chunk_id(f.name), f.bytes, f.rows or 0)
                                        for f in kept])
        log.info("%s: staging sealed in %.2fs: %d file(s) in the manifest, %d left out (not in the checkpoint)",
                 attempt, time.monotonic() - started, len(kept), len(files) - len(kept))

    def check_schema(self, attempt: Attempt, data: Sequence[Staged]) -> None:
        """The rule (docs/iceberg-target.md): the window's files must fit the
        table's current schema as it is; a column the table lacks, or a type
        it cannot take, fails the job commit, nothing is published. The table
        is never evolved by a window (evolve it yourself, then rerun)."""
        from pyiceberg.io.pyarrow import _check_pyarrow_schema_compatible

        metadata = self.table().metadata
        for schema in {str(f.schema): f.schema for f in data if f.schema is not None}.values():
            try:
                _check_pyarrow_schema_compatible(metadata.schema(), schema, format_version=metadata.format_version)
            except ValueError as exc:
                raise TargetError(
                    f"{attempt}: the transform's output does not fit the schema of {self.label}: {exc}\n  the "
                    f"table's schema:\n    {str(metadata.schema()).replace(chr(10), chr(10) + '    ')}\n  the "
                    f"window's rows:\n    {schema.to_string().replace(chr(10), chr(10) + '    ')}\n  nothing of this "
                    "window is published: cast the transform's output to the table's columns and types, or evolve "
                    "the table's schema yourself (the target never does), then rerun the window") from None

    # ------------------------------------------------------------------ prepare and commit's check

    def data_paths(self, attempt: Attempt, manifest: Sequence[ManifestFile]) -> list[str]:
        """The full paths of the manifest's data files: what the commit's snapshot names."""
        return [f"{self.attempt_url(attempt)}/{m.path}" for m in manifest if m.kind == "data"]

    def staging_problems(self, attempt: Attempt, checkpoint: Checkpoint) -> list[str]:
        with self.ledger.connect() as conn, conn.transaction():
            manifest = load_manifest(conn, attempt)
        return self.manifest_problems(attempt, checkpoint, manifest, footers=True)

    def commit_problems(self, conn: psycopg.Connection, attempt: Attempt, checkpoint: Checkpoint) -> list[str]:
        return self.manifest_problems(attempt, checkpoint, load_manifest(conn, attempt), footers=False)

    def manifest_problems(self, attempt: Attempt, checkpoint: Checkpoint, manifest: Sequence[ManifestFile], *,
                          footers: bool) -> list[str]:
        """Where the manifest differs from the checkpoint, or the files from the
        manifest (each there with its size; and its footer's rows, ``footers``)."""
        if self._gone(attempt):
            return attempts.chunk_problems(checkpoint.chunks, None, self.attempt_url(attempt))
        problems = []
        rows = sum(m.rows for m in manifest if m.kind == "data")
        dead = sum(m.rows for m in manifest if m.kind == "dead_letters")
        if (rows, dead) != (checkpoint.row_count, checkpoint.dead_letter_count):
            problems.append(f"the manifest of {attempt} lists {rows} rows and {dead} dead letters, the checkpoint "
                            f"counts {checkpoint.row_count} and {checkpoint.dead_letter_count}")
        for m in manifest:
            url = f"{self.attempt_url(attempt)}/{m.path}"
            size = self.store.size(url)
            if size != m.bytes:
                problems.append(f"{url} is missing ({m.bytes} bytes in the manifest)" if size is None
                                else f"{url} has {size} bytes, the manifest {m.bytes}")
            elif footers and self.store.footer(url)[0] != m.rows:
                problems.append(f"{url} holds other rows than the manifest's {m.rows}")
        return problems


def _counts(files: Sequence[Staged]) -> dict[int, tuple[int, int]]:
    """chunk -> (rows, dead letters) of the files (one without a footer counts nothing)."""
    by_chunk: dict[int, tuple[int, int]] = {}
    for f in files:
        rows, dead = by_chunk.get(chunk_id(f.name), (0, 0))
        n = f.rows or 0
        by_chunk[chunk_id(f.name)] = (rows + n, dead) if f.kind == "data" else (rows, dead + n)
    return by_chunk
