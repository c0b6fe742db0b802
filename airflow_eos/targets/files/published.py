"""What ``verify`` reads of the file target: the published partitions and
their rows as a temp table of the ledger's connection. A mixin of
:class:`~airflow_eos.targets.files.sink.FileSink`."""

from __future__ import annotations

import json
import os
import secrets
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

from airflow_eos.core.columns import LINEAGE_COLUMNS, WINDOW_COLUMNS
from airflow_eos.core.errors import TargetError
from airflow_eos.core.sink import ForeignRecord
from airflow_eos.core.windows import to_utc
from airflow_eos.targets.files.commit import COMMIT_FORMAT
from airflow_eos.targets.files.fields import FileSinkFields
from airflow_eos.targets.files.writer import COMMIT_FILE, visible

if TYPE_CHECKING:
    import psycopg
    from psycopg import sql

    from airflow_eos.targets.files.storage import Files


class FilePublished(FileSinkFields):
    """``published_partitions`` and ``published_relation`` of
    :class:`~airflow_eos.targets.files.sink.FileSink`."""

    # ------------------------------------------------------------------ for verify

    def published_partitions(self, pipeline: str) -> list[tuple[str, dict[str, Any]]]:
        """(directory, commit manifest) of every partition under the root whose
        ``_eos_commit.json`` names ``pipeline``: what a reader of the root
        sees of the pipeline. Hidden directories are skipped as readers skip them."""
        found = []
        for directory, dirs, files in self.files.walk(self.root):
            dirs[:] = sorted(d for d in dirs if visible(d))
            if COMMIT_FILE in files:
                try:
                    doc = json.loads(self.files.read_bytes(os.path.join(directory, COMMIT_FILE)))
                except (OSError, ValueError):
                    continue
                if doc.get("format") == COMMIT_FORMAT and doc.get("pipeline") == pipeline:
                    found.append((directory, doc))
        return found

    def _require_root(self, conn: psycopg.Connection, pipeline: str) -> None:
        """A vanished root is said as such, not as every record missing."""
        if self.files.is_dir(self.root):
            return
        published = conn.execute(
            "SELECT count(*) FROM eos.publications WHERE target = ANY(%s) AND pipeline = %s AND state = 'published'",
            (self.target_ids, pipeline)).fetchone()[0]
        raise TargetError(
            f"verify cannot read the file target {self.root}: the directory is gone (not there, or not a directory "
            f"where verify runs). The ledger records {published} window(s) of pipeline {pipeline!r} published "
            "there, which no reader can see now: restore the directory (from a backup, or mount the file system "
            "it lives on), then run verify again")

    def unattributed(self, conn: psycopg.Connection, pipeline: str, topics: Sequence[str]) -> Iterator[ForeignRecord]:
        """Every data file a reader of the root reads (every visible file under
        visible directories, as ``spark.read.parquet(root)`` and
        ``pyarrow.dataset`` read it) outside this pipeline's partition
        directories (those are :meth:`published_relation`'s), except the
        windows of other pipelines of a root shared by layout that the ledger
        records as published there: a foreign file, a second pipeline's rows, a
        leftover. Each names its file and, where the commit manifest or the
        rows' lineage tell, where it came from."""
        self._require_root(conn, pipeline)
        shared = "{pipeline}" in self.layout
        known = {(p, loc) for p, loc in conn.execute(
            "SELECT pipeline, location FROM eos.publications WHERE target = ANY(%s) AND state = 'published'",
            (self.target_ids,))} if shared else set()
        found = []
        for directory, dirs, files in self.files.walk(self.root):
            dirs[:] = sorted(d for d in dirs if visible(d))
            names = sorted(f for f in files if visible(f))
            doc = _commit_doc(self.files, directory) if COMMIT_FILE in files else None
            owner = doc.get("pipeline") if doc else None
            location = os.path.relpath(directory, self.root)
            if not names or owner == pipeline or (owner, location) in known:
                continue
            for name in names:
                path = os.path.join(directory, name)
                rows, origin = _origin(self.files, path, doc, shared)
                held = f"holds {rows} row(s)" if rows is not None else "is a file"
                found.append(ForeignRecord(path, f"{held} that readers of {self.root} see and no committed window "
                                                 f"of pipeline {pipeline!r} accounts for: {origin}", rows=rows))
        return iter(found)

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
        self._require_root(conn, pipeline)
        extra = [c for c in columns if c not in LINEAGE_COLUMNS + WINDOW_COLUMNS]
        wanted = list(LINEAGE_COLUMNS) + extra
        name = f"eos_published_{secrets.token_hex(6)}"
        tables: list[tuple[str, pa.Table]] = []
        for directory, doc in self.published_partitions(pipeline):
            for entry in self.files.entries(directory):
                if not visible(entry.name) or not self.files.is_file(entry.path):
                    continue
                with self.files.open_input(entry.path) as f:
                    names = pq.read_schema(f).names
                    absent = [c for c in wanted if c not in names]
                    if absent:
                        raise TargetError(f"{entry.path} has no column(s) {absent}: verify needs the lineage columns "
                                          f"{list(LINEAGE_COLUMNS)} (a record-level pipeline) and the columns asked "
                                          "for")
                    f.seek(0)
                    tables.append((to_utc(doc["window_start"]).isoformat(), pq.read_table(f, columns=wanted)))
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


def _commit_doc(files: Files, directory: str) -> dict[str, Any] | None:
    try:
        doc = json.loads(files.read_bytes(os.path.join(directory, COMMIT_FILE)))
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) and doc.get("format") == COMMIT_FORMAT else None


def _origin(files: Files, path: str, doc: dict[str, Any] | None, shared: bool) -> tuple[int | None, str]:
    """(rows, where they came from) of a data file nobody committed here."""
    import pyarrow.parquet as pq
    try:
        with files.open_input(path) as f:
            meta = pq.read_metadata(f)
    except Exception as exc:  # noqa: BLE001 - whatever the file is, readers fail on it the same way
        return None, f"not a Parquet file ({type(exc).__name__}): spark.read.parquet and pyarrow fail on it"
    if doc is not None:
        why = ("a window the ledger does not record as published here" if shared
               else "a second pipeline's rows in a root of one pipeline")
        return meta.num_rows, (f"{COMMIT_FILE} names pipeline {doc.get('pipeline')!r}, window "
                               f"{doc.get('window_start')}, attempt {doc.get('epoch')}: {why}")
    return (meta.num_rows, "no " + COMMIT_FILE + " (not published by airflow-eos, or a leftover)"
            + _lineage(files, path, meta))


def _lineage(files: Files, path: str, meta) -> str:
    """What the file's lineage columns say of its rows' sources, if it has them."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq
    names = meta.schema.names
    if not all(c in names for c in LINEAGE_COLUMNS) or not meta.num_rows:
        return "; it has no lineage columns" if meta.num_rows else ""
    with files.open_input(path) as f:
        table = pq.read_table(f, columns=[c for c in (*LINEAGE_COLUMNS, "eos_pipeline") if c in names])
    said = []
    if "eos_pipeline" in names:
        said.append("pipeline(s) " + ", ".join(sorted(map(str, pc.unique(table["eos_pipeline"]).to_pylist()))))
    sources = sorted({(t, p) for t, p in zip(table["eos_topic"].to_pylist(), table["eos_partition"].to_pylist())})
    offsets = pc.min_max(table["eos_offset"]).as_py()
    said.append("records of " + ", ".join(f"{t}[{p}]" for t, p in sources[:5]) + ("..." if len(sources) > 5 else "")
                + f" offsets {offsets['min']}..{offsets['max']}")
    return "; its lineage says: " + "; ".join(said)


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
