"""What the PostgreSQL target needs to know of its table, read from the
catalog: the columns the job writes, whether rows carry their window, how it is
partitioned, the upsert key's index (for begin and commit); and the relation of
its published rows that ``verify`` audits. Every check says clearly what is
wrong when the table cannot take what the sink stages."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from airflow_eos.core.columns import LINEAGE_COLUMNS, WINDOW_COLUMNS
from airflow_eos.core.database import redact
from airflow_eos.core.errors import TargetError
from airflow_eos.core.sink import ForeignRecord
from airflow_eos.staging.tables import CHUNK_COLUMN
from airflow_eos.targets.postgres.names import PARTITION_PER_WINDOW

if TYPE_CHECKING:
    import psycopg
    from psycopg import sql


@dataclass(frozen=True)
class Shape:
    """What begin and commit need to know of the target table."""

    staged: tuple[str, ...]  # columns the job writes, in the target's order
    window_columns: bool
    oid: int
    schema: str  # the target's schema (partition_per_window puts each window's partition there)


def describe(conn: psycopg.Connection, target: sql.Identifier, table: str, url: str | None, *, mode: str,
             key: tuple[str, ...], columns: tuple[str, ...] | None) -> Shape:
    """Check the target table (``target``, named ``table`` in messages, in the
    database at ``url``) can take what a sink of this ``mode``, ``key`` and
    ``columns`` stages; say clearly what is wrong when it cannot."""
    oid = conn.execute("SELECT to_regclass(%s)::oid", (target.as_string(conn),)).fetchone()[0]
    if oid is None:
        raise TargetError(f"target table {table} does not exist in {redact(url)}; create it first")
    kind, schema = conn.execute("SELECT c.relkind, n.nspname FROM pg_class c JOIN pg_namespace n"
                                " ON n.oid = c.relnamespace WHERE c.oid = %s", (oid,)).fetchone()
    if kind not in ("r", "p"):
        raise TargetError(f"target {table} is not a table (relkind {kind!r})")
    if mode == PARTITION_PER_WINDOW:
        _check_partitioned_by_window(conn, oid, kind, table)
    rows = conn.execute(
        "SELECT attname, attgenerated <> '' OR attidentity = 'a' FROM pg_attribute"
        " WHERE attrelid = %s AND attnum > 0 AND NOT attisdropped ORDER BY attnum", (oid,),
    ).fetchall()
    names = [name for name, _ in rows]
    generated = {name for name, gen in rows if gen}
    if CHUNK_COLUMN in names:
        raise TargetError(f"target table {table} has a column {CHUNK_COLUMN!r}, which the sink reserves")
    window_columns = all(c in names for c in WINDOW_COLUMNS)
    if mode == "replace_window" and not window_columns:
        raise TargetError(
            f"target table {table} needs the columns eos_pipeline (text) and eos_window_start "
            "(timestamptz) in mode 'replace_window': they record each row's window so a rerun can replace it"
        )
    writable = [n for n in names if n not in WINDOW_COLUMNS and n not in generated]
    if columns is None:
        staged = tuple(writable)
    else:
        unknown = [c for c in columns if c not in writable]
        if unknown:
            raise TargetError(f"columns {unknown} are not writable columns of target table {table} "
                              f"(writable: {writable})")
        staged = tuple(n for n in writable if n in columns)
    if mode == "upsert":
        missing = [k for k in key if k not in staged]
        if missing:
            raise TargetError(f"upsert key columns {missing} are not staged columns of {table}")
        unique = conn.execute(
            """
            SELECT EXISTS (
                SELECT 1 FROM pg_index i
                WHERE i.indrelid = %(oid)s AND i.indisunique AND i.indpred IS NULL AND i.indexprs IS NULL
                  AND i.indnkeyatts = cardinality(%(key)s::text[])
                  AND (SELECT array_agg(a.attname::text) FROM pg_attribute a
                       WHERE a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey::int2[])) @> %(key)s::text[])
            """,
            {"oid": oid, "key": list(key)},
        ).fetchone()[0]
        if not unique:
            raise TargetError(f"upsert key ({', '.join(key)}) of {table} needs a unique index "
                              "or primary key on exactly these columns")
    return Shape(staged, window_columns, oid, schema)


def _check_partitioned_by_window(conn: psycopg.Connection, oid: int, kind: str, table: str) -> None:
    wanted = (f"mode {PARTITION_PER_WINDOW!r} needs target table {table} partitioned by window, "
              "created with PARTITION BY RANGE (eos_window_start): each window is attached as one partition")
    if kind != "p":
        raise TargetError(f"{wanted}; it is not partitioned")
    strategy, key = conn.execute(
        "SELECT p.partstrat, array(SELECT coalesce(a.attname::text, '(expression)')"
        " FROM unnest(p.partattrs::int2[]) WITH ORDINALITY k(attnum, i)"
        " LEFT JOIN pg_attribute a ON a.attrelid = p.partrelid AND a.attnum = k.attnum ORDER BY k.i)"
        " FROM pg_partitioned_table p WHERE p.partrelid = %s", (oid,)).fetchone()
    if strategy != "r" or key != ["eos_window_start"]:
        how = {"r": "RANGE", "l": "LIST", "h": "HASH"}.get(strategy, strategy)
        raise TargetError(f"{wanted}; it is partitioned by {how} ({', '.join(key)})")


def published_relation(conn: psycopg.Connection, target: sql.Identifier, table: str, url: str | None,
                       pipeline: str, columns: Sequence[str]) -> sql.Composed:
    """The rows of ``pipeline`` in the target table, with the window columns,
    the lineage columns if the table has all three, and those of ``columns`` it
    has (see :meth:`airflow_eos.core.sink.Sink.published_relation`)."""
    from psycopg import sql
    oid = conn.execute("SELECT to_regclass(%s)::oid", (target.as_string(conn),)).fetchone()[0]
    if oid is None:
        raise TargetError(f"target table {table} does not exist in {redact(url)}")
    names = {r[0] for r in conn.execute(
        "SELECT attname FROM pg_attribute WHERE attrelid = %s AND attnum > 0 AND NOT attisdropped", (oid,))}
    if not all(c in names for c in WINDOW_COLUMNS):
        raise TargetError(f"target table {table} has no columns {' and '.join(WINDOW_COLUMNS)}: verify "
                          "needs each row's window (modes 'replace_window', 'partition_per_window') to audit it")
    selected = list(WINDOW_COLUMNS) + (list(LINEAGE_COLUMNS) if all(c in names for c in LINEAGE_COLUMNS) else [])
    selected += [c for c in dict.fromkeys(columns) if c in names and c not in selected]
    # Values go in as literals, not parameters, as in the commit: the caller
    # composes the relation into queries of its own.
    return sql.SQL("(SELECT {} FROM {} WHERE eos_pipeline = {}::text)").format(
        sql.SQL(", ").join(map(sql.Identifier, selected)), target, sql.Literal(pipeline))


def unattributed(conn: psycopg.Connection, target: sql.Identifier, table: str, pipeline: str,
                 topics: Sequence[str]) -> Iterator[ForeignRecord]:
    """Sink.unattributed of a table: its rows of other pipelines (or of none)
    whose lineage names one of ``topics`` (the pipeline's source topics): the
    same source records published again, from another pipeline id or left
    over. Rows of other pipelines with other topics are theirs. A table
    without lineage columns cannot tell: nothing."""
    from psycopg import sql
    oid = conn.execute("SELECT to_regclass(%s)::oid", (target.as_string(conn),)).fetchone()[0]
    names = {r[0] for r in conn.execute(
        "SELECT attname FROM pg_attribute WHERE attrelid = %s AND attnum > 0 AND NOT attisdropped", (oid,))}
    if oid is None or not all(c in names for c in LINEAGE_COLUMNS):
        return
    # values as literals, as in published_relation: a table name may hold a %
    rows = conn.execute(sql.SQL(
        "SELECT eos_pipeline, eos_window_start, eos_topic, eos_partition, eos_offset, count(*) FROM {}"
        " WHERE eos_pipeline IS DISTINCT FROM {}::text AND eos_topic = ANY({}::text[])"
        " GROUP BY 1, 2, 3, 4, 5 ORDER BY 3, 4, 5, 1, 2").format(target, sql.Literal(pipeline),
                                                                  sql.Literal(list(topics))))
    for owner, window_start, topic, partition, offset, n in rows:
        who = f"pipeline {owner!r}" if owner is not None else "no pipeline (eos_pipeline is null)"
        yield ForeignRecord(f"table {table}", f"has {n} row(s) of {who} (window {window_start.isoformat() if window_start else None}) for "
                            f"source record {topic}[{partition}]@{offset} of this pipeline's topics: readers of the "
                            "table see that record again", topic, partition, offset)


def resolved_name(conn: psycopg.Connection, target: sql.Identifier) -> tuple[str, str] | None:
    """(schema, table) of the table ``target`` names in this session (a name
    without a schema resolves through the connection's search_path), or None
    if there is none."""
    return conn.execute("SELECT n.nspname, c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
                        " WHERE c.oid = to_regclass(%s)", (target.as_string(conn),)).fetchone()
