"""The file target's staging: its layout on disk, the writer that Spark tasks
(or any Python process) use, and the scan that counts what is staged.

An attempt's staging directory, under the target's root::

    <root>/_eos_staging/<attempt.staging>/
        data/                  the writers' Parquet files (the Spark job's output directory)
        dead_letters/          the writers' dead letters, Parquet (topic, partition, offset, error, key, value)
        publish/               sealed: exactly the checkpoint's data files (+ _eos_commit.json once decided);
                               the commit renames it to the window's partition directory
        sealed_dead_letters/   sealed: exactly the checkpoint's dead letters (the commit puts them in the ledger)

Names starting with ``_`` or ``.`` are invisible to Spark, Hive and PyArrow, so
nothing under ``_eos_staging`` is ever read as published data.

A *chunk* is what one writer call stages: one data file and one dead-letter
file of the same name. Spark's own Parquet writer names its files itself; each
of its files is then a chunk of its own. Either way a file's chunk id is a hash
of its name (:func:`chunk_id`), so the counts are read back from the files'
Parquet footers (:func:`scan`) however they were written.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import secrets
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from airflow_eos.core.attempt import StagedChunk
from airflow_eos.core.columns import DEAD_LETTER_COLUMNS
from airflow_eos.core.errors import TargetError
from airflow_eos.core.faults import fault_point
from airflow_eos.core.sink import dead_letters_as_rows
from airflow_eos.core.staged_files import one_schema
from airflow_eos.targets.files.storage import Files, files_for

if TYPE_CHECKING:
    import pyarrow as pa

log = logging.getLogger(__name__)

STAGING_DIR = "_eos_staging"
TRASH_DIR = "_eos_trash"
COMMIT_FILE = "_eos_commit.json"
DATA = "data"
DEAD_LETTERS = "dead_letters"
PUBLISH = "publish"
SEALED_DEAD_LETTERS = "sealed_dead_letters"
STAGING_SUBDIRS = (DATA, DEAD_LETTERS, PUBLISH, SEALED_DEAD_LETTERS)
# kind of a staged file -> (where writers put it, where the seal moves it)
KINDS = {"data": (DATA, PUBLISH), "dead_letters": (DEAD_LETTERS, SEALED_DEAD_LETTERS)}


def chunk_id(name: str) -> int:
    """The chunk a staged file belongs to: a 63-bit hash of its file name."""
    return int.from_bytes(hashlib.blake2b(name.encode(), digest_size=8).digest(), "big") >> 1


def visible(name: str) -> bool:
    return not name.startswith(("_", "."))


def dead_letter_schema() -> pa.Schema:
    import pyarrow as pa
    return pa.schema([("topic", pa.string()), ("partition", pa.int32()), ("offset", pa.int64()),
                      ("error", pa.string()), ("key", pa.binary()), ("value", pa.binary())])


@dataclass(frozen=True)
class StagedFile:
    kind: str  # "data" | "dead_letters"
    folder: str  # one of STAGING_SUBDIRS
    name: str
    bytes: int
    rows: int | None  # None: no readable Parquet footer (a file Spark or a writer left half done)
    schema: str | None = None  # the Arrow schema, as text (data files)

    @property
    def chunk(self) -> int:
        return chunk_id(self.name)

    @property
    def path(self) -> str:
        return f"{self.folder}/{self.name}"


def read_footer(files: Files, path: str) -> tuple[int, str]:
    """(rows, Arrow schema as text) of a Parquet file, from its footer only."""
    import pyarrow.parquet as pq
    with files.open_input(path) as f:
        meta = pq.read_metadata(f)
    return meta.num_rows, meta.schema.to_arrow_schema().remove_metadata().to_string(show_schema_metadata=False)


def scan(files: Files, staging_dir: str, folders: Iterable[str] = STAGING_SUBDIRS) -> list[StagedFile] | None:
    """Every visible file of the staging's folders with its size and footer
    row count; None if the staging directory is gone."""
    if not files.is_dir(staging_dir):
        return None
    found = []
    for folder in folders:
        kind = next(k for k, where in KINDS.items() if folder in where)
        try:
            entries = files.entries(os.path.join(staging_dir, folder))
        except FileNotFoundError:
            continue
        for entry in entries:
            if not visible(entry.name) or not entry.is_file:
                continue
            try:
                rows, schema = read_footer(files, entry.path)
            except Exception:  # noqa: BLE001 - any unreadable file counts as "no footer"
                rows, schema = None, None
            found.append(StagedFile(kind, folder, entry.name, entry.size, rows, schema))
    return found


def counts(files: Iterable[StagedFile]) -> dict[int, tuple[int, int]]:
    """chunk -> (rows, dead letters) of the files (a file without a footer counts nothing)."""
    by_chunk: dict[int, tuple[int, int]] = {}
    for f in files:
        rows, dead = by_chunk.get(f.chunk, (0, 0))
        n = f.rows or 0
        by_chunk[f.chunk] = (rows + n, dead) if f.kind == "data" else (rows, dead + n)
    return by_chunk


def file_digest(files: Files, paths: Iterable[str]) -> str:
    digest = hashlib.blake2b(digest_size=16)
    for path in paths:
        with files.open_input(path) as f:
            while block := f.read(1 << 20):
                digest.update(block)
    return digest.hexdigest()


@dataclass(frozen=True)
class FileWriter:
    """Stages rows of one attempt as Parquet files, from inside Spark tasks or
    any process that sees the target's root. Plain data: pickle it into the
    tasks, or pass ``to_json()`` as an option.

    Call :meth:`write` once per task; return its StagedChunk to Spark as the
    task's commit message; on job commit pass every chunk to
    ``FileSink.checkpoint``. A writer writes only inside its attempt's staging
    directory and never creates it: once the attempt is aborted (its staging
    deleted) or committed (its staging renamed away), every write is refused.
    """

    staging_dir: str  # <root>/_eos_staging/<attempt.staging>
    target: str  # for messages
    reserved: tuple[str, ...] = ()  # columns the layout's directories give readers; the rows may not hold them

    def to_json(self) -> str:
        return json.dumps({"staging_dir": self.staging_dir, "target": self.target, "reserved": list(self.reserved)})

    @classmethod
    def from_json(cls, text: str) -> "FileWriter":
        data = json.loads(text)
        return cls(data["staging_dir"], data["target"], tuple(data.get("reserved") or ()))

    @property
    def files(self) -> Files:
        return files_for(self.staging_dir)

    @property
    def data_dir(self) -> str:
        """Where rows go: the Spark job's output directory for its own Parquet writer."""
        return os.path.join(self.staging_dir, DATA)

    @property
    def dead_letter_dir(self) -> str:
        return os.path.join(self.staging_dir, DEAD_LETTERS)

    def write(self, batches: Iterable[pa.RecordBatch | pa.Table],
              dead_letters: Iterable[pa.RecordBatch | pa.Table | Mapping] = ()) -> StagedChunk:
        """Write the batches as one Parquet file and the dead letters as a
        second one of the same name, as one chunk. Each file is written under a
        hidden temporary name, flushed to disk and renamed into place: a file
        half written (a task killed, a full disk) is never counted or published.
        ``dead_letters`` is read after ``batches`` is exhausted, so a list that
        the batches' generator fills works. Dead letters have ``topic``,
        ``partition``, ``offset``, ``error`` and optionally ``key``, ``value``."""
        import pyarrow as pa
        started = time.monotonic()
        name = f"part-{secrets.token_hex(8)}.parquet"
        written = []
        try:
            self._check_staging()
            rows = self._write_rows(os.path.join(self.data_dir, name), batches)
            if rows:
                written.append(os.path.join(self.data_dir, name))
            dead_rows = list(dead_letters_as_rows(dead_letters))
            if dead_rows:
                table = pa.Table.from_pylist([dict(zip(DEAD_LETTER_COLUMNS, r)) for r in dead_rows],
                                             schema=dead_letter_schema())
                path = os.path.join(self.dead_letter_dir, name)
                self._write_table(path, [table], table.schema)
                written.append(path)
        except FileNotFoundError as exc:
            raise self._gone() from exc
        except OSError as exc:
            raise TargetError(f"cannot stage rows for {self.target} in {self.staging_dir}: {exc}; nothing of this "
                              "chunk is counted (its temporary file is hidden and removed)") from exc
        except pa.ArrowException as exc:
            raise TargetError(f"cannot write rows for {self.target} as Parquet: {exc}") from exc
        chunk = StagedChunk(chunk_id(name), rows, len(dead_rows), file_digest(self.files, written))
        seconds = time.monotonic() - started
        log.info("staged chunk %d (%s) into %s: %d rows, %d dead letters in %.2fs", chunk.chunk, name,
                 self.staging_dir, rows, chunk.dead_letters, seconds)
        return chunk

    def _check_staging(self) -> None:
        if not self.files.is_dir(self.data_dir):
            raise self._gone()

    def _gone(self) -> TargetError:
        return TargetError(f"staging directory {self.staging_dir} of {self.target} does not exist: its attempt was "
                           "aborted or committed (a fenced or zombie writer cannot stage any more)")

    def _write_rows(self, path: str, batches: Iterable[pa.RecordBatch | pa.Table]) -> int:
        chunk = one_schema(batches)
        if chunk is None:
            return 0
        schema, tables = chunk
        reserved = sorted(set(schema.names) & set(self.reserved))
        if reserved:
            raise TargetError(f"rows for {self.target} may not hold the column(s) {reserved}: the partition "
                              "directories give them to readers (the layout)")
        return self._write_table(path, tables, schema)

    def _write_table(self, path: str, tables: Iterable[pa.Table], schema: pa.Schema) -> int:
        import pyarrow.parquet as pq
        rows = 0
        # a hidden temp name in a directory that must exist (a writer never recreates a deleted staging), synced,
        # then renamed: the file appears whole or not at all
        with self.files.atomic_output(path) as sink, pq.ParquetWriter(sink, schema, compression="snappy") as out:
            for table in tables:
                out.write_table(table)
                rows += table.num_rows
                fault_point("stage.mid_write")
        return rows

