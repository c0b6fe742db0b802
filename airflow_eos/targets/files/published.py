"""What ``verify`` reads of the file target: the published partitions and
their rows as a temp table of the ledger's connection. A mixin of
:class:`~airflow_eos.targets.files.sink.FileSink`."""

from __future__ import annotations

import json
import os
import secrets
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from airflow_eos.core.errors import TargetError
from airflow_eos.core.windows import to_utc
from airflow_eos.targets.files.commit import COMMIT_FORMAT
from airflow_eos.targets.files.writer import COMMIT_FILE, visible

if TYPE_CHECKING:
    import psycopg
    from psycopg import sql

LINEAGE_COLUMNS = ("eos_topic", "eos_partition", "eos_offset")


class FilePublished:
    """``published_partitions`` and ``published_relation`` of
    :class:`~airflow_eos.targets.files.sink.FileSink`."""

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
