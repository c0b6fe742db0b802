"""What ``verify`` reads of the Iceberg target: the table at its current
snapshot, as every reader sees it (delete files applied), each data file
attributed to its window by the attempt folder it lies in. A mixin of
:class:`~airflow_eos.targets.iceberg.sink.IcebergSink`."""

from __future__ import annotations

import secrets
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

from airflow_eos.core.columns import LINEAGE_COLUMNS, WINDOW_COLUMNS
from airflow_eos.core.errors import TargetError
from airflow_eos.core.sink import ForeignRecord
from airflow_eos.targets.iceberg import table as tables
from airflow_eos.targets.iceberg.fields import IcebergSinkFields

if TYPE_CHECKING:
    import psycopg
    import pyarrow as pa
    from psycopg import sql


class IcebergPublished(IcebergSinkFields):
    """published_relation and unattributed of an IcebergSink."""

    def _owned_tasks(self, conn: psycopg.Connection) -> tuple[Any, list[tuple[Any, tuple[str, Any] | None]]]:
        """(the table, each scan task of its current snapshot with the
        (pipeline, window start) of the attempt of this ledger whose folder
        holds its file, or None: a file of no attempt of this ledger)."""
        table = self.table()
        tasks = list(tables.iter_scan_tasks(table))
        prefix = self.eos_root + "/"
        staging = {t.file.file_path: t.file.file_path[len(prefix):].split("/", 1)[0] for t in tasks
                   if t.file.file_path.startswith(prefix)}
        owners = {s: (p, w) for s, p, w in conn.execute(
            "SELECT staging_table, pipeline, window_start FROM eos.attempts WHERE staging_table = ANY(%s)",
            (sorted(set(staging.values())),))}
        return table, [(t, owners.get(staging.get(t.file.file_path, ""))) for t in tasks]

    @staticmethod
    def _read(table, tasks: Sequence[Any], columns: Sequence[str]) -> pa.Table:
        from pyiceberg.expressions import AlwaysTrue
        from pyiceberg.io.pyarrow import ArrowScan
        return ArrowScan(table.metadata, table.io, table.schema().select(*columns), AlwaysTrue()).to_table(tasks)

    def published_relation(self, conn: psycopg.Connection, pipeline: str,
                           columns: Sequence[str] = ()) -> sql.Composable:
        """A TEMP table, in ``conn``'s session, of every row of the table's
        current snapshot in a file of one of the pipeline's attempts:
        ``eos_pipeline``, ``eos_window_start`` (the attempt's), the lineage
        and those of ``columns`` the table has."""
        from psycopg import sql
        table, owned = self._owned_tasks(conn)
        names = table.schema().column_names
        absent = [c for c in LINEAGE_COLUMNS if c not in names]
        if absent:
            raise TargetError(f"{self.label} has no column(s) {absent}: verify needs the lineage columns")
        extra = [c for c in columns if c in names and c not in LINEAGE_COLUMNS + WINDOW_COLUMNS]
        wanted = [*LINEAGE_COLUMNS, *extra]
        by_window: dict[Any, list[Any]] = {}
        for task, owner in owned:
            if owner is not None and owner[0] == pipeline:
                by_window.setdefault(owner[1], []).append(task)
        name = f"eos_published_{secrets.token_hex(6)}"
        types = {c: _pg_type(table.schema().find_field(c).field_type) for c in extra}
        conn.execute(sql.SQL("CREATE TEMP TABLE {} (eos_pipeline text NOT NULL, eos_window_start timestamptz NOT NULL,"
                             " eos_topic text, eos_partition integer, eos_offset bigint{})").format(
            sql.Identifier(name), sql.SQL("").join(sql.SQL(", {} {}").format(sql.Identifier(c), sql.SQL(types[c]))
                                                    for c in extra)))
        with conn.cursor() as cur, cur.copy(sql.SQL("COPY {} FROM STDIN").format(sql.Identifier(name))) as copy:
            for window_start, tasks in by_window.items():
                rows = self._read(table, tasks, wanted)
                values = [rows.column(c).to_pylist() for c in wanted]
                for record in zip(*values):
                    copy.write_row((pipeline, window_start, *record))
        return sql.Identifier(name)

    def unattributed(self, conn: psycopg.Connection, pipeline: str, topics: Sequence[str]) -> Iterator[ForeignRecord]:
        """The table's files (current snapshot) outside the pipeline's attempts
        whose rows name one of ``topics`` in their lineage: the same source
        records published by another pipeline, or by a writer that is no
        pipeline of this ledger. Rows without such lineage are other data of
        the table (a lakehouse table has other writers): not this pipeline's
        concern."""
        table, owned = self._owned_tasks(conn)
        names = table.schema().column_names
        if "eos_topic" not in names:
            return iter(())
        wanted = set(topics)
        found = []
        for task, owner in owned:
            if owner is not None and owner[0] == pipeline:
                continue
            lineage = self._read(table, [task], [c for c in LINEAGE_COLUMNS if c in names])
            mine = [r for r in lineage.to_pylist() if r.get("eos_topic") in wanted]
            if not mine:
                continue
            who = (f"pipeline {owner[0]!r}'s window {owner[1].isoformat()}" if owner is not None
                   else "a writer that is no pipeline of this ledger")
            first = mine[0]
            found.append(ForeignRecord(task.file.file_path, f"holds {len(mine)} row(s) of {pipeline!r}'s source "
                                       f"topics, written by {who}", first.get("eos_topic"),
                                       first.get("eos_partition"), first.get("eos_offset"), rows=len(mine)))
        return iter(found)


def _pg_type(field_type) -> str:
    from pyiceberg.types import DoubleType, FloatType, IntegerType, LongType
    if isinstance(field_type, (IntegerType, LongType)):
        return "bigint"
    if isinstance(field_type, (FloatType, DoubleType)):
        return "double precision"
    return "text"
