"""What the targets that stage Parquet files share (the file target, Iceberg):
a chunk's Arrow batches written as one schema, the staged dead letters read
back, and deleting a staging folder a zombie task may still be writing into."""

from __future__ import annotations

import errno
import time
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING

from airflow_eos.core.columns import DEAD_LETTER_COLUMNS
from airflow_eos.core.errors import TargetError

if TYPE_CHECKING:
    import pyarrow as pa

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
