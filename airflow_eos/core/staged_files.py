"""What the targets that stage Parquet files share (the file target, Iceberg):
a chunk's Arrow batches written as one schema, the staged dead letters read
back, deleting a staging folder a zombie task may still be writing into, and an
attempt's manifest of sealed files in the ledger (``eos.staged_files``)."""

from __future__ import annotations

import errno
import os
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from airflow_eos.core.columns import DEAD_LETTER_COLUMNS
from airflow_eos.core.errors import TargetError

if TYPE_CHECKING:
    import psycopg
    import pyarrow as pa

    from airflow_eos.core.attempt import Attempt

DELETE_TRIES = 5


def one_schema(batches: Iterable[pa.RecordBatch | pa.Table]) -> tuple[pa.Schema, Iterator[pa.Table]] | None:
    """A chunk's non-empty batches as tables of its first batch's columns and
    types (a later batch is reordered and cast; one with other columns is
    refused as it comes), with that schema; None if there is no row."""
    tables = (t for t in _as_tables(batches) if t.num_rows)
    first = next(tables, None)
    if first is None:
        return None
    return first.schema, _conform(first, tables)


def _as_tables(batches: Iterable[pa.RecordBatch | pa.Table]) -> Iterator[pa.Table]:
    import pyarrow as pa
    for b in batches:
        yield b if isinstance(b, pa.Table) else pa.Table.from_batches([b])


def _conform(first: pa.Table, rest: Iterator[pa.Table]) -> Iterator[pa.Table]:
    yield first
    schema = first.schema
    for table in rest:
        if table.schema.equals(schema):
            yield table
            continue
        if sorted(table.schema.names) != sorted(schema.names):
            raise TargetError(f"a batch has the columns {table.schema.names}, the chunk's first batch "
                              f"{schema.names}: one chunk's rows share one schema")
        yield table.select(schema.names).cast(schema)


def dead_letter_records(table: pa.Table) -> list[tuple]:
    """The rows of a staged dead-letter file, in ``eos.dead_letters``' column order."""
    return [tuple(r[c] for c in DEAD_LETTER_COLUMNS) for r in table.select(list(DEAD_LETTER_COLUMNS)).to_pylist()]


def delete_while_written(delete: Callable[[], object], tries: int = DELETE_TRIES) -> None:
    """Run ``delete`` (of a folder and everything in it), again while a writer
    still adds files to the folder (a zombie attempt's task: the folder is not
    empty when its last entry is removed); a folder already gone is done.
    Raises the last error if it keeps failing."""
    for i in range(tries):
        try:
            delete()
            return
        except FileNotFoundError:
            return
        except OSError as exc:
            if exc.errno not in (errno.ENOTEMPTY, errno.EEXIST) or i == tries - 1:
                raise
            time.sleep(0.05 * (i + 1))


@dataclass(frozen=True)
class ManifestFile:
    """A sealed file of an attempt, as its manifest lists it."""

    path: str  # relative to the attempt's staging folder, in the target's layout
    kind: str  # "data" | "dead_letters"
    chunk: int
    bytes: int
    rows: int

    @property
    def name(self) -> str:
        return os.path.basename(self.path)


def record_manifest(conn: psycopg.Connection, attempt: Attempt, manifest: Iterable[ManifestFile]) -> None:
    """The attempt's manifest is ``manifest``, in place of what an earlier seal recorded."""
    key = (attempt.pipeline, attempt.window_start, attempt.epoch)
    conn.execute("DELETE FROM eos.staged_files WHERE pipeline = %s AND window_start = %s AND epoch = %s", key)
    with conn.cursor() as cur:
        cur.executemany(
            "INSERT INTO eos.staged_files (pipeline, window_start, epoch, path, kind, chunk, bytes, rows)"
            " VALUES (%s, %s, %s, %s, %s, %s, %s, %s)",
            [(*key, m.path, m.kind, m.chunk, m.bytes, m.rows) for m in manifest])


def load_manifest(conn: psycopg.Connection, attempt: Attempt) -> list[ManifestFile]:
    """The attempt's manifest, by path."""
    rows = conn.execute(
        "SELECT path, kind, chunk, bytes, rows FROM eos.staged_files WHERE pipeline = %s AND window_start = %s"
        " AND epoch = %s ORDER BY path", (attempt.pipeline, attempt.window_start, attempt.epoch)).fetchall()
    return [ManifestFile(*r) for r in rows]
