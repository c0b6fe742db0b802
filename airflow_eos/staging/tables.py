"""The tables of an attempt's staging: one for its rows, each tagged with the
chunk (the writer transaction) that staged it, and one for its dead letters,
both in schema ``eos_staging`` and named by the attempt. A target creates the
rows' table in its own shape; the dead letters' table, the chunk counts and
the drop are the same for every target.

psycopg is imported by the functions that need it: a DAG file imports the
targets' specs, which must not load it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import psycopg
    from psycopg import sql

STAGING_SCHEMA = "eos_staging"
CHUNK_COLUMN = "eos_chunk"  # which writer transaction staged the row
# Each writer transaction sets eos.chunk; a staged row's chunk column defaults to it.
CHUNK_DEFAULT = "current_setting('eos.chunk')::bigint"
DEAD_LETTER_SUFFIX = "_dl"


def staging_ids(staging: str) -> tuple[sql.Identifier, sql.Identifier]:
    """The tables of an attempt's staging: its rows and its dead letters."""
    from psycopg import sql
    return sql.Identifier(STAGING_SCHEMA, staging), sql.Identifier(STAGING_SCHEMA, staging + DEAD_LETTER_SUFFIX)


def create_dead_letters(conn: psycopg.Connection, staging: str, *, logged: bool) -> None:
    """Create the staging's dead-letter table. ``logged``: whether it must
    survive a crash of the database (an unlogged table is emptied by one)."""
    from psycopg import sql
    _, dead_table = staging_ids(staging)
    conn.execute(sql.SQL(
        'CREATE {}TABLE {} ({} bigint NOT NULL, topic text NOT NULL, partition integer NOT NULL,'
        ' "offset" bigint NOT NULL, error text NOT NULL, key bytea, value bytea)'
    ).format(sql.SQL("" if logged else "UNLOGGED "), dead_table, sql.Identifier(CHUNK_COLUMN)))


def exists(conn: psycopg.Connection, staging: str) -> bool:
    """Whether the staging's rows table exists (it is dropped when its attempt ends)."""
    rows_table, _ = staging_ids(staging)
    return conn.execute("SELECT to_regclass(%s) IS NOT NULL", (rows_table.as_string(conn),)).fetchone()[0]


def count_chunks(conn: psycopg.Connection, staging: str) -> dict[int, tuple[int, int]]:
    """chunk -> (rows, dead letters) in the staging."""
    from psycopg import sql
    rows_table, dead_table = staging_ids(staging)
    rows = conn.execute(sql.SQL("SELECT {0}, count(*) FROM {1} GROUP BY {0}").format(
        sql.Identifier(CHUNK_COLUMN), rows_table)).fetchall()
    dead = conn.execute(sql.SQL("SELECT {0}, count(*) FROM {1} GROUP BY {0}").format(
        sql.Identifier(CHUNK_COLUMN), dead_table)).fetchall()
    counts = {chunk: (n, 0) for chunk, n in rows}
    for chunk, n in dead:
        counts[chunk] = (counts.get(chunk, (0, 0))[0], n)
    return counts


def drop(conn: psycopg.Connection, staging: str) -> None:
    """Drop the staging's tables (if they still exist)."""
    from psycopg import sql
    for table in staging_ids(staging):
        conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(table))


__all__ = ["CHUNK_COLUMN", "CHUNK_DEFAULT", "DEAD_LETTER_SUFFIX", "STAGING_SCHEMA",
           "count_chunks", "create_dead_letters", "drop", "exists", "staging_ids"]
